"""The embedding and rerank doors: OpenAI's POST /v1/embeddings, llama-server's
/embedding and /embeddings (per-token vectors with pooling none, embd_normalize),
and /rerank, /v1/rerank in Jina's and Cohere's shape (TEI's with `texts`). Each
input is tokenized as llama-server tokenizes it (special tokens added and parsed)
and served by the embedding node (dgr.embedding)."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import trio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from dgr.doors.context import ServerState
from dgr.doors.fields import BadRequest, check_fields, json_object, read_bool, read_int
from dgr.embedding import MAX_INPUTS
from dgr.pooling import normalize


async def _input_ids(node, entry: Any, field: str) -> list[int]:
    """One input's tokens: a string, token ids, a list mixing both (pieces of one
    input), {"prompt_string": text} or {"content": [{"type": "text", "text": ...}]}."""
    if isinstance(entry, str):
        if not entry:
            raise BadRequest(f"'{field}' holds an empty string: there is nothing to embed",
                             field)
        return await node.tokenize_off_loop(entry, add_special=True, parse_special=True)
    if isinstance(entry, dict):
        if isinstance(entry.get("prompt_string"), str) and len(entry) == 1:
            return await _input_ids(node, entry["prompt_string"], field)
        parts = entry.get("content")
        if len(entry) != 1 or not isinstance(parts, list) or not parts or not all(
                isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                for p in parts):
            raise BadRequest(f"an object in '{field}' must be {{\"prompt_string\": text}} or "
                             "{\"content\": [{\"type\": \"text\", \"text\": ...}]} (this model "
                             "takes text only)", field)
        return await _input_ids(node, "".join(p["text"] for p in parts), field)
    if isinstance(entry, list) and entry and all(
            isinstance(t, str) or (isinstance(t, int) and not isinstance(t, bool))
            for t in entry):
        ids: list[int] = []
        for i, piece in enumerate(entry):
            if isinstance(piece, str):
                ids += await node.tokenize_off_loop(piece, add_special=i == 0,
                                                    parse_special=True)
            else:
                ids.append(piece)
        return ids
    raise BadRequest(f"'{field}' must be a string, token ids, or a list of those", field)


async def _inputs(node, body: dict) -> list[list[int]]:
    """The request's inputs as token ids."""
    field = "input" if "input" in body else "content"
    value = body.get(field)
    if value is None:
        raise BadRequest("'input' (or 'content') must be given", "input")
    # one input: a string, an object, or a list of ids (with text pieces among them)
    one = not isinstance(value, list) or any(
        isinstance(t, int) and not isinstance(t, bool) for t in value)
    entries = [value] if one else value
    if not entries:
        raise BadRequest(f"'{field}' is an empty list: there is nothing to embed", field)
    if len(entries) > MAX_INPUTS:
        raise BadRequest(f"'{field}' holds {len(entries)} inputs; a request holds at most "
                         f"{MAX_INPUTS}", field)
    return [await _input_ids(node, entry, field) for entry in entries]


def _norm(body: dict) -> int:
    value = read_int(body, "embd_normalize", -1, 1 << 20)
    return 2 if value is None else value


