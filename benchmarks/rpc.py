"""The cost of distance: dgr's decode rate with the model's layers local, on one or
two ggml RPC workers (`python -m dgr worker`, loopback), and on one worker behind a
proxy that adds a fixed round-trip time (tc netem is not available here).

    python benchmarks/rpc.py [--levels 1,8,16] [--new-tokens 32] [--rtt-ms 1,10]

Workers and node share this machine's cores; llama.cpp computes a step's layers in
order, so a worker computes while the node waits and the two do not compete. What
distance adds is a round trip per graph split and step (inputs, compute, outputs),
and what crosses the wire: llama.cpp offloads the last layers, the output layer
with them, so each sampled row's logits (n_vocab floats) come back from a worker."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import dgr  # noqa: E402
from benchmarks.servers import free_port  # noqa: E402
from dgr.engine import resolve_model_path  # noqa: E402

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def wait_port(port: int, proc: subprocess.Popen | None = None, timeout: float = 60,
              host: str = "127.0.0.1") -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((host, port), timeout=1).close()
            return
        except OSError:
            if (proc is not None and proc.poll() is not None) or time.monotonic() > deadline:
                raise RuntimeError(f"nothing listens on port {port}")
            time.sleep(0.05)


@contextlib.contextmanager
def worker(threads: int = 1):
    """A `python -m dgr worker` process on a free loopback port (its host:port)."""
    with worker_process(threads) as (endpoint, _):
        yield endpoint


@contextlib.contextmanager
def worker_process(threads: int = 1, host: str = "127.0.0.1", prefix: tuple[str, ...] = (),
                   args: tuple[str, ...] = (), stderr=subprocess.DEVNULL):
    """A `python -m dgr worker` process listening on host (its host:port, the
    process); `prefix` runs it through another command (e.g. `ip netns exec NS`),
    `args` are more of the worker's options."""
    port = free_port()
    proc = subprocess.Popen([*prefix, sys.executable, "-m", "dgr", "worker", "--host", host,
                             "--port", str(port), "--threads", str(threads), *args], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        wait_port(port, proc, host=host)
        yield f"{host}:{port}", proc
    finally:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def delaying_proxy(target: str, rtt_s: float):
    """A TCP proxy in front of `target` (host:port) that holds every byte rtt_s / 2
    in each direction (ordered, pipelined: it adds latency, not a bandwidth limit);
    yields its own host:port."""
    target_host, _, target_port = target.rpartition(":")
    port = free_port()
    started = threading.Event()
    stop = {}

    broken = (trio.BrokenResourceError, trio.ClosedResourceError)

    async def pipe(source, sink, connection: trio.CancelScope):
        """source -> sink, each chunk held rtt_s / 2; a broken side ends the connection."""
        send, receive = trio.open_memory_channel(1 << 16)

        async def reader():
            async with send:
                try:
                    while data := await source.receive_some(1 << 16):
                        await send.send((trio.current_time() + rtt_s / 2, data))
                except broken:
                    connection.cancel()

        async def writer():
            try:
                async for due, data in receive:
                    await trio.sleep_until(due)
                    await sink.send_all(data)
                await sink.send_eof()
            except broken:
                connection.cancel()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            nursery.start_soon(writer)

    async def handle(client):
        try:
            upstream = await trio.open_tcp_stream(target_host, int(target_port))
        except OSError:
            await client.aclose()
            return
        for stream in (client, upstream):
            stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        async with client, upstream, trio.open_nursery() as nursery:
            nursery.start_soon(pipe, client, upstream, nursery.cancel_scope)
            nursery.start_soon(pipe, upstream, client, nursery.cancel_scope)

    async def main():
        async with trio.open_nursery() as nursery:
            stop["scope"], stop["token"] = nursery.cancel_scope, trio.lowlevel.current_trio_token()
            listeners = await trio.open_tcp_listeners(port, host="127.0.0.1")
            nursery.start_soon(trio.serve_listeners, handle, listeners)
            started.set()

    thread = threading.Thread(target=trio.run, args=(main,), daemon=True)
    thread.start()
    started.wait(10)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        stop["token"].run_sync_soon(stop["scope"].cancel)
        thread.join(10)


def link_totals(node) -> tuple[int, int]:
    """Bytes the node's connections to its workers carried so far (the kernel's
    count, /capabilities), and steps run."""
    links = [d["link"] for d in node.capabilities()["devices"] if "link" in d]
    moved = sum(link["bytes_sent"] + link["bytes_received"] for link in links)
    return moved, int(node.telemetry.registry.get_sample_value("dgr_steps_total") or 0)


async def decode_rate(config: dgr.NodeConfig, levels: list[int], n_new: int,
                      links: dict | None = None) -> dict:
    """Decode tokens/s per concurrency level; with `links`, also the bytes per step
    that crossed to the workers at each level."""
    rates = {}
    async with dgr.open_node(config) as node:
        params = dgr.SamplingParams(max_tokens=n_new, ignore_eos=True)
        await node.generate(PROMPT, dgr.SamplingParams(max_tokens=2))
        for c in levels:
            moved, steps = link_totals(node)
            started = time.perf_counter()

            async def one(i):
                await node.generate(f"{PROMPT} ({i})", params)

            async with trio.open_nursery() as nursery:
                for i in range(c):
                    nursery.start_soon(one, i)
            rates[c] = c * n_new / (time.perf_counter() - started)
            if links is not None:
                moved_after, steps_after = link_totals(node)
                links[c] = (moved_after - moved) / max(1, steps_after - steps)
    return rates


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--levels", default="1,8,16")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--rtt-ms", default="1,10")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    model = resolve_model_path(args.model)
    levels = [int(x) for x in args.levels.split(",")]

    def config(workers=(), rpc_layers=None):
        return dgr.NodeConfig(model_path=model, max_running=max(levels), max_waiting=max(levels),
                              n_ctx=max(levels) * 512, n_threads=args.threads,
                              rpc_workers=workers, rpc_layers=rpc_layers)

    results = {}
    per_step = {}

    def record(name, rates, links=None):
        results[name] = rates
        base = results["local"]
        print(f"{name:28s} " + "  ".join(
            f"c={c}: {r:6.1f} tok/s ({r / base[c]:.2f}x)" for c, r in rates.items()), flush=True)
        if links:
            per_step[name] = links
            print(f"{'':28s} " + "  ".join(f"c={c}: {b / 1024:6.1f} KiB/step" for c, b in links.items()),
                  flush=True)

    # A fresh worker for each configuration: ggml's RPC client keeps its connection to
    # an endpoint for the life of the process, and a worker serves one client at a time.
    record("local", trio.run(decode_rate, config(), levels, args.new_tokens))
    with worker(args.threads) as endpoint:
        links = {}
        record("1 worker, half the layers",
               trio.run(decode_rate, config([endpoint]), levels, args.new_tokens, links), links)
    for rtt in (float(x) for x in args.rtt_ms.split(",") if x):
        with worker(args.threads) as endpoint, delaying_proxy(endpoint, rtt / 1000) as proxied:
            record(f"1 worker, +{rtt:g} ms RTT", trio.run(
                decode_rate, config([proxied]), levels, args.new_tokens))
    with worker(args.threads) as a, worker(args.threads) as b:
        links = {}
        record("2 workers, a third each", trio.run(
            decode_rate, config([a, b]), levels, args.new_tokens, links), links)
    if args.out:
        Path(args.out).write_text(json.dumps({"tok_s": results, "link_bytes_per_step": per_step},
                                             indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
