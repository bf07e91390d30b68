"""The templated burst in process as the bench's auto node sees it (as
../draft-cap/burst_node_trace.py: the code edit's warm-up at c = 16 with
speculation off, then 2 rounds of c = 8 and 16, each after its earlier user),
every request at speculation MODE: the row times the plan reads as each burst
starts (mean output rows, ms) and the fit, then per burst its decode tok/s, the
draft rows, and its decode-only steps by output rows (steps, median ms).

    python evidence/DGR-026/row-context/trace_points.py auto|off
"""
import sys, time
from pathlib import Path
import trio
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import dgr
from benchmarks.speculation import EARLIER_USER, N_NEW, WORKLOADS
from dgr.engine import resolve_model_path
BUILD = WORKLOADS["templated burst"]
async def one(node, i, mode, stamps, build=BUILD):
    prompt, _ = build(i)
    params = dgr.SamplingParams(max_tokens=N_NEW, temperature=0.0, speculation=mode, ignore_eos=True)
    async with node.stream(prompt, params) as chunks:
        async for chunk in chunks:
            if chunk.token_id is not None:
                stamps.append(time.perf_counter())

async def burst(node, c, offset, mode="auto"):
    await one(node, offset + EARLIER_USER, mode, [])
    pts = node._loop.row_times.points()
    print("  points at burst start:", [(r, round(1e3*s)) for r, s in pts if r <= 40])
    print("  fit:", node._loop.step_time.report())
    stamps = [[] for _ in range(c)]
    first = node.steps[-1].index if node.steps else -1
    async with trio.open_nursery() as n:
        for i in range(c):
            n.start_soon(one, node, offset + i, mode, stamps[i])
    steps = [s for s in node.steps if s.index > first]
    span = max(s[-1] for s in stamps) - min(s[0] for s in stamps)
    return sum(len(s) - 1 for s in stamps) / span, steps

async def main():
    mode = sys.argv[1]
    config = dgr.NodeConfig(model_path=resolve_model_path(None), max_running=16,
                            n_ctx=16 * 2048, speculation="auto")
    async with dgr.open_node(config) as node:
        async with trio.open_nursery() as n:
            for i in range(16):
                n.start_soon(one, node, 90_000 + i, "off", [], WORKLOADS["code edit"])
        pts = node._loop.row_times.points()
        print("after warm-up points:", [(r, round(1e3*s)) for r, s in pts if r <= 40])
        for r in range(2):
            for c in (8, 16):
                rate, steps = await burst(node, c, 100 * r + 1000 * c, mode)
                dec = {}
                for s in steps:
                    if not s.prefill:
                        dec.setdefault(len(s.decode) + s.draft_rows, []).append(1e3 * s.duration_s)
                print(f"r{r} c={c} {mode}: {rate:.1f} tok/s, {len(steps)} steps, drafts {sum(s.draft_rows for s in steps)}")
                print("   decode-only step ms by rows:", {k: (len(v), round(sorted(v)[len(v)//2])) for k, v in sorted(dec.items())})
trio.run(main)
