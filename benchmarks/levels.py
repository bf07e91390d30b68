"""The levels case of `python -m benchmarks`: dgr against its peers at each concurrency.

For each concurrency c: c streaming sessions with fixed prompts, greedy, N new
tokens each (ignore_eos), against dgr's HTTP server and llama-server (-np c) from
the same pinned llama.cpp, driven identically over HTTP; and llama-cpp-python's
`Llama` one request at a time (what Python users embed today). llama-batched-bench
gives the pure-decode ceiling; it runs built from the pristine pin and from the
patched one, alternating, to show what dgr's patch stack costs at each batch size.
Every level runs `rounds` rounds, both servers afresh each round, with each round's
ratio reported.

Reported: aggregate generated tokens/s, prefill tokens/s, TTFT and inter-token
latency p50/p99, dgr's batch occupancy, KV pressure and queue depth (scraped from
/metrics), rejections, the saturation point, dgr/peer ratios, and a batch-vs-solo
corruption check (tokens and log-probabilities, bitwise).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import time

import httpx
import trio

from benchmarks.completions import PROMPTS, pct, stream_one, whole_one
from benchmarks.servers import PEER_REPACK, PEER_REPACK_OFF, dgr_server, free_port, llama_server
from dgr._step import step
from dgr.consistency import Verdict
from dgr.telemetry import STEP_PHASES

# cells of each slot's context
CTX_PER_SLOT = 1024


def checked_levels(levels: list[int]) -> list[int]:
    """The levels whose batch-vs-solo corruption check runs: 8 and the highest, from 8 up."""
    return sorted({c for c in levels if c >= 8} & {8, max(levels, default=0)})


def bar_steps(levels: list[int], rounds: int) -> int:
    """The progress bar's steps of `run`."""
    return rounds * 2 * len(levels) + len(levels) + 2 + len(checked_levels(levels))


def run(report, peers, model, levels, n_new, threads, rounds, bar) -> None:
    """dgr and its peers at each concurrency level, the patches' cost, corruption checks,
    into `report` (its "dgr", "llama_server", "llama_cpp_python" and "corruption" lists
    and the keys set here)."""
    checked = checked_levels(levels)
    report["patch_cost"] = patch_cost(peers["llama-batched-bench"],
                                      peers["llama-batched-bench-patched"], model, levels,
                                      n_new, threads)
    report["batched_bench_ceiling"] = {c: tg for c, (pp, tg) in report["patch_cost"]["pristine"].items()}
    # contexts past 512 cells: the flash-attention patch's reduction
    report["patch_cost_long"] = patch_cost(peers["llama-batched-bench"],
                                           peers["llama-batched-bench-patched"], model, [1, 4],
                                           32, threads, n_prompt=2048)
    bar.update()
    report["engine_decode"] = engine_decode_rate(model, levels, n_new, threads)
    bar.update()
    # Rounds alternate dgr and llama-server at each c, each started afresh; the first
    # round's figures fill the tables, every round's ratio the rounds table.
    report["level_rounds"] = []
    for r in range(rounds):
        for c in levels:
            with dgr_server(model, c, CTX_PER_SLOT, threads, free_port()) as srv:
                ours = trio.run(run_level, srv.url, c, n_new, True)
                bar.set_postfix(c=c, dgr=f"{ours['gen_tok_s']:.0f}")
                bar.update()
                if r == 0 and c in checked:
                    report["corruption"].append(
                        trio.run(corruption_check, srv.url, n_new, c))
                    bar.update()
            with llama_server(peers["llama-server"], model, c, CTX_PER_SLOT, threads,
                              free_port()) as srv:
                theirs = trio.run(run_level, srv.url, c, n_new, False)
                bar.update()
            if r == 0:
                report["dgr"].append(ours)
                report["llama_server"].append(theirs)
            report["level_rounds"].append({"round": r, "c": c, "dgr": ours["gen_tok_s"],
                                           "llama_server": theirs["gen_tok_s"]})
    llm = llama_peer(model, threads)
    for c in levels:
        report["llama_cpp_python"].append(llama_cpp_python_level(llm, c, n_new))
        bar.update()
    del llm


