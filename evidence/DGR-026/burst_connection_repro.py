"""Does the burst's earlier user break llama-server runs? N runs of the templated
burst at c = 1 against one llama-server started as the bench starts it (-b 2048), each
failure's traceback printed, then the count.

    PYTHONPATH=. python3 evidence/DGR-026/burst_connection_repro.py N
"""
import sys, traceback, trio
from benchmarks.concurrency import llama_server, free_port, SPEC_PEER_BATCH
from benchmarks.peers import ensure_peers
from benchmarks import speculation as spec
from dgr.engine import resolve_model_path
peers = ensure_peers()
srv = llama_server(peers["llama-server"], str(resolve_model_path(None)), 16, 2048, 2, free_port(), log=None)
srv.argv += ["-b", str(SPEC_PEER_BATCH)]
with srv:
    fails = 0
    for k in range(int(sys.argv[1])):
        try:
            trio.run(spec.run_level, srv.url, "templated burst", 1, False, None, 5000 + 100 * k)
        except BaseException as exc:
            fails += 1
            traceback.print_exception(exc, limit=3)
    print("fails", fails)
