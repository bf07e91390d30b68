"""The bench's levels case at one c (48-token greedy streamed completions over HTTP,
benchmarks/concurrency.run_level), dgr with --speculation auto and off and
llama-server, each started afresh for each run, the order alternating by round;
4 rounds: tokens/s, TTFT p50 and ITL p50 per run, then the medians and auto's
ratios to the others.

    python3 evidence/DGR-025/levels_modes_ab.py 1 > evidence/DGR-025/levels-modes-c1.txt
"""
import statistics
import sys
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.concurrency import dgr_server, free_port, llama_server, run_level  # noqa: E402
from benchmarks.peers import ensure_peers  # noqa: E402
from dgr.engine import resolve_model_path  # noqa: E402

model = resolve_model_path(None)
peers = ensure_peers(log=lambda m: None, batched_bench=False)
c = int(sys.argv[1])
rates: dict[str, list[float]] = {"dgr auto": [], "dgr off": [], "llama-server": []}
print(f"c = {c}, 48 tokens a completion, streamed")
for r in range(4):
    for name in list(rates) if r % 2 == 0 else list(rates)[::-1]:
        if name == "llama-server":
            server = llama_server(peers["llama-server"], model, c, 1024, 2, free_port())
        else:
            server = dgr_server(model, c, 1024, 2, free_port(),
                                ["--speculation", name.split()[1]])
        with server:
            out = trio.run(run_level, server.url, c, 48, name != "llama-server")
        rates[name].append(out["gen_tok_s"])
        print(f"round {r}, {name}: {out['gen_tok_s']:.1f} tok/s, TTFT p50 "
              f"{out['ttft_p50_ms']:.0f} ms, ITL p50 {out['itl_p50_ms']:.1f} ms", flush=True)
for name, values in rates.items():
    print(f"{name}: median {statistics.median(values):.1f} tok/s")
for peer in ("dgr off", "llama-server"):
    ratios = [a / b for a, b in zip(rates["dgr auto"], rates[peer])]
    print(f"dgr auto / {peer}: median {statistics.median(ratios):.3f} "
          f"({', '.join(f'{x:.3f}' for x in ratios)})")
