"""llama-server's /tokenize and /detokenize, /tokenize also in vLLM's shape, and
vLLM's render endpoints: what a router that routes by prompt tokens (vllm-router's
cache-aware policy) asks a worker, answered with the tokens the node's own doors
compute for the same body."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from dgr.doors import chat_turn
from dgr.doors.context import ServerState
from dgr.doors.fields import (CHAT_PROMPT_FIELDS, BadRequest, check_fields, json_object,
                              read_bool)
from dgr.doors.openai import parse_chat, parse_completion
from dgr.doors.responses import parse_response_request


async def tokenize(request: Request, server: ServerState) -> Response:
    node = server.ready_vocabulary()
    body = await server.read_json(request)
    if isinstance(body, dict) and ("prompt" in body or "messages" in body):
        ids = await vllm_tokens(server, body)
        strs = ([node.token_text(t) for t in ids] if read_bool(body, "return_token_strs")
                else None)
        tokens = (_pieces(node, ids) if read_bool(body, "with_pieces") else ids)
        return JSONResponse({"count": len(ids), "max_model_len": node.engine_info["n_ctx_seq"],
                             "tokens": tokens, "token_strs": strs})
    content, add_special, with_pieces = parse_tokenize(body)
    ids = await node.tokenize_off_loop(content, add_special=add_special, parse_special=True)
    return JSONResponse({"tokens": _pieces(node, ids) if with_pieces else ids})


def _pieces(node, ids: list[int]) -> list[dict]:
    """llama-server's with_pieces: each token's id and piece."""
    return [{"id": t, "piece": token_piece(node.token_bytes(t))} for t in ids]


async def render_completion(request: Request, server: ServerState) -> Response:
    """vLLM's POST /v1/completions/render: a completion body's prompts as token ids."""
    node = server.ready_node()
    parsed = parse_completion(await server.read_json(request))
    rendered = []
    for prompt in parsed.prompts:
        ids = (await node.tokenize_off_loop(prompt) if isinstance(prompt, str) else prompt)
        rendered.append({"token_ids": ids})
    return JSONResponse(rendered)


async def render_chat(request: Request, server: ServerState) -> Response:
    """vLLM's POST /v1/chat/completions/render (and /v1/responses/render): the prompt
    the chat template makes of the body, as token ids."""
    return JSONResponse({"token_ids": await _chat_body_tokens(request, server)})


async def input_tokens(request: Request, server: ServerState) -> Response:
    """llama-server's POST /v1/chat/completions/input_tokens (and the Responses
    API's): how many tokens the body's prompt is, as its door would make it."""
    return JSONResponse({"input_tokens": len(await _chat_body_tokens(request, server))})


async def _chat_body_tokens(request: Request, server: ServerState) -> list[int]:
    node = server.ready_node()
    body = await server.read_json(request)
    if "/responses/" in request.url.path:
        parsed = parse_response_request(body, server.responses, node.tool_format)
        return await chat_turn.render(node, parsed.chat, server.config, "input").tokens(node)
    return await chat_turn.render(node, parse_chat(body, node.tool_format),
                                  server.config).tokens(node)


async def vllm_tokens(server: ServerState, body: dict) -> list[int]:
    """vLLM's /tokenize: a prompt ({"model", "prompt"}) or a chat ({"model",
    "messages"} and what else says how the chat door makes its prompt: tools, the
    thinking switch and budget) as the completions and chat doors tokenize it."""
    node = server.ready_node()
    check_fields(body, "/tokenize")
    if "messages" in body:
        chat = parse_chat({k: body[k] for k in CHAT_PROMPT_FIELDS if k in body},
                          node.tool_format)
        return await chat_turn.render(node, chat, server.config).tokens(node)
    _no_chat_fields(body, "prompt")
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise BadRequest("'prompt' must be a string", "prompt")
    add_special = body.get("add_special_tokens", True)
    if not isinstance(add_special, bool):
        raise BadRequest("'add_special_tokens' must be a boolean", "add_special_tokens")
    return await node.tokenize_off_loop(prompt, add_special=add_special)


async def detokenize(request: Request, server: ServerState) -> Response:
    node = server.ready_vocabulary()
    tokens = parse_detokenize(await server.read_json(request))
    return JSONResponse({"content": node.detokenize(tokens)})


def parse_tokenize(body: Any) -> tuple[str, bool, bool]:
    """llama-server's POST /tokenize: (content, add_special, with_pieces)."""
    body = json_object(body)
    check_fields(body, "/tokenize")
    if body.get("return_token_strs"):
        raise BadRequest("'return_token_strs' goes with vLLM's 'prompt' or 'messages'",
                         "return_token_strs")
    _no_chat_fields(body, "content")
    content = body.get("content")
    if not isinstance(content, str):
        raise BadRequest("'content' must be a string", "content")
    return content, read_bool(body, "add_special"), read_bool(body, "with_pieces")


def _no_chat_fields(body: dict, given: str) -> None:
    """Refuse the fields of a chat's tokens beside a text's (`given`)."""
    for name in sorted(CHAT_PROMPT_FIELDS - {"messages"}):
        if body.get(name) is not None:
            raise BadRequest(f"'{name}' goes with 'messages', not '{given}'", name)


def parse_detokenize(body: Any) -> list[int]:
    """llama-server's POST /detokenize: the token ids."""
    body = json_object(body)
    check_fields(body, "/detokenize")
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise BadRequest("'tokens' must be a list of token ids", "tokens")
    return tokens


def token_piece(piece: bytes) -> Any:
    """A token's piece as llama-server reports it: its text, or its bytes when
    they are not valid UTF-8 on their own (part of a character)."""
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError:
        return list(piece)
