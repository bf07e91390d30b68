"""dgr's errors, classified once and rendered in each protocol's shape."""

import json

import pytest
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from dgr.doors import problems
from dgr.doors.fields import BadRequest
from dgr.errors import AdmissionRejected, InvalidRequest, NodeClosed


@pytest.mark.parametrize("exc, status, kind", [
    (BadRequest("'n' must be an integer", "n"), 400, "invalid_request"),
    (InvalidRequest("the prompt is empty"), 400, "invalid_request"),
    (AdmissionRejected("queue_full", "the queue is full"), 429, "rate_limit"),
    (AdmissionRejected("draining", "the node is draining"), 503, "overloaded"),
    (problems.TooLarge(), 413, "too_large"),
    (problems.Unavailable("the model is loading"), 503, "overloaded"),
    (NodeClosed("the node is shut down"), 503, "overloaded"),
    (HTTPException(404), 404, "not_found"),
    (ClientDisconnect(), 499, "client_gone"),
    (ExceptionGroup("one", [BadRequest("x")]), 400, "invalid_request"),
    (problems.SessionEnded(problems.model_failed("boom")), 500, "server_error"),
])
def test_each_error_means_one_thing_in_every_shape(exc, status, kind):
    problem = problems.classify(exc, retry_after=lambda: "3", max_body_bytes=10)
    assert (problem.status, problem.kind) == (status, kind)
    for render in (problems.openai, problems.anthropic):
        response = render(problem)
        assert response.status_code == status
        if kind != "client_gone":
            body = json.loads(response.body)
            assert body["error"]["message"] == problem.message and body["error"]["type"]
    if kind == "rate_limit":
        assert problem.headers == {"Retry-After": "3"}


def test_every_kind_has_a_type_in_each_shape():
    for kind in problems.KINDS:
        if kind == "client_gone":
            continue
        problem = problems.Problem(400, kind, "m", "c")
        assert problems.openai_error(problem)["error"]["type"].endswith("_error")
        assert problems.anthropic_error(problem)["error"]["type"]
        assert problems.llama_error(problem)["error"]["code"] == 400


def test_an_exceeded_context_carries_llama_servers_figures():
    exc = AdmissionRejected("never_fits", "too long", figures={"n_prompt_tokens": 9, "n_ctx": 4})
    body = problems.openai_error(problems.classify(exc))
    assert body["error"]["type"] == "exceed_context_size_error" and body["error"]["n_ctx"] == 4


def test_an_unknown_error_is_a_logged_500():
    assert problems.classify(RuntimeError("bug")).status == 500
