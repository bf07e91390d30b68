import sys, time, trio, dgr
sys.path.insert(0, "/work/main")
from benchmarks.speculation import WORKLOADS
N = 96
async def main():
    cfg = dgr.NodeConfig(model_path=None, n_ctx=16384, max_running=16)
    async with dgr.open_node(cfg) as node:
        await node.generate("warm up", dgr.SamplingParams(max_tokens=8))
        for rnd in range(2):
            for w, build in WORKLOADS.items():
                row = []
                for mode in ("auto", "off", "always"):
                    prompt, extra = build(rnd * 10 + {"off": 0, "auto": 1, "always": 2}[mode])
                    p = dgr.SamplingParams(max_tokens=N, ignore_eos=not extra, speculation=mode, **extra)
                    stamps = []
                    async with node.stream(prompt, p) as s:
                        async for c in s:
                            if c.token_id is not None:
                                stamps.append(time.perf_counter())
                    row.append((len(stamps) - 1) / (stamps[-1] - stamps[0]))
                sp = node.capabilities()["speculation"]["sources"]
                print(f"{w:16s} auto {row[0]:6.1f} off {row[1]:6.1f} always {row[2]:6.1f} tok/s   acc ctx {sp['context']['acceptance']} node {sp['node']['acceptance']}", flush=True)
        print(node.capabilities()["budgets"]["scratch"]["step_time_model"])
trio.run(main)
