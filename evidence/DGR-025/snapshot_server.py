"""A dgr server running the package copy that snapshot.sh made (dgr-A in the A/B
scripts beside this file): `python -m dgr run` with the editable install's finder
taken out of sys.meta_path (it sits ahead of sys.path) and the copy first on it."""

import sys

from benchmarks.concurrency import ServerProcess, dgr_server, free_port

RUN_SNAPSHOT = ("import runpy, sys; sys.meta_path[:] = [f for f in sys.meta_path "
                "if 'editable' not in getattr(f, '__module__', '')]; "
                "sys.path.insert(0, {dir!r}); runpy.run_module('dgr', run_name='__main__')")


def snapshot_server(snapshot_dir: str, model: str, c: int, threads: int,
                    ctx_per_slot: int = 512) -> ServerProcess:
    server = dgr_server(model, c, ctx_per_slot, threads, free_port())
    assert server.argv[1:3] == ["-m", "dgr"]
    return ServerProcess("dgr-A", [sys.executable, "-c", RUN_SNAPSHOT.format(dir=snapshot_dir),
                                   *server.argv[3:]], server.port)
