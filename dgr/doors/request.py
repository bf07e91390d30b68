"""One generation request, whichever door it came in by (GenerationRequest), and
the door-neutral rules every door's parser builds it with: the sampling values
it read (each under the door's own name for it, so that an error names the
field the client sent), a response format's grammar, a chat's messages and how
its prompt ends. Each door reads its own protocol's fields (dgr.doors.fields)
and calls these with typed values; no door goes through another protocol's JSON.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import attrs

from dgr import reasoning
from dgr import tools as tool_calls
from dgr.chat import CONTINUED_TEXT
from dgr.spec import DEFAULT_TENANT, Requester, SamplingParams
from dgr.tenants import checked_name
from dgr.doors.fields import BadRequest, read_bool, read_int
from dgr.errors import InvalidRequest

MAX_CHOICES = 32  # prompts x n in one request
TEMPERATURE_RANGE = (0.0, 2.0)  # OpenAI's, narrower than the library's


@attrs.frozen
class GenerationRequest:
    """What a door asks of the node: prompts or a chat, how to sample, and the
    outputs wanted. A per-request option is a field here, set by the doors that
    read it."""

    params: SamplingParams
    prompts: list = attrs.field(factory=list)  # completions: each a str or token ids
    # a chat: its messages as `chat_message` makes them (the prompt is rendered later)
    messages: Optional[list[dict]] = None
    stream: bool = False
    include_usage: bool = False
    n: int = 1  # choices per prompt
    top_logprobs: int = 0  # chat: alternatives reported per token (logprobs may be on without)
    echo: bool = False  # completions: each choice's text begins with its prompt
    tools: Optional[tool_calls.ToolSpec] = None  # chat: tools the answer may call
    timings_per_token: bool = False  # llama-server's: each streamed chunk has its timings
    return_progress: bool = False  # llama-server's: a stream reports its prompt's prefill
    # a chat: whether the prompt ends by opening the assistant's turn, or continues the
    # last message (the assistant's: a prefill); see `prompt_ending`
    add_generation_prompt: bool = True
    continue_final: bool = False
    verbose: bool = False  # llama-server's: the response shows the prompt (`__verbose`)
    # a chat of a thinking model (dgr.reasoning): whether it may think (None: as its
    # template does), and how the thinking is returned (None: the server's
    # --reasoning-format)
    thinking: Optional[bool] = None
    effort: Optional[str] = None  # reasoning_effort, for templates that read it
    reasoning_format: Optional[str] = None
    thinking_budget: Optional[int] = None  # tokens (None or -1: the server's --reasoning-budget)
    # llama-server's: text the model's thinking ends with where the budget cuts it
    reasoning_budget_message: str = ""
    # vLLM's include_reasoning (false: the thinking split off is not returned) and
    # SGLang's stream_reasoning (false: streamed in one delta once it ends)
    include_reasoning: bool = True
    stream_reasoning: bool = True
    requester: Requester = Requester()  # whose it is and its priority (`requester_of`)

    @property
    def chat(self) -> bool:
        return self.messages is not None


def named_values(body: dict, names: dict[str, str]) -> dict[str, tuple[str, Any]]:
    """{SamplingParams field: (the door's name, value)} of the values `body` gives
    for a door's table `names` ({the door's name: the field}); where two names
    give one field, the later in the table wins."""
    return {field: (name, body[name]) for name, field in names.items()
            if body.get(name) is not None}


def sampling(values: dict[str, tuple[str, Any]], *, temperature: float = 1.0, logprobs: int = 0,
             logit_bias: Optional[dict] = None, grammar: Optional[str] = None,
             prompt_logprobs: Optional[int] = None) -> SamplingParams:
    """The SamplingParams of the values a door read (`named_values`), `temperature`
    being the door's default; a bad value is a 400 naming the door's field."""
    fields = {field: value for field, (_, value) in values.items()}
    if "lora" in values:
        fields["lora"] = lora_pairs(*values["lora"])
    if "model" in values and not isinstance(values["model"][1], str):
        raise BadRequest("'model' must be a string", values["model"][0])
    if "temperature" in values:
        name, value = values["temperature"]
        low, high = TEMPERATURE_RANGE
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or not math.isfinite(value)):
            raise BadRequest(f"'{name}' must be a number", name)
        if not low <= value <= high:
            raise BadRequest(f"'{name}' must be within {low}..{high}, got {value}", name)
        fields["temperature"] = float(value)
    else:
        fields["temperature"] = temperature
    stop = fields.get("stop")
    if stop is not None and not (isinstance(stop, str) and stop) and not (
            isinstance(stop, list) and all(isinstance(s, str) and s for s in stop)):
        name = values["stop"][0]
        raise BadRequest(f"'{name}' must be a non-empty string or a list of them", name)
    if fields.get("top_k") == -1:
        fields["top_k"] = 0  # llama-server's "no top-k"
    try:
        return SamplingParams(**fields, logprobs=logprobs, logit_bias=logit_bias or {},
                              grammar=grammar, prompt_logprobs=prompt_logprobs)
    except InvalidRequest as exc:
        raise BadRequest(str(exc), values.get(exc.field, (exc.field,))[0]) from None


def lora_pairs(name: str, value: Any) -> Optional[tuple]:
    """llama-server's per-request adapters ([{"id", "scale"}]) as (id, scale) pairs;
    an empty list asks for none in particular (the global scales), as there."""
    if not isinstance(value, list) or not all(
            isinstance(entry, dict) and set(entry) <= {"id", "scale"}
            and isinstance(entry.get("id"), int) and not isinstance(entry.get("id"), bool)
            and isinstance(entry.get("scale"), (int, float))
            and not isinstance(entry.get("scale"), bool) for entry in value):
        raise BadRequest(f"'{name}' must be a list of {{\"id\": adapter id, \"scale\": number}}",
                         name)
    return tuple((entry["id"], entry["scale"]) for entry in value) or None


def reasoning_fields(body: dict, effort=None) -> dict:
    """The GenerationRequest fields of a chat's `chat_template_kwargs` (vLLM's and
    llama-server's; `enable_thinking` and `reasoning_effort` are the ones templates of
    thinking models read), OpenAI's `reasoning_effort` (or the door's own `effort`:
    the Responses API's reasoning.effort), and llama-server's `reasoning_format`."""
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise BadRequest("'chat_template_kwargs' must be an object", "chat_template_kwargs")
    for key in kwargs:
        if key not in ("enable_thinking", "reasoning_effort"):
            raise BadRequest(f"'chat_template_kwargs.{key}' is not supported (only "
                             "enable_thinking and reasoning_effort)", "chat_template_kwargs")
    thinking = kwargs.get("enable_thinking")
    if thinking is not None and not isinstance(thinking, bool):
        raise BadRequest("'chat_template_kwargs.enable_thinking' must be a boolean",
                         "chat_template_kwargs")
    effort = effort or body.get("reasoning_effort") or kwargs.get("reasoning_effort")
    if effort is not None and effort not in reasoning.EFFORTS:
        raise BadRequest(f"'reasoning_effort' must be one of {', '.join(reasoning.EFFORTS)}",
                         "reasoning_effort")
    fmt = body.get("reasoning_format")
    if fmt is not None and fmt not in reasoning.FORMATS:
        raise BadRequest(f"'reasoning_format' must be one of {', '.join(reasoning.FORMATS)}",
                         "reasoning_format")
    if "separate_reasoning" in body and not read_bool(body, "separate_reasoning"):
        fmt = "none"  # SGLang's: the thinking stays in the answer's text
    budget = None
    for name in ("thinking_budget_tokens", "reasoning_budget_tokens"):  # llama-server's
        if body.get(name) is not None:
            budget = read_int(body, name, -1, 1 << 30)
    shown = {name: read_bool(body, name) for name in ("include_reasoning", "stream_reasoning")
             if name in body}
    message = body.get("reasoning_budget_message") or ""
    if not isinstance(message, str):
        raise BadRequest("'reasoning_budget_message' must be a string", "reasoning_budget_message")
    return {"thinking": thinking, "effort": effort, "reasoning_format": fmt,
            "thinking_budget": budget, "reasoning_budget_message": message} | shown


def prompt_list(prompt: Any, name: str = "prompt") -> list:
    """A completion's prompts: one prompt (a string or token ids), or a list of
    them (one choice each)."""
    several = isinstance(prompt, list) and bool(prompt) and all(
        isinstance(p, (str, list)) for p in prompt)
    prompts = prompt if several else [prompt]
    for p in prompts:
        if isinstance(p, str):
            if not p:
                raise BadRequest(f"'{name}' must not be empty", name)
        elif not (isinstance(p, list) and p
                  and all(isinstance(t, int) and not isinstance(t, bool) for t in p)):
            raise BadRequest(f"'{name}' must be a non-empty string, a list of token ids, or a "
                             "list of those", name)
    return prompts


def gbnf(value: Any, name: str) -> str:
    """A request's own GBNF grammar text."""
    if not isinstance(value, str) or not value.strip():
        raise BadRequest(f"'{name}' must be non-empty GBNF text", name)
    return value


