"""Google Cloud Vertex AI's prediction protocol for custom containers, as
llama-server serves it. With AIP_MODE=PREDICTION in the environment (Vertex AI
sets it), POST AIP_PREDICT_ROUTE (default /predict) takes {"instances": [...]},
each instance a body for the door its `@requestFormat` names (a path's camelCase
alias, "chatCompletions" for /v1/chat/completions, or the path itself), all
answered whole and together: {"predictions": [...]}, each a door's answer or its
error object. AIP_HEALTH_ROUTE also serves /health; AIP_HTTP_PORT is the port.
https://cloud.google.com/vertex-ai/docs/predictions/custom-container-requirements
"""

from __future__ import annotations

import json
from typing import Awaitable, Callable, Mapping, Optional

import attrs
import trio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from dgr.doors.problems import Problem, openai, openai_error

MAX_INSTANCES = 128  # llama-server's bound
Endpoint = Callable[[Request], Awaitable[Response]]


@attrs.frozen
class VertexSettings:
    predict_route: str
    health_route: Optional[str]
    port: Optional[int]

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Optional["VertexSettings"]:
        """The settings Vertex AI gives a container, or None outside it."""
        if env.get("AIP_MODE") != "PREDICTION":
            return None
        port = env.get("AIP_HTTP_PORT")
        return cls(env.get("AIP_PREDICT_ROUTE") or "/predict",
                   env.get("AIP_HEALTH_ROUTE") or None, int(port) if port else None)


def request_format(path: str) -> str:
    """A path's camelCase alias: /v1/chat/completions -> chatCompletions."""
    words = [w for w in path.removeprefix("/v1").replace("-", "/").replace("_", "/").split("/")
             if w]
    return "".join(w if i == 0 else w[:1].upper() + w[1:] for i, w in enumerate(words))


def predict_endpoint(doors: dict[str, Endpoint], read_json: Callable[[Request], Awaitable],
                     error_of: Callable[[BaseException], Response]) -> Endpoint:
    """The predict route over `doors` (path -> endpoint of a POST door); `read_json`
    reads a body within the server's bound; `error_of` answers an exception as the
    server would."""
    paths: dict[str, str] = {}
    for path in doors:
        paths.setdefault(request_format(path), path)
        paths.setdefault(path, path)

    async def one(request: Request, instance) -> object:
        if not isinstance(instance, dict) or not isinstance(instance.get("@requestFormat"), str):
            return openai_error(Problem(400, "invalid_request", "each instance must be an "
                                        "object with a string @requestFormat", "invalid_value"))
        payload = {k: v for k, v in instance.items() if k != "@requestFormat"}
        if "stream" in payload:
            payload["stream"] = False  # a prediction is answered whole
        path = paths.get(instance["@requestFormat"])
        if path is None:
            return openai_error(Problem(400, "invalid_request", "no door for @requestFormat "
                                        f"{instance['@requestFormat']!r}", "invalid_value"))
        body = json.dumps(payload).encode()
        sent = []

        async def receive():  # the body, then nothing (a disconnect is the outer request's)
            if sent:
                await trio.sleep_forever()
            sent.append(True)
            return {"type": "http.request", "body": body, "more_body": False}

        headers = [(k, v) for k, v in request.scope["headers"] if k != b"content-length"]
        scope = request.scope | {"path": path, "raw_path": path.encode(), "method": "POST",
                                 "headers": headers + [(b"content-length", str(len(body)).encode())]}
        try:
            response = await doors[path](Request(scope, receive))
        except Exception as exc:  # noqa: BLE001 - answered as the server answers it
            response = error_of(exc)
        return json.loads(response.body)

    async def predict(request: Request) -> Response:
        data = await read_json(request)
        instances = data.get("instances") if isinstance(data, dict) else None
        if not isinstance(instances, list) or len(instances) > MAX_INSTANCES:
            return openai(Problem(400, "invalid_request", "the body must be an object whose "
                                  f"'instances' is a list of at most {MAX_INSTANCES}",
                                  "invalid_value", "instances"))
        predictions: list = [None] * len(instances)

        async def answer(i: int, instance) -> None:
            predictions[i] = await one(request, instance)

        async with trio.open_nursery() as nursery:
            for i, instance in enumerate(instances):
                nursery.start_soon(answer, i, instance)
        return JSONResponse({"predictions": predictions})

    return predict
