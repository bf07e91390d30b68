"""The mixed load in process (no HTTP): 4 sessions stream 160 greedy tokens of the
bench's prompts on the default model; after 3 s a long prompt (the prompts
repeated, about 1,100 tokens) asks for 4. From the node's own step records: each
step that prefilled beside the decoders, its time against the step-time fit the
node ended with and against the median decode-only step of the 4; from the
streams: the long prompt's time to first token and the decoders' worst gap while it
prefilled over their median gap (gaps between the steps that gave them tokens).

    python evidence/DGR-025/mixed_probe.py --steps          # one run, every such step
    sh evidence/DGR-025/snapshot.sh /tmp/dgr-A REV
    python evidence/DGR-025/mixed_probe.py --before /tmp/dgr-A [--rounds 4]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def probe(show_steps: bool) -> dict:
    import trio

    import dgr
    from benchmarks.concurrency import PROMPTS
    from dgr.engine import resolve_model_path
    from dgr.step_time import attended

    async def main():
        cfg = dgr.NodeConfig(model_path=resolve_model_path(None), max_running=5,
                             n_ctx=5 * 2048)
        async with dgr.open_node(cfg) as node:
            stamps = {}

            async def decoder(i):
                params = dgr.SamplingParams(max_tokens=160, temperature=0, ignore_eos=True)
                async with node.stream(PROMPTS[i], params) as chunks:
                    stamps[i] = [time.perf_counter() async for chunk in chunks
                                 if chunk.token_id is not None]

            async with trio.open_nursery() as nursery:
                for i in range(4):
                    nursery.start_soon(decoder, i)
                await trio.sleep(3.0)
                sent, first = time.perf_counter(), None
                async with node.stream(" ".join(PROMPTS) * 12,
                                       dgr.SamplingParams(max_tokens=4, temperature=0)) as chunks:
                    async for chunk in chunks:
                        if chunk.token_id is not None and first is None:
                            first = time.perf_counter()
            a, b, c, e = node._loop.step_time.fitted
            steps = list(node._loop.steps)
        decode_only = statistics.median(s.duration_s for s in steps
                                        if len(s.decode) == 4 and not s.prefill)
        beside = []
        for s in steps:
            if s.prefill and s.decode:
                chunks = [(start, end) for _, start, end in s.prefill]
                rows = sum(end - start for start, end in chunks)
                fit = a + b * (len(s.decode) + s.draft_rows) + c * rows + e * attended(chunks)
                beside.append(s.duration_s / decode_only)
                if show_steps:
                    print(f"decode {len(s.decode)} + {s.draft_rows} drafts, prefill {rows:3d} at "
                          f"{chunks[0][0]:4d}: {1e3 * s.duration_s:5.1f} ms (the last fit "
                          f"{1e3 * fit:5.1f}), {s.duration_s / decode_only:.2f}x the "
                          f"decode-only step ({1e3 * decode_only:.1f} ms)")
        # gaps between the steps that gave a decoder tokens (a step's drafts give it
        # several at once, which a gap between tokens would count as gaps of ~0)
        steps_seen = {i: [t for j, t in enumerate(times) if j == 0 or t - times[j - 1] > 1e-3]
                      for i, times in stamps.items()}
        gaps = [later - earlier for times in steps_seen.values()
                for earlier, later in zip(times, times[1:])]
        during = [later - earlier for times in steps_seen.values()
                  for earlier, later in zip(times, times[1:]) if sent <= later <= first + 1e-3]
        return {"ttft_ms": 1e3 * (first - sent), "worst_step_x": max(beside),
                "worst_gap_x": max(during) / statistics.median(gaps)}

    return trio.run(main)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", action="store_true")
    parser.add_argument("--before", help="a snapshot.sh copy of the package")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe or args.steps:
        sys.path.append(str(ROOT))  # benchmarks; dgr is the one PYTHONPATH gives
        import dgr
        print(json.dumps({**probe(args.steps), "dgr": dgr.__file__}))
        sys.exit()
    trees = {"A": args.before, "B (this tree)": str(ROOT)}
    got = {name: [] for name in trees}
    print("| round | tree | long prompt TTFT ms | worst prefilling step / decode-only step | "
          "worst gap while it prefills / median gap |")
    print("|---|---|---|---|---|")
    for r in range(args.rounds):
        for name, path in (trees.items() if r % 2 == 0 else reversed(trees.items())):
            out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--probe"],
                                 check=True, capture_output=True, text=True,
                                 env={**os.environ, "PYTHONPATH": path}).stdout
            row = json.loads(out.splitlines()[-1])
            assert row["dgr"].startswith(path), row["dgr"]
            got[name].append(row)
            print(f"| {r} | {name} | {row['ttft_ms']:.0f} | {row['worst_step_x']:.2f} | "
                  f"{row['worst_gap_x']:.2f} |", flush=True)
    print()
    for name, rows in got.items():
        print(f"{name}: medians TTFT {statistics.median(r['ttft_ms'] for r in rows):.0f} ms, "
              f"worst step {statistics.median(r['worst_step_x'] for r in rows):.2f}x, "
              f"worst gap {statistics.median(r['worst_gap_x'] for r in rows):.2f}x")
