"""The mixed-load case of `python -m benchmarks`: decoders streaming while a long
prompt arrives. It measures the long prompt's TTFT and the decoders' gaps
between steps while it prefills, for dgr at several --decode-stall values and for
llama-server."""

from __future__ import annotations

import statistics

import httpx
import trio

from benchmarks.completions import PROMPTS, stream_one
from benchmarks.servers import dgr_server, free_port, llama_server

LONG_PROMPT = " ".join(["The committee reviewed the annual report on regional water supplies, "
                        "noting changes in rainfall, reservoir levels and demand."] * 60)


def run(peers, model, threads, stalls: list[float], bar) -> dict:
    """{server: mixed_load's result}: dgr at each --decode-stall, then llama-server."""
    report = {}
    for stall in stalls:
        with dgr_server(model, 5, 2048, threads, free_port(),
                        ["--decode-stall", str(stall)]) as srv:
            report[f"dgr, --decode-stall {stall:g}"] = trio.run(
                mixed_load, srv.url, LONG_PROMPT, True)
            bar.update()
    with llama_server(peers["llama-server"], model, 5, 2048, threads, free_port()) as srv:
        report["llama-server"] = trio.run(mixed_load, srv.url, LONG_PROMPT, False)
        bar.update()
    return report


async def mixed_load(url, long_prompt, is_dgr, n_decoders=4):
    """n decoders stream; then a long prompt arrives. Decoder gaps while it prefills."""
    async with httpx.AsyncClient(timeout=600) as client:
        decoders = [None] * n_decoders
        long_result = {}
        async with trio.open_nursery() as nursery:
            async def decoder(i):
                decoders[i] = await stream_one(client, url, PROMPTS[i], 160, is_dgr=is_dgr)

            for i in range(n_decoders):
                nursery.start_soon(decoder, i)
            await trio.sleep(3.0)  # decoders are past their prefill and streaming
            long_result.update(await stream_one(client, url, long_prompt, 4, is_dgr=is_dgr))
    window = (long_result["sent"], long_result["stamps"][0])
    # gaps between the steps that gave a decoder tokens: a step's accepted drafts come
    # in one write, whose tokens a gap between tokens would count as gaps of ~0
    steps = [[t for i, t in enumerate(d["stamps"]) if i == 0 or t - d["stamps"][i - 1] > 1e-3]
             for d in decoders]
    gaps = [b - a for times in steps for a, b in zip(times, times[1:])
            if window[0] <= b <= window[1] + 1e-3]
    all_gaps = [b - a for times in steps for a, b in zip(times, times[1:])]
    return {"long_prompt_ttft_ms": 1000 * (window[1] - window[0]),
            "gap_median_ms": 1000 * statistics.median(all_gaps),
            "gap_worst_during_prefill_ms": 1000 * max(gaps) if gaps else None,
            "gap_median_during_prefill_ms": 1000 * statistics.median(gaps) if gaps else None}


def markdown(report: dict) -> list[str]:
    lines = ["", "| mixed load | long prompt TTFT ms | decoder gap median ms | median during "
             "prefill ms | worst during prefill ms | worst / median |", "|---|---|---|---|---|---|"]
    for name, row in report.items():
        worst = row["gap_worst_during_prefill_ms"]
        lines.append(f"| {name} | {row['long_prompt_ttft_ms']:.0f} | {row['gap_median_ms']:.0f} | "
                     f"{row['gap_median_during_prefill_ms'] or 0:.0f} | {worst or 0:.0f} | "
                     f"{(worst or 0) / row['gap_median_ms']:.1f} |")
    return lines
