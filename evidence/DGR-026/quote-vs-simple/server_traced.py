"""dgr.server.serve as `python -m dgr run` serves (16 slots of 2,048 cells, 2 threads) on
the port given, until SIGTERM; then prints every step the node ran (rows, tokens, what
the speculation policy planned, time). Started by client.py."""
import sys, contextlib, signal
import trio
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))
import dgr.server as server
from dgr.config import NodeConfig, ServerConfig
from dgr.engine import resolve_model_path
captured = {}
orig = server.open_node
@contextlib.asynccontextmanager
async def capture(cfg):
    async with orig(cfg) as node:
        captured["node"] = node
        yield node
server.open_node = capture
async def main():
    nc = NodeConfig(model_path=resolve_model_path(None), max_running=16, max_waiting=64, n_ctx=16 * 2048, n_threads=2)
    sc = ServerConfig(port=int(sys.argv[1]))
    shutdown = trio.Event()
    async def stop_on_signal():
        with trio.open_signal_receiver(signal.SIGTERM) as sigs:
            async for _ in sigs:
                shutdown.set(); return
    async with trio.open_nursery() as n:
        n.start_soon(stop_on_signal)
        await n.start(lambda task_status: server.serve(nc, sc, task_status=task_status, shutdown=shutdown, handle_signals=False))

    for s in captured["node"].steps:
        print(f"step {s.index}: rows {len(s.decode)}+{s.draft_rows}, {s.generated} tok, planned {s.planned[0]:.1f} in {1e3*s.planned[1]:.0f} ms, took {1e3*s.duration_s:.0f} ms", flush=True)
trio.run(main)
