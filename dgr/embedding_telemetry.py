"""An embedding node's figures (dgr.embedding.EmbeddingNode), as Prometheus
families of their own registry, and the rate its queue drains at."""

from __future__ import annotations

import collections
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from dgr.telemetry import admission_families

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class EmbeddingTelemetry:
    """The node's embedding figures, as Prometheus families of their own registry."""

    def __init__(self, node) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.admitted, self.rejected = admission_families(r, "dgr_embedding_", "Requests")
        self.requests = Counter("dgr_embedding_requests", "Embedding and rerank requests "
                                "answered, by kind and outcome", ["kind", "outcome"], registry=r)
        self.inputs = Counter("dgr_embedding_inputs", "Inputs computed, by kind", ["kind"],
                              registry=r)
        self.tokens = Counter("dgr_embedding_tokens", "Input tokens computed, by kind", ["kind"],
                              registry=r)
        self.steps = Counter("dgr_embedding_steps", "Embedding steps (llama_decode calls)",
                             registry=r)
        self.latency = Histogram("dgr_embedding_request_seconds", "Seconds from a request's "
                                 "admission to its last vector, by kind", ["kind"],
                                 buckets=_LATENCY_BUCKETS, registry=r)
        self.step_seconds = Histogram("dgr_embedding_step_seconds", "Seconds of one embedding "
                                      "step", buckets=_LATENCY_BUCKETS, registry=r)
        waiting = Gauge("dgr_embedding_waiting", "Inputs and their tokens waiting for a step",
                        ["what"], registry=r)
        waiting.labels("inputs").set_function(lambda: len(node._queue))
        waiting.labels("tokens").set_function(lambda: node._waiting_tokens)
        Gauge("dgr_embedding_requests_in_node", "Requests admitted and not yet answered",
              registry=r).set_function(lambda: len(node._requests))
        self._answered: collections.deque = collections.deque(maxlen=64)

    def answered(self, request, outcome: str) -> None:
        self.requests.labels(request.kind, outcome).inc()
        if outcome == "ok":
            self.latency.labels(request.kind).observe(time.perf_counter() - request.queued_at)
        self._answered.append(time.monotonic())

    def drain_rate(self) -> float:
        """Requests answered per second lately (a full queue's Retry-After)."""
        if len(self._answered) < 2:
            return 0.0
        span = self._answered[-1] - self._answered[0]
        return (len(self._answered) - 1) / span if span > 0 else 0.0

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
