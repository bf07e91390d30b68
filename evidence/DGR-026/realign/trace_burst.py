"""The bench's templated burst at c = 1 in process: per round, the earlier user's request
then the timed one, speculation off and then auto (auto on prompts 50 numbers on, so
that it does not draft from off's answer to its own prompt); decode tok/s and steps; with
a second argument, auto's steps.

    python3 evidence/DGR-026/realign/trace_burst.py ROUNDS [v]
"""
import sys, time
import trio
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))
import dgr
from benchmarks.speculation import N_NEW, WORKLOADS, BURST, EARLIER_USER
from dgr.engine import resolve_model_path

async def answer(node, i, mode):
    prompt, extra = WORKLOADS[BURST](i)
    params = dgr.SamplingParams(max_tokens=N_NEW, temperature=0.0, speculation=mode, ignore_eos=True)
    stamps, toks = [], []
    async with node.stream(prompt, params) as chunks:
        async for chunk in chunks:
            if chunk.token_id is not None:
                stamps.append(time.perf_counter()); toks.append(chunk.token_id)
    return (len(toks) - 1) / (stamps[-1] - stamps[0]), toks

async def main():
    config = dgr.NodeConfig(model_path=resolve_model_path(None), max_running=16,
                            max_waiting=64, n_ctx=16 * 2048)
    async with dgr.open_node(config) as node:
        await answer(node, 90000, "off")
        for r in range(int(sys.argv[1])):
            for mode in ("off", "auto"):
                offset = 1000 + 100 * r + (50 if mode == "auto" else 0)
                await answer(node, offset + EARLIER_USER, mode)
                first = node.steps[-1].index
                rate, toks = await answer(node, offset, mode)
                steps = [s for s in node.steps if s.index > first]
                print(f"r{r} {mode}: {rate:.1f} tok/s, {len(steps)} steps")
                if mode == "auto" and len(sys.argv) > 2:
                    for s in steps:
                        print(f"   step {s.index}: rows {len(s.decode)}+{s.draft_rows}, {s.generated} tok, "
                              f"planned {s.planned[0]:.1f} in {1e3*s.planned[1]:.0f} ms, took {1e3*s.duration_s:.0f} ms")
trio.run(main)
