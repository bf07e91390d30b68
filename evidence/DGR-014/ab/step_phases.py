import sys, time, trio, dgr
c = int(sys.argv[1]); n = int(sys.argv[2]) if len(sys.argv) > 2 else 64
async def main():
    async with dgr.open_node(dgr.NodeConfig(n_threads=2)) as node:
        t = node.telemetry
        def snap():
            g = t.registry.get_sample_value
            return {p: g("dgr_step_phase_seconds_total", {"phase": p}) or 0 for p in ("plan","decode","sample","update")} | {
                "step": g("dgr_step_duration_seconds_sum") or 0, "n": g("dgr_steps_total") or 0}
        await node.generate("warm up", dgr.SamplingParams(max_tokens=4))
        a = snap(); t0 = time.perf_counter()
        async with trio.open_nursery() as nur:
            for i in range(c):
                nur.start_soon(node.generate, f"Tell me a story about number {i}.", dgr.SamplingParams(max_tokens=n, ignore_eos=True))
        el = time.perf_counter() - t0
        b = snap(); steps = b["n"] - a["n"]
        ms = {k: 1000 * (b[k] - a[k]) / steps for k in ("plan","decode","sample","update","step")}
        print(f"c={c} tok/s={c*n/el:.1f} steps={steps:.0f} " + " ".join(f"{k}={v:.3f}" for k, v in ms.items()),
              f"outside={100*(ms['step']-ms['decode'])/ms['step']:.2f}%")
trio.run(main)