async def scrape(client, url, stats, stop, interval=0.5):
    """Poll dgr's /metrics for peaks of occupancy, KV pressure and queue depth.
    Rarely: rendering and parsing the metrics costs CPU on the 2 cores the
    servers share, and llama-server is not polled (polling every 50 ms made
    dgr's llama_decode 22.0-22.3 ms instead of 20.4-20.9 ms at c=1 here)."""
    names = {"dgr_batch_occupancy_ratio": "occupancy", "dgr_kv_pressure_ratio": "kv_pressure",
             "dgr_queue_sessions": "queue_depth"}
    while not stop.is_set():
        try:
            text = (await client.get(url + "/metrics")).text
        except httpx.HTTPError:
            break
        for line in text.splitlines():
            name, _, value = line.partition(" ")
            if name in names:
                key = names[name]
                stats[key] = max(stats.get(key, 0.0), float(value))
        await trio.sleep(interval)


def metric_value(text, name):
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


async def run_level(url, c, n_new, is_dgr, streamed=True):
    """c greedy completions of n_new tokens at once (streamed: with each token's time,
    for TTFT and inter-token latency; else only their tokens a second)."""
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=64)) as client:
        results = [None] * c
        stats: dict = {}
        stop = trio.Event()
        before = (await client.get(url + "/metrics")).text if is_dgr else ""
        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            if is_dgr:
                nursery.start_soon(scrape, client, url, stats, stop)

            async def one(i):
                results[i] = await (stream_one if streamed else whole_one)(
                    client, url, PROMPTS[i % len(PROMPTS)], n_new, is_dgr=is_dgr)

            async with trio.open_nursery() as sessions:
                for i in range(c):
                    sessions.start_soon(one, i)
            # Before the scraper's sleep ends: waiting for it added up to 0.5 s to
            # dgr's elapsed time (and to no peer's) until DGR-014.
            elapsed = time.perf_counter() - started
            stop.set()
            nursery.cancel_scope.cancel()
        after = (await client.get(url + "/metrics")).text if is_dgr else ""
    ok = [r for r in results if r["status"] == 200]
    generated = sum(len(r["stamps"]) if streamed else r["generated"] for r in ok)
    ttft = [r["stamps"][0] - r["sent"] for r in ok if streamed and r["stamps"]]
    itl = [b - a for r in ok if streamed for a, b in zip(r["stamps"], r["stamps"][1:])]
    out = {"concurrency": c, "gen_tok_s": generated / elapsed, "elapsed_s": elapsed,
           "generated": generated, "rejected": len(results) - len(ok),
           "ttft_p50_ms": 1000 * pct(ttft, 50), "ttft_p99_ms": 1000 * pct(ttft, 99),
           "itl_p50_ms": 1000 * pct(itl, 50), "itl_p99_ms": 1000 * pct(itl, 99)}
    if is_dgr:
        rows = metric_value(after, "dgr_batch_rows_sum") - metric_value(before, "dgr_batch_rows_sum")
        steps = metric_value(after, "dgr_batch_rows_count") - metric_value(before, "dgr_batch_rows_count")
        budget = metric_value(after, "dgr_batch_token_budget")
        prefill = (metric_value(after, "dgr_prefill_tokens_total")
                   - metric_value(before, "dgr_prefill_tokens_total"))
        split = {}
        for phase in STEP_PHASES:
            name = f'dgr_step_phase_seconds_total{{phase="{phase}"}}'
            split[phase] = 1000 * (metric_value(after, name) - metric_value(before, name)) / max(steps, 1)
        split["step"] = 1000 * (metric_value(after, "dgr_step_duration_seconds_sum")
                                - metric_value(before, "dgr_step_duration_seconds_sum")) / max(steps, 1)
        # The loop's overhead: everything in a step but llama_decode.
        split["outside_decode_pct"] = (100 * (split["step"] - split["decode"]) / split["step"]
                                       if split["step"] else 0.0)
        out |= {"step_ms_split": split,
                "prefill_tok_s": prefill / elapsed,
                "mean_occupancy": rows / steps / budget if steps else 0.0,
                "peak_occupancy": stats.get("occupancy", 0.0),
                "peak_kv_pressure": stats.get("kv_pressure", 0.0),
                "peak_queue_depth": stats.get("queue_depth", 0.0)}
    return out


