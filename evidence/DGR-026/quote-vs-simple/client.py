"""A dgr node served in a process of its own (server_traced.py: dgr.server.serve, 16 slots
of 2,048 cells, 2 threads, its steps printed as it exits), this client in another,
as the bench runs them: the bench's warm-up, then the quoting summary and the code edit
at c = 1, two rounds; prints decode tok/s per run, the server its steps to OUT.

    python3 evidence/DGR-026/quote-vs-simple/client.py OUT
"""
import sys, time, subprocess, httpx, trio, signal
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))
from benchmarks import speculation as spec
from benchmarks.servers import free_port
port = free_port()
proc = subprocess.Popen([sys.executable, str(__import__("pathlib").Path(__file__).with_name("server_traced.py")), str(port)], stdout=open(sys.argv[1], "w"), stderr=subprocess.STDOUT)
url = f"http://127.0.0.1:{port}"
for _ in range(600):
    try:
        if httpx.get(url + "/health", timeout=1).status_code == 200: break
    except httpx.HTTPError: pass
    time.sleep(0.2)
trio.run(spec.run_level, url, "code edit", 1, True, {"speculation": "off"}, 90_000)
print("MARK warm-up done", flush=True)
for r in range(2):
    for wl in ("quoting summary", "code edit"):
        res = trio.run(spec.run_level, url, wl, 1, True, None, 100 * r + 1000)
        print(wl, round(res["decode_tok_s"], 1), flush=True)
proc.send_signal(signal.SIGTERM); proc.wait(60)
