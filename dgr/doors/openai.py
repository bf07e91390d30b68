"""OpenAI's completions and chat completions without I/O: a body becomes a
GenerationRequest (dgr.doors.request), and a session's results become response
objects or stream chunks (CompletionBuilder). Requests are validated strictly by
type and range against the door's fields (dgr.doors.fields).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Optional

from dgr import __version__
from dgr._codes import MAX_LOGPROBS
from dgr import tools as tool_calls
from dgr.doors.fields import BadRequest, check_fields, json_object, read_bool, read_int
from dgr.doors.request import (MAX_CHOICES, GenerationRequest, chat_message, checked_chat, gbnf,
                               joined_text, json_object_grammar, named_values, prompt_ending,
                               prompt_list, reasoning_fields, sampling, schema_grammar,
                               tool_call)
from dgr.stream import Chunk, PromptProgress, TopLogprobs

# OpenAI's message roles, as the chat template knows them ("developer" is OpenAI's
# newer name for "system")
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant",
         "tool": "tool"}
# OpenAI's (and llama-server's, vLLM's) name of each SamplingParams field that a
# request passes as it is (n_predict over max_tokens, as llama-server reads them)
SAMPLING_NAMES = {
    "max_tokens": "max_tokens", "n_predict": "max_tokens", "temperature": "temperature",
    "top_p": "top_p", "top_k": "top_k", "min_p": "min_p", "typical_p": "typical_p",
    "seed": "seed", "stop": "stop",
    "ignore_eos": "ignore_eos", "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty", "repeat_penalty": "repeat_penalty",
    "repetition_penalty": "repeat_penalty", "repeat_last_n": "repeat_last_n",
    "min_tokens": "min_tokens", "stop_token_ids": "stop_token_ids", "speculation": "speculation",
    "model": "model", "lora": "lora", "skip_special_tokens": "skip_special_tokens",
}
CHAT_SAMPLING_NAMES = SAMPLING_NAMES | {"max_completion_tokens": "max_tokens"}
# OpenAI's system_fingerprint, the build that answers, in llama-server's form ("b" and
# the build)
SYSTEM_FINGERPRINT = f"b{__version__}-dgr"


def _outputs(body: dict, n_prompts: int) -> dict:
    """The fields of GenerationRequest that completions and chat read alike."""
    n = read_int(body, "n", 1, MAX_CHOICES) or 1
    if n_prompts * n > MAX_CHOICES:
        raise BadRequest(f"prompts x n must be at most {MAX_CHOICES}, got {n_prompts * n}", "n")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise BadRequest("'stream_options' must be an object", "stream_options")
    return {"n": n, "stream": read_bool(body, "stream"),
            "include_usage": bool(options and options.get("include_usage") is True),
            "timings_per_token": read_bool(body, "timings_per_token"),
            "return_progress": read_bool(body, "return_progress")}


def _sampling_values(body: dict, names: dict) -> dict:
    if "repeat_penalty" in body and "repetition_penalty" in body:
        raise BadRequest("give 'repeat_penalty' or 'repetition_penalty', not both", "repeat_penalty")
    return named_values(body, names)


def _grammar(body: dict) -> Optional[str]:
    """GBNF from `grammar` (llama.cpp's extension) or `response_format` (OpenAI's:
    json_object, or json_schema converted by llama-cpp-python's converter)."""
    grammar, fmt = body.get("grammar"), body.get("response_format")
    if grammar is not None and fmt is not None:
        raise BadRequest("give 'grammar' or 'response_format', not both", "grammar")
    if grammar is not None:
        return gbnf(grammar, "grammar")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        # llama-server's extension: a schema beside json_object constrains the object
        extra = set(fmt) - {"type", "schema"}
        if extra:
            raise BadRequest(f"'response_format.{sorted(extra)[0]}' is not supported",
                             "response_format")
        if "schema" not in fmt:
            return json_object_grammar()
        return schema_grammar(fmt["schema"], "'response_format.schema'", "response_format")
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        return schema_grammar(spec.get("schema") if isinstance(spec, dict) else None,
                              "'response_format.json_schema.schema'", "response_format")
    raise BadRequest("'response_format.type' must be text, json_object or json_schema",
                     "response_format")


def _logit_bias(body: dict) -> dict:
    value = body.get("logit_bias")
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadRequest("'logit_bias' must be an object of token ids", "logit_bias")
    out = {}
    for key, bias in value.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            raise BadRequest(f"'logit_bias' keys must be token ids, got {key!r}", "logit_bias") from None
        out[token] = bias
    return out


def parse_completion(body: Any) -> GenerationRequest:
    body = json_object(body)
    check_fields(body, "/v1/completions")
    prompts = prompt_list(body.get("prompt"))
    logprobs = read_int(body, "logprobs", 0, MAX_LOGPROBS) or 0
    echo = read_bool(body, "echo")
    # echo with logprobs: the prompt's tokens are reported too (scored, computed whole),
    # and max_tokens may be 0 (how evaluation tools score a continuation)
    scored = logprobs if echo and body.get("logprobs") is not None else None
    params = sampling(_sampling_values(body, SAMPLING_NAMES), logprobs=logprobs,
                      logit_bias=_logit_bias(body), grammar=_grammar(body),
                      prompt_logprobs=scored)
    return GenerationRequest(params, prompts=prompts, echo=echo, **_outputs(body, len(prompts)))


def chat_messages(messages: Any) -> list[dict]:
    """OpenAI's chat messages as the chat template renders them (request.chat_message)."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list", "messages")
    out = []
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BadRequest("every message needs a string 'role'", "messages")
        if m["role"] not in ROLES:
            raise BadRequest(f"message role {m['role']!r} is not one of "
                             f"{', '.join(sorted(ROLES))}", "messages")
        content, parts = m.get("content"), None
        if isinstance(content, list):
            if not all(isinstance(part, dict) and part.get("type") == "text"
                       and isinstance(part.get("text"), str) for part in content):
                raise BadRequest("only text content parts are supported", "messages")
            parts = [part["text"] for part in content]
            content = joined_text(parts)
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise BadRequest("message 'content' must be a string or a list of text parts", "messages")
        calls = m.get("tool_calls")
        if calls is not None and (m["role"] != "assistant" or not isinstance(calls, list)):
            raise BadRequest("'tool_calls' belong to assistant messages, as a list", "messages")
        thought = m.get("reasoning_content")  # an earlier turn's thinking (llama-server's, vLLM's)
        if thought is not None and (m["role"] != "assistant" or not isinstance(thought, str)):
            raise BadRequest("'reasoning_content' belongs to assistant messages, as a string",
                             "messages")
        out.append(chat_message(ROLES[m["role"]], content,
                                [_tool_call(call) for call in calls or ()],
                                m.get("tool_call_id"), thought, parts))
    return checked_chat(out)


def _tool_call(call: Any) -> dict:
    """One of OpenAI's assistant tool calls (its arguments as JSON text)."""
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        raise BadRequest("a tool call needs a function name", "messages")
    try:
        arguments = json.loads(function.get("arguments") or "{}")
    except (TypeError, ValueError):
        raise BadRequest("a tool call's arguments must be JSON text", "messages") from None
    return tool_call(call.get("id"), function.get("name"), arguments)


def parse_chat(body: Any, tool_format=None) -> GenerationRequest:
    """A chat completion request; tools are in `tool_format` (the model's,
    dgr.tool_formats; None: the generic one)."""
    body = json_object(body)
    check_fields(body, "/v1/chat/completions")
    messages = chat_messages(body.get("messages"))
    try:
        tools = tool_calls.parse_tools(body, tool_format)
    except tool_calls.ToolsError as exc:
        raise BadRequest(str(exc), exc.field) from None
    if tools is not None and (body.get("grammar") is not None
                              or body.get("response_format") is not None):
        raise BadRequest("'tools' cannot be combined with 'grammar' or 'response_format'",
                         "tools")
    logprobs = top = 0
    if read_bool(body, "logprobs"):
        top = read_int(body, "top_logprobs", 0, MAX_LOGPROBS) or 0
        logprobs = max(top, 1)  # the engine reports the chosen token's with one alternative
    elif body.get("top_logprobs") is not None:
        raise BadRequest("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    if body.get("json_schema") is not None:  # llama-server's: response_format's schema, top level
        if body.get("response_format") is not None or body.get("grammar") is not None:
            raise BadRequest("give 'json_schema', 'response_format' or 'grammar', one of them",
                             "json_schema")
        grammar = schema_grammar(body["json_schema"], "'json_schema'", "json_schema")
    else:
        grammar = tools.format.grammar(tools) if tools is not None else _grammar(body)
    add = body.get("add_generation_prompt")
    if add is not None and not isinstance(add, bool):
        raise BadRequest("'add_generation_prompt' must be a boolean", "add_generation_prompt")
    params = sampling(_sampling_values(body, CHAT_SAMPLING_NAMES), logprobs=logprobs,
                      logit_bias=_logit_bias(body), grammar=grammar)
    return GenerationRequest(
        params, messages=messages, top_logprobs=top, tools=tools,
        verbose=read_bool(body, "verbose"), **_outputs(body, 1), **reasoning_fields(body),
        **prompt_ending(messages, add, read_bool(body, "continue_final_message")))


class CompletionBuilder:
    """Builds the OpenAI response objects of one completions or chat request."""

    def __init__(self, model: str, chat: bool, token_text, token_bytes=None, top_logprobs: int = 0,
                 reports_thinking: bool = False):
        self.model = model
        self.chat = chat
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self._token_text = token_text  # token id -> str (for logprobs)
        self._token_bytes = token_bytes or (lambda t: token_text(t).encode())
        self._top = top_logprobs  # chat: alternatives per token
        self._offsets: dict[int, int] = {}  # choice index -> text offset so far
        # chat: the thinking is split off (usage counts its tokens)
        self._reports_thinking = reports_thinking

    def _object(self, kind: str) -> dict:
        """The fields every object of the request begins with (OpenAI's
        system_fingerprint: the build that answers)."""
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model,
                "system_fingerprint": SYSTEM_FINGERPRINT}

    def _logprobs(self, chunks: list[Chunk], index: int = 0,
                  prompt: Optional[list] = None) -> Optional[dict]:
        rows = [c for c in chunks if c.token_id is not None and c.top_logprobs is not None]
        if prompt:
            return self._with_prompt(rows, index, prompt)
        if not rows:
            return None
        if self.chat:
            return {"content": [{
                "token": self._token_text(c.token_id), "logprob": c.logprob,
                "bytes": list(self._token_bytes(c.token_id)),
                "top_logprobs": [{"token": self._token_text(t), "logprob": lp,
                                  "bytes": list(self._token_bytes(t))}
                                 for t, lp in c.top_logprobs[:self._top]]} for c in rows]}
        offsets = []
        for c in rows:
            offsets.append(self._offsets.get(index, 0))
            self._offsets[index] = offsets[-1] + len(c.text)
        return {"tokens": [self._token_text(c.token_id) for c in rows],
                "token_logprobs": [c.logprob for c in rows],
                "top_logprobs": [_top_dict(c.top_logprobs, self._token_text) for c in rows],
                "text_offset": offsets}

    def _with_prompt(self, rows: list[Chunk], index: int, prompt: list) -> dict:
        """Completions' logprobs with the prompt's tokens first (echo): `prompt` is
        (token id, (logprob, alternatives) or None) per prompt token, None for the
        first, as OpenAI reports it. A prompt token's text_offset counts the text
        of the tokens before it; the generated tokens' go on from there."""
        tokens, lps, tops, offsets, at = [], [], [], [], 0
        for token, score in prompt:
            text = self._token_text(token)
            tokens.append(text)
            lps.append(None if score is None else score[0])
            tops.append(None if score is None else _top_dict(score[1], self._token_text))
            offsets.append(at)
            at += len(text)
        self._offsets[index] = at
        rest = self._logprobs(rows, index) if rows else None
        if rest is not None:
            tokens += rest["tokens"]
            lps += rest["token_logprobs"]
            tops += rest["top_logprobs"]
            offsets += rest["text_offset"]
        return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops,
                "text_offset": offsets}

    def usage(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0,
              reasoning_tokens: int = 0) -> dict:
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                 "total_tokens": prompt_tokens + completion_tokens,
                 "prompt_tokens_details": {"cached_tokens": cached_tokens}}
        if self._reports_thinking:
            usage["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
        return usage

    def full(self, choices: list[tuple], prompt_tokens: int, completion_tokens: int,
             cached_tokens: int = 0, prompts: Optional[list] = None) -> dict:
        """choices: (answer, token chunks, finish reason) of each choice, by index, the
        answer a completion's text or a chat's dgr.doors.chat_turn.WholeChoice;
        prompts: each choice's scored prompt (echo with logprobs; see _with_prompt)."""
        out = []
        thought_tokens = 0
        for index, (answer, chunks, finish_reason) in enumerate(choices):
            logprobs = self._logprobs(chunks, index, prompts[index] if prompts else None)
            if self.chat:
                message: dict = {"role": "assistant"}
                thought_tokens += answer.thought_tokens
                if answer.thought:
                    message["reasoning_content"] = answer.thought
                message["content"] = answer.content
                if answer.calls:
                    message["tool_calls"] = answer.calls
                    finish_reason = "tool_calls" if answer.tool_use else finish_reason
                out.append({"index": index, "message": message,
                            "logprobs": logprobs, "finish_reason": finish_reason})
            else:
                out.append({"index": index, "text": answer, "logprobs": logprobs,
                            "finish_reason": finish_reason})
        return self._object("chat.completion" if self.chat else "text_completion") | {
            "choices": out,
            "usage": self.usage(prompt_tokens, completion_tokens, cached_tokens, thought_tokens)}

    def delta(self, text: str, chunks: list[Chunk], finish_reason: Optional[str] = None,
              index: int = 0, prompt: Optional[list] = None,
              timing: Optional[dict] = None) -> dict:
        """A chunk of a choice's text (a chat's role goes first, in role_chunk);
        `timing`: llama-server's timings so far (timings_per_token)."""
        logprobs = self._logprobs(chunks, index, prompt)
        if self.chat:
            delta = {} if finish_reason is not None and not text else {"content": text}
            choice = {"index": index, "delta": delta, "logprobs": logprobs,
                      "finish_reason": finish_reason}
            obj = "chat.completion.chunk"
        else:
            choice = {"index": index, "text": text, "logprobs": logprobs,
                      "finish_reason": finish_reason}
            obj = "text_completion"
        chunk = self._object(obj) | {"choices": [choice]}
        return chunk if timing is None else chunk | {"timings": timing}

    def progress_chunk(self, progress: dict, timing: Optional[dict] = None) -> dict:
        """A report of the prompt's prefill (return_progress): no choice yet."""
        chunk = self._object("chat.completion.chunk" if self.chat else "text_completion") | {
            "choices": [], "prompt_progress": progress}
        return chunk if timing is None else chunk | {"timings": timing}

    def reasoning_chunk(self, text: str, index: int) -> dict:
        """A piece of a chat choice's thinking (llama-server's and vLLM's field)."""
        return self._chunk(index, {"reasoning_content": text})

    def role_chunk(self, index: int) -> dict:
        """A chat choice's first chunk: its role, no content yet."""
        return self._chunk(index, {"role": "assistant", "content": None})

    def tool_delta(self, part, index: int) -> dict:
        """A part of a chat answer read for tool calls (dgr.doors.chat_turn) as OpenAI
        streams it: text as content; a call's id, type and name with empty arguments;
        then its arguments' text piece by piece."""
        if isinstance(part, tool_calls.CallStarted):
            delta: dict = {"tool_calls": [{"index": part.index, "id": part.id, "type": "function",
                                           "function": {"name": part.name, "arguments": ""}}]}
        elif isinstance(part, tool_calls.ArgumentsPiece):
            delta = {"tool_calls": [{"index": part.index, "function": {"arguments": part.text}}]}
        else:
            delta = {"content": part.text}
        return self._chunk(index, delta)

    def finish_chunk(self, index: int, finish_reason: str) -> dict:
        """A chat choice's last chunk: its finish reason, no delta."""
        return self._chunk(index, {}, finish_reason)

    def _chunk(self, index: int, delta: dict, finish_reason: Optional[str] = None) -> dict:
        return self._object("chat.completion.chunk") | {
            "choices": [{"index": index, "delta": delta, "logprobs": None,
                         "finish_reason": finish_reason}]}

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int,
                    cached_tokens: int = 0, reasoning_tokens: int = 0) -> dict:
        return self._object("chat.completion.chunk" if self.chat else "text_completion") | {
            "choices": [],
            "usage": self.usage(prompt_tokens, completion_tokens, cached_tokens, reasoning_tokens)}


