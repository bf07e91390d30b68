"""llama.cpp's native API, as llama-server serves it to the GGUF tools that speak
it: `POST /completion` (its fields, its response and stream shapes), `GET /props`,
`GET /slots`, `POST /apply-template`. A completion becomes a GenerationRequest
by llama.cpp's own fields; a llama.cpp field with no meaning here is taken only
at a value that changes nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from dgr._codes import MAX_LOGPROBS
from dgr.doors import chat_turn
from dgr.doors.fields import (CHAT_PROMPT_FIELDS, BadRequest, check_fields, json_object,
                              read_bool, read_int)
from dgr.doors.openai import parse_chat, progress_timings, prompt_progress, timings
from dgr.doors.request import (GenerationRequest, gbnf, named_values, prompt_list,
                               requester_of, sampling, schema_grammar)
from dgr.doors.problems import ended, error_response, llama_error
from dgr.doors.sse import SessionEvents, read_one, read_whole, sse_event

if TYPE_CHECKING:
    from dgr.doors.context import ServerState

# llama.cpp's name of each SamplingParams field /completion takes (n_predict over
# max_tokens, as llama-server reads them)
_SAMPLING_NAMES = {"max_tokens": "max_tokens", "n_predict": "max_tokens"} | {
    name: name for name in ("temperature", "top_k", "top_p", "min_p", "typical_p", "seed",
                            "stop", "ignore_eos", "repeat_penalty", "repeat_last_n",
                            "presence_penalty", "frequency_penalty", "model", "lora")}
# llama-server's default temperature for /completion
_TEMPERATURE = 0.8


def _temperature(server: "ServerState") -> float:
    return server.config.temperature if server.config.temperature is not None else _TEMPERATURE


def _llama_prompt(node, prompt: Any) -> Any:
    """llama.cpp's prompt shapes as prompts (request.prompt_list): {"prompt_string":
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


def _llama_bias(node, bias: Any) -> dict:
    """llama.cpp's logit_bias as {token id: bias}: pairs or an object, each key a
    token id or a text whose tokens all take the bias; a bias of false bans (-100)."""
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
                out[token] = value
        elif isinstance(key, int) and not isinstance(key, bool) or isinstance(key, str):
            out[int(key)] = value
        else:
            raise BadRequest(f"'logit_bias' keys must be token ids or texts, got {key!r}",
                             "logit_bias")
    return out


def _probabilities(node, chunk) -> dict:
    """A token's llama-server completion_probabilities entry (n_probs)."""
    def entry(token: int, logprob: float) -> dict:
        return {"id": token, "token": node.token_text(token),
                "bytes": list(node.token_bytes(token)), "logprob": logprob}

    return entry(chunk.token_id, chunk.logprob) | {
        "top_logprobs": [entry(t, lp) for t, lp in chunk.top_logprobs or []]}


def parse_llama_completion(body: Any, node) -> GenerationRequest:
    """llama-server's POST /completion (its prompt shapes and logit_bias need the
    node's tokenizer)."""
    body = json_object(body)
    check_fields(body, "/completion")
    values = named_values(body, _SAMPLING_NAMES)
    if values.get("max_tokens", (None, None))[1] == -1:
        del values["max_tokens"]  # llama.cpp's "until the end": the node's default
    if body.get("grammar") is not None and body.get("json_schema") is not None:
        raise BadRequest("give 'grammar' or 'json_schema', not both", "grammar")
    grammar = (gbnf(body["grammar"], "grammar") if body.get("grammar") is not None else
               schema_grammar(body["json_schema"], "'json_schema'", "json_schema")
               if body.get("json_schema") is not None else None)
    bias = body.get("logit_bias")
    params = sampling(values, temperature=_TEMPERATURE,
                      logprobs=read_int(body, "n_probs", 0, MAX_LOGPROBS) or 0,
                      logit_bias=_llama_bias(node, bias) if bias is not None else None,
                      grammar=grammar)
    return GenerationRequest(params, prompts=prompt_list(_llama_prompt(node, body.get("prompt"))),
                             stream=read_bool(body, "stream"),
                             timings_per_token=read_bool(body, "timings_per_token"),
                             return_progress=read_bool(body, "return_progress"))


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
    parsed = attrs.evolve(parse_llama_completion(body, node),
                          requester=requester_of(request, None, body.get("priority")))
    return_tokens = read_bool(body, "return_tokens")
    if len(parsed.prompts) > 1:
        if parsed.stream:
            raise BadRequest("stream one prompt at a time", "prompt")
        return await _several(request, server, node, parsed, return_tokens)
    tokens: list[int] = []
    if parsed.stream:
        stream_cm = node.stream(parsed.prompts[0], parsed.params, progress=parsed.return_progress,
                                requester=parsed.requester)
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
                    await emit(sse_event(report))
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
                    await emit(sse_event(piece))
                else:
                    texts.append(chunk.text)
            problem = ended([chunks])
            if problem is not None:
                await emit(sse_event(llama_error(problem)))
                return
            final = _result(parsed, chunks, "".join(texts), tokens, server.model_name(parsed.params),
                            return_tokens, node)
            last = texts[-1] if texts and chunks.finish_reason is not None else ""
            await emit(sse_event(final | {"content": last}))

        return SessionEvents(produce, close=lambda: stream_cm.__aexit__(None, None, None))
    async with node.stream(parsed.prompts[0], parsed.params, whole=True,
                           requester=parsed.requester) as chunks:
        got = await read_one(request, chunks)
    rows = [chunk for chunk in got if chunk.token_id is not None]
    tokens += [chunk.token_id for chunk in rows]
    text = "".join(chunk.text for chunk in got)
    result = _result(parsed, chunks, text, tokens, server.model_name(parsed.params), return_tokens, node)
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

    async with node.stream_group(parsed.prompts, parsed.params, 1, whole=True,
                                 requester=parsed.requester) as streams:
        await read_whole(request, streams, collect)
    return JSONResponse([_result(parsed, chunks, texts[i], tokens[i], server.model_name(parsed.params),
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
    # the fields that make a chat's prompt, as the chat door renders it
    chat = parse_chat({k: body[k] for k in CHAT_PROMPT_FIELDS if k in body}, node.tool_format)
    return JSONResponse({"prompt": chat_turn.render(node, chat, server.config).prompt})
