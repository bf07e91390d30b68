"""llama-server's metrics (`llamacpp:` names) from the node's own figures, after
dgr's families in GET /metrics: what dashboards and alerts written for
llama-server read. Written as llama-server writes them (prometheus_client would
add `_total` to `n_tokens_max`, a counter llama-server names without it)."""

from __future__ import annotations

# (name, type, help, the snapshot's figure it shows)
_FAMILIES = [
    ("prompt_tokens_total", "counter", "Prompt tokens computed (not taken from the cache).",
     "prefilled"),
    ("prompt_tokens_cached_total", "counter", "Prompt tokens taken from the prefix cache or "
     "a running session.", "cached"),
    ("prompt_seconds_total", "counter", "Seconds from sessions' admission to their first "
     "token (their prompts' time, the queue included).", "prompt_s"),
    ("tokens_predicted_total", "counter", "Tokens generated.", "generated"),
    ("tokens_predicted_seconds_total", "counter", "Seconds between consecutive tokens of "
     "sessions.", "predicted_s"),
    ("n_decode_total", "counter", "Steps run (each one llama_decode per call).", "steps"),
    ("n_tokens_max", "counter", "The most rows (tokens) one step has run.", "rows_max"),
    ("spec_decode_num_draft_tokens_total", "counter", "Draft tokens verified.", "drafted"),
    ("spec_decode_num_accepted_tokens_total", "counter", "Draft tokens accepted.", "accepted"),
    ("spec_decode_num_drafts_total", "counter", "Steps that verified drafts.", "draft_steps"),
    ("prompt_tokens_seconds", "gauge", "Prompt tokens computed per second, lately.", "prefill_rate"),
    ("predicted_tokens_seconds", "gauge", "Tokens generated per second, lately.", "decode_rate"),
    ("requests_processing", "gauge", "Sessions running.", "active"),
    ("requests_deferred", "gauge", "Sessions waiting for a slot.", "waiting"),
    ("n_busy_slots_per_decode", "gauge", "Sessions with a decode row, per step on average.", "busy_per_step"),
]


def figures(node) -> dict:
    """A snapshot of the figures the families read: plain numbers, cheap at every
    scrape (reading the metrics registry's samples would render it again)."""
    telemetry, totals = node.telemetry, node.telemetry.step_totals
    load = node.router_load()
    rates = telemetry.recent_rates()
    return {"prefilled": totals.tokens["prefill"], "cached": load["prompt_tokens_cached"],
            "prompt_s": telemetry.ttft.total, "generated": totals.tokens["generated"],
            "predicted_s": telemetry.itl.total, "steps": totals.steps,
            "rows_max": totals.rows_max,
            "drafted": telemetry.drafted_total, "accepted": telemetry.accepted_total,
            "draft_steps": totals.spec_steps,
            "prefill_rate": rates["prefill_tokens_per_s"],
            "decode_rate": rates["decode_tokens_per_s"],
            "active": load["running"], "waiting": load["waiting"],
            "busy_per_step": totals.tokens["decode"] / totals.steps if totals.steps else 0.0}


def exposition(node) -> bytes:
    snapshot = figures(node)
    lines = []
    for name, kind, text, figure in _FAMILIES:
        lines += [f"# HELP llamacpp:{name} {text}", f"# TYPE llamacpp:{name} {kind}",
                  f"llamacpp:{name} {float(snapshot[figure])!r}"]
    return ("\n".join(lines) + "\n").encode()
