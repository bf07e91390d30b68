"""Who a session belongs to and what that tenant may take: its bounds (running,
queued, queued prompt tokens, a token rate), its weight, and its virtual token
counter, by which equal-priority sessions of different tenants take turns.

Fair shares are Sheng et al.'s virtual token counter (VTC, "Fairness in Serving
Large Language Models", OSDI 2024): each tenant's counter grows by the tokens
served to it (a prompt token counts PROMPT_COST, an output token OUTPUT_COST),
divided by its weight; the waiting session whose tenant has the least counter
runs next; a tenant that comes back after having nothing queued or running
starts at the least counter among the active ones, so idleness banks no credit.
Output tokens are charged as sessions leave, and counted live for the running
ones whenever an order is taken (`counters`): the pump's per-token path pays
nothing for fairness.

The keys file (`--api-keys`) gives each API key its tenant: a line per key,
`KEY tenant=NAME [weight=W] [max_running=N] [max_waiting=N] [max_queued_tokens=N]
[tokens_per_min=N]`, `#` starts a comment. No I/O beyond reading that file, no
llama.cpp.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Callable, Iterable, Optional

import attrs

from dgr.errors import AdmissionRejected

if TYPE_CHECKING:
    from dgr.sequence import Session

PROMPT_COST = 1.0  # VTC's weights: an output token costs what two prompt tokens do
OUTPUT_COST = 2.0
MAX_TENANT_NAME = 64  # characters of a tenant's name (X-Tenant, user)
# tenants seen by name in metrics beyond the listed ones; the rest are counted as OTHER
MAX_LABELED = 32
OTHER = "other"
RATE_WINDOW_S = 60.0  # tokens_per_min's minute

_BOUNDS = ("max_running", "max_waiting", "max_queued_tokens", "tokens_per_min")


@attrs.frozen
class TenantBounds:
    """One tenant's weight and bounds (None: only the node's own bounds)."""

    name: str
    weight: float = 1.0
    max_running: Optional[int] = None
    max_waiting: Optional[int] = None
    max_queued_tokens: Optional[int] = None
    tokens_per_min: Optional[int] = None

    def facts(self) -> dict:
        """What /capabilities says of the tenant."""
        return {"weight": self.weight, **{name: getattr(self, name) for name in _BOUNDS}}


def read_keys(path: str) -> dict[str, TenantBounds]:
    """The keys file at `path`: {API key: its tenant's bounds}; a line that is not
    `KEY tenant=NAME [option=value ...]` is a ValueError naming it. Lines naming one
    tenant must agree on its options."""
    try:
        with open(path, encoding="utf-8") as file:
            lines = file.read().splitlines()
    except OSError as exc:
        raise ValueError(f"--api-keys: cannot read {path}: {exc.strerror}") from None
    keys: dict[str, TenantBounds] = {}
    tenants: dict[str, TenantBounds] = {}
    for number, line in enumerate(lines, 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        where = f"--api-keys {path}, line {number}"
        key, options = words[0], _options(words[1:], where)
        if "=" in key:
            raise ValueError(f"{where}: a line starts with its key, then tenant=NAME")
        if key in keys:
            raise ValueError(f"{where}: the key is listed twice")
        bounds = _bounds(options, where)
        if tenants.setdefault(bounds.name, bounds) != bounds:
            raise ValueError(f"{where}: tenant {bounds.name!r} is given other options on an "
                             "earlier line")
        keys[key] = bounds
    if not keys:
        raise ValueError(f"--api-keys {path}: the file lists no key")
    return keys


def _options(words: list[str], where: str) -> dict[str, str]:
    options = {}
    for word in words:
        name, equals, value = word.partition("=")
        if not equals or not value:
            raise ValueError(f"{where}: {word!r} is not NAME=VALUE")
        if name in options:
            raise ValueError(f"{where}: {name} is given twice")
        options[name] = value
    return options


def _bounds(options: dict[str, str], where: str) -> TenantBounds:
    unknown = set(options) - {"tenant", "weight", *_BOUNDS}
    if unknown:
        raise ValueError(f"{where}: unknown option {', '.join(sorted(unknown))} (known: tenant, "
                         f"weight, {', '.join(_BOUNDS)})")
    if "tenant" not in options:
        raise ValueError(f"{where}: tenant=NAME is missing")
    name = checked_name(options["tenant"], where)
    try:
        weight = float(options.get("weight", 1.0))
    except ValueError:
        raise ValueError(f"{where}: weight must be a number") from None
    if not (math.isfinite(weight) and weight > 0):
        raise ValueError(f"{where}: weight must be a positive number")
    figures = {}
    for bound in _BOUNDS:
        if bound in options:
            value = options[bound]
            # a tenant that may run nothing, or spend nothing, could only wait forever
            least = 1 if bound in ("max_running", "tokens_per_min") else 0
            if not value.isdigit() or int(value) < least:
                raise ValueError(f"{where}: {bound} must be an integer of at least {least}")
            figures[bound] = int(value)
    return TenantBounds(name, weight, **figures)


def checked_name(name: str, where: str) -> str:
    """A tenant's name as given (a header, a body's user, the keys file): printable,
    within MAX_TENANT_NAME characters."""
    if not name or len(name) > MAX_TENANT_NAME or not name.isprintable():
        raise ValueError(f"{where}: a tenant's name is 1..{MAX_TENANT_NAME} printable characters")
    return name


class TokenRate:
    """tokens_per_min as a bucket that refills continuously: a session is admitted
    while the bucket holds any tokens; its prompt is charged then, its output as it
    leaves, so a bucket may go below zero and the tenant waits it back."""

    def __init__(self, per_min: int, clock: Callable[[], float] = time.monotonic):
        self.per_min = per_min
        self._clock = clock
        self._level = float(per_min)
        self._at = clock()

    def level(self) -> float:
        now = self._clock()
        self._level = min(self.per_min, self._level + (now - self._at) * self.per_min
                          / RATE_WINDOW_S)
        self._at = now
        return self._level

    def charge(self, tokens: int) -> None:
        self.level()
        self._level -= tokens

    def seconds_to_positive(self) -> float:
        """Seconds until the bucket holds a token again (0 when it does)."""
        level = self.level()
        if level > 0:
            return 0.0
        return (1 - level) * RATE_WINDOW_S / self.per_min


class Tenant:
    """One tenant's standing: its sessions running, waiting (parked ones among them)
    and their prompt tokens, its counter, its rate."""

    def __init__(self, bounds: TenantBounds, clock: Callable[[], float]):
        self.bounds = bounds
        self.running = 0
        self.waiting = 0
        self.waiting_tokens = 0
        self.parked = 0
        self.charged = 0.0  # VTC: served tokens' cost / weight, of sessions gone or started
        self.rate = (TokenRate(bounds.tokens_per_min, clock)
                     if bounds.tokens_per_min is not None else None)

    @property
    def active(self) -> bool:
        return bool(self.running or self.waiting)

    def under_running_bound(self) -> bool:
        bound = self.bounds.max_running
        return bound is None or self.running < bound


class Tenants:
    """Every tenant with a session on the node (and every listed one): their bounds,
    standing and counters. Unlisted tenants are forgotten when they have nothing left
    on the node; a returning one starts at the least active counter anyway."""

    def __init__(self, listed: Iterable[TenantBounds] = (),
                 clock: Callable[[], float] = time.monotonic):
        self.listed = {bounds.name: bounds for bounds in listed}
        self._clock = clock
        self.by_name: dict[str, Tenant] = {name: Tenant(bounds, clock)
                                           for name, bounds in self.listed.items()}

    def get(self, name: str) -> Tenant:
        tenant = self.by_name.get(name)
        if tenant is None:
            tenant = self.by_name[name] = Tenant(TenantBounds(name), self._clock)
        return tenant

    def check(self, name: str, queued: list["Session"]) -> None:
        """Refuse `queued` (sessions of tenant `name` about to wait) past the tenant's
        own bounds: its rate (tenant_rate), its queue (tenant_queue_full). Retry-After
        is the rate's refill time, or None (the node's drain rate)."""
        tenant = self.get(name)
        bounds = tenant.bounds
        if tenant.rate is not None and tenant.rate.level() <= 0:
            raise AdmissionRejected(
                "tenant_rate", f"tenant {name!r} used its {bounds.tokens_per_min} tokens per "
                "minute", retry_after=tenant.rate.seconds_to_positive())
        tokens = sum(len(s.spec.prompt) for s in queued)
        if bounds.max_waiting is not None and tenant.waiting + len(queued) > bounds.max_waiting:
            raise AdmissionRejected("tenant_queue_full", f"tenant {name!r} has "
                                    f"{tenant.waiting} sessions waiting (its bound: "
                                    f"{bounds.max_waiting})")
        if (bounds.max_queued_tokens is not None
                and tenant.waiting_tokens + tokens > bounds.max_queued_tokens):
            raise AdmissionRejected("tenant_queue_full", f"tenant {name!r} has "
                                    f"{tenant.waiting_tokens} prompt tokens waiting (its "
                                    f"bound: {bounds.max_queued_tokens})")

    def arriving(self, name: str, running: list["Session"]) -> None:
        """A session of `name` comes: a tenant idle until now starts at the least
        counter of the active ones (VTC's lift)."""
        tenant = self.get(name)
        if tenant.active:
            return
        live = self.counters(running)
        active = [live[other] for other, t in self.by_name.items() if t.active]
        if active:
            tenant.charged = max(tenant.charged, min(active))

    def counters(self, running: list["Session"]) -> dict[str, float]:
        """Each tenant's virtual token counter now: what it was charged, and its running
        sessions' output since they last started (a resumed one's earlier output is
        charged already)."""
        live = {name: tenant.charged for name, tenant in self.by_name.items()}
        for session in running:
            name = session.spec.requester.tenant
            live[name] += (OUTPUT_COST * (len(session.generated) - session.resumed_from)
                           / self.by_name[name].bounds.weight)
        return live

    def queued(self, session: "Session", parked: bool = False) -> None:
        tenant = self.get(session.spec.requester.tenant)
        tenant.waiting += 1
        tenant.waiting_tokens += len(session.spec.prompt)
        tenant.parked += parked
        if tenant.rate is not None and not parked:
            tenant.rate.charge(len(session.spec.prompt))

    def dequeued(self, session: "Session", parked: bool = False) -> None:
        tenant = self.by_name[session.spec.requester.tenant]
        tenant.waiting -= 1
        tenant.waiting_tokens -= len(session.spec.prompt)
        tenant.parked -= parked

    def started(self, session: "Session", resumed: bool = False) -> None:
        """A session of the tenant got a slot: its prompt is charged (once, not again
        when it resumes)."""
        tenant = self.by_name[session.spec.requester.tenant]
        tenant.running += 1
        if not resumed:
            tenant.charged += PROMPT_COST * len(session.spec.prompt) / tenant.bounds.weight

    def stopped(self, session: "Session", output_tokens: int) -> None:
        """A running session gave up its slot (it left, or is parked) having generated
        `output_tokens` since it last started."""
        tenant = self.by_name[session.spec.requester.tenant]
        tenant.running -= 1
        tenant.charged += OUTPUT_COST * output_tokens / tenant.bounds.weight

    def left(self, session: "Session") -> None:
        """A session left the node: its output counts against the rate; an unlisted
        tenant with nothing left is forgotten."""
        name = session.spec.requester.tenant
        tenant = self.by_name.get(name)
        if tenant is not None and tenant.rate is not None:
            tenant.rate.charge(len(session.generated))
        self.forget_idle(name)

    def forget_idle(self, name: str) -> None:
        """Forget an unlisted tenant with nothing on the node."""
        tenant = self.by_name.get(name)
        if tenant is not None and not tenant.active and name not in self.listed:
            del self.by_name[name]

    def statistics(self) -> dict:
        """Each tenant's running sessions and queue, in use and in all (None: no
        bound of its own), as `tenant:NAME:running`, `tenant:NAME:waiting_sessions`
        (its parked ones among them) and `tenant:NAME:waiting_tokens`."""
        stats = {}
        for name, t in sorted(self.by_name.items()):
            b = t.bounds
            stats |= {f"tenant:{name}:running": {"used": t.running, "capacity": b.max_running},
                      f"tenant:{name}:waiting_sessions": {"used": t.waiting,
                                                          "capacity": b.max_waiting,
                                                          "parked": t.parked},
                      f"tenant:{name}:waiting_tokens": {"used": t.waiting_tokens,
                                                        "capacity": b.max_queued_tokens}}
        return stats
