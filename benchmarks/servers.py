"""The servers a bench drives: dgr's node and llama-server as subprocesses, each
on a free loopback port, healthy before it is used and stopped after."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def cpu_has_amx() -> bool:
    """Whether this machine's CPU has AMX tiles (/proc/cpuinfo's amx_tile flag)."""
    try:
        return re.search(r"\bamx_tile\b", Path("/proc/cpuinfo").read_text()) is not None
    except OSError:
        return False


# The llama.cpp peers run with their defaults, weight repacking included, but on CPUs with
# AMX: there the pinned build's AMX repacked matmul crashes (a general protection fault at
# its ldtilecfg, in ggml_backend_amx_mul_mat), and the peers run without repacking.
PEER_REPACK_OFF = cpu_has_amx()
PEER_REPACK = ["--no-repack"] if PEER_REPACK_OFF else []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """A server as a context manager: started on entry and ready once its /health
    answers 200 (within 120 s), terminated on exit (killed after 20 s)."""

    def __init__(self, name, argv, port, log=None):
        self.name, self.argv, self.port, self.log = name, argv, port, log
        self.url = f"http://127.0.0.1:{port}"
        self.proc = None

    def __enter__(self):
        out = open(self.log, "wb") if self.log else subprocess.DEVNULL
        self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT)
        if self.log:
            out.close()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}: {self.argv}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} did not become healthy")

    def __exit__(self, *exc):
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def dgr_server(model, c, ctx_per_slot, threads, port, extra=(), log=None):
    return ServerProcess("dgr", [sys.executable, "-m", "dgr", "run", "--model", model,
                                 "--port", str(port), "--max-running", str(c),
                                 "--max-waiting", str(4 * c), "--ctx", str(c * ctx_per_slot),
                                 "--threads", str(threads), "--log-level", "WARNING", *extra],
                         port, log)


def llama_server(binary, model, c, ctx_per_slot, threads, port, log=None):
    return ServerProcess("llama-server", [str(binary), "-m", model, "--port", str(port),
                                          "-np", str(c), "-c", str(c * ctx_per_slot),
                                          "-t", str(threads), "-b", "512", "-ub", "512",
                                          *PEER_REPACK], port, log)
