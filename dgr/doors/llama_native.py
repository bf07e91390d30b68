"""llama.cpp's native API, as llama-server serves it to the GGUF tools that speak
it: `POST /completion` (its fields, its response and stream shapes), `GET /props`,
`GET /slots`, `POST /apply-template`. A completion becomes an OpenAI completion
body, parsed and validated as `/v1/completions` is; a llama.cpp field with no
meaning here is taken only at a value that changes nothing."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from dgr.doors.fields import BadRequest, check_fields, read_bool
from dgr.doors.openai import parse_completion, progress_timings, prompt_progress, timings
from dgr.doors.prompts import chat_text
from dgr.doors.sse import SessionEvents, ending, error_response, read_one, read_whole

if TYPE_CHECKING:
    from dgr.doors.context import ServerState

# llama.cpp's name -> the OpenAI completion body's
_RENAMED = {"max_tokens": "max_tokens", "n_predict": "max_tokens", "n_probs": "logprobs"} | {
    name: name for name in ("temperature", "top_k", "top_p", "min_p", "seed", "stop",
                            "ignore_eos", "repeat_penalty", "repeat_last_n", "presence_penalty",
                            "frequency_penalty", "grammar", "stream", "timings_per_token",
                            "return_progress", "logit_bias")}
# llama-server's default temperature for /completion
_TEMPERATURE = 0.8


def _temperature(server: "ServerState") -> float:
    return server.config.temperature if server.config.temperature is not None else _TEMPERATURE


def _llama_prompt(node, prompt: Any) -> Any:
    """llama.cpp's prompt shapes as the OpenAI door takes them: {"prompt_string":
    text} is its text (multimodal_data is refused: no model here reads images); a
    list mixing token ids and texts is one prompt, its texts tokenized in place
    (the first with the BOS, as llama-server does); another list is one prompt each."""
    if isinstance(prompt, dict):
        return _json_prompt(prompt)
    if not isinstance(prompt, list):
        return prompt
    if (any(isinstance(p, str) for p in prompt)
            and any(isinstance(p, int) and not isinstance(p, bool) for p in prompt)):
        ids: list = []
        for i, piece in enumerate(prompt):
            ids += (node.tokenize(piece, add_special=i == 0, parse_special=True)
                    if isinstance(piece, str) else [piece])
        return ids
    return [_json_prompt(p) if isinstance(p, dict) else p for p in prompt]


def _json_prompt(prompt: dict) -> Any:
    if prompt.get("multimodal_data"):
        raise BadRequest("'multimodal_data' is not supported: the model reads no images",
                         "prompt")
    if set(prompt) - {"prompt_string", "multimodal_data"}:
        raise BadRequest("a prompt object takes 'prompt_string' (and 'multimodal_data')",
                         "prompt")
    return prompt.get("prompt_string")


def _llama_bias(node, bias: Any) -> Any:
    """llama.cpp's logit_bias as OpenAI's ({token id: bias}): pairs or an object,
    each key a token id or a text whose tokens all take the bias; a bias of false
    bans (-100)."""
    pairs = bias.items() if isinstance(bias, dict) else bias
    if not isinstance(pairs, (list, type({}.items()))) or not all(
            isinstance(p, (list, tuple)) and len(p) == 2 for p in pairs):
        raise BadRequest("'logit_bias' must be [[token or text, bias], ...] or an object",
                         "logit_bias")
    out: dict = {}
    for key, value in pairs:
        value = -100 if value is False else value
        if isinstance(key, str) and not key.isdigit():
            for token in node.tokenize(key, add_special=False, parse_special=False):
                out[str(token)] = value
        else:
            out[str(key)] = value
    return out


def _probabilities(node, chunk) -> dict:
    """A token's llama-server completion_probabilities entry (n_probs)."""
    def entry(token: int, logprob: float) -> dict:
        return {"id": token, "token": node.token_text(token),
                "bytes": list(node.token_bytes(token)), "logprob": logprob}

    return entry(chunk.token_id, chunk.logprob) | {
        "top_logprobs": [entry(t, lp) for t, lp in chunk.top_logprobs or []]}


