"""The bench's grammar case: does a grammar-constrained session slow the others?

8 greedy sessions run beside a 9th that samples (temperature 0.7), once without a
grammar, once under a JSON schema (llama.cpp's grammar sampler) and once under a
tool call's grammar (dgr.tools, tool_choice "required"), alternating, in one
process: the 8 sessions' aggregate tokens/s in each, and their ratios (1.0: the
grammar costs the others nothing beyond what any sampled session does).

The 9th session is restarted whenever it ends, and a restart costs a prefill: so
that both kinds live equally long, the plain one ignores end-of-generation and the
schema asks for at least 100 items (a JSON text longer than its 400 tokens). Each
round reports how many times the 9th session ended, so that a difference in
restarts is not mistaken for the grammar's cost."""

from __future__ import annotations

import json
import time

import trio

import dgr

SCHEMA = {"type": "object", "properties": {
    "items": {"type": "array", "minItems": 100,
              "items": {"type": "string", "minLength": 2, "maxLength": 24}}},
    "required": ["items"]}
PROMPTS = [f"Session {i}: describe a city you would like to visit, and why." for i in range(8)]
# a tool whose call is as long as the schema's answer
TOOL = {"name": "add_fruits", "description": "Add fruits to the list",
        "parameters": {"type": "object", "properties": {"fruits": SCHEMA["properties"]["items"]},
                       "required": ["fruits"]}}


NINTH = "List many fruits as JSON:"


async def eight_beside(model: str, threads: int, grammar: str | None, n_new: int,
                       ninth_prompt: str = NINTH) -> tuple[float, int]:
    """The 8 sessions' tokens/s, and how many times the 9th session ended meanwhile."""
    config = dgr.NodeConfig(model_path=model, n_ctx=8192, n_threads=threads)
    plain = dgr.SamplingParams(max_tokens=n_new, ignore_eos=True)
    async with dgr.open_node(config) as node:
        await node.generate("warm up", dgr.SamplingParams(max_tokens=4))
        results = [None] * len(PROMPTS)
        ended = []
        async with trio.open_nursery() as nursery:
            async def ninth():
                while True:
                    await node.generate(ninth_prompt, dgr.SamplingParams(
                        max_tokens=400, temperature=0.7, grammar=grammar,
                        ignore_eos=grammar is None))
                    ended.append(time.monotonic())

            nursery.start_soon(ninth)
            await trio.sleep(0.5)  # the 9th session is decoding
            started = time.monotonic()
            async with trio.open_nursery() as sessions:
                async def one(i):
                    results[i] = await node.generate(PROMPTS[i], plain)

                for i in range(len(PROMPTS)):
                    sessions.start_soon(one, i)
            elapsed = time.monotonic() - started
            nursery.cancel_scope.cancel()
    restarts = sum(1 for t in ended if started <= t <= started + elapsed)
    return sum(len(r.token_ids) for r in results) / elapsed, restarts


def run(model: str, threads: int, rounds: int = 2, n_new: int = 96) -> list[dict]:
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    from dgr import tools

    grammar = json_schema_to_gbnf(json.dumps(SCHEMA))
    spec = tools.ToolSpec((TOOL,), "required", False)
    tool_grammar = tools.grammar(spec)
    # as a chat request with tools has it: the tools described before the question
    tool_prompt = tools.system_prompt(spec) + "\n" + NINTH
    out = []
    for _ in range(rounds):
        sampled, sampled_ends = trio.run(eight_beside, model, threads, None, n_new)
        constrained, constrained_ends = trio.run(eight_beside, model, threads, grammar, n_new)
        called, called_ends = trio.run(eight_beside, model, threads, tool_grammar, n_new,
                                       tool_prompt)
        out.append({"beside_sampled_tok_s": sampled, "beside_grammar_tok_s": constrained,
                    "beside_tool_call_tok_s": called, "ratio": constrained / sampled,
                    "tool_call_ratio": called / sampled, "sampled_9th_ended": sampled_ends,
                    "grammar_9th_ended": constrained_ends, "tool_call_9th_ended": called_ends})
    return out


def markdown(rounds: list[dict]) -> list[str]:
    lines = ["", "| grammar case, round | 8 greedy beside a sampled session tok/s | beside a "
             "JSON-schema session tok/s | ratio | beside a tool-call session tok/s | ratio | "
             "9th session ended (sampled / schema / tool call) |",
             "|---|---|---|---|---|---|---|"]
    for i, r in enumerate(rounds):
        lines.append(f"| {i} | {r['beside_sampled_tok_s']:.1f} | {r['beside_grammar_tok_s']:.1f} "
                     f"| {r['ratio']:.3f} | {r['beside_tool_call_tok_s']:.1f} "
                     f"| {r['tool_call_ratio']:.3f} | {r['sampled_9th_ended']} / "
                     f"{r['grammar_9th_ended']} / {r['tool_call_9th_ended']} |")
    return lines
