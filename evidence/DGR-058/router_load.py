"""What the routers themselves read of two nodes' load: two tiny-model nodes behind
smg and behind vllm-router, each router with its power-of-two policy (smg polls the
nodes' /v1/loads, vllm-router their /get_load), long requests keeping both nodes busy,
and each router's own view polled meanwhile (its GET /get_loads): the largest load it
reported for each node, running and waiting requests.

    PATH=.venv/bin:$PATH .venv/bin/python evidence/DGR-058/router_load.py
"""

import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.servers import dgr_server, free_port  # noqa: E402
from dgr.testmodel import write_test_model  # noqa: E402


def main() -> int:
    model = str(write_test_model(Path(tempfile.mkdtemp()) / "tiny.gguf"))
    for router, policy in (("smg", "power_of_two"), ("vllm-router", "power_of_two")):
        # 4 slots, 8,192 cells: a 6,000-token request at a time runs, the others wait
        with dgr_server(model, 4, 2048, 1, free_port()) as a, \
                dgr_server(model, 4, 2048, 1, free_port()) as b:
            port = free_port()
            argv = [router, *(["launch"] if router == "smg" else []), "--worker-urls", a.url,
                    b.url, "--policy", policy, "--host", "127.0.0.1", "--port", str(port)]
            proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                base = f"http://127.0.0.1:{port}"
                for _ in range(150):
                    try:
                        listed = httpx.get(base + "/v1/models", timeout=1)
                        if listed.status_code == 200 and listed.json()["data"]:
                            break
                    except httpx.HTTPError:
                        pass
                    time.sleep(0.2)
                model_id = listed.json()["data"][0]["id"]

                def request(i):
                    try:
                        httpx.post(base + "/v1/completions", timeout=300, json={
                            "model": model_id, "prompt": f"request {i}", "max_tokens": 6000,
                            "ignore_eos": True, "temperature": 0})
                    except httpx.HTTPError:
                        pass  # cut off when the run ends

                threads = [threading.Thread(target=request, args=(i,)) for i in range(16)]
                for t in threads:  # arriving over 8 s: the routers poll every few seconds
                    t.start()
                    time.sleep(0.5)
                seen: dict[str, float] = {}
                held: dict[str, float] = {}
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline and any(t.is_alive() for t in threads):
                    time.sleep(1)
                    view = httpx.get(base + "/get_loads", timeout=5).json()
                    if router == "smg":  # SGLang's shape, one entry per node and rank
                        loads = {e["worker"]: e["num_running_reqs"] + e["num_waiting_reqs"]
                                 for e in view["loads"]}
                    else:
                        loads = {e["worker"]: e["load"] for e in view["workers"]}
                    for worker, load in loads.items():
                        seen[worker] = max(seen.get(worker, 0), load)
                    for node in (a, b):  # the node's own count, at the same moment
                        own = httpx.get(node.url + "/get_load", timeout=5).json()["load"]
                        held[node.url] = max(held.get(node.url, 0), own)
                print(("" if router == "smg" else "\n")
                      + f"## {router} ({policy}): the largest load each node held, and the "
                      "largest the router read of it")
                for worker in sorted(held):
                    print(f"{worker} held {held[worker]:g}, read {seen.get(worker, 0):g}")
                sys.stdout.flush()
            finally:
                proc.terminate()
                proc.wait(10)
                for node in (a, b):
                    node.proc.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
