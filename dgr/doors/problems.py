"""dgr's errors as every door answers them: `classify` decides once what an
exception means (a Problem: status, kind, code, message, the field at fault,
headers), and each protocol renders a Problem in its own shape (`openai`, for
OpenAI's, vLLM's and llama-server's doors; `anthropic`, for the Messages API).
A 4xx for bad input and refusals, a 503 while the node cannot serve, a 500 only
for a real server fault (logged)."""

from __future__ import annotations

import math
import logging
from typing import Callable, Optional

import attrs
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse, Response

from dgr.doors.fields import BadRequest
from dgr.errors import AdmissionRejected, InvalidRequest, ModelNotFound, NodeClosed, NotServed

log = logging.getLogger("dgr.server")

# what went wrong, whatever the protocol: each renderer names each kind its way
KINDS = ("invalid_request", "context_exceeded", "authentication", "not_found", "too_large",
         "rate_limit", "overloaded", "server_error", "client_gone", "not_supported")


class TooLarge(Exception):
    """A request body past the server's bound (ServerConfig.max_body_bytes)."""


class Unavailable(Exception):
    """The node is not serving (loading, failed or stopped)."""


class SessionEnded(Exception):
    """A session read whole failed or was cancelled (`ended`): the answer is its
    Problem."""

    def __init__(self, problem: "Problem"):
        super().__init__(problem.message)
        self.problem = problem


@attrs.frozen
class Problem:
    status: int
    kind: str  # one of KINDS
    message: str
    code: str  # OpenAI's error code (and llama-server's)
    param: Optional[str] = None  # the request field at fault
    headers: Optional[dict] = None
    figures: dict = attrs.field(factory=dict)  # an exceeded context's sizes (llama-server's)


def classify(exc: BaseException, retry_after: Callable[[], Optional[str]] = lambda: None,
             max_body_bytes: int = 0) -> Problem:
    """What `exc` (raised while a door served a request) means; `retry_after` gives
    a full queue's Retry-After seconds."""
    if isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        return classify(exc.exceptions[0], retry_after, max_body_bytes)
    if isinstance(exc, SessionEnded):
        return exc.problem
    if isinstance(exc, HTTPException) and exc.status_code in (404, 405):
        found = exc.status_code == 404
        return Problem(exc.status_code, "not_found" if found else "invalid_request",
                       "no such endpoint" if found else "method not allowed",
                       "not_found" if found else "method_not_allowed", headers=exc.headers)
    if isinstance(exc, ModelNotFound):
        return Problem(404, "not_found", str(exc), "model_not_found", "model")
    if isinstance(exc, NotServed):  # llama-server's answer: 501, not_supported_error
        return Problem(501, "not_supported", str(exc), "not_supported")
    if isinstance(exc, BadRequest):
        return Problem(400, "invalid_request", str(exc), "invalid_value", exc.param)
    if isinstance(exc, InvalidRequest):
        return Problem(400, "invalid_request", str(exc), "invalid_value")
    if isinstance(exc, TooLarge):
        return Problem(413, "too_large", f"request body exceeds {max_body_bytes} bytes",
                       "body_too_large")
    if isinstance(exc, AdmissionRejected):
        if exc.reason == "never_fits":
            return Problem(400, "context_exceeded", str(exc), "context_length_exceeded",
                           figures=dict(exc.figures))
        if exc.reason in ("draining", "unhealthy"):
            return Problem(503, "overloaded", str(exc), exc.reason)
        after = (str(max(1, math.ceil(exc.retry_after))) if exc.retry_after is not None
                 else retry_after())
        return Problem(429, "rate_limit", str(exc), exc.reason,
                       headers={"Retry-After": after} if after else None)
    if isinstance(exc, (Unavailable, NodeClosed)):
        return Problem(503, "overloaded", str(exc), "unavailable")
    if isinstance(exc, ClientDisconnect):
        return Problem(499, "client_gone", "the client disconnected", "client_gone")
    log.error("internal error", exc_info=exc)
    return Problem(500, "server_error", "internal server error", "internal_error")


def model_failed(message: str) -> Problem:
    """A session the model failed (its error chunk's message)."""
    return Problem(500, "server_error", message, "model_failed")


def ended(streams) -> Optional[Problem]:
    """The Problem of a session of `streams` (ended) that admission refused after
    admitting it (429: a session that outranked it took its queue place), failed, or
    was cancelled by a shutdown, else None; in that order."""
    refused = next((c for c in streams if c.session.refused is not None), None)
    if refused is not None:
        session = refused.session
        return Problem(429, "rate_limit", f"{session.refused}: {session.error}", session.refused)
    failed = next((c for c in streams if c.finish_reason == "error"), None)
    if failed is not None:
        return model_failed(failed.error)
    if any(c.finish_reason == "cancelled" for c in streams):
        return Problem(503, "overloaded", "the session was cancelled (server shutting down)",
                       "cancelled")
    return None


_OPENAI_TYPES = {"invalid_request": "invalid_request_error",
                 "context_exceeded": "exceed_context_size_error",  # llama-server's
                 "authentication": "authentication_error",
                 "not_found": "invalid_request_error", "too_large": "invalid_request_error",
                 "rate_limit": "rate_limit_error", "overloaded": "server_error",
                 "server_error": "server_error", "not_supported": "not_supported_error"}
_ANTHROPIC_TYPES = {"invalid_request": "invalid_request_error",
                    "context_exceeded": "invalid_request_error",
                    "authentication": "authentication_error", "not_found": "not_found_error",
                    "too_large": "request_too_large", "rate_limit": "rate_limit_error",
                    "overloaded": "overloaded_error", "server_error": "api_error",
                    "not_supported": "invalid_request_error"}


def _openai_body(message: str, kind: str, code: Optional[str] = None,
                 param: Optional[str] = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def openai_error(problem: Problem) -> dict:
    """The error object of OpenAI's shape (llama-server's figures beside it on an
    exceeded context, which its clients read to trim a history)."""
    body = _openai_body(problem.message, _OPENAI_TYPES[problem.kind], problem.code,
                        problem.param)
    body["error"] |= problem.figures
    return body


def llama_error(problem: Problem) -> dict:
    """The error event of llama-server's native stream (its code is the status)."""
    return {"error": {"code": problem.status, "message": problem.message,
                      "type": _OPENAI_TYPES[problem.kind]}}


def anthropic_error(problem: Problem) -> dict:
    return {"type": "error", "error": {"type": _ANTHROPIC_TYPES[problem.kind],
                                       "message": problem.message}}


def _response(body_of: Callable[[Problem], dict]) -> Callable[[Problem], Response]:
    def render(problem: Problem) -> Response:
        if problem.kind == "client_gone":
            # nobody reads this; the status is for the log line (nginx's "client closed request")
            return Response(status_code=499)
        return JSONResponse(body_of(problem), status_code=problem.status, headers=problem.headers)
    return render


openai = _response(openai_error)
anthropic = _response(anthropic_error)


def error_response(status: int, message: str, kind: str, code: Optional[str] = None,
                   headers: Optional[dict] = None) -> JSONResponse:
    """An OpenAI-shaped error that no exception stands for (a feature switched off,
    no slot free, no such prefix), `kind` being OpenAI's error type."""
    return JSONResponse(_openai_body(message, kind, code), status_code=status, headers=headers)
