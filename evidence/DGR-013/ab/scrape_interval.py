import sys, trio
sys.path.insert(0, '.')
import benchmarks.concurrency as bc
from dgr.node import resolve_model_path
model = resolve_model_path(None)
orig = bc.scrape
for c in (1, 16):
    with bc.dgr_server(model, c, 1024, 2, bc.free_port()) as srv:
        for rnd in range(3):
            for interval in (0.05, 0.5):
                async def scrape(client, url, stats, stop, interval=interval):
                    await orig(client, url, stats, stop, interval)
                bc.scrape = scrape
                r = trio.run(bc.run_level, srv.url, c, 64, True)
                print(f"c={c} round {rnd} scrape every {interval}s: {r['gen_tok_s']:.1f} tok/s, decode {r['step_ms_split']['decode']:.2f} ms/step", flush=True)
