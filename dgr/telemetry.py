"""Prometheus metrics of one node, in a registry the node owns.

Names follow Prometheus conventions: `dgr_` prefix, `_total` for counters,
base units (seconds, cells, tokens). Rates (prefill/decode tokens per second)
follow from the counters; `recent_rates` gives them over a short window for
the capability report.
"""

from __future__ import annotations

import bisect
import itertools
import math
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from dgr._codes import MAX_DRAFT, DraftSource
from dgr.admission import REASONS
from dgr.events import StepFigures
from dgr.rpc_stats import RpcLinks
from dgr.sequence import FinishReason
from dgr.tenant_telemetry import TenantMetrics

# draft sources by name (dgr._codes.DraftSource)
DRAFT_SOURCES = {DraftSource.DRAFT_CONTEXT: "context", DraftSource.DRAFT_NODE: "node",
                 DraftSource.DRAFT_STRUCTURE: "structure", DraftSource.DRAFT_VALUES: "values"}
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0,
                    1.5, 2.5, 5.0, 10.0, 30.0)
STEP_PHASES = ("plan", "decode", "sample", "update")
_PHASE_FIELDS = [(phase, f"{phase}_s") for phase in STEP_PHASES]  # StepFigures' names


def admission_families(registry: CollectorRegistry, prefix: str,
                       what: str) -> tuple[Counter, Counter]:
    """A node's admission counters, the same families whatever its kind (`prefix` names
    the kind's, `what` what it admits): accepted, and refused by reason (every reason
    of dgr.admission.REASONS there at 0 from the start)."""
    admitted = Counter(f"{prefix}admissions", f"{what} accepted by admission.",
                       registry=registry)
    rejected = Counter(f"{prefix}admissions_rejected", f"{what} refused by admission.",
                       ["reason"], registry=registry)
    for reason in REASONS:
        rejected.labels(reason)
    return admitted, rejected


