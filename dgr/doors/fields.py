"""What each door accepts: its fields, in one table.

Every field a door lists is honoured; a hint (HINTS) is accepted and changes
nothing that the protocol promises (attribution, retention, routing); anything
else is refused with a 400 naming it: a parameter silently ignored would be a
wrong answer that looks right.
"""

from __future__ import annotations

from typing import Optional

from dgr.errors import InvalidRequest

# the OpenAI sampling fields that completions and chat share; `top_k`, `min_p`,
# `ignore_eos`, `repeat_penalty` (alias `repetition_penalty`) and `repeat_last_n` are
# the common extensions that llama-server and vLLM accept, `typical_p` llama-server's
_SAMPLING = {"model", "max_tokens", "temperature", "top_p", "top_k", "min_p", "typical_p", "n",
             "stream", "stream_options", "stop", "seed", "ignore_eos", "logit_bias",
             "presence_penalty", "frequency_penalty", "repeat_penalty", "repetition_penalty",
             "repeat_last_n", "response_format", "grammar", "min_tokens", "stop_token_ids",
             "speculation", "timings_per_token", "return_progress", "n_predict", "lora",
             "skip_special_tokens"}

# the chat door's fields that make a chat's prompt (the endpoints that show a chat's
# prompt or tokens take these, as the chat door reads them)
CHAT_PROMPT_FIELDS = {"messages", "tools", "tool_choice", "parallel_tool_calls",
                      "add_generation_prompt", "continue_final_message", "chat_template_kwargs",
                      "reasoning_effort", "thinking_budget_tokens", "reasoning_budget_tokens"}

FIELDS = {
    "/v1/completions": _SAMPLING | {"prompt", "logprobs", "echo", "priority"},
    "/v1/chat/completions": _SAMPLING | {"messages", "logprobs", "top_logprobs",
                                         "max_completion_tokens", "tools", "tool_choice",
                                         "parallel_tool_calls", "json_schema",
                                         "add_generation_prompt", "continue_final_message",
                                         "verbose", "chat_template_kwargs",
                                         "reasoning_format", "thinking_budget_tokens",
                                         "reasoning_budget_tokens", "reasoning_effort",
                                         "reasoning_budget_message",
                                         "include_reasoning", "separate_reasoning",
                                         "stream_reasoning", "priority"},
    "/v1/responses": {"model", "input", "instructions", "max_output_tokens", "temperature",
                      "top_p", "top_k", "min_p", "repetition_penalty", "text", "stream", "store",
                      "previous_response_id", "seed", "tools", "tool_choice",
                      "parallel_tool_calls", "timings_per_token", "return_progress",
                      "reasoning", "priority"},
    # llama-server's shape, and vLLM's (what vllm-router's cache-aware policy sends)
    # Anthropic's Messages API (`thinking` only as {"type": "disabled"})
    "/v1/messages": {"model", "max_tokens", "messages", "system", "stop_sequences",
                     "temperature", "top_p", "top_k", "stream", "tools", "tool_choice",
                     "thinking", "metadata"},
    "/v1/messages/count_tokens": {"model", "messages", "system", "tools", "tool_choice",
                                  "thinking"},
    # llama.cpp's native completion
    "/completion": {"prompt", "n_predict", "max_tokens", "temperature", "top_k", "top_p", "min_p",
                    "typical_p", "seed", "stop", "stream", "n_probs", "ignore_eos",
                    "repeat_penalty", "repeat_last_n", "presence_penalty", "frequency_penalty",
                    "logit_bias", "grammar", "json_schema", "return_tokens", "timings_per_token",
                    "return_progress", "response_fields", "model", "lora", "priority"},
    "/tokenize": {"content", "add_special", "with_pieces", "model", "prompt",
                  "add_special_tokens", "return_token_strs"} | CHAT_PROMPT_FIELDS,
    "/detokenize": {"tokens"},
    # OpenAI's embeddings, and llama-server's native /embedding (content, embd_normalize)
    "/v1/embeddings": {"input", "content", "model", "encoding_format", "dimensions",
                       "embd_normalize"},
    # Jina's and Cohere's rerank (documents, top_n, return_documents), TEI's (texts,
    # return_text)
    "/rerank": {"query", "documents", "texts", "top_n", "return_documents", "return_text",
                "model"},
}
# OpenAI's own hints, per door (`user` names a request's tenant where no API key or
# X-Tenant header does: dgr.doors.request.requester_of)
# llama-server's slot preference, prompt caching and n_keep change no output here (the
# node places sessions and caches prefixes itself, bitwise, and never shifts a context)
_LLAMA_HINTS = {"id_slot", "cache_prompt", "n_keep"}
HINTS = {
    "/v1/completions": {"user", "metadata", "store", "service_tier"} | _LLAMA_HINTS,
    "/v1/chat/completions": {"user", "metadata", "store", "service_tier"} | _LLAMA_HINTS,
    "/v1/responses": {"user", "metadata", "service_tier"},
    "/v1/messages": {"service_tier"},
    "/v1/messages/count_tokens": set(),
    "/completion": _LLAMA_HINTS,
    "/tokenize": set(),
    "/detokenize": set(),
    "/v1/embeddings": {"user"},
    "/rerank": {"user"},
}


# Fields routers add to every request they forward (smg 1.13 and vllm-router 0.1.17
# re-serialise bodies from their request structs, defaults included), each with the
# value it adds, which asks for nothing dgr does differently: accepted at that value,
# a 400 naming the field at any other. The sampling fields routers add (top_k -1,
# min_p 0, repetition_penalty 1) are honoured fields of the doors above.
ROUTER_DEFAULTS = {
    "priority": (0, "smg (Responses)"),
    "no_stop_trim": (False, "vllm-router"),                # stop strings are trimmed
    "return_hidden_states": (False, "vllm-router"),
    "add_special_tokens": (True, "vLLM's embeddings"),    # special tokens are added
    "truncate_prompt_tokens": (None, "vLLM's embeddings"),  # an input past the context: 400
}
ROUTED = {"/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/embeddings"}


class BadRequest(InvalidRequest):
    """A request a door refuses (400), naming the field at fault."""

    def __init__(self, message: str, param: Optional[str] = None):
        super().__init__(message)
        self.param = param


def check_fields(body: dict, door: str, names: Optional[dict] = None) -> None:
    """Refuse a field `door` neither honours nor takes as a hint (`names` maps a
    field to the name the error gives it)."""
    for name, value in body.items():
        if name in FIELDS[door] or name in HINTS[door]:
            continue
        shown = (names or {}).get(name, name)
        if door in ROUTED and name in ROUTER_DEFAULTS:
            default, _ = ROUTER_DEFAULTS[name]
            if value == default and type(value) is type(default):
                continue
            raise BadRequest(f"'{shown}' is supported only at {default!r}, as routers send it",
                             shown)
        raise BadRequest(f"'{shown}' is not supported by this server", shown)


def json_object(body) -> dict:
    """A request body that must be a JSON object."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body


def read_bool(body: dict, name: str) -> bool:
    """A boolean field (absent or null: False)."""
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise BadRequest(f"'{name}' must be a boolean", name)
    return value


def read_int(body: dict, name: str, lo: int, hi: int) -> Optional[int]:
    """An integer field within lo..hi (absent or null: None)."""
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"'{name}' must be an integer", name)
    if not lo <= value <= hi:
        raise BadRequest(f"'{name}' must be within {lo}..{hi}, got {value}", name)
    return value
