"""The adapters' doors: vLLM's run-time loading and unloading (`POST
/v1/load_lora_adapter`, `/v1/unload_lora_adapter`, with --runtime-lora), each adapter
in /v1/models as vLLM lists them (its `parent` the base model), and llama-server's
`GET`/`POST /lora-adapters` (the global scales). The adapters themselves:
dgr.adapters."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from dgr.doors.context import ServerState
from dgr.doors.fields import BadRequest, json_object
from dgr.doors.problems import error_response


def model_entries(server: ServerState) -> list[dict]:
    """/v1/models' entry of each adapter served (vLLM's shape): loaded, or known and
    loaded when named (--lora-dir, --lora-modules)."""
    node = server.node
    if node is None:
        return []
    paths = {name: node.adapters.known.path(name) for name in node.adapters.known.names()}
    paths.update((a["name"], a["path"]) for a in node.adapters.report())
    return [{"id": name, "object": "model", "created": 0, "owned_by": "dgr", "root": path,
             "parent": server.model_id, "max_model_len": node.budgets.kv_cells_per_session}
            for name, path in paths.items()]


async def _runtime_request(request: Request, server: ServerState, fields: set[str]):
    """(node, body) of a run-time loading request (its `fields` and no other), or the
    403 where --runtime-lora is off."""
    node = server.ready_node()
    if not server.config.runtime_lora:
        return node, error_response(403, "loading adapters at run time is off: start the "
                                    "node with --runtime-lora", "invalid_request_error",
                                    "runtime_lora_off")
    body = json_object(await server.read_json(request))
    unknown = sorted(set(body) - fields)
    if unknown:
        raise BadRequest(f"'{unknown[0]}' is not supported by this server", unknown[0])
    return node, body


def _string(body: dict, name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value:
        raise BadRequest(f"'{name}' must be a non-empty string", name)
    return value


async def load_adapter(request: Request, server: ServerState) -> Response:
    """vLLM's: {"lora_name", "lora_path"} loads the file as model `lora_name`."""
    node, body = await _runtime_request(request, server, {"lora_name", "lora_path",
                                                          "lora_int_id", "load_inplace"})
    if isinstance(body, Response):
        return body
    name = _string(body, "lora_name")
    await node.adapters.load(name, _string(body, "lora_path"))
    return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")


async def unload_adapter(request: Request, server: ServerState) -> Response:
    """vLLM's: {"lora_name"} unloads it (its sessions running finish with it)."""
    node, body = await _runtime_request(request, server, {"lora_name", "lora_int_id"})
    if isinstance(body, Response):
        return body
    name = _string(body, "lora_name")
    node.adapters.unload(name)
    return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")


async def lora_adapters(request: Request, server: ServerState) -> Response:
    """llama-server's: GET lists the adapters with their global scales; POST
    [{"id", "scale"}] sets them (those not listed: 0)."""
    node = server.ready_node()
    if request.method == "POST":
        body = await server.read_json(request)
        if not isinstance(body, list) or not all(
                isinstance(e, dict) and type(e.get("id")) is int
                and type(e.get("scale")) in (int, float) for e in body):
            raise BadRequest('the body must be a list of {"id": adapter id, "scale": number}')
        node.adapters.set_global_scales({e["id"]: e["scale"] for e in body})
        return JSONResponse({"success": True})
    return JSONResponse([{"id": a["id"], "path": a["path"], "scale": a["global_scale"],
                          "task_name": "", "prompt_prefix": ""}
                         for a in node.adapters.report()])
