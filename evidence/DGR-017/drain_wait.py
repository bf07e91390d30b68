"""The node in-process at c=1: the Trio thread's CPU per token and the wall/CPU time of
BatchLoop.drain (a proxy times it)."""
import time, trio, dgr
PROMPT = "Write a long story about a lighthouse keeper and the sea. " * 3
class Proxy:
    def __init__(self, b): self._b = b; self.wall = 0; self.cpu = 0; self.n = 0
    def __getattr__(self, k): return getattr(self._b, k)
    def drain(self):
        w, c = time.perf_counter(), time.thread_time()
        r = self._b.drain()
        self.wall += time.perf_counter() - w; self.cpu += time.thread_time() - c; self.n += 1
        return r
async def main():
    cfg = dgr.NodeConfig(model_path=None, max_running=4, max_waiting=16)
    async with dgr.open_node(cfg) as node:
        loop = node._loop
        p = Proxy(loop.batch); loop.batch = p
        await node.generate(PROMPT, dgr.SamplingParams(max_tokens=4))
        p.wall = p.cpu = p.n = 0
        c0 = time.thread_time(); t0 = time.perf_counter()
        for i in range(4):
            async with node.stream(PROMPT + str(i), dgr.SamplingParams(max_tokens=128, ignore_eos=True)) as chunks:
                async for ch in chunks:
                    pass
        el = time.perf_counter() - t0; cpu = time.thread_time() - c0
        print(f"tok/s={4*128/el:.1f} trio cpu/token={1000*cpu/512:.3f} ms; drain n={p.n} wall/call={1000*p.wall/p.n:.3f} cpu/call={1000*p.cpu/p.n:.3f}")
trio.run(main)
