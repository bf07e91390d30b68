"""Greedy answers (speculation off, one at a time on one node, the default model) of
four bench workloads for six users each: two earlier users (request numbers 90000,
90001) and users 0-3, as prompt and answer token ids, into answers.json (for
replay.py).

    PYTHONPATH=. python3 evidence/DGR-026/burst-replay/answers.py \
        "templated burst" "table to JSON" "code edit" "quoting summary"
"""
import json
import pathlib
import sys

import trio

import dgr
from benchmarks.speculation import N_NEW, WORKLOADS
from dgr.engine import resolve_model_path

USERS = (90000, 90001, 0, 1, 2, 3)


async def answer(node, workload, i):
    prompt, extra = WORKLOADS[workload](i)
    params = dgr.SamplingParams(max_tokens=N_NEW, temperature=0.0, speculation="off",
                                ignore_eos="grammar" not in extra, **extra)
    out = []
    async with node.stream(prompt, params) as chunks:
        async for chunk in chunks:
            if chunk.token_id is not None:
                out.append(chunk.token_id)
    return node.tokenize(prompt), out


async def main():
    config = dgr.NodeConfig(model_path=resolve_model_path(None), max_running=4,
                            max_waiting=16, n_ctx=4096)
    answers = {}
    async with dgr.open_node(config) as node:
        for workload in sys.argv[1:]:
            answers[workload] = [await answer(node, workload, i) for i in USERS]
    (pathlib.Path(__file__).parent / "answers.json").write_text(json.dumps(answers))


trio.run(main)
