"""perf over llama-server serving the serving-path workload (the tiny model, 64 curl
clients x 256 tokens, not streamed, again and again) for 6 s, as profile_c64.py does for dgr:
    python evidence/DGR-025/profile_c64_llama_server.py OUT.data"""
import subprocess, sys, tempfile, time
from pathlib import Path
ROOT = Path(__file__).resolve().parents[2]; sys.path.insert(0, str(ROOT))
from benchmarks import serving
from benchmarks.concurrency import llama_server, free_port
from dgr.testmodel import write_test_model
out = sys.argv[1]
model = str(write_test_model(Path(tempfile.mkdtemp()) / "tiny.gguf"))
with llama_server(ROOT/'vendor/build-peers/bin/llama-server', model, 64, 512, 2, free_port()) as srv:
    serving.clients(srv.url, 1, True)
    pid = str(srv.proc.pid)
    prof = subprocess.Popen(["perf", "record", "-g", "-F", "999", "-p", pid, "-o", out, "--", "sleep", "6"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t = time.time(); n = 0
    while time.time() - t < 6.5:
        serving.clients(srv.url, 64, False); n += 1
    prof.wait()
