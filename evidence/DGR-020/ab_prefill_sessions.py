"""A/B: prefill_sessions_per_step 4 (the default) vs 16 (= max_running) with one
llama_decode per step, alternating: the burst of ab_one_call.py
(16 sessions behind a cached ~1,500-token system prompt), TTFT p50 / p99 ms, and the
mixed load (4 decoders, then a ~1,000-token prompt).

    python evidence/DGR-020/ab_prefill_sessions.py
"""
import sys

import trio

import dgr

sys.path.insert(0, "evidence/DGR-020")
from ab_one_call import MODEL, burst, mixed  # noqa: E402


async def measure(sessions):
    cfg = dgr.NodeConfig(model_path=MODEL, n_ctx=65536, prefill_sessions_per_step=sessions)
    async with dgr.open_node(cfg) as node:
        b = await burst(node)
    async with dgr.open_node(cfg) as node:
        m = await mixed(node)
    return b, m


for rnd in range(2):
    order = (16, 4) if rnd % 2 == 0 else (4, 16)
    got = {s: trio.run(measure, s) for s in order}
    (b16, m16), (b4, m4) = got[16], got[4]
    print(f"round {rnd}: burst TTFT p50/p99 ms, 16 per step {b16[0]:.0f}/{b16[1]:.0f}, 4 per step "
          f"{b4[0]:.0f}/{b4[1]:.0f} (p50 ratio {b16[0] / b4[0]:.2f}); mixed: long-prompt TTFT ms "
          f"{m16[0]:.0f} vs {m4[0]:.0f}, worst decoder gap ms {m16[1]:.0f} vs {m4[1]:.0f}", flush=True)
