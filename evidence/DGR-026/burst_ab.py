"""The bench's templated burst (benchmarks/speculation.py) over HTTP, dgr servers
from several trees alternating in each round: c = 8 then 16 on one server, as the
bench runs them, speculation off and auto on prompts of their own (which goes
first alternating by round); per run the decode tok/s as the bench counts it,
the node's steps from its metrics (steps, mean step time, decode rows, draft
tokens and those accepted, steps with drafts) and when sessions got their first
and last tokens (seconds from the requests being sent).

    python evidence/DGR-026/burst_ab.py TREE[,TREE...] ROUNDS LEVELS [WORKLOAD]

Each TREE is a checkout of dgr with its extensions built (the server runs from it).
"""

import os
import statistics
import sys
from pathlib import Path

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import speculation as spec  # noqa: E402
from benchmarks.concurrency import ServerProcess, free_port  # noqa: E402

trees = sys.argv[1].split(",")
rounds = int(sys.argv[2])
levels = [int(x) for x in sys.argv[3].split(",")]
workload = sys.argv[4] if len(sys.argv) > 4 else "templated burst"
KEYS = ["dgr_steps_total", "dgr_step_duration_seconds_sum", "dgr_decode_tokens_total",
        "dgr_spec_draft_tokens_total", "dgr_spec_accepted_tokens_total", "dgr_spec_steps_total"]


def metrics(url: str) -> dict[str, float]:
    """The node's metrics, labelled series summed."""
    out: dict[str, float] = {}
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith("dgr_"):
            name, value = line.rsplit(" ", 1)
            name = name.split("{")[0]
            out[name] = out.get(name, 0.0) + float(value)
    return out


results: dict[tuple, list[float]] = {}
for r in range(rounds):
    for tree in trees:
        os.chdir(tree)
        port = free_port()
        argv = [sys.executable, "-m", "dgr", "run", "--port", str(port), "--max-running", "16",
                "--max-waiting", "64", "--ctx", str(16 * 2048), "--threads", "2",
                "--log-level", "WARNING"]
        with ServerProcess("dgr", argv, port) as srv:
            spec._warm_up(srv, True, 16)
            for c in levels:
                offset = 100 * r + 1000 * c
                modes = (("off", offset), ("auto", offset + 50))
                for mode, prompts in (modes if r % 2 == 0 else modes[::-1]):
                    before = metrics(srv.url)
                    out = trio.run(spec.run_level, srv.url, workload, c, True,
                                   {"speculation": mode}, prompts)
                    after = metrics(srv.url)
                    d = {k[4:].replace("_total", ""): after.get(k, 0) - before.get(k, 0)
                         for k in KEYS}
                    results.setdefault((tree, c, mode), []).append(out["decode_tok_s"])
                    print(f"r{r} {tree} c={c} {mode:4s} decode {out['decode_tok_s']:6.1f} tok/s, "
                          f"steps {d['steps']:.0f}, mean step "
                          f"{1e3 * d['step_duration_seconds_sum'] / max(1, d['steps']):.1f} ms, "
                          f"decode rows {d['decode_tokens']:.0f}, drafted "
                          f"{d['spec_draft_tokens']:.0f}, accepted {d['spec_accepted_tokens']:.0f},"
                          f" steps with drafts {d['spec_steps']:.0f}; first tokens "
                          f"{out['first_s'][0]:.2f}-{out['first_s'][-1]:.2f} s, last "
                          f"{out['last_s'][0]:.2f}-{out['last_s'][-1]:.2f} s", flush=True)
for tree in trees:
    for c in levels:
        ratios = [a / o for a, o in zip(results[(tree, c, "auto")], results[(tree, c, "off")])]
        print(f"{tree} c={c} auto / off per round: {', '.join(f'{x:.2f}' for x in ratios)}; "
              f"median {statistics.median(ratios):.2f}")