async def corruption_check(url, n_new, c):
    """Each of c prompts alone (with top-2 logprobs), then all c together:
    tokens by the correctness bar, and log-probabilities compared bitwise."""
    prompts = [PROMPTS[i % len(PROMPTS)] + ("" if i < len(PROMPTS) else f" ({i})") for i in range(c)]
    async with httpx.AsyncClient(timeout=600) as client:
        solo = [await stream_one(client, url, p, n_new, logprobs=2) for p in prompts]
        together = [None] * c

        async def one(i):
            together[i] = await stream_one(client, url, prompts[i], n_new, logprobs=2)

        async with trio.open_nursery() as nursery:
            for i in range(c):
                nursery.start_soon(one, i)
    verdict = Verdict()
    for i, (a, b) in enumerate(zip(solo, together)):
        verdict.add(i, a["tokens"], a["gaps"], b["tokens"])
    result = verdict.as_dict()
    result["concurrency"] = c
    result["logprobs_bitwise_equal"] = sum(a["logprobs"] == b["logprobs"] and len(a["logprobs"]) > 0
                                           for a, b in zip(solo, together))
    return result


def llama_peer(model, threads):
    """llama_cpp.Llama as the other peers run (PEER_REPACK): its defaults, but weight
    repacking off on CPUs with AMX. Llama has no parameter for that, so there its
    model-parameter defaults are wrapped."""
    import llama_cpp.llama_cpp as lowlevel
    from llama_cpp import Llama

    defaults = lowlevel.llama_model_default_params

    def no_repack():
        params = defaults()
        params.use_extra_bufts = False
        return params

    if PEER_REPACK_OFF:
        lowlevel.llama_model_default_params = no_repack
    try:
        return Llama(model_path=model, n_ctx=2048, n_threads=threads, verbose=False)
    finally:
        lowlevel.llama_model_default_params = defaults


def llama_cpp_python_level(llm, c, n_new):
    """What Python users embed today: llama_cpp.Llama, one request at a time."""
    generated, ttft, itl = 0, [], []
    started = time.perf_counter()
    for i in range(c):
        llm.reset()
        sent = time.perf_counter()
        stamps = []
        for part in llm.create_completion(PROMPTS[i % len(PROMPTS)], max_tokens=n_new,
                                          temperature=0.0, stream=True):
            if part["choices"][0]["text"]:
                stamps.append(time.perf_counter())
        generated += len(stamps)
        if stamps:
            ttft.append(stamps[0] - sent)
        itl += [b - a for a, b in zip(stamps, stamps[1:])]
    elapsed = time.perf_counter() - started
    return {"concurrency": c, "gen_tok_s": generated / elapsed, "generated": generated,
            "ttft_p50_ms": 1000 * pct(ttft, 50), "ttft_p99_ms": 1000 * pct(ttft, 99),
            "itl_p50_ms": 1000 * pct(itl, 50), "itl_p99_ms": 1000 * pct(itl, 99)}


def engine_decode_rate(model, levels, n_new, threads):
    """dgr's engine alone, in this process: decode tokens/s with c rows per step
    (dgr's default split KV and weight repacking), to compare with batched-bench's
    ceiling without HTTP, Python serving work or the client sharing the CPU."""
    from dgr import NodeConfig, _engine, weight_repack
    from dgr.engine import repacked_tensors

    repacked = repacked_tensors(NodeConfig(model_path=model), model)
    engine = _engine.Engine(model, n_ctx=max(levels) * 512, n_seq_max=max(levels), n_batch=512,
                           n_ubatch=512, n_threads=threads,
                           repack=weight_repack.patterns(repacked))
    rates = {}
    prompt = list(engine.tokenize(PROMPTS[0]))
    for c in levels:
        for slot in range(c):
            engine.release(slot)
            step(engine, prompt, list(range(len(prompt))), [slot] * len(prompt),
                        [0] * (len(prompt) - 1) + [1])
        tokens, positions = [prompt[-1]] * c, [len(prompt)] * c
        started = time.perf_counter()
        for _ in range(n_new):
            sampled, *_ = step(engine, tokens, positions, list(range(c)), [1] * c)
            tokens, positions = sampled.tolist(), [p + 1 for p in positions]
        rates[str(c)] = c * n_new / (time.perf_counter() - started)
        for slot in range(c):
            engine.release(slot)
    engine.close()
    return rates