def json_object_grammar() -> str:
    """GBNF of any JSON object (OpenAI's json_object response format)."""
    from llama_cpp.llama_grammar import JSON_GBNF

    return JSON_GBNF


def schema_grammar(schema: Any, where: str, name: str) -> str:
    """GBNF of a JSON schema (llama-cpp-python's converter); `where` names it in
    the error, `name` is the field at fault."""
    if not isinstance(schema, dict):
        raise BadRequest(f"{where} must be an object", name)
    try:
        return tool_calls.json_grammar(schema)
    except Exception as exc:  # the converter's message names what it cannot handle
        raise BadRequest(f"unsupported JSON schema: {exc}", name) from None


def joined_text(parts: list[str]) -> str:
    """A message's text parts (or blocks) as its one text: joined by a newline, as
    llama.cpp's server and vLLM join them."""
    return "\n".join(parts)


def chat_message(role: str, content: str, calls: Optional[list[dict]] = None,
                 answers: Optional[str] = None, thought: Optional[str] = None,
                 parts: Optional[list[str]] = None) -> dict:
    """A chat message as the chat template renders it: a role of ROLES' values, its
    text, an assistant's tool calls ({"id", "type": "function", "function": {"name",
    "arguments": a JSON value}}), or the call a tool message answers; an assistant's
    thinking (`reasoning_content`, which templates of thinking models render or drop;
    gpt-oss's reads it as `thinking`). An assistant's message given in text `parts`
    (its content their `joined_text`), continued as the final message, adds them
    joined by a blank line, as llama.cpp continues one."""
    message = {"role": role, "content": content}
    if role == "assistant" and parts is not None and len(parts) > 1:
        message[CONTINUED_TEXT] = "\n\n".join(parts)
    if thought:
        message["reasoning_content"] = message["thinking"] = thought
    if calls:
        message["tool_calls"] = calls
    if role == "tool":
        message["tool_call_id"] = answers
    return message


