"""c=1 client: n streamed completions of 128 tokens (ignore_eos), one line each.

    python c1_client.py URL [n]
"""
import sys, time, httpx
url = sys.argv[1]; n = int(sys.argv[2]) if len(sys.argv) > 2 else 4
with httpx.Client(timeout=600) as c:
    for i in range(n):
        t0 = time.perf_counter(); k = 0
        with c.stream("POST", url + "/v1/completions", json={"prompt": f"Write a long story about a dragon number {i}.", "max_tokens": 128, "temperature": 0, "stream": True, "ignore_eos": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    k += 1
        print(f"{k} chunks in {time.perf_counter()-t0:.2f}s", flush=True)
