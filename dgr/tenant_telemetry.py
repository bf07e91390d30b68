"""Per tenant and priority metrics: sessions running, waiting and parked (read from
admission at each scrape), tokens served, time to first token, parks and refusals.

Labels are bounded: the listed tenants (--api-keys) and the first MAX_LABELED others
seen have their own `tenant` label, the rest share "other"; so do the first
MAX_LABELED priorities. A client choosing its `user` cannot grow the registry.
"""

from __future__ import annotations

from typing import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily

from dgr.sequence import Session
from dgr.spec import Requester
from dgr.tenants import MAX_LABELED, OTHER

_TTFT_BUCKETS = (0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0, 30.0, 60.0)


class _Labels:
    """A bounded set of label values: the first `limit` seen (and those given) keep
    their own, the rest are OTHER."""

    def __init__(self, limit: int, given: Iterable[str] = ()):
        self._limit = limit
        self._given = set(given)
        self._seen: set[str] = set()

    def __call__(self, value: str) -> str:
        if value in self._given or value in self._seen:
            return value
        if len(self._seen) < self._limit:
            self._seen.add(value)
            return value
        return OTHER


class TenantMetrics:
    """The families, in the node's registry."""

    def __init__(self, registry: CollectorRegistry):
        self._tenant = _Labels(MAX_LABELED)
        self._priority = _Labels(MAX_LABELED)
        self._sessions: Callable[[], dict[str, list[Session]]] = dict
        labels = ["tenant", "priority"]
        self.tokens = Counter("dgr_tenant_tokens", "Tokens served, by tenant, priority and kind "
                              "(prompt: at a session's start; output: as it leaves).",
                              labels + ["kind"], registry=registry)
        self.ttft = Histogram("dgr_tenant_time_to_first_token_seconds", "From admission to "
                              "the first sampled token, by tenant and priority.", labels,
                              buckets=_TTFT_BUCKETS, registry=registry)
        self.parks = Counter("dgr_tenant_parks", "Running sessions parked, by tenant and "
                             "priority.", labels,
                             registry=registry)
        self.rejected = Counter("dgr_tenant_admissions_rejected", "Sessions refused by "
                                "admission, by tenant and reason.", ["tenant", "reason"],
                                registry=registry)
        registry.register(self)

    def watch(self, listed: Iterable[str],
              sessions: Callable[[], dict[str, list[Session]]]) -> None:
        """The listed tenants (labelled whatever else is seen), and admission's sessions
        by state, read at each scrape."""
        self._tenant = _Labels(MAX_LABELED, listed)
        self._sessions = sessions

    def labels(self, requester: Requester) -> tuple[str, str]:
        return self._tenant(requester.tenant), self._priority(str(requester.priority))

    def first_token(self, session: Session, seconds: float) -> None:
        self.ttft.labels(*self.labels(session.spec.requester)).observe(seconds)

    def left(self, session: Session) -> None:
        """A session left: its tokens served (its prompt once, whatever its parks)."""
        tenant, priority = self.labels(session.spec.requester)
        if session.first_token_at is not None or session.n_prefilled:
            self.tokens.labels(tenant, priority, "prompt").inc(len(session.spec.prompt))
        self.tokens.labels(tenant, priority, "output").inc(len(session.generated))

    def parked(self, requester: Requester) -> None:
        self.parks.labels(*self.labels(requester)).inc()

    def refused(self, requester: Requester, reason: str) -> None:
        self.rejected.labels(self._tenant(requester.tenant), reason).inc()

    def collect(self):
        family = GaugeMetricFamily("dgr_tenant_sessions", "Sessions on the node by tenant, "
                                   "priority and state (running, waiting, parked).",
                                   labels=["tenant", "priority", "state"])
        counts: dict[tuple[str, str, str], int] = {}
        for state, sessions in self._sessions().items():
            for session in sessions:
                key = (*self.labels(session.spec.requester), state)
                counts[key] = counts.get(key, 0) + 1
        for key, count in sorted(counts.items()):
            family.add_metric(list(key), count)
        yield family

    def describe(self):
        return []
