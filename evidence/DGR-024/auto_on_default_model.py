"""What tool_choice "auto" does on the default model (a base model): 6 requests
with a weather tool, greedy, max_tokens 200, through the chat endpoint's parsing and template;
whether each answer is a tool call or text.

    python evidence/DGR-024/auto_on_default_model.py
"""

import sys
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import dgr  # noqa: E402
from dgr import tools  # noqa: E402
from dgr.doors.openai import parse_chat  # noqa: E402

TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
QUESTIONS = ["What is the weather in Paris?", "Is it raining in London right now?",
             "Tell me a joke.", "What is 2 + 2?", "How warm is it in Rome today?",
             "Write a haiku about the sea."]


async def main():
    async with dgr.open_node(dgr.NodeConfig(n_ctx=8192, max_running=4)) as node:
        for question in QUESTIONS:
            parsed, messages = parse_chat({"messages": [{"role": "user", "content": question}],
                                           "tools": [TOOL], "tool_choice": "auto",
                                           "max_tokens": 200, "temperature": 0})
            ids = node.tokenize(node.chat_prompt(messages, parsed.tools), parse_special=True)
            result = await node.generate(ids, parsed.params)
            reader = tools.AnswerReader()
            reader.feed(result.text)
            content, calls = reader.result()
            kind = f"{len(calls)} tool call(s)" if calls else "text"
            print(f"{question!r}: {kind}, finish {result.finish_reason}, "
                  f"{len(result.token_ids)} tokens: {result.text[:90]!r}")


trio.run(main)