async def openai_embeddings(request: Request, server: ServerState) -> Response:
    """POST /v1/embeddings: each input's pooled vector, normalized (Euclidean unless
    embd_normalize says otherwise), as floats or base64 float32 (encoding_format)."""
    node = server.ready_embedder("embedding")
    body = json_object(await server.read_json(request))
    check_fields(body, "/v1/embeddings")
    if "input" not in body and "content" in body:  # llama-server's native field
        return await _native(node, body)
    if node.pooling == "none":
        raise BadRequest("pooling 'none' gives a vector per token, which OpenAI's shape cannot "
                         "carry: use /embedding, or start the node with another --pooling")
    fmt = body.get("encoding_format") or "float"
    if fmt not in ("float", "base64"):
        raise BadRequest("'encoding_format' must be 'float' or 'base64'", "encoding_format")
    dimensions = read_int(body, "dimensions", 1, 1 << 20)
    n_embd = node.engine_info["n_embd"]
    if dimensions is not None and dimensions != n_embd:
        raise BadRequest(f"this model's vectors have {n_embd} dimensions and it declares no "
                         "shorter ones (Matryoshka truncation): 'dimensions' must be "
                         f"{n_embd} or absent", "dimensions")
    inputs = await _inputs(node, body)
    norm = _norm(body)
    vectors = await node.embed(inputs)
    data = []
    for i, vector in enumerate(vectors):
        vector = normalize(vector, norm)
        entry = {"object": "embedding", "index": i,
                 "embedding": vector.tolist() if fmt == "float" else
                 base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")}
        if fmt == "base64":
            entry["encoding_format"] = "base64"
        data.append(entry)
    tokens = sum(len(ids) for ids in inputs)
    return JSONResponse({"object": "list", "data": data,
                         "model": body.get("model") or server.model_id,
                         "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


async def llama_embeddings(request: Request, server: ServerState) -> Response:
    """llama-server's POST /embedding and /embeddings: [{"index", "embedding"}], the
    embedding a list of one pooled vector (normalized by embd_normalize, default
    Euclidean), or with pooling none every token's vector, as computed."""
    node = server.ready_embedder("embedding")
    body = json_object(await server.read_json(request))
    check_fields(body, "/v1/embeddings")
    return await _native(node, body)


async def _native(node, body: dict) -> Response:
    inputs = await _inputs(node, body)
    norm = _norm(body)
    vectors = await node.embed(inputs)
    out = []
    for i, vector in enumerate(vectors):
        rows = vector.tolist() if vector.ndim == 2 else [normalize(vector, norm).tolist()]
        out.append({"index": i, "embedding": rows})
    return JSONResponse(out)


async def rerank(request: Request, server: ServerState) -> Response:
    """POST /rerank, /v1/rerank (and /reranking): the documents' relevance to the query,
    best first, top_n of them; Jina's and Cohere's shape (`documents`,
    `relevance_score`, `return_documents`), or TEI's (`texts`: a bare list of
    {"index", "score"}, with `return_text`)."""
    node = server.ready_embedder("rerank")
    body = json_object(await server.read_json(request))
    check_fields(body, "/rerank")
    query = body.get("query")
    if not isinstance(query, str) or not query:
        raise BadRequest("'query' must be a non-empty string", "query")
    tei = "texts" in body
    field = "texts" if tei else "documents"
    documents = body.get(field)
    if not isinstance(documents, list) or not documents:
        raise BadRequest(f"'{field}' must be a non-empty list of strings", field)
    if len(documents) > MAX_INPUTS:
        raise BadRequest(f"'{field}' holds {len(documents)} documents; a request holds at "
                         f"most {MAX_INPUTS}", field)
    texts = []
    for document in documents:
        text = document.get("text") if isinstance(document, dict) else document
        if not isinstance(text, str) or not text:
            raise BadRequest(f"each of '{field}' must be a non-empty string (or "
                             "{\"text\": string})", field)
        texts.append(text)
    top_n = read_int(body, "top_n", 1, 1 << 30) or len(texts)
    with_text = read_bool(body, "return_text" if tei else "return_documents")
    inputs = await trio.to_thread.run_sync(node.rerank_inputs, query, texts)
    scores = await node.embed(inputs)
    label = "score" if tei else "relevance_score"
    # best first; equal scores keep the documents' order
    order = sorted(range(len(texts)), key=lambda i: -float(scores[i][0]))[:top_n]
    results = []
    for i in order:
        entry = {"index": i, label: float(np.float32(scores[i][0]))}
        if with_text:
            entry |= {"text": texts[i]} if tei else {"document": {"text": texts[i]}}
        results.append(entry)
    if tei:
        return JSONResponse(results)
    tokens = sum(len(ids) for ids in inputs)
    return JSONResponse({"object": "list", "model": body.get("model") or server.model_id,
                         "results": results,
                         "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})
