"""KV tier workloads for `python -m benchmarks` (the kv_tier case).

- rotate: conversations of a ~`doc_words`-word document each (more of them
  than the KV pool holds), taking turns round-robin; every turn resends the
  whole history (document, questions, answers) and a new question, streamed,
  greedy. Time to first token p50/p99 of the turns after the first (the first
  turn of every conversation computes its document everywhere) and the prompt
  tokens the server computed. Servers: dgr without the tier (`--cache-ram 0`),
  dgr with host memory, dgr with a disk tier restarted between turns (the turns
  after the restart have only what the disk kept), llama-server with its
  `--cache-ram` (on by default in the pinned build), all driven identically over
  HTTP.
- restore vs recompute: in one node process, the time to first token of a
  prompt of n tokens computed from nothing, then the same prompt restored from
  the host tier (after the pool's copy was evicted into it), and the batch
  loop's own restore time.
"""

from __future__ import annotations

import statistics
import tempfile
import time

import trio

from benchmarks.completions import pct
from benchmarks.servers import dgr_server, free_port, llama_server
from benchmarks.shared_prefix import http_client, prefill_counter, stream

SERVERS = ("dgr no tier", "dgr host", "dgr disk restart", "llama-server")
TOPICS = ["rivers", "mountains", "trains", "bread", "clocks", "bees", "ships", "glass"]


def document(i: int, words: int) -> str:
    """Conversation i's document: its own numbers, so no two share more than a word."""
    parts, n = [], 0
    while n < words:
        k = len(parts)
        parts.append(f"Entry {i}.{k}: the {TOPICS[(i + k) % 8]} ledger records {(i * 31 + k * 7) % 997} "
                     f"units, checked by clerk {(i + k * 13) % 89}.")
        n += 14
    return "Document:\n" + " ".join(parts) + "\n"


def question(i: int, turn: int) -> str:
    return f"\nQuestion {turn + 1}: what does entry {i}.{turn * 3} record?\nAnswer:"


class Conversations:
    """The conversations' histories, kept across a server restart."""

    def __init__(self, n: int, words: int):
        self.history = [document(i, words) for i in range(n)]
        self.turn = [0] * n

    async def rotate(self, url: str, is_dgr: bool, turns: int, n_new: int) -> dict:
        """`turns` rounds: each conversation in turn asks its next question."""
        ttft, computed_reported = {}, []
        async with http_client() as client:
            before = await prefill_counter(client, url, is_dgr)
            for _ in range(turns):
                for i in range(len(self.history)):
                    prompt = self.history[i] + question(i, self.turn[i])
                    first, _, prompt_n, answer = await stream(
                        client, url, "/v1/completions",
                        {"prompt": prompt, "max_tokens": n_new, "ignore_eos": True})
                    ttft.setdefault(self.turn[i], []).append(first)
                    computed_reported.append(prompt_n)
                    self.history[i] = prompt + answer
                    self.turn[i] += 1
            after = await prefill_counter(client, url, is_dgr)
        computed = (after - before if is_dgr else
                    (sum(computed_reported) if all(p is not None for p in computed_reported)
                     else None))
        later = [t for turn, values in ttft.items() if turn > 0 for t in values]
        return {"turns": sorted(ttft), "requests": len(computed_reported),
                "ttft_p50_ms_per_turn": {t: 1000 * statistics.median(v) for t, v in ttft.items()},
                "ttft_p50_ms": 1000 * pct(later, 50) if later else None,
                "ttft_p99_ms": 1000 * pct(later, 99) if later else None,
                "prompt_tokens_computed": computed}