def tool_call(call_id: Any, name: Any, arguments: Any) -> dict:
    """An assistant's tool call in a chat message (`chat_message`)."""
    if not isinstance(name, str) or not name:
        raise BadRequest("a tool call needs a function name", "messages")
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def checked_chat(messages: list[dict], field: str = "messages") -> list[dict]:
    """A chat's messages (`chat_message`'s), each tool message answering an earlier
    call; named `field` in an error."""
    if not messages:
        raise BadRequest(f"'{field}' must be a non-empty list", field)
    call_ids = set()
    for message in messages:
        call_ids.update(call["id"] for call in message.get("tool_calls", ()))
        if message["role"] == "tool" and message["tool_call_id"] not in call_ids:
            raise BadRequest(f"tool message for {message['tool_call_id']!r} answers no earlier "
                             "tool call", field)
    return messages


def prompt_ending(messages: list[dict], add: Optional[bool] = None,
                  continue_asked: bool = False) -> dict:
    """How a chat's prompt ends: a chat whose last message is the assistant's text
    continues it (llama-server's prefill, Anthropic's; vLLM's continue_final_message
    asks for it), unless add_generation_prompt says otherwise; else the assistant's
    turn is opened, unless add_generation_prompt is false. The fields of
    GenerationRequest it sets."""
    if continue_asked and add:
        raise BadRequest("'continue_final_message' continues the last message, so "
                         "'add_generation_prompt' cannot be true beside it",
                         "continue_final_message")
    last_is_text = messages[-1]["role"] == "assistant" and not messages[-1].get("tool_calls")
    if continue_asked and not last_is_text:
        raise BadRequest("'continue_final_message' needs the last message to be the "
                         "assistant's text", "continue_final_message")
    if len(messages) > 1 and messages[-1]["role"] == messages[-2]["role"] == "assistant":
        raise BadRequest("the chat cannot end with two assistant messages", "messages")
    continue_final = continue_asked or (last_is_text and add is None)
    return {"add_generation_prompt": add is not False and not continue_final,
            "continue_final": continue_final}


def requester_of(request, user: Any = None, priority: Any = None,
                 names: tuple[str, str] = ("user", "priority")) -> Requester:
    """Whose a request is: the tenant its API key names (--api-keys, found by the
    server's guard), else its X-Tenant header, else `user` (the body's, the door's
    field `names[0]`); and how urgent: `priority` (the door's field `names[1]`), else
    its X-Priority header, else 0."""
    tenant = request.scope.get("dgr.tenant") or request.headers.get("x-tenant")
    field = "X-Tenant" if tenant is not None else names[0]
    tenant = tenant if tenant is not None else user
    if tenant is not None:
        if not isinstance(tenant, str):
            raise BadRequest(f"'{field}' must be a string", field)
        try:
            checked_name(tenant, f"'{field}'")
        except ValueError as exc:
            raise BadRequest(str(exc), field) from None
    field = names[1]
    if priority is None and "x-priority" in request.headers:
        field, priority = "X-Priority", request.headers["x-priority"].strip()
        try:
            priority = int(priority)
        except ValueError:
            raise BadRequest("'X-Priority' must be an integer", field) from None
    try:
        return Requester(tenant or DEFAULT_TENANT, 0 if priority is None else priority)
    except InvalidRequest as exc:  # the field as the door names it: its errors may name no param
        raise BadRequest(f"'{field}': {exc}", field) from None