def batched_bench(binary, model, levels, n_new, threads, n_prompt=64, env=None):
    """{batch size: (prompt tokens/s, generated tokens/s)} from llama-batched-bench
    (`env`: variables added to its environment)."""
    n_ctx = max(levels) * max(512, n_prompt + n_new)
    out = subprocess.run([str(binary), "-m", model, "-c", str(n_ctx), "-b", "512",
                          "-ub", "512", "-npp", str(n_prompt), "-ntg", str(n_new),
                          "-npl", ",".join(map(str, levels)), "-t", str(threads), *PEER_REPACK],
                         capture_output=True, text=True, check=True,
                         env={**os.environ, **(env or {})}).stdout
    rates = {}
    for line in out.splitlines():
        cells = [x.strip() for x in line.strip().strip("|").split("|")]
        if len(cells) >= 10 and cells[2].isdigit():
            rates[int(cells[2])] = (float(cells[5]), float(cells[7]))  # S_PP t/s, S_TG t/s
    return rates


def patch_cost(pristine, patched, model, levels, n_new, threads, n_prompt=64, rounds=3):
    """llama-batched-bench from the pristine and the patched pin, alternating (the
    machine drifts by 10-30 % within a run): the best of `rounds` runs of each,
    per batch size."""
    best = {"pristine": {}, "patched": {}, "n_prompt": n_prompt, "n_new": n_new}
    variants = (("pristine", pristine, None), ("patched", patched, None))
    for _ in range(rounds):
        for name, binary, env in variants:
            for c, (pp, tg) in batched_bench(binary, model, levels, n_new, threads, n_prompt,
                                             env).items():
                old = best[name].get(str(c), (0.0, 0.0))
                best[name][str(c)] = (max(old[0], pp), max(old[1], tg))
    return best


def saturation(levels: list[dict]) -> int | None:
    """The concurrency after which every further doubling adds less than 10 %
    throughput (None: the last measured doubling still added 10 % or more)."""
    by_c = {r["concurrency"]: r["gen_tok_s"] for r in levels}
    saturated = None
    for c in sorted(by_c, reverse=True):
        if 2 * c not in by_c:
            continue
        if by_c[2 * c] >= 1.10 * by_c[c]:
            break
        saturated = c
    return saturated


def markdown(report) -> list[str]:
    lines = ["| c | dgr tok/s | llama-server tok/s | dgr/server | Llama tok/s | dgr/Llama | "
             "batched-bench ceiling | dgr/ceiling | dgr TTFT p50/p99 ms | dgr ITL p50/p99 ms | "
             "server ITL p50/p99 ms | mean/peak occupancy | peak KV | peak queue | rejected |",
             "|" + "---|" * 15]
    server = {r["concurrency"]: r for r in report["llama_server"]}
    llama = {r["concurrency"]: r for r in report["llama_cpp_python"]}
    ceiling = report["batched_bench_ceiling"]
    for r in report["dgr"]:
        c = r["concurrency"]
        s, py, ceil = server.get(c), llama.get(c), ceiling.get(str(c), ceiling.get(c))
        lines.append(
            f"| {c} | {r['gen_tok_s']:.1f} | {s['gen_tok_s']:.1f} | {r['gen_tok_s'] / s['gen_tok_s']:.2f} | "
            + (f"{py['gen_tok_s']:.1f} | {r['gen_tok_s'] / py['gen_tok_s']:.2f} | " if py else "– | – | ")
            + (f"{ceil:.1f} | {r['gen_tok_s'] / ceil:.2f} | " if ceil else "– | – | ")
            + f"{r['ttft_p50_ms']:.0f}/{r['ttft_p99_ms']:.0f} | {r['itl_p50_ms']:.0f}/{r['itl_p99_ms']:.0f} | "
            f"{s['itl_p50_ms']:.0f}/{s['itl_p99_ms']:.0f} | {r['mean_occupancy']:.3f}/{r['peak_occupancy']:.3f} | "
            f"{r['peak_kv_pressure']:.2f} | {r['peak_queue_depth']:.0f} | {r['rejected']} |")
    if report.get("level_rounds"):
        lines.extend(markdown_level_rounds(report["level_rounds"]))
    for cost in (report.get("patch_cost"), report.get("patch_cost_long")):
        if cost:
            lines.extend(markdown_patch_cost(cost, 3))
    lines.append("")
    lines.append("Engine alone (in-process decode, no HTTP) vs the ceiling: " + ", ".join(
        f"c={c}: {rate:.1f} tok/s ({rate / ceiling[c]:.2f}x)" if c in ceiling else f"c={c}: {rate:.1f}"
        for c, rate in report["engine_decode"].items()) + ".")
    lines.append("")
    lines.append("dgr step time split, mean ms per step of the batch loop (plan = mailbox, "
                 "finish requests, policy, batch fill; update = post-step update, KV release, "
                 "publishing events; step = from the previous step's end, or the loop's "
                 "wake-up, to this one's events published; outside = share of step time not "
                 "in llama_decode):")
    lines.append("")
    lines.append("| c | plan | decode | sample | update | step | outside llama_decode |")
    lines.append("|---|---|---|---|---|---|---|")
    for r in report["dgr"]:
        sp = r["step_ms_split"]
        lines.append(f"| {r['concurrency']} | " + " | ".join(
            f"{sp[k]:.3f}" for k in (*STEP_PHASES, "step"))
            + f" | {sp['outside_decode_pct']:.2f} % |")
    lines.append("")
    top = max(report["levels"])

    def sat(c):
        return f"c = {c}" if c is not None else f"not reached up to c = {top}"

    lines.append(f"Saturation (the c after which every doubling adds < 10 % throughput): "
                 f"dgr {sat(report['saturation']['dgr'])}, "
                 + f"llama-server {sat(report['saturation']['llama_server'])}.")
    for v in report.get("corruption", []):
        lines.append(f"Corruption check, dgr ({v['concurrency']} prompts at c={v['concurrency']}, "
                     f"batch vs solo, greedy): identical tokens {v['identical']}, near-tie "
                     f"divergences {v['near_tie']}, unexplained {v['unexplained']}, "
                     f"log-probabilities bitwise equal {v['logprobs_bitwise_equal']} of {v['concurrency']}.")
    return lines