def run_rotate(servers: dict, n_conv: int, words: int, turns: int, n_new: int) -> dict:
    """servers: name -> (start(log name) -> ServerProcess, is_dgr, restart): with
    restart the server is stopped and started again halfway through the turns."""
    report = {}
    for name, (start, is_dgr, restart) in servers.items():
        conversations = Conversations(n_conv, words)
        try:
            if restart:
                first_half = turns // 2
                with start(name + "-1") as srv:
                    before = trio.run(conversations.rotate, srv.url, is_dgr, first_half, n_new)
                with start(name + "-2") as srv:
                    after = trio.run(conversations.rotate, srv.url, is_dgr, turns - first_half,
                                     n_new)
                report[name] = {"before_restart": before, "after_restart": after}
            else:
                with start(name) as srv:
                    report[name] = trio.run(conversations.rotate, srv.url, is_dgr, turns, n_new)
        except Exception as exc:  # a server that fails is reported, not hidden
            report[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    return report


def run(peers, model, threads, out, conversations: int, words: int, turns: int,
        server_names: list[str], restore_sizes: list[int]) -> dict:
    """The case: 16 slots and a 32,768-cell pool for dgr, llama-server with -np 16 and
    4,096 cells a slot and its --cache-ram default; each server's log in `out`."""
    cache_dir = tempfile.mkdtemp(prefix="dgr-kv-bench-")

    def dgr(*extra):
        return lambda log: dgr_server(model, 16, 2048, threads, free_port(), list(extra),
                                      log=out / f"kv-{log.replace(' ', '-')}.log")

    servers = {"dgr no tier": (dgr("--cache-ram", "0"), True, False),
               "dgr host": (dgr(), True, False),
               "dgr disk restart": (dgr("--cache-dir", cache_dir), True, True),
               "llama-server": (lambda log: llama_server(
                   peers["llama-server"], model, 16, 4096, threads, free_port(),
                   log=out / f"kv-{log.replace(' ', '-')}.log"), False, False)}
    report = {"conversations": conversations, "words": words, "turns": turns,
              "rotate": run_rotate({name: servers[name] for name in server_names},
                                   conversations, words, turns, 16)}
    if restore_sizes:
        report["restore"] = trio.run(restore_vs_recompute, model, restore_sizes, threads)
    return report


async def restore_vs_recompute(model: str, sizes: list[int], threads: int) -> list[dict]:
    """Per prompt size: TTFT computed, TTFT restored from host memory, the loop's restore time."""
    import dgr

    rows = []
    config = dgr.NodeConfig(model_path=model, max_running=2, max_waiting=2,
                            n_ctx=max(sizes) + 512, n_threads=threads)
    params = dgr.SamplingParams(max_tokens=1, temperature=0.0)
    async with dgr.open_node(config) as node:
        # a first request pays for warming up (threads, buffers): not the first size's
        await node.generate(node.tokenize(document(0, 100))[:64], params)
        await node.flush_prefix_cache()
        for n in sizes:
            ids = node.tokenize(document(n, n))[:n]
            await node.flush_prefix_cache()
            t0 = time.perf_counter()
            computed = await node.generate(ids, params)
            recompute_s = time.perf_counter() - t0
            await node.flush_prefix_cache(tiers=("pool",))  # into the host tier
            reg = node.telemetry.registry
            restore_before = reg.get_sample_value("dgr_kv_tier_restore_seconds_total") or 0
            t0 = time.perf_counter()
            restored = await node.generate(ids, params)
            restored_s = time.perf_counter() - t0
            restore_loop = (reg.get_sample_value("dgr_kv_tier_restore_seconds_total") or 0
                            ) - restore_before
            rows.append({"tokens": len(ids), "ttft_computed_s": recompute_s,
                         "ttft_restored_s": restored_s, "loop_restore_s": restore_loop,
                         "state_bytes": node.tiers.host.bytes,
                         "speedup": recompute_s / restored_s,
                         "same_token": computed.token_ids == restored.token_ids})
            await node.flush_prefix_cache()
    return rows


def markdown(report: dict) -> list[str]:
    lines = ["", "## KV tiers", "",
             "| server | turns | TTFT p50 ms (turns > 1) | p99 ms | prompt tokens computed |",
             "|---|---|---|---|---|"]
    for name, result in report.get("rotate", {}).items():
        parts = ([("", result)] if "before_restart" not in result else
                 [(" (before restart)", result["before_restart"]),
                  (" (after restart)", result["after_restart"])])
        for suffix, r in parts:
            if "error" in r:
                lines.append(f"| {name}{suffix} | error: {r['error']} | | | |")
                continue
            p50 = "-" if r["ttft_p50_ms"] is None else f"{r['ttft_p50_ms']:.0f}"
            p99 = "-" if r["ttft_p99_ms"] is None else f"{r['ttft_p99_ms']:.0f}"
            lines.append(f"| {name}{suffix} | {len(r['turns'])} | {p50} | {p99} | "
                         f"{r['prompt_tokens_computed']} |")
    rows = report.get("restore", [])
    if rows:
        lines += ["", "| prefix tokens | TTFT computed s | TTFT restored s | loop restore ms | "
                  "state MB | computed / restored |", "|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['tokens']} | {r['ttft_computed_s']:.3f} | {r['ttft_restored_s']:.3f} | "
                         f"{1000 * r['loop_restore_s']:.1f} | {r['state_bytes'] / 1e6:.1f} | "
                         f"{r['speedup']:.1f} |")
    return lines
