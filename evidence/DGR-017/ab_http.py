"""A/B at low c: dgr server vs llama-server, alternating, with/without the 0.5 s metrics scrape."""
import sys, time, trio, httpx
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
from benchmarks import concurrency as bc
from benchmarks.peers import ensure_peers
from dgr.engine import resolve_model_path

async def level(url, c, n_new, is_dgr, scrape):
    async with httpx.AsyncClient(timeout=600) as client:
        before = (await client.get(url + "/metrics")).text if is_dgr else ""
        stats = {}; stop = trio.Event(); res = [None]*c
        t0 = time.perf_counter()
        async with trio.open_nursery() as nursery:
            if scrape:
                nursery.start_soon(bc.scrape, client, url, stats, stop)
            async def one(i):
                res[i] = await bc.stream_one(client, url, bc.PROMPTS[i % len(bc.PROMPTS)], n_new, is_dgr=is_dgr)
            async with trio.open_nursery() as s:
                for i in range(c):
                    s.start_soon(one, i)
            el = time.perf_counter() - t0
            nursery.cancel_scope.cancel()
        after = (await client.get(url + "/metrics")).text if is_dgr else ""
    gen = sum(len(r["stamps"]) for r in res)
    out = gen / el
    extra = ""
    if is_dgr:
        steps = bc.metric_value(after, "dgr_batch_rows_count") - bc.metric_value(before, "dgr_batch_rows_count")
        st = bc.metric_value(after, "dgr_step_duration_seconds_sum") - bc.metric_value(before, "dgr_step_duration_seconds_sum")
        dec = bc.metric_value(after, 'dgr_step_phase_seconds_total{phase="decode"}') - bc.metric_value(before, 'dgr_step_phase_seconds_total{phase="decode"}')
        extra = f" step={1000*st/steps:.2f} decode={1000*dec/steps:.2f} outside={100*(st-dec)/st:.2f}%"
    return out, extra

# the first run (ab-http-before-parallel-sampling.txt, c=1,2,4) also had "dgr-noscrape"
VARIANTS = ("dgr", "llama-server")
def main():
    levels = [int(x) for x in sys.argv[1].split(",")]
    rounds = int(sys.argv[2]); n_new = int(sys.argv[3])
    model = resolve_model_path(None)
    peers = ensure_peers(log=lambda m: None)
    for c in levels:
        for r in range(rounds):
            row = []
            for name in VARIANTS:
                port = bc.free_port()
                cm = (bc.llama_server(peers["llama-server"], model, c, 1024, 2, port) if name == "llama-server"
                      else bc.dgr_server(model, c, 1024, 2, port))
                with cm:
                    url = f"http://127.0.0.1:{port}"
                    trio.run(level, url, c, 8, name != "llama-server", False)  # warm-up
                    tps, extra = trio.run(level, url, c, n_new, name != "llama-server", name == "dgr")
                row.append((name, tps, extra))
            base = row[-1][1]
            print(f"c={c} r={r} " + " | ".join(f"{n} {t:.1f} ({t/base:.3f}){e}" for n, t, e in row), flush=True)
main()
