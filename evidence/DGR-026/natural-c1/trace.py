"""The bench's c = 1 matrix in process, as one round of `python -m dgr bench --cases
speculation --spec-levels 1` runs it on a fresh node (default model, greedy, 96 tokens,
benchmarks/speculation.py's prompts; the warm-up's code edit with speculation off),
for rounds 0 and 1 (round r: prompt number 1000 + 100 r), with speculation auto: the
steps and their summed time; for natural text, its text and every step with drafts (draft
rows, tokens given, what the policy planned: tokens and ms, and what it took). Then natural
text with speculation off at another prompt number (its steps' time, for scale).

    python evidence/DGR-026/natural-c1/trace.py
"""

import sys
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import dgr  # noqa: E402
from benchmarks.speculation import N_NEW, WORKLOADS  # noqa: E402
from dgr.engine import resolve_model_path  # noqa: E402


async def one(node, workload, i, mode):
    prompt, extra = WORKLOADS[workload](i)
    params = dgr.SamplingParams(max_tokens=N_NEW, temperature=0.0, speculation=mode,
                                ignore_eos="grammar" not in extra, **extra)
    first_step = node.steps[-1].index if node.steps else -1
    text = []
    async with node.stream(prompt, params) as chunks:
        async for chunk in chunks:
            text.append(chunk.text or "")
    return [s for s in node.steps if s.index > first_step], "".join(text)


async def main():
    config = dgr.NodeConfig(model_path=resolve_model_path(None), max_running=16,
                            max_waiting=64, n_ctx=16 * 2048)
    for r in (0, 1):
        async with dgr.open_node(config) as node:
            await one(node, "code edit", 90000, "off")
            for workload in WORKLOADS:
                steps, text = await one(node, workload, 1000 + 100 * r, "auto")
                drafted = sum(s.draft_rows for s in steps)
                print(f"round {r} {workload}: {len(steps)} steps, "
                      f"{sum(s.duration_s for s in steps):.3f} s, {drafted} drafted")
                if workload != "natural text":
                    continue
                print("   text:", repr(text))
                n = 0
                for s in steps:
                    n += s.generated
                    if s.draft_rows:
                        print(f"   step {s.index} (at token {n - s.generated}): {s.draft_rows} "
                              f"draft rows, {s.generated} tokens (planned "
                              f"{s.planned[0]:.2f} in {1e3 * s.planned[1]:.0f} ms), took "
                              f"{1e3 * s.duration_s:.0f} ms")
            steps, text = await one(node, "natural text", 2000 + 100 * r, "off")
            print(f"round {r} natural text (another prompt number), off: {len(steps)} steps, "
                  f"{sum(s.duration_s for s in steps):.3f} s")
            spec = node._loop.batch.scheduler.speculation
            print(f"   trust {spec.trust():.2f}; acceptance {spec.acceptance()}")


if __name__ == "__main__":
    trio.run(main)
