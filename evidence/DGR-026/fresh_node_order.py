"""One dgr server (the bench's: --max-running 16, 1,024 cells a slot, 2 threads), the
bench's speculation workload at c = 16 run several times in the order given, each
run's decode tok/s (as the bench counts it) and when its sessions' first and last
tokens came (seconds from the requests being sent).

    python3 evidence/DGR-026/fresh_node_order.py "code edit" off,off,auto,off
"""
import statistics, sys, time, trio, httpx
sys.path.insert(0, '.')
from benchmarks.concurrency import dgr_server, free_port
from benchmarks.speculation import WORKLOADS, _one
from dgr.engine import resolve_model_path

async def level(url, workload, c, mode, offset):
    build = WORKLOADS[workload]
    results = [None]*c
    started = time.perf_counter()
    async with httpx.AsyncClient(timeout=900, limits=httpx.Limits(max_connections=64)) as client:
        async def one(i):
            prompt, body = build(offset + i)
            results[i] = await _one(client, url, prompt, body | {"speculation": mode}, True)
        async with trio.open_nursery() as n:
            for i in range(c):
                n.start_soon(one, i)
    firsts = sorted(s[0]-started for s, _ in results)
    lasts = sorted(s[-1]-started for s, _ in results)
    tokens = sum(len(s)-1 for s, _ in results)
    return tokens/(lasts[-1]-firsts[0]), firsts, lasts

model = resolve_model_path(None)
with dgr_server(model, 16, 1024, 2, free_port()) as srv:
    for r in range(1):
        for k, mode in enumerate(sys.argv[2].split(",")):
            rate, firsts, lasts = trio.run(level, srv.url, sys.argv[1], 16, mode, 100*r + 50*k + 3000)
            print(f"r{r} {mode}: {rate:.1f} tok/s; first tokens at {firsts[0]:.1f}..{firsts[-1]:.1f} s (median {statistics.median(firsts):.1f}); last tokens {lasts[0]:.1f}..{lasts[-1]:.1f}", flush=True)
