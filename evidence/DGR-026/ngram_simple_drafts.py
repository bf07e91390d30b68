"""What llama-server's ngram-simple drafts on the bench's workloads at c = 1: one
llama-server (the pristine pin, the bench's arguments, --spec-type ngram-simple or
what is given), each workload twice, 96 greedy tokens; its own timings (drafted,
accepted) and its log's draft acceptance and mean draft length.

    python3 evidence/DGR-026/ngram_simple_drafts.py [--spec-type ngram-simple]
"""
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.concurrency import NO_REPACK, free_port  # noqa: E402
from benchmarks.speculation import N_NEW, WORKLOADS  # noqa: E402
from dgr.engine import resolve_model_path  # noqa: E402

spec = sys.argv[1:] or ["--spec-type", "ngram-simple"]
port = free_port()
log = Path(tempfile.mkdtemp()) / "llama-server.log"
server = subprocess.Popen([str(ROOT / "vendor/build-peers/bin/llama-server"), "-m",
                           resolve_model_path(None), "--port", str(port), "-np", "1", "-c", "2048",
                           "-t", "2", "-b", "512", "-ub", "512", *NO_REPACK, *spec],
                          stdout=subprocess.DEVNULL, stderr=log.open("w"))
url = f"http://127.0.0.1:{port}"
try:
    for _ in range(240):
        try:
            if httpx.get(url + "/health").status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    print("llama-server", *spec)
    for workload in ("code edit", "quoting summary", "table to JSON", "templated burst",
                     "natural text"):
        for i in range(2):
            prompt, extra = WORKLOADS[workload](i)
            timings = httpx.post(url + "/completion", timeout=600, json={
                "prompt": prompt, "n_predict": N_NEW, "temperature": 0, "cache_prompt": False,
                "ignore_eos": "grammar" not in extra, **extra}).json()["timings"]
            print(f"{workload} #{i}: {timings['predicted_n']} tokens at "
                  f"{timings['predicted_per_second']:.1f} tok/s, drafted {timings.get('draft_n')}, "
                  f"accepted {timings.get('draft_n_accepted')}")
finally:
    server.terminate()
    server.wait()
print()
print("its log's draft lines:")
print("".join(line.split("| ", 2)[-1] for line in log.open() if "draft acceptance" in line), end="")