def _completion_body(body: Any) -> dict:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    check_fields(body, "/completion")
    out: dict = {"prompt": body.get("prompt"), "temperature": _TEMPERATURE}
    for name, value in body.items():
        if name in _RENAMED and value is not None:
            out[_RENAMED[name]] = value
    if body.get("n_predict") is not None:
        out["max_tokens"] = body["n_predict"]  # over max_tokens, as llama-server reads them
    if out.get("max_tokens") == -1:
        del out["max_tokens"]  # llama.cpp's "until the end": the node's default
    if body.get("json_schema") is not None:
        out["response_format"] = {"type": "json_schema",
                                  "json_schema": {"schema": body["json_schema"]}}
    return out


def _logit_bias(params, eog_tokens: list[int]) -> list[dict]:
    """The biases as llama-server reports them: with ignore_eos, each
    end-of-generation token's bias is -inf (JSON null)."""
    banned = [{"token": token, "bias": None} for token in eog_tokens] if params.ignore_eos else []
    return banned + [{"token": int(token), "bias": bias} for token, bias in params.logit_bias]


def _result(parsed, chunks, text: str, tokens: list[int], model: str,
            return_tokens: bool, node) -> dict:
    reason = str(chunks.finish_reason)
    stop_type = ("word" if chunks.stop_sequence is not None else
                 "limit" if reason == "length" else "eos")
    return {"index": 0, "content": text, "tokens": tokens if return_tokens else [],
            "id_slot": chunks.session.slot if chunks.session.slot is not None else -1,
            "stop": True, "model": model, "tokens_predicted": len(chunks.session.generated),
            "tokens_evaluated": chunks.prompt_tokens, "tokens_cached": chunks.cached_tokens,
            "has_new_line": "\n" in text, "truncated": False, "stop_type": stop_type,
            "stopping_word": chunks.stop_sequence or "",
            "generation_settings": {"n_predict": parsed.params.max_tokens or -1,
                                    "temperature": parsed.params.temperature,
                                    "seed": parsed.params.seed,
                                    "logit_bias": _logit_bias(parsed.params, node.eog_tokens)},
            "timings": timings(chunks)}


async def completion(request: Request, server: "ServerState") -> Response:
    node = server.ready_node()
    body = await server.read_body(request, "/completion")
    if isinstance(body, dict):
        body = body | {"prompt": _llama_prompt(node, body.get("prompt"))}
        if body.get("logit_bias") is not None:
            body["logit_bias"] = _llama_bias(node, body["logit_bias"])
    parsed = parse_completion(_completion_body(body))
    return_tokens = read_bool(body, "return_tokens")
    if len(parsed.prompts) > 1:
        if parsed.stream:
            raise BadRequest("stream one prompt at a time", "prompt")
        return await _several(request, server, node, parsed, return_tokens)
    tokens: list[int] = []
    if parsed.stream:
        stream_cm = node.stream(parsed.prompts[0], parsed.params, progress=parsed.return_progress)
        chunks = await stream_cm.__aenter__()

        async def produce(emit) -> None:
            texts = []
            started = None  # the first progress report's time
            async for chunk in chunks:
                if chunk.progress is not None:
                    started = started or chunk.progress.at
                    report = {"index": 0, "content": "", "tokens": [], "stop": False,
                              "prompt_progress": prompt_progress(chunk.progress, started)}
                    if parsed.timings_per_token:
                        report["timings"] = progress_timings(chunk.progress, started)
                    await emit("data: " + json.dumps(report) + "\n\n")
                    continue
                if chunk.token_id is not None:
                    tokens.append(chunk.token_id)
                    request.scope["dgr.tokens"] = len(tokens)
                if chunk.finish_reason is None:
                    texts.append(chunk.text)
                    piece = {"index": 0, "content": chunk.text,
                             # llama-server sends each piece's token whether or not
                             # return_tokens asks (which is for the whole response)
                             "tokens": [chunk.token_id] if chunk.token_id is not None else [],
                             "stop": False}
                    if parsed.timings_per_token:
                        piece["timings"] = timings(chunks)
                    if parsed.params.logprobs and chunk.token_id is not None:
                        piece["completion_probabilities"] = [_probabilities(node, chunk)]
                    await emit("data: " + json.dumps(piece, ensure_ascii=False) + "\n\n")
                else:
                    texts.append(chunk.text)
            ended = ending([chunks])
            if ended is not None:
                await emit("data: " + json.dumps({"error": {"code": ended[0],
                                                            "message": ended[1]}}) + "\n\n")
                return
            final = _result(parsed, chunks, "".join(texts), tokens, server.model_id,
                            return_tokens, node)
            last = texts[-1] if texts and chunks.finish_reason is not None else ""
            await emit("data: " + json.dumps(final | {"content": last}, ensure_ascii=False)
                       + "\n\n")

        return SessionEvents(produce, close=lambda: stream_cm.__aexit__(None, None, None))
    rows: list = []
    async with node.stream(parsed.prompts[0], parsed.params, whole=True) as chunks:
        text, instead = await read_one(request, chunks, tokens, rows)
    if instead is not None:
        return instead
    result = _result(parsed, chunks, text, tokens, server.model_id, return_tokens, node)
    if parsed.params.logprobs:
        result["completion_probabilities"] = [_probabilities(node, row) for row in rows]
    wanted = body.get("response_fields")
    if isinstance(wanted, list) and "prompt" in wanted:
        # the prompt's text, special tokens written out (a call per token: only when asked)
        result["prompt"] = "".join(node.token_text(t) for t in chunks.session.spec.prompt)
    return JSONResponse(_fields(result, wanted))


