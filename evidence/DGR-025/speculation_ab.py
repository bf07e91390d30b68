"""The levels case at c sessions (benchmarks/concurrency.run_level: c streamed greedy
completions of 48 tokens over HTTP, default model), dgr with `--speculation auto`
(the default) and `off`, alternating, rounds; the drafts auto verified and accepted.

    python evidence/DGR-025/speculation_ab.py [--rounds 4] [--c 1]
"""

import argparse
import os
import re
import statistics
import sys
from pathlib import Path

import httpx
import trio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.concurrency import dgr_server, free_port, run_level  # noqa: E402
from dgr.engine import resolve_model_path  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--rounds", type=int, default=4)
parser.add_argument("--c", type=int, default=1)
args = parser.parse_args()
model = resolve_model_path(None)
threads = os.cpu_count() or 2


def drafts(url: str) -> tuple[int, int]:
    text = httpx.get(url + "/metrics").text
    total = {}
    for name in ("dgr_spec_draft_tokens_total", "dgr_spec_accepted_tokens_total"):
        total[name] = sum(float(v) for v in re.findall(rf"^{name}\{{[^}}]*\}} (\S+)$", text, re.M))
    return int(total["dgr_spec_draft_tokens_total"]), int(total["dgr_spec_accepted_tokens_total"])


rates = {"auto": [], "off": []}
print("| round | speculation | tok/s | drafted | accepted |")
print("|---|---|---|---|---|")
for r in range(args.rounds):
    for mode in ("auto", "off"):
        with dgr_server(model, args.c, 1024, threads, free_port(),
                        extra=("--speculation", mode)) as srv:
            got = trio.run(run_level, srv.url, args.c, 48, True)
            drafted, accepted = drafts(srv.url)
        rates[mode].append(got["gen_tok_s"])
        print(f"| {r} | {mode} | {got['gen_tok_s']:.1f} | {drafted} | {accepted} |", flush=True)
ratios = [a / o for a, o in zip(rates["auto"], rates["off"])]
print()
print(f"auto / off: median {statistics.median(ratios):.3f}, min {min(ratios):.3f}, "
      f"max {max(ratios):.3f}")
