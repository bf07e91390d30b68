"""A/B of two dgr checkouts in one run: the code before the split and after,
c sessions of greedy 48-token completions at once, alternating which checkout
goes first each round; in-process (`dgr.open_node`, defaults, the default
model) or, with --http, through `python -m dgr run` (defaults) and c clients
posting /v1/completions at once (a connection each, not streamed). Also
compares the tokens each session got across the two (they must be equal).

    python evidence/DGR-023/ab_levels.py --old /tmp/old --new . [--rounds 4] [--http]
"""

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time

PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):",
           "The three laws of thermodynamics", "In 1969, the first", "A recipe for bread:",
           "The quick brown fox", "Dear hiring manager,"]


def worker(levels, tokens):
    import trio

    import dgr

    async def main():
        out = {"dgr": dgr.__file__, "levels": {}}
        params = dgr.SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
        async with dgr.open_node(dgr.NodeConfig()) as node:
            await node.generate(PROMPTS[0], params)  # warm-up
            for c in levels:
                results = [None] * c

                async def one(i):
                    results[i] = await node.generate(PROMPTS[i % len(PROMPTS)] + f" ({i})",
                                                     params)

                started = time.perf_counter()
                async with trio.open_nursery() as nursery:
                    for i in range(c):
                        nursery.start_soon(one, i)
                elapsed = time.perf_counter() - started
                digest = hashlib.sha256(json.dumps([r.token_ids for r in results]).encode())
                out["levels"][str(c)] = {"tok_s": c * tokens / elapsed,
                                         "tokens": digest.hexdigest()[:16]}
        print(json.dumps(out))

    trio.run(main)


def http_worker(levels, tokens):
    import concurrent.futures
    import socket

    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "dgr", "run", "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(base + "/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.2)

        def one(i):
            body = {"prompt": PROMPTS[i % len(PROMPTS)] + f" ({i})", "max_tokens": tokens,
                    "temperature": 0, "ignore_eos": True, "logprobs": 1}
            with httpx.Client(timeout=300) as client:
                reply = client.post(base + "/v1/completions", json=body).json()
            logprobs = reply["choices"][0]["logprobs"]
            return logprobs["tokens"], logprobs["token_logprobs"]

        one(0)  # warm-up
        import dgr

        out = {"dgr": "http, " + dgr.__file__, "levels": {}}
        with concurrent.futures.ThreadPoolExecutor(max(levels)) as pool:
            for c in levels:
                started = time.perf_counter()
                results = list(pool.map(one, range(c)))
                elapsed = time.perf_counter() - started
                digest = hashlib.sha256(json.dumps(results).encode())
                out["levels"][str(c)] = {"tok_s": c * tokens / elapsed,
                                         "tokens": digest.hexdigest()[:16]}
        print(json.dumps(out))
    finally:
        server.terminate()
        server.wait(30)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--old", required=True)
    parser.add_argument("--new", required=True)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--levels", default="1,8,32")
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--http", action="store_true")
    args = parser.parse_args()
    levels = [int(c) for c in args.levels.split(",")]
    if args.worker:
        (http_worker if args.http else worker)(levels, args.tokens)
        return
    runs = {"old": [], "new": []}
    for r in range(args.rounds):
        order = ["old", "new"] if r % 2 == 0 else ["new", "old"]
        for name in order:
            path = os.path.abspath(getattr(args, name))
            env = dict(os.environ, PYTHONPATH=path)
            proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker",
                                   "--old", args.old, "--new", args.new, "--levels", args.levels,
                                   "--tokens", str(args.tokens)] + (["--http"] if args.http else []),
                                  env=env, cwd=path, capture_output=True, text=True, check=True)
            result = json.loads(proc.stdout.strip().splitlines()[-1])
            runs[name].append(result)
            print(f"round {r + 1} {name} ({result['dgr']}): " + ", ".join(
                f"c={c} {v['tok_s']:.1f} tok/s" for c, v in result["levels"].items()), flush=True)
    print()
    print("| c | old tok/s (median) | new tok/s (median) | new/old per round | median | min | max | tokens equal |")
    print("|---|---|---|---|---|---|---|---|")
    for c in map(str, levels):
        old = [run["levels"][c]["tok_s"] for run in runs["old"]]
        new = [run["levels"][c]["tok_s"] for run in runs["new"]]
        ratios = [n / o for n, o in zip(new, old)]
        same = len({run["levels"][c]["tokens"] for run in runs["old"] + runs["new"]}) == 1
        print(f"| {c} | {statistics.median(old):.1f} | {statistics.median(new):.1f} | "
              f"{', '.join(f'{x:.3f}' for x in ratios)} | {statistics.median(ratios):.3f} | "
              f"{min(ratios):.3f} | {max(ratios):.3f} | {'yes' if same else 'NO'} |")


if __name__ == "__main__":
    main()