def markdown_level_rounds(rows: list[dict]) -> list[str]:
    """Each round's dgr / llama-server ratio at each c, and their median, min, max."""
    ratios: dict[int, list[float]] = {}
    for row in rows:
        ratios.setdefault(row["c"], []).append(row["dgr"] / row["llama_server"])
    n = max(len(values) for values in ratios.values())
    lines = ["", "dgr / llama-server by round (each round both servers afresh at each c):",
             "", "| c | " + " | ".join(f"round {i}" for i in range(n))
             + " | median | min | max |", "|---|" + "---|" * (n + 3)]
    for c, values in ratios.items():
        lines.append(f"| {c} | " + " | ".join(f"{v:.3f}" for v in values)
                     + f" | {statistics.median(values):.3f} | {min(values):.3f} | "
                       f"{max(values):.3f} |")
    return lines


def markdown_patch_cost(cost, rounds) -> list[str]:
    lines = ["", f"llama-batched-bench, patched pin vs pristine pin, {cost['n_prompt']}-token "
             f"prompts + {cost['n_new']} new tokens (best of {rounds} alternating runs; "
             "PP = prompt processing, TG = generation, tokens/s):", "",
             "| batch | pristine PP | patched PP | PP ratio | pristine TG | patched TG | TG ratio |",
             "|---|---|---|---|---|---|---|"]
    for c in sorted((k for k in cost["pristine"]), key=int):
        (pp0, tg0), (pp1, tg1) = cost["pristine"][c], cost["patched"][c]
        lines.append(f"| {c} | {pp0:.1f} | {pp1:.1f} | {pp1 / pp0:.3f} | {tg0:.1f} | {tg1:.1f} | "
                     f"{tg1 / tg0:.3f} |")
    return lines


def plot(report, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for key, label in (("dgr", "dgr"), ("llama_server", "llama-server"),
                       ("llama_cpp_python", "llama-cpp-python Llama")):
        rows = report.get(key)
        if not rows:
            continue
        a.plot([r["concurrency"] for r in rows], [r["gen_tok_s"] for r in rows], "o-", label=label)
        if key != "llama_cpp_python":
            b.plot([r["concurrency"] for r in rows], [r["itl_p99_ms"] for r in rows], "o-", label=label)
    ceiling = report["batched_bench_ceiling"]
    if ceiling:
        xs = sorted(int(k) for k in ceiling)
        a.plot(xs, [ceiling[str(x)] if str(x) in ceiling else ceiling[x] for x in xs], "k--",
               label="batched-bench ceiling")
    for ax, title in ((a, "aggregate generated tokens/s"), (b, "inter-token latency p99 (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent sessions")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