class Telemetry:
    def __init__(self, rate_window_s: float = 10.0):
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.sessions_active = Gauge("dgr_sessions_active", "Sessions holding a sequence slot "
                                     "(prefilling or decoding).", registry=r)
        self.healthy = Gauge("dgr_healthy", "1 while the node can serve sessions; 0 once it has "
                             "failed for good (an RPC worker lost) until it is restarted.", registry=r)
        self.healthy.set(1)
        self.queue_sessions = Gauge("dgr_queue_sessions", "Sessions waiting for a slot.", registry=r)
        self.queue_tokens = Gauge("dgr_queue_tokens", "Prompt tokens of the waiting sessions.", registry=r)
        self.batch_token_budget = Gauge("dgr_batch_token_budget", "Token budget of one step.", registry=r)
        self.kv_cells_total = Gauge("dgr_kv_cells_total", "KV cells of the context.", registry=r)
        self.kv_cells_used = Gauge("dgr_kv_cells_used", "KV cells holding tokens, summed over "
                                    "sequences (a shared prefix counts once per holder).", registry=r)
        self.kv_cells_reserved = Gauge("dgr_kv_cells_reserved",
                                       "KV cells reserved by running sessions (prompt + max_tokens).",
                                       registry=r)
        self.kv_pressure = Gauge("dgr_kv_pressure_ratio", "KV cells reserved divided by cells total.",
                                 registry=r)
        self.prefix_hits = Counter("dgr_prefix_hits", "Sessions that started with a shared "
                                   "prompt prefix already in the KV pool.", registry=r)
        self.prefix_tokens_reused = Counter("dgr_prefix_tokens_reused", "Prompt tokens not "
                                            "prefilled because their KV was shared.", registry=r)
        self.prefix_evictions = Counter("dgr_prefix_evictions", "Cached prefixes evicted to make "
                                        "room for a starting session.", registry=r)
        tier = ["tier"]
        self.tier_bytes = Gauge("dgr_kv_tier_bytes", "Bytes of stored prefixes per KV tier "
                                "(host, disk).", tier, registry=r)
        self.tier_entries = Gauge("dgr_kv_tier_entries", "Stored prefixes per KV tier.", tier,
                                  registry=r)
        self.tier_hits = Counter("dgr_kv_tier_hits", "Sessions that started from a prefix of a "
                                 "KV tier (host: restored; disk: read into host memory).", tier,
                                 registry=r)
        self.tier_tokens_restored = Counter("dgr_kv_tier_tokens_restored", "Prompt tokens not "
                                            "prefilled because their KV was restored.", registry=r)
        self.tier_writes = Counter("dgr_kv_tier_writes", "Prefixes stored per KV tier.", tier,
                                   registry=r)
        self.tier_evictions = Counter("dgr_kv_tier_evictions", "Prefixes removed for room per "
                                      "KV tier.", tier, registry=r)
        self.tier_dropped = Counter("dgr_kv_tier_dropped", "Prefixes not stored: a save over "
                                    "the loop's bound, a disk write queue full, a bad file.",
                                    tier, registry=r)
        self.tier_restores = Counter("dgr_kv_tier_restores", "Stored prefixes restored into a "
                                     "slot by the batch loop.", registry=r)
        self.tier_restore_seconds = Counter("dgr_kv_tier_restore_seconds", "Time the batch loop "
                                            "spent restoring prefixes.", registry=r)
        self.tier_save_seconds = Counter("dgr_kv_tier_save_seconds", "Time the batch loop spent "
                                         "saving prefixes out of the pool.", registry=r)
        self.kv_cells_cached = Gauge("dgr_kv_cells_cached", "KV cells of token prefixes kept "
                                     "by free slots (evictable).", registry=r)
        self.step_failures = Counter("dgr_step_failures", "Steps whose llama_decode failed.",
                                     ["code"], registry=r)
        self.admitted, self.rejected = admission_families(r, "dgr_", "Sessions")
        self.finished = Counter("dgr_sessions_finished", "Sessions ended, by finish reason.",
                                ["reason"], registry=r)
        self.step_totals = StepTotals()
        self.tokens_reused = 0  # dgr_prefix_tokens_reused_total, read without the registry
        # draft tokens verified and accepted, all sources, read without the registry
        self.drafted_total = 0
        self.accepted_total = 0
        r.register(self.step_totals)
        self.batch_rows = StepHistogram("dgr_batch_rows", "Rows (tokens) per llama_decode step.",
                                        (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048))
        self.step_duration = StepHistogram(
            "dgr_step_duration_seconds", "Wall time of one step of the batch loop, from the end "
            "of the previous one (or its wake-up) to its events being published.",
            _LATENCY_BUCKETS)
        r.register(self.batch_rows)
        r.register(self.step_duration)
        self.ttft = StepHistogram("dgr_time_to_first_token_seconds", "From admission to the "
                                  "first sampled token.", _LATENCY_BUCKETS)
        self.itl = StepHistogram("dgr_inter_token_latency_seconds", "Between consecutive "
                                 "sampled tokens of one session.", _LATENCY_BUCKETS)
        r.register(self.ttft)
        r.register(self.itl)
        self.spec_drafted = Counter("dgr_spec_draft_tokens", "Draft tokens verified beside "
                                    "decode rows (speculative decoding), by source.",
                                    ["source"], registry=r)
        self.spec_accepted = Counter("dgr_spec_accepted_tokens", "Draft tokens accepted: the "
                                     "session's sampler picked them, by source.", ["source"],
                                     registry=r)
        self.spec_accepted_at = Counter("dgr_spec_accepted_at_position", "Draft tokens "
                                        "accepted, by their place in the draft (1 = first).",
                                        ["position"], registry=r)
        self._drafted = {src: self.spec_drafted.labels(name) for src, name in DRAFT_SOURCES.items()}
        self._accepted = {src: self.spec_accepted.labels(name)
                          for src, name in DRAFT_SOURCES.items()}
        self._accepted_at = [self.spec_accepted_at.labels(str(i + 1)) for i in range(MAX_DRAFT)]
        for reason in FinishReason:
            self.finished.labels(reason)
        self.parks = Counter("dgr_parks", "Running sessions parked (dgr.admission): for a "
                             "session that outranked them, or for KV cells.", registry=r)
        self.pool_full_parks = Counter("dgr_pool_full_parks", "Running sessions parked "
                                       "because the KV pool could not place their rows.",
                                       registry=r)
        self.resumes = Counter("dgr_resumes", "Parked sessions resumed.", registry=r)
        self.tenants = TenantMetrics(r)
        self._window = rate_window_s
        # prefill rows and generated tokens, and finished sessions, in fixed time
        # buckets: memory set by the window, not by the step or session rate
        self._recent = RateWindow(rate_window_s, 2)
        self._finishes = RateWindow(60.0, 1)

    def watch(self, load, cells_used, kv_cells_total: int) -> None:
        """Read the load gauges from `load()` (an admission Load) and `cells_used()`
        when scraped, so that no step or token pays for keeping them current."""
        def reading(field):
            return lambda: getattr(load(), field)

        for gauge, field in ((self.sessions_active, "active"), (self.queue_sessions, "waiting"),
                             (self.queue_tokens, "waiting_tokens"),
                             (self.kv_cells_reserved, "reserved_cells"),
                             (self.kv_cells_cached, "cached_cells")):
            gauge.set_function(reading(field))
        self.kv_pressure.set_function(lambda: load().reserved_cells / kv_cells_total)
        self.kv_cells_used.set_function(cells_used)

    def watch_rpc(self, links: RpcLinks) -> None:
        """Per RPC worker, bytes each way and the kernel's smoothed round-trip time
        of this process's connections to it, read when scraped."""
        self.registry.register(_RpcCollector(links))

    def watch_adapters(self, adapters) -> None:
        """Per loaded LoRa adapter (dgr.adapters.AdapterTable), its sessions, rank and
        bytes, read when scraped."""
        self.registry.register(_AdapterCollector(adapters))

    def record_prefix_reuse(self, tokens: int) -> None:
        """A session started with `tokens` prompt tokens shared in the pool."""
        self.prefix_hits.inc()
        self.prefix_tokens_reused.inc(tokens)
        self.tokens_reused += tokens

    def record_step(self, figures: StepFigures, budget: int) -> None:
        """One step of the batch loop."""
        rows = self.step_totals.add(figures, budget)
        self.batch_rows.observe(rows)
        self.step_duration.observe(figures.total_s)
        self._recent.add(time.monotonic(), figures.prefill_rows, figures.generated)

    def record_drafts(self, source: int, drafted: int, accepted: int) -> None:
        """A decode row's drafts: `drafted` verified, the first `accepted` taken."""
        self._drafted[source].inc(drafted)
        self.drafted_total += drafted
        self.accepted_total += accepted
        if accepted:
            self._accepted[source].inc(accepted)
            for counter in self._accepted_at[:accepted]:
                counter.inc()

    def speculation_totals(self) -> dict:
        """Drafted and accepted tokens so far, per source, and the steps with drafts
        (for /capabilities)."""
        def total(name, **labels):
            return int(self.registry.get_sample_value(name, labels) or 0)

        sources = {}
        for name in DRAFT_SOURCES.values():
            drafted = total("dgr_spec_draft_tokens_total", source=name)
            accepted = total("dgr_spec_accepted_tokens_total", source=name)
            sources[name] = {"drafted": drafted, "accepted": accepted,
                             "acceptance": accepted / drafted if drafted else None}
        return {"steps_with_drafts": total("dgr_spec_steps_total"), "sources": sources,
                "accepted_at_position": [total("dgr_spec_accepted_at_position_total",
                                               position=str(i + 1)) for i in range(MAX_DRAFT)]}

    def recent_rates(self) -> dict[str, float]:
        """Prefill and generated tokens per second over the last window."""
        (prefill, generated), _ = self._recent.totals(time.monotonic())
        return {"prefill_tokens_per_s": prefill / self._window,
                "decode_tokens_per_s": generated / self._window}

    def parking_totals(self) -> dict[str, int]:
        """Sessions parked and resumed so far (for /capabilities)."""
        return {name: int(self.registry.get_sample_value(f"dgr_{name}_total") or 0)
                for name in ("parks", "resumes")}

    def prefix_totals(self) -> dict[str, int]:
        """The prefix cache's counters so far (for /capabilities)."""
        def total(name):
            return int(self.registry.get_sample_value(name) or 0)

        return {"hits": total("dgr_prefix_hits_total"),
                "tokens_reused": total("dgr_prefix_tokens_reused_total"),
                "tokens_prefilled": total("dgr_prefill_tokens_total"),
                "evictions": total("dgr_prefix_evictions_total")}

    def tier_totals(self) -> dict:
        """The KV tiers' counters so far (for /capabilities)."""
        def total(name, **labels):
            return self.registry.get_sample_value(name, labels) or 0

        per_tier = {name: {tier: int(total(f"dgr_kv_tier_{name}_total", tier=tier))
                           for tier in ("host", "disk")}
                    for name in ("hits", "writes", "evictions", "dropped")}
        return {**per_tier, "restores": int(total("dgr_kv_tier_restores_total")),
                "tokens_restored": int(total("dgr_kv_tier_tokens_restored_total")),
                "restore_s": total("dgr_kv_tier_restore_seconds_total"),
                "save_s": total("dgr_kv_tier_save_seconds_total")}

    def record_park(self, requester, pool_full: bool = False) -> None:
        """A session of `requester` (dgr.spec.Requester) was parked (pool_full: for
        KV cells)."""
        self.parks.inc()
        if pool_full:
            self.pool_full_parks.inc()
        self.tenants.parked(requester)

    def record_finish(self, reason: str) -> None:
        self.finished.labels(reason).inc()
        self._finishes.add(time.monotonic(), 1)

    def drain_rate(self) -> float:
        """Sessions ended per second over the last minute (how fast places free up)."""
        now = time.monotonic()
        (ended,), oldest = self._finishes.totals(now)
        if not ended:
            return 0.0
        return ended / max(1.0, now - oldest)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class RateWindow:
    """Counts over the last `window_s` seconds in `buckets` fixed time buckets
    (a ring): adding is O(1) and the memory is the buckets', whatever the rate."""

    def __init__(self, window_s: float, n_values: int, buckets: int = 60):
        self._width = window_s / buckets
        self._n = buckets
        self._starts = [-math.inf] * buckets          # each bucket's start time
        self._sums = [[0] * n_values for _ in range(buckets)]

    def add(self, now: float, *values: int) -> None:
        index = int(now // self._width)
        slot = index % self._n
        start = index * self._width
        if self._starts[slot] != start:  # the bucket last held an older interval
            self._starts[slot] = start
            self._sums[slot] = [0] * len(self._sums[slot])
        sums = self._sums[slot]
        for i, value in enumerate(values):
            sums[i] += value

    def totals(self, now: float) -> tuple[list[int], float]:
        """The sums over the window, and the start of its oldest bucket with counts
        (now if none)."""
        since = now - self._n * self._width
        totals = [0] * len(self._sums[0])
        oldest = now
        for start, sums in zip(self._starts, self._sums):
            if start > since:
                oldest = min(oldest, start)
                for i, value in enumerate(sums):
                    totals[i] += value
        return totals, oldest


class StepHistogram:
    """A Prometheus histogram in plain numbers, fed and collected on the Trio thread,
    for what is observed per step or per token: prometheus_client's Histogram takes
    a lock per observation, which per token is a measurable share of the Trio
    thread."""

    def __init__(self, name: str, documentation: str, buckets: tuple[float, ...]):
        self._name, self._documentation = name, documentation
        self._bounds = list(buckets)
        self._labels = [floatToGoString(b) for b in buckets] + ["+Inf"]
        self._counts = [0] * (len(buckets) + 1)  # per bucket, not cumulative
        self._sum = 0.0

    def observe(self, value: float) -> None:
        # the bucket of value: the first bound >= value (Prometheus' le), else +Inf
        self._counts[bisect.bisect_left(self._bounds, value)] += 1
        self._sum += value

    @property
    def total(self) -> float:
        """The sum of the values observed."""
        return self._sum

    def observe_all(self, values: list[float]) -> None:
        bounds, counts = self._bounds, self._counts
        for value in values:
            counts[bisect.bisect_left(bounds, value)] += 1
        self._sum += sum(values)

    def describe(self):
        return []

    def collect(self):
        family = HistogramMetricFamily(self._name, self._documentation)
        family.add_metric([], list(zip(self._labels, itertools.accumulate(self._counts))),
                          self._sum)
        yield family


class StepTotals:
    """The counters every step adds to, and the last step's batch occupancy, in plain
    numbers fed and collected on the Trio thread: prometheus_client's metrics would
    take a lock for each of the dozen updates a step."""

    def __init__(self):
        self.steps = 0
        self.spec_steps = 0
        self.tokens = {"prefill": 0, "decode": 0, "generated": 0}
        self.phase_s = dict.fromkeys(STEP_PHASES, 0.0)
        self.occupancy = 0.0
        self.rows_max = 0  # the most rows a step has run

    def add(self, figures: StepFigures, budget: int) -> int:
        """One step's figures; returns its rows."""
        self.steps += 1
        phase_s = self.phase_s
        for phase, field in _PHASE_FIELDS:
            phase_s[phase] += getattr(figures, field)
        prefill, decode = figures.prefill_rows, figures.decode_rows
        tokens = self.tokens
        tokens["prefill"] += prefill
        tokens["decode"] += decode
        tokens["generated"] += figures.generated
        rows = prefill + decode + figures.draft_rows
        if figures.draft_rows:
            self.spec_steps += 1
        self.rows_max = max(self.rows_max, rows)
        self.occupancy = rows / budget
        return rows

    def describe(self):
        return []

    def collect(self):
        yield CounterMetricFamily("dgr_steps", "llama_decode steps run.", self.steps)
        for name, doc in (("prefill", "Prompt tokens decoded (prefill rows)."),
                          ("decode", "Decode rows: generated tokens fed back."),
                          ("generated", "Tokens sampled for sessions.")):
            yield CounterMetricFamily(f"dgr_{name}_tokens", doc, self.tokens[name])
        yield CounterMetricFamily("dgr_spec_steps", "Steps that verified draft tokens.",
                                  self.spec_steps)
        phases = CounterMetricFamily(
            "dgr_step_phase_seconds", "Time spent per step phase: plan (mailbox, finish "
            "requests, policy, batch fill), decode (inside llama_decode), sample (sampling "
            "and log-probabilities), update (post-step update, KV release, publishing). "
            "Everything but decode is the loop's overhead.", labels=["phase"])
        for phase, seconds in self.phase_s.items():
            phases.add_metric([phase], seconds)
        yield phases
        yield GaugeMetricFamily("dgr_batch_occupancy_ratio", "Rows of the last step divided "
                                "by the step token budget.", self.occupancy)


class _AdapterCollector:
    """dgr_adapter_* families from the node's adapter table."""

    def __init__(self, adapters):
        self._adapters = adapters

    def describe(self):
        return []

    def collect(self):
        families = {"sessions": GaugeMetricFamily(
                        "dgr_adapter_sessions", "Sessions running or waiting with a LoRa "
                        "adapter.", labels=["adapter"]),
                    "rank": GaugeMetricFamily("dgr_adapter_rank", "A loaded LoRa adapter's "
                                              "rank.", labels=["adapter"]),
                    "bytes": GaugeMetricFamily("dgr_adapter_bytes", "A loaded LoRa adapter's "
                                               "tensors' bytes.", labels=["adapter"])}
        for adapter in self._adapters.report():
            for field, family in families.items():
                family.add_metric([adapter["name"]], adapter[field])
        yield from families.values()
        # by name, loaded or not, since the node started
        totals = {field: CounterMetricFamily(f"dgr_adapter_{metric}", text, labels=["adapter"])
                  for field, (metric, text) in _ADAPTER_COUNTS.items()}
        for name, counts in sorted(self._adapters.counts.items()):
            for field, family in totals.items():
                family.add_metric([name], counts[field])
        yield from totals.values()


_ADAPTER_COUNTS = {  # AdapterTable.counts' field: (metric, help)
    "loads": ("loads", "Times a LoRa adapter was loaded (at start, on request, on demand)."),
    "evictions": ("evictions", "Times a LoRa adapter loaded on demand was evicted, idle."),
    "sessions": ("sessions_started", "Sessions started with a LoRa adapter."),
    "tokens": ("tokens", "Tokens generated by sessions with a LoRa adapter, as they end."),
    "busy": ("busy_refusals", "Requests for a LoRa adapter refused (adapters_busy): all "
             "--max-loras loaded adapters were in use."),
}


class _RpcCollector:
    """dgr_rpc_* families from the kernel's TCP figures (dgr.rpc_stats)."""

    def __init__(self, links: RpcLinks):
        self._links = links

    def describe(self):
        return []

    def collect(self):
        sent = CounterMetricFamily("dgr_rpc_sent_bytes", "Bytes sent to an RPC worker and "
                                   "acknowledged (its layers' inputs, graphs, weights at load).",
                                   labels=["worker"])
        received = CounterMetricFamily("dgr_rpc_received_bytes", "Bytes received from an RPC "
                                       "worker (its layers' outputs).", labels=["worker"])
        rtt = GaugeMetricFamily("dgr_rpc_rtt_seconds", "Smoothed round-trip time of the TCP "
                                "connection to an RPC worker (the kernel's estimate).",
                                labels=["worker"])
        for endpoint, link in self._links.figures().items():
            sent.add_metric([endpoint], link.bytes_sent)
            received.add_metric([endpoint], link.bytes_received)
            rtt.add_metric([endpoint], link.rtt_s)
        yield sent
        yield received
        yield rtt
