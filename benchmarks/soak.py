"""Soak: many sessions through one node, with cancellations and slow readers.

    python benchmarks/soak.py [--sessions 1000] [--concurrency 32] [--model PATH]

Defaults follow the reliability issue: 1,000 sessions at concurrency 32
against max_running=8 and max_waiting=8; 20 % are cancelled at a random moment
(while queued, prefilling or decoding) and 10 % read slowly. Every session must
end exactly one way (completed, rejected with a reason, or cancelled) and the
counts must add up; afterwards no KV cell is in use, no task or thread is left,
and RSS stays within 5 % of RSS after warm-up. Without --model it uses the tiny
generated test model (the runtime is under test, not the model).
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import dgr  # noqa: E402
from dgr.errors import AdmissionRejected  # noqa: E402


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def count_threads() -> int:
    """Threads alive, but Trio's idle worker threads: it keeps them ~10 s for reuse
    (the node tokenizes text prompts on them); a busy one carries its job's name."""
    return sum(not t.name.startswith("Trio thread ") for t in threading.enumerate())


def count_tasks() -> int:
    def walk(task):
        return 1 + sum(walk(child) for nursery in task.child_nurseries for child in nursery.child_tasks)

    return walk(trio.lowlevel.current_root_task())


async def soak(model: str, sessions: int, concurrency: int, seed: int = 7,
               warmup: int = 100) -> dict:
    rng = random.Random(seed)
    config = dgr.NodeConfig(model_path=model, max_running=8, max_waiting=8, n_ctx=8192,
                            n_batch=256, n_ubatch=256, prefill_chunk=32)
    outcomes: collections.Counter = collections.Counter()
    reasons: collections.Counter = collections.Counter()
    cancelled_in: collections.Counter = collections.Counter()
    threads_before = count_threads()
    tasks_before = count_tasks()
    next_index = iter(range(sessions))
    report: dict = {}
    started = time.perf_counter()

    async with dgr.open_node(config) as node:

        async def one(i: int) -> None:
            prompt = "".join(rng.choice("abcdefghij klmnop") for _ in range(rng.randint(5, 300)))
            params = dgr.SamplingParams(max_tokens=rng.randint(4, 48), ignore_eos=rng.random() < 0.5)
            cancel_after = rng.uniform(0.0, 0.3) if rng.random() < 0.2 else None
            slow = rng.random() < 0.1
            seen: dict = {}

            async def consume():
                async with node.stream(prompt, params) as chunks:
                    seen["session"] = chunks.session
                    async for _ in chunks:
                        if slow:
                            await trio.sleep(0.01)
                    seen["end"] = chunks.finish_reason

            async def canceller(scope):
                await trio.sleep(cancel_after)
                session = seen.get("session")
                seen["cancelled_in"] = session.phase.value if session else "admission"
                scope.cancel()

            with trio.CancelScope() as scope:
                try:
                    async with trio.open_nursery() as nursery:
                        if cancel_after is not None:
                            nursery.start_soon(canceller, scope)
                        await consume()
                        nursery.cancel_scope.cancel()
                except* AdmissionRejected as group:
                    seen["end"] = "rejected"
                    reasons[group.exceptions[0].reason] += 1
            end = seen.get("end")
            if end in ("stop", "length"):
                outcomes["completed"] += 1
            elif end == "rejected":
                outcomes["rejected"] += 1
                await trio.sleep(retry_after())  # a client backs off, as after a 429
            elif scope.cancelled_caught or end == "cancelled":
                outcomes["cancelled"] += 1
                cancelled_in[seen.get("cancelled_in", "?")] += 1
            else:
                outcomes[f"unexpected:{end}"] += 1

        def retry_after() -> float:
            # What the server's Retry-After says (queue ahead / session drain rate), jittered.
            rate = node.telemetry.drain_rate()
            estimate = (node.waiting_sessions + 1) / rate if rate > 0 else 0.5
            return min(5.0, estimate) * rng.uniform(0.5, 1.5)

        async def client() -> None:
            for i in next_index:
                await one(i)
                if i == warmup:
                    report["rss_after_warmup"] = rss_bytes()

        async with trio.open_nursery() as nursery:
            for _ in range(concurrency):
                nursery.start_soon(client)
        report["rss_after_soak"] = rss_bytes()
        report["kv_cells_cached_after"] = node.capabilities()["load"]["kv_cells_cached"]
        report["kv_cells_in_use_cached"] = await node.kv_cells_in_use()
        await node.flush_prefix_cache()
        report["kv_cells_in_use_after"] = await node.kv_cells_in_use()
        report["active_after"] = node.active_sessions
        report["waiting_after"] = node.waiting_sessions
        metrics = node.telemetry.registry
        report["node_finished"] = {r: metrics.get_sample_value("dgr_sessions_finished_total",
                                                               {"reason": r})
                                   for r in ("stop", "length", "cancelled", "error")}
        report["node_rejected"] = {r: metrics.get_sample_value("dgr_admissions_rejected_total",
                                                               {"reason": r})
                                   for r in ("queue_full", "queue_tokens_full", "never_fits")}
    report["elapsed_s"] = time.perf_counter() - started
    report["sessions"] = sessions
    report["concurrency"] = concurrency
    report["outcomes"] = dict(outcomes)
    report["rejection_reasons"] = dict(reasons)
    report["cancelled_in_phase"] = dict(cancelled_in)
    report["outcomes_total"] = sum(outcomes.values())
    report["threads_left"] = count_threads() - threads_before
    report["tasks_left"] = count_tasks() - tasks_before
    report["rss_growth"] = report["rss_after_soak"] / report["rss_after_warmup"] - 1
    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--model", default=None, help="GGUF (default: the tiny generated test model)")
    parser.add_argument("--out", default=None, help="write the report as JSON here")
    args = parser.parse_args(argv)
    model = args.model
    if model is None:
        from dgr.testmodel import write_test_model

        model = str(write_test_model(Path(tempfile.mkdtemp()) / "tiny.gguf"))
    report = trio.run(soak, model, args.sessions, args.concurrency)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    ok = (report["outcomes_total"] == args.sessions
          and set(report["outcomes"]) <= {"completed", "rejected", "cancelled"}
          and report["kv_cells_in_use_after"] == 0 and report["threads_left"] <= 0
          and report["tasks_left"] == 0 and report["rss_growth"] <= 0.05)
    print("SOAK", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
