"""The shared-prefix bench's 8-turn chat against a llama-server on port 8311, with
http_client() (a connection per request) or one kept-alive client (argv[1] keepalive)."""
import os, sys, trio
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # the repository
from benchmarks import shared_prefix
if sys.argv[1] == "keepalive":
    import httpx
    shared_prefix.http_client = lambda: httpx.AsyncClient(timeout=600)
r = trio.run(shared_prefix.chat, "http://127.0.0.1:8311", False)
print(sys.argv[1], "turns", len(r["ttft_ms_per_turn"]), [round(x) for x in r["ttft_ms_per_turn"]], "computed", r["prompt_tokens_computed"])
