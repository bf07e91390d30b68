"""In-process node at concurrency c: step split from the node's metrics."""
import sys, time, trio, dgr
PROMPT = "Write a long story about a lighthouse keeper and the sea. " * 3

def split(node):
    reg = node.telemetry.registry
    out = {}
    for phase in ("plan", "decode", "sample", "update"):
        out[phase] = reg.get_sample_value("dgr_step_phase_seconds_total", {"phase": phase})
    out["step"] = reg.get_sample_value("dgr_step_duration_seconds_sum")
    out["n"] = reg.get_sample_value("dgr_steps_total")
    return out

async def main(c, n_new, temp):
    cfg = dgr.NodeConfig(model_path=None, max_running=max(c, 1), max_waiting=16)
    async with dgr.open_node(cfg) as node:
        await node.generate(PROMPT, dgr.SamplingParams(max_tokens=4, temperature=0.0))
        a = split(node)
        t0 = time.perf_counter()
        async def one(i):
            await node.generate(PROMPT + str(i), dgr.SamplingParams(max_tokens=n_new, temperature=temp, ignore_eos=True, seed=i))
        async with trio.open_nursery() as n:
            for i in range(c):
                n.start_soon(one, i)
        el = time.perf_counter() - t0
        b = split(node)
        d = {k: b[k] - a[k] for k in a}
        steps = d["n"]
        ms = {k: 1000 * d[k] / steps for k in d if k != "n"}
        print(f"c={c} temp={temp} tok/s={c*n_new/el:.1f} steps={steps:.0f} " +
              " ".join(f"{k}={v:.3f}" for k, v in ms.items()) +
              f" outside={100*(ms['step']-ms['decode'])/ms['step']:.2f}%")

for c in map(int, sys.argv[1].split(",")):
    trio.run(main, c, int(sys.argv[2]), float(sys.argv[3]))
