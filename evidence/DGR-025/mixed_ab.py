"""The bench's mixed-load case, alternating servers, several rounds.

4 streaming decoders (160 tokens each), then a long prompt (about 1,200 tokens,
4 generated): the long prompt's time to first token, and the decoders' gaps
between tokens while it prefills (worst and median) against their median gap
over the whole run. Each round starts each server afresh, in this order:

- dgr: its defaults (prefill by a step-time budget, --decode-stall 3);
- dgr, fixed pieces: --decode-stall 0 (prefill_chunk = 256 rows a step beside
  decoders, the policy before the step-time budget for this case);
- llama-server: the pinned tree, as the bench runs it (-np 5, -b 512).

    DGR_STALLS=6 python evidence/DGR-025/mixed_ab.py [--rounds 4] [--before /tmp/dgr-A]

(DGR_STALLS: more --decode-stall values to try, comma-separated; mixed-ab.txt
was run with DGR_STALLS=6.)
"""

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.concurrency import dgr_server, free_port, llama_server, mixed_load  # noqa: E402
from benchmarks.peers import ensure_peers  # noqa: E402
from dgr.engine import resolve_model_path  # noqa: E402
from snapshot_server import snapshot_server  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--rounds", type=int, default=4)
parser.add_argument("--json", default=None, help="write every round's figures here")
parser.add_argument("--before", default=None,
                    help="also dgr-A, a snapshot.sh copy of the package, with dgr's defaults")
args = parser.parse_args()
model = resolve_model_path(None)
threads = os.cpu_count() or 2
peers = ensure_peers(log=lambda m: print(m, file=sys.stderr), batched_bench=False)
long_prompt = " ".join(["The committee reviewed the annual report on regional water supplies, "
                        "noting changes in rainfall, reservoir levels and demand."] * 60)
stalls = [float(x) for x in os.environ.get("DGR_STALLS", "").split(",") if x]
variants = {
    "dgr": lambda port: dgr_server(model, 5, 2048, threads, port),
    **{f"dgr, --decode-stall {x:g}": (lambda x: lambda port: dgr_server(
        model, 5, 2048, threads, port, ["--decode-stall", str(x)]))(x) for x in stalls},
    **({"dgr-A": lambda port: snapshot_server(args.before, model, 5, threads, 2048)}
       if args.before else {}),
    "dgr, fixed pieces": lambda port: dgr_server(model, 5, 2048, threads, port,
                                                 ["--decode-stall", "0"]),
    "llama-server": lambda port: llama_server(peers["llama-server"], model, 5, 2048, threads,
                                              port),
}
rounds = []
print("| round | server | long prompt TTFT ms | worst gap while it prefills ms | median gap "
      "while it prefills ms | median gap ms | worst / median | TTFT / llama-server's |")
print("|---|---|---|---|---|---|---|---|")
for r in range(args.rounds):
    got = {}
    for name, start in variants.items():
        with start(free_port()) as srv:
            got[name] = trio.run(mixed_load, srv.url, long_prompt, name != "llama-server")
    for name, m in got.items():
        m["worst_over_median"] = m["gap_worst_during_prefill_ms"] / m["gap_median_ms"]
        m["ttft_ratio"] = m["long_prompt_ttft_ms"] / got["llama-server"]["long_prompt_ttft_ms"]
        print(f"| {r} | {name} | {m['long_prompt_ttft_ms']:.0f} | "
              f"{m['gap_worst_during_prefill_ms']:.0f} | {m['gap_median_during_prefill_ms']:.0f} | "
              f"{m['gap_median_ms']:.0f} | {m['worst_over_median']:.1f} | {m['ttft_ratio']:.2f} |",
              flush=True)
    rounds.append(got)
print()
print("| server | TTFT / llama-server's: median (min-max) | worst gap / median gap: median (min-max) |")
print("|---|---|---|")
for name in variants:
    ttft = [g[name]["ttft_ratio"] for g in rounds]
    stall = [g[name]["worst_over_median"] for g in rounds]
    print(f"| {name} | {statistics.median(ttft):.2f} ({min(ttft):.2f}-{max(ttft):.2f}) | "
          f"{statistics.median(stall):.1f} ({min(stall):.1f}-{max(stall):.1f}) |")
if args.json:
    Path(args.json).write_text(json.dumps(rounds, indent=2))