def timings(stream) -> dict:
    """llama-server's `timings` of a session's stream (dgr.stream.SessionStream) so
    far: its prompt (from arrival to the first token, the queue included) and its
    generation (from the first token to the last: the rate is over the steps after
    the first token, which came with the prompt), counts, milliseconds, rates. The
    tokens predicted are the session's generated tokens, as the node's metrics count
    them (an end-of-generation token that ends it is not one)."""
    session = stream.session
    predicted_n = len(session.generated)
    cached = stream.cached_tokens
    prompt_n = stream.prompt_tokens - cached
    first, last = session.first_token_at, session.last_token_at
    prompt_ms = (first - session.arrived_at) * 1e3 if first is not None else 0.0
    predicted_ms = (last - first) * 1e3 if first is not None else 0.0
    return {"cache_n": cached,
            "prompt_n": prompt_n, "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
            "prompt_per_second": prompt_n * 1e3 / prompt_ms if prompt_ms else 0.0,
            "predicted_n": predicted_n, "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_ms / (predicted_n - 1) if predicted_n > 1 else 0.0,
            "predicted_per_second": ((predicted_n - 1) * 1e3 / predicted_ms
                                     if predicted_n > 1 and predicted_ms else 0.0)}


def prompt_progress(report: PromptProgress, started: float) -> dict:
    """llama-server's `prompt_progress` of a report (dgr.stream.PromptProgress);
    `started`: when the first report came (its time is counted from it)."""
    return {"total": report.total, "cache": report.cached, "processed": report.processed,
            "time_ms": (report.at - started) * 1e3}


def progress_timings(report: PromptProgress, started: float) -> dict:
    """llama-server's timings while a prompt is prefilled: nothing generated yet."""
    prompt_n = report.processed - report.cached
    prompt_ms = (report.at - started) * 1e3
    return {"cache_n": report.cached, "prompt_n": prompt_n, "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
            "prompt_per_second": prompt_n * 1e3 / prompt_ms if prompt_ms else 0.0,
            "predicted_n": 0, "predicted_ms": 0.0, "predicted_per_token_ms": 0.0,
            "predicted_per_second": 0.0}


def _top_dict(top: TopLogprobs, token_text) -> dict:
    out: dict[str, float] = {}
    for t, lp in top:
        out.setdefault(token_text(t), lp)
    return out
