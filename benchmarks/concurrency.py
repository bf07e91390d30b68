"""`python -m benchmarks`: dgr side by side with its peers, in one run.

Each case is a module of its own, with its workloads, its run and its Markdown:
levels (benchmarks/levels.py: dgr against llama-server, llama-cpp-python and
llama-batched-bench's ceiling at each concurrency, the patch stack's cost, a
batch-vs-solo corruption check), serving (benchmarks/serving.py: the serving path
on the tiny test model, whose steps cost next to nothing), mixed (benchmarks/
mixed_load.py: decoder stalls while a long prompt prefills, at several
--decode-stall values), prefix (benchmarks/shared_prefix.py: shared system prompts
and a multi-turn chat with and without dgr's prefix cache, and against
llama-server's prompt caching), grammar (benchmarks/grammar.py: whether a
JSON-schema-constrained session slows others), speculation (benchmarks/
speculation.py: exact speculative decoding on quoting and natural workloads
against llama-server with and without its n-gram speculation), kv_tier
(benchmarks/kv_tier.py: the KV tier beyond the pool against llama-server's
--cache-ram), prefill (benchmarks/prefill.py: cold prompts at c = 1 against
llama-server's defaults) and decode (benchmarks/decode.py: steady decode at c = 1,
8 and 16 against llama-server's defaults, on a random-weight Llama of about 1B
parameters and on the default model, and the share of the memory bound each
reaches). The servers they start are in benchmarks/servers.py.

Output: JSON, Markdown and, with the levels case, a PNG plot.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import adapters as adapters_case  # noqa: E402
from benchmarks import cpu_kinds  # noqa: E402
from benchmarks import embeddings as embeddings_case  # noqa: E402
from benchmarks import decode as decode_case  # noqa: E402
from benchmarks import grammar as grammar_case  # noqa: E402
from benchmarks import kv_tier as kv_tier_case  # noqa: E402
from benchmarks import levels as levels_case  # noqa: E402
from benchmarks import mixed_load as mixed_case  # noqa: E402
from benchmarks import prefill as prefill_case  # noqa: E402
from benchmarks import scaleout as scaleout_case  # noqa: E402
from benchmarks import serving, shared_prefix  # noqa: E402
from benchmarks import speculation as speculation_case  # noqa: E402
from benchmarks import tenants as tenants_case  # noqa: E402
from benchmarks.peers import ensure_peers  # noqa: E402
from benchmarks.servers import dgr_server, free_port, llama_server  # noqa: E402
from dgr import weight_repack  # noqa: E402
from dgr.engine import resolve_model_path  # noqa: E402


def markdown(report) -> str:
    lines = [f"Machine: {report['cpu']}; kernels: {report['cpu_kind']} (both servers)."
             ] if "cpu" in report else []
    lines += levels_case.markdown(report) if report["dgr"] else []
    if report.get("mixed_load"):
        lines.extend(mixed_case.markdown(report["mixed_load"]))
    if report.get("serving"):
        lines.extend(serving.markdown(report["serving"], "dgr", "llama-server"))
    if report.get("prefix"):
        lines.extend(shared_prefix.markdown(report["prefix"]))
    if report.get("grammar"):
        lines.extend(grammar_case.markdown(report["grammar"]))
    if report.get("speculation"):
        lines.extend(speculation_case.markdown(report["speculation"]))
    if report.get("kv_tier"):
        lines.extend(kv_tier_case.markdown(report["kv_tier"]))
    if report.get("prefill"):
        lines.extend(prefill_case.markdown(report["prefill"]))
    if report.get("scaleout"):
        lines.extend(scaleout_case.markdown(report["scaleout"]))
    for result in report.get("decode", []):
        lines.extend(decode_case.markdown(result))
    if report.get("adapters"):
        lines.extend(adapters_case.markdown(report["adapters"]))
    if report.get("embeddings"):
        lines.extend(embeddings_case.markdown(report["embeddings"]))
    if report.get("tenants"):
        lines.extend(tenants_case.markdown(report["tenants"]))
    return "\n".join(lines) + "\n"


def write(report, out: Path) -> str:
    """bench.json, bench.md and (with the levels case) bench.png in `out`; the Markdown."""
    report["saturation"] = {key: levels_case.saturation(report[key])
                            for key in ("dgr", "llama_server") if key in report}
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(report, indent=2))
    table = markdown(report)
    (out / "bench.md").write_text(table)
    if report["dgr"]:
        levels_case.plot(report, out / "bench.png")
    return table


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="GGUF model (default: Gemma 3 270M Q4_K_M)")
    parser.add_argument("--levels", default="1,2,4,8,16,32", help="concurrency levels")
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens generated per session")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--cpu-kind", default="native", choices=cpu_kinds.KINDS,
                        help="the kernels both servers run: this machine's (native) or one "
                             "instruction set's only (benchmarks/cpu_kinds.py)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "out"), help="output folder")
    parser.add_argument("--kv-conversations", type=int, default=48,
                        help="conversations of the kv_tier case (more than the pool holds)")
    parser.add_argument("--kv-words", type=int, default=900,
                        help="words of each kv_tier conversation's document (~2,000 tokens)")
    parser.add_argument("--kv-turns", type=int, default=4, help="turns of each conversation")
    parser.add_argument("--kv-restore-sizes", default="256,1000,4000,16000",
                        help="prefix sizes of the restore vs recompute measurement")
    parser.add_argument("--kv-servers", default=",".join(kv_tier_case.SERVERS),
                        help="servers of the kv_tier case")
    parser.add_argument("--cases",
                        default="levels,serving,mixed,prefix,grammar,speculation,kv_tier,prefill,"
                                "scaleout,decode",
                        help="cases to run: levels (dgr vs peers at each c, patch cost, "
                             "corruption check), serving (the serving path: the tiny model, "
                             "c = 1, 16, 64, streamed and not), mixed (mixed load), prefix "
                             "(shared prefixes), grammar (8 sessions beside a JSON-schema one "
                             "vs a sampled one), speculation (quoting and natural workloads, "
                             "dgr off/auto vs llama-server without and with n-gram drafts), "
                             "kv_tier (the KV tier beyond the pool vs llama-server's "
                             "--cache-ram), prefill (cold prompts at c = 1 vs llama-server's "
                             "defaults), scaleout (two nodes behind smg and vllm-router: "
                             "affinity, cached tokens, a node killed or drained), decode "
                             "(steady decode at c = 1, 8, 16 vs llama-server's defaults on a "
                             "~1B Llama and the default model), adapters (32 LoRa adapters: "
                             "8 x 2 sessions, 32 x 1, 16 on one and on none, vs llama-server "
                             "with the same files; --adapters-model; not in the default "
                             "set), embeddings (a BERT-style encoder, "
                             "inputs of 16-512 tokens at c = 1, 8, 32 vs llama-server "
                             "--embeddings; not in the default set), tenants (a batch "
                             "tenant at c = 32 beside a chat a second: the chats' time to "
                             "first token and the batch's tokens/s against each alone, dgr "
                             "--scheduling-policy priority vs llama-server; not in the "
                             "default set)")
    parser.add_argument("--spec-levels", default="1,2,4,8,16",
                        help="concurrency levels of the speculation case")
    parser.add_argument("--spec-rounds", type=int, default=1,
                        help="rounds of the speculation case (each runs every server)")
    parser.add_argument("--spec-servers", default=",".join(speculation_case.SERVERS),
                        help="servers of the speculation case")
    parser.add_argument("--spec-workloads", default=",".join(speculation_case.WORKLOADS),
                        help="workloads of the speculation case")
    parser.add_argument("--prefill-lengths", default=",".join(map(str, prefill_case.LENGTHS)),
                        help="prompt lengths of the prefill case")
    parser.add_argument("--adapters-model", choices=("default", "llama"), default="default",
                        help="the adapters case's model: the default model (adapters on the "
                             "attention weights) or a random Llama of n_embd 512, 4 layers, "
                             "Q8_0 (adapters on all seven layer weights)")
    parser.add_argument("--prefill-llama-1b", action="store_true",
                        help="run the prefill case on a random-weight Llama of about 1B "
                             "parameters in Q4_K_M (16 layers of full attention, 32 heads over 8 "
                             "KV heads) that the bench writes into --out, not on --model")
    parser.add_argument("--weight-repack", default=None, choices=weight_repack.MODES,
                        help="dgr's --weight-repack in the prefill and decode cases "
                        "(default: dgr's default)")
    parser.add_argument("--rounds", type=int, default=4,
                        help="alternating rounds of dgr and llama-server at each c (levels and "
                             "serving cases): each round's ratio, their median, min and max")
    parser.add_argument("--skip-mixed", action="store_true", help="skip the mixed-load case")
    parser.add_argument("--mixed-stalls", default="3,6,0",
                        help="dgr --decode-stall values tried in the mixed-load case (dgr's "
                             "default is 3; 0: fixed --prefill-chunk pieces)")
    parser.add_argument("--render-only", action="store_true",
                        help="re-render bench.md and bench.png from OUT/bench.json, run nothing")
    args = parser.parse_args(argv)
    for option, chosen, case, known in (
            ("--spec-workloads", args.spec_workloads, "speculation", speculation_case.WORKLOADS),
            ("--spec-servers", args.spec_servers, "speculation", speculation_case.SERVERS),
            ("--kv-servers", args.kv_servers, "kv_tier", kv_tier_case.SERVERS)):
        unknown = set(chosen.split(",")) - set(known)
        if unknown:
            parser.error(f"{option}: unknown {sorted(unknown)}; the {case} case has "
                         f"{', '.join(known)}")
    if (speculation_case.BURST in args.spec_workloads.split(",")
            and max(map(int, args.spec_levels.split(","))) >= speculation_case.EARLIER_USER):
        parser.error(f"--spec-levels: the {speculation_case.BURST}'s levels stay below "
                     f"{speculation_case.EARLIER_USER}, its earlier user's number")
    out = Path(args.out)
    if args.render_only:
        print(write(json.loads((out / "bench.json").read_text()), out))
        return 0
    from tqdm import tqdm

    model = resolve_model_path(args.model)
    cases = set(args.cases.split(","))
    if args.skip_mixed:
        cases.discard("mixed")
    levels = [int(x) for x in args.levels.split(",")] if "levels" in cases else []

    def log(message):
        print(message, file=sys.stderr)

    cpu_kinds.use(args.cpu_kind, log)
    peers = ensure_peers(log=log, batched_bench="levels" in cases, kind=args.cpu_kind)
    report: dict = {"model": model, "levels": levels, "new_tokens": args.new_tokens,
                    "threads": args.threads, "cpu": cpu_kinds.cpu(), "cpu_kind": args.cpu_kind,
                    "dgr": [], "llama_server": [],
                    "llama_cpp_python": [], "corruption": []}
    mixed_stalls = [float(x) for x in args.mixed_stalls.split(",")]
    steps = ((levels_case.bar_steps(levels, args.rounds) if levels else 0)
             + (1 if "serving" in cases else 0)
             + (1 + len(mixed_stalls) if "mixed" in cases else 0) + (3 if "prefix" in cases else 0)
             + (1 if "grammar" in cases else 0) + (1 if "speculation" in cases else 0)
             + (1 if "kv_tier" in cases else 0)
             + (args.rounds if "prefill" in cases else 0)
             + (4 * len(scaleout_case.ROUTERS) if "scaleout" in cases else 0)
             + (2 * args.rounds * len(decode_case.LEVELS) if "decode" in cases else 0)
             + (args.rounds if "adapters" in cases else 0)
             + (2 * args.rounds if "embeddings" in cases else 0)
             + (2 * args.rounds if "tenants" in cases else 0))
    out.mkdir(parents=True, exist_ok=True)
    with tqdm(total=steps, desc="bench", unit="run") as bar:
        if levels:
            levels_case.run(report, peers, model, levels, args.new_tokens, args.threads,
                            args.rounds, bar)
        if "serving" in cases:
            servers = {"dgr": lambda m, c: dgr_server(m, c, 512, args.threads, free_port()),
                       "llama-server": lambda m, c: llama_server(
                           peers["llama-server"], m, c, 512, args.threads, free_port())}
            report["serving"] = serving.run(servers, [1, 16, 64], args.rounds)
            bar.update()
        if "mixed" in cases:
            report["mixed_load"] = mixed_case.run(peers, model, args.threads, mixed_stalls, bar)
        if "prefix" in cases:
            report["prefix"] = shared_prefix.run(peers, model, args.threads, out, bar)
        if "grammar" in cases:
            report["grammar"] = grammar_case.run(model, args.threads)
            bar.update()
        if "speculation" in cases:
            report["speculation"] = speculation_case.run(
                speculation_case.server_starts(peers, model, args.threads, out,
                                               args.spec_servers.split(",")),
                [int(x) for x in args.spec_levels.split(",")], args.spec_rounds,
                args.spec_workloads.split(","))
            bar.update()
        if "kv_tier" in cases:
            report["kv_tier"] = kv_tier_case.run(
                peers, model, args.threads, out, args.kv_conversations, args.kv_words,
                args.kv_turns, [name for name in args.kv_servers.split(",") if name],
                [int(x) for x in args.kv_restore_sizes.split(",") if x])
            bar.update()
        repack = ["--weight-repack", args.weight_repack] if args.weight_repack else []
        mode = f", dgr --weight-repack {args.weight_repack}" if args.weight_repack else ""
        if "prefill" in cases:
            lengths = [int(x) for x in args.prefill_lengths.split(",")]
            if args.prefill_llama_1b:
                report["prefill"] = prefill_case.run(
                    peers, prefill_case.llama_1b(out), args.threads, lengths, args.rounds, bar,
                    prefill_case.TEST_ID_RANGE, repack)
                report["prefill"]["model"] = "random-weight Llama ~1B Q4_K_M" + mode
            else:
                report["prefill"] = prefill_case.run(peers, model, args.threads, lengths,
                                                     args.rounds, bar, dgr_extra=repack)
                report["prefill"]["model"] = "the default model" + mode
        if "scaleout" in cases:
            report["scaleout"] = scaleout_case.run(model, args.threads, bar=bar)
        if "decode" in cases:
            report["decode"] = []
            for name, path in (("random-weight Llama ~1B Q4_K_M", prefill_case.llama_1b(out)),
                               ("the default model", model)):
                result = decode_case.run(peers, path, args.threads, rounds=args.rounds, bar=bar,
                                         dgr_extra=repack)
                report["decode"].append(result | {"model": name + mode})
        if "adapters" in cases:
            report["adapters"] = adapters_case.run(peers, model, args.threads,
                                                   rounds=args.rounds, bar=bar,
                                                   which=args.adapters_model)
        if "embeddings" in cases:
            report["embeddings"] = embeddings_case.run(peers, args.threads, rounds=args.rounds,
                                                       bar=bar)
        if "tenants" in cases:
            report["tenants"] = tenants_case.run(peers, model, args.threads, args.rounds, bar)
    print(write(report, out))
    print(f"wrote results to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