def _fields(result: dict, wanted) -> dict:
    """llama-server's response_fields: only those fields, a path "a/b" read nested
    and named as written (none: the whole result)."""
    if not wanted:
        return result
    if not isinstance(wanted, list) or not all(isinstance(f, str) for f in wanted):
        raise BadRequest("'response_fields' must be a list of field paths", "response_fields")
    picked = {}
    for path in wanted:
        value = result
        for key in path.split("/"):
            value = value.get(key) if isinstance(value, dict) else None
        if value is not None:
            picked[path] = value
    return picked


async def _several(request: Request, server: "ServerState", node, parsed,
                   return_tokens: bool) -> Response:
    """Several prompts, admitted together: a list of results, in their order."""
    texts: list[str] = [""] * len(parsed.prompts)
    tokens: list[list[int]] = [[] for _ in parsed.prompts]

    async def collect(i, chunks):
        got = await chunks.read_all()
        texts[i] = "".join(chunk.text for chunk in got)
        tokens[i] = [chunk.token_id for chunk in got if chunk.token_id is not None]

    async with node.stream_group(parsed.prompts, parsed.params, 1, whole=True) as streams:
        instead = await read_whole(request, streams, collect)
    if instead is not None:
        return instead
    return JSONResponse([_result(parsed, chunks, texts[i], tokens[i], server.model_id,
                                 return_tokens, node) | {"index": i}
                         for i, chunks in enumerate(streams)])


async def props(request: Request, server: "ServerState") -> Response:
    node = server.ready_node()
    info = node.engine_info
    return JSONResponse({
        "default_generation_settings": {
            "n_ctx": node.budgets.kv_cells_per_session,
            # llama.cpp's seed for "a fresh one each request" is 2^32 - 1
            "params": {"temperature": _temperature(server),
                       "seed": server.config.seed if server.config.seed is not None
                       else 0xFFFFFFFF}},
        "total_slots": info["n_seq_max"], "model_alias": server.model_id,
        "model_path": info["path"], "modalities": {"vision": False, "audio": False},
        "chat_template": node.chat_template() or "", "build_info": "dgr"})


async def slots(request: Request, server: "ServerState") -> Response:
    """Each slot's state and token counts, as llama-server's GET /slots shows them
    (without the prompt, the text or the sampling parameters); with
    ?fail_on_no_slot, 503 when every slot is taken."""
    if not server.config.slots_endpoint:
        return error_response(501, "this server does not serve /slots (--no-slots)",
                              "not_supported_error")
    states = server.ready_node().slots()
    if request.query_params.get("fail_on_no_slot") and all(s["is_processing"] for s in states):
        return error_response(503, "no slot available", "unavailable_error")
    return JSONResponse(states)


async def apply_template(request: Request, server: "ServerState") -> Response:
    node = server.ready_node()
    body = await server.read_json(request)
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        raise BadRequest("'messages' must be a list", "messages")
    from dgr.doors.openai import parse_chat

    chat, messages = parse_chat({k: body[k] for k in ("messages", "tools", "tool_choice",
                                                      "add_generation_prompt",
                                                      "continue_final_message") if k in body},
                                node.tool_format)
    return JSONResponse({"prompt": chat_text(node, chat, messages)})
