"""The CPU a request costs a server's Trio thread: N requests one after another, each
on a connection of its own (as the bench's curl clients), by http.client; the
thread's user + system time from /proc before and after, over N.

dgr (the tiny model): GET /health, completions of 1 and of 64 tokens (greedy,
not streamed). Hypercorn alone (the server dgr runs in, with its Trio worker):
an ASGI app that answers `{}` by hand, and the same answer from a Starlette route.

    python evidence/DGR-025/per_request_cpu.py [--requests 1000] [--rounds 2]
    (--serve raw|starlette PORT: the Hypercorn-only server, started by the above)
"""

import argparse
import http.client
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

TICK = os.sysconf("SC_CLK_TCK")


def serve(kind: str, port: int) -> None:
    import trio
    from hypercorn.config import Config
    from hypercorn.trio import serve as hypercorn_serve
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def raw(scope, receive, send):
        if scope["type"] == "lifespan":
            while (await receive())["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"{}"})

    async def health(request):
        return JSONResponse({})

    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.loglevel = "WARNING"
    app = raw if kind == "raw" else Starlette(routes=[Route("/health", health)])
    trio.run(hypercorn_serve, app, config)


def main_thread_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/task/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def request(port: int, method: str, path: str, body: bytes | None) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port)
    conn.request(method, path, body=body,
                 headers={"Content-Type": "application/json"} if body else {})
    conn.getresponse().read()
    conn.close()


def per_request(pid: int, port: int, method: str, path: str, body: bytes | None,
                n: int) -> tuple[float, float]:
    """(ms of the Trio thread's CPU a request, ms of wall time a request)."""
    for _ in range(20):
        request(port, method, path, body)
    cpu, wall = main_thread_seconds(pid), time.perf_counter()
    for _ in range(n):
        request(port, method, path, body)
    return ((main_thread_seconds(pid) - cpu) / n * 1e3,
            (time.perf_counter() - wall) / n * 1e3)


def wait_listening(port: int) -> None:
    for _ in range(200):
        try:
            request(port, "GET", "/health", None)
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"nothing answers on port {port}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--serve", nargs=2, metavar=("KIND", "PORT"))
    args = parser.parse_args()
    if args.serve:
        serve(args.serve[0], int(args.serve[1]))
        sys.exit(0)
    import tempfile

    from benchmarks.concurrency import dgr_server, free_port
    from dgr.testmodel import write_test_model

    model = str(write_test_model(Path(tempfile.mkdtemp()) / "tiny.gguf"))
    n = args.requests

    def completion(tokens: int) -> bytes:
        return json.dumps({"prompt": "Once upon a time", "max_tokens": tokens,
                           "temperature": 0, "ignore_eos": True}).encode()

    print(f"{n} requests a case, one connection each; ms a request")
    print()
    print("| round | server | request | Trio thread CPU | wall |")
    print("|---|---|---|---|---|")
    for r in range(args.rounds):
        with dgr_server(model, 64, 512, 2, free_port()) as srv:
            port = int(srv.url.rsplit(":", 1)[1])
            for name, method, path, body in (("GET /health", "GET", "/health", None),
                                             ("1-token completion", "POST", "/v1/completions",
                                              completion(1)),
                                             ("64-token completion", "POST", "/v1/completions",
                                              completion(64))):
                cpu, wall = per_request(srv.proc.pid, port, method, path, body, n)
                print(f"| {r} | dgr | {name} | {cpu:.3f} | {wall:.3f} |", flush=True)
        for kind in ("raw", "starlette"):
            port = free_port()
            proc = subprocess.Popen([sys.executable, __file__, "--serve", kind, str(port)])
            try:
                wait_listening(port)
                cpu, wall = per_request(proc.pid, port, "GET", "/health", None, n)
                print(f"| {r} | Hypercorn alone | {kind} ASGI app | {cpu:.3f} | {wall:.3f} |",
                      flush=True)
            finally:
                proc.terminate()
                proc.wait()
