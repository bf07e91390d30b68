"""The bench's speculation case: exact speculative decoding against llama-server's.

Workloads whose answers quote their input (a code file rewritten with one
change, a summary that quotes its document, a table extracted into JSON under
a grammar, a many-user burst of one templated request) and plain continuation
of natural text, at each concurrency c: c sessions at once, greedy, 96 tokens
each (end-of-generation ignored, so every server generates as many; the JSON
grammar's answer is longer than that), streamed over HTTP. The burst's c
sessions come after one more user's request, untimed: a burst is many users, so
at c = 1 too a timed request follows another user's answer, which a server may
draft from (dgr's node-wide store, llama-server's ngram-mod). Every prompt starts
with its request's own number, so that no server reuses another request's prompt
beyond its first tokens.

Servers, from the same pin, in one run, the whole matrix per round, the order
reversed every other round (each server warmed by an untimed run first): dgr with
speculation off and with auto (two nodes, so that each has served the same
requests before every run as each llama-server has, and dgr auto drafts from no
answers but its own: on one node, auto after off drafted from off's answers of
the same workload, which no peer had), up together and run cell by cell back to
back (`run`); llama-server without speculation and with `--spec-type ngram-mod`
and `ngram-simple`, one at a time; every server gets the same prompts. Reported
per server: decode tokens/s (tokens after each session's first, over the time
from the first session's first token to the last session's last: what
speculation changes, prefill left out; at c > 1 it also counts against dgr the
decode steps it runs while other prompts still prefill beside them, where
llama-server prefills them all first), wall tokens/s (every token, from the
requests being sent), dgr auto's acceptance (from its metrics), and a bitwise
column: dgr auto's text equal to dgr off's for every session.
"""

from __future__ import annotations

import json
import statistics
import time

import httpx
import trio

from benchmarks.servers import dgr_server, free_port, llama_server

N_NEW = 96

_CODE_LINES = []
for _k in range(14):
    _CODE_LINES += [f"def parse_record_{_k}(line):",
                    f"    fields = line.split(',')",
                    f"    return {{'id': int(fields[0]), 'value': float(fields[{_k % 3 + 1}])}}",
                    ""]
CODE = "\n".join(_CODE_LINES)
DOCUMENT = " ".join(
    f"In {1900 + 7 * k}, the river town of Alder built its {['first', 'second', 'third'][k % 3]} "
    f"bridge, and the council recorded that trade grew by {k + 3} percent." for k in range(12))
PEOPLE = [("Ana", "Lisbon", 31), ("Ben", "Leeds", 45), ("Chen", "Xian", 28), ("Dara", "Cork", 39),
          ("Eli", "Haifa", 52), ("Fay", "Perth", 24), ("Gus", "Oslo", 61), ("Hana", "Kobe", 35),
          ("Ivo", "Split", 47), ("Jun", "Osaka", 30), ("Kai", "Turku", 42), ("Lea", "Lyon", 27)]
TABLE = "\n".join(f"| {n} | {c} | {a} |" for n, c, a in PEOPLE)
JSON_GRAMMAR = r'''root ::= "[" ws obj ("," ws obj)* ws "]"
obj ::= "{\"name\": \"" [A-Za-z]+ "\", \"city\": \"" [A-Za-z]+ "\", \"age\": " [0-9]+ "}"
ws ::= [ \n]*'''
NAMES = ["Avery", "Blake", "Casey", "Devon", "Emery", "Finley", "Gray", "Harper", "Indy", "Jordan",
         "Kendall", "Logan", "Morgan", "Noel", "Oakley", "Parker"]

# the workload whose c sessions come after an earlier user's request, numbered the
# run's first plus EARLIER_USER: past its c sessions (c < EARLIER_USER, which the
# bench's command line holds to), within the 100 numbers of its run (run's offset)
BURST = "templated burst"
EARLIER_USER = 40

# the dgr nodes (--speculation off, auto) and the peers, as the tables name them
OFF, AUTO = "dgr off", "dgr auto"
SERVERS = (OFF, AUTO, "llama-server", "llama-server ngram-mod", "llama-server ngram-simple")
# llama-server's batch here: 16 slots, each its sampled token and up to 64 drafts
# (ngram-mod's most)
PEER_BATCH = 2048

WORKLOADS = {
    "code edit": lambda i: (f"# request {i}\n{CODE}\n\n# The same module with parse_record_3 "
                            f"renamed to read_record_3, nothing else changed:\n\n"
                            f"def parse_record_0(line):\n", {}),
    "quoting summary": lambda i: (f"Report {i}.\n{DOCUMENT}\n\nSummary, quoting the report's "
                                  f"sentences word for word:\n\"In 1900, the river town", {}),
    "table to JSON": lambda i: (f"Table {i} (name | city | age):\n{TABLE}\n\nThe same table as "
                                f"JSON:\n", {"grammar": JSON_GRAMMAR}),
    BURST: lambda i: (f"Ticket {1000 + i} from {NAMES[i % len(NAMES)]}: my order has not "
                      f"arrived.\nReply using the standard template:\nDear "
                      f"{NAMES[i % len(NAMES)]}, thank you for contacting us about ticket "
                      f"{1000 + i}.", {}),
    "natural text": lambda i: (f"Chapter {i}. The old lighthouse keeper climbed the stairs "
                               f"every evening, and as the lamp warmed he thought about", {}),
}
QUOTING = ["code edit", "quoting summary", "table to JSON", BURST]


async def _one(client, url, prompt, extra, is_dgr):
    # a grammar ends where it does (dgr refuses ignore_eos with one): its answer is
    # longer than N_NEW tokens
    body = {"prompt": prompt, "max_tokens": N_NEW, "temperature": 0,
            "ignore_eos": "grammar" not in extra, "stream": True, **extra}
    if not is_dgr:
        body["cache_prompt"] = False
    stamps, texts = [], []
    async with client.stream("POST", url + "/v1/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{url}: HTTP {response.status_code}: {(await response.aread())[:300]!r}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            for choice in event.get("choices") or []:
                if choice.get("text"):
                    stamps.append(time.perf_counter())
                    texts.append(choice["text"])
    return stamps, "".join(texts)


async def run_level(url, workload, c, is_dgr, extra=None, offset=0):
    """c sessions of `workload` at once (the burst's after its earlier user's request):
    decode tokens/s, each session's text, and when the sessions' first and last
    tokens came (seconds from the requests being sent, earliest first)."""
    build = WORKLOADS[workload]
    results = [None] * c
    if workload == BURST:
        # a client of its own: llama-server closes a connection after a streamed reply,
        # and a pooled one reused for the next request fails ("Server disconnected")
        async with httpx.AsyncClient(timeout=900) as client:
            prompt, body = build(offset + EARLIER_USER)
            await _one(client, url, prompt, body | (extra or {}), is_dgr)
    started = time.perf_counter()
    async with httpx.AsyncClient(timeout=900, limits=httpx.Limits(max_connections=64)) as client:
        async def one(i):
            prompt, body = build(offset + i)
            results[i] = await _one(client, url, prompt, body | (extra or {}), is_dgr)

        async with trio.open_nursery() as nursery:
            for i in range(c):
                nursery.start_soon(one, i)
    firsts = [s[0] for s, _ in results if s]
    lasts = [s[-1] for s, _ in results if s]
    tokens = sum(max(0, len(s) - 1) for s, _ in results)
    span = max(lasts) - min(firsts) if firsts else 0.0
    generated = sum(len(s) for s, _ in results)
    return {"decode_tok_s": tokens / span if span > 0 else 0.0,
            "wall_tok_s": generated / (max(lasts) - started) if lasts else 0.0,
            "texts": [text for _, text in results],
            "first_s": sorted(t - started for t in firsts),
            "last_s": sorted(t - started for t in lasts)}


def _spec_counts(url):
    text = httpx.get(url + "/metrics", timeout=30).text
    drafted = accepted = 0.0
    for line in text.splitlines():
        if line.startswith("dgr_spec_draft_tokens_total{"):
            drafted += float(line.rsplit(" ", 1)[1])
        elif line.startswith("dgr_spec_accepted_tokens_total{"):
            accepted += float(line.rsplit(" ", 1)[1])
    return drafted, accepted


def server_starts(peers, model, threads, out, names: list[str]) -> dict:
    """The servers `run` takes, by name (of SERVERS): 16 slots of 2,048 cells each,
    each server's log in `out`."""
    def llama(*extra):
        def start(log):
            server = llama_server(peers["llama-server"], model, 16, 2048, threads, free_port(),
                                  log=out / f"spec-{log}.log")
            # its batch holds 16 slots' drafts (at -b 512 the n-gram modes abort at
            # c = 16: "batch must be large enough to hold the sampled and draft
            # tokens"); its ubatches stay 512 (the later -b is the one llama-server takes)
            server.argv += ["-b", str(PEER_BATCH), *extra]
            return server
        return start, False

    def dgr(mode):
        return (lambda log: dgr_server(model, 16, 2048, threads, free_port(),
                                       ["--speculation", mode], log=out / f"spec-{log}.log"),
                True)

    every = {OFF: dgr("off"), AUTO: dgr("auto"), "llama-server": llama(),
             "llama-server ngram-mod": llama("--spec-type", "ngram-mod"),
             "llama-server ngram-simple": llama("--spec-type", "ngram-simple")}
    return {name: every[name] for name in names}


class _Up:
    """A server of the case, started: a run that fails is recorded in `failures`, and
    a server that died is replaced by a fresh one that goes on."""

    def __init__(self, name, start, is_dgr, r, failures):
        self.name, self.start, self.is_dgr, self.r, self.failures = name, start, is_dgr, r, failures
        self.log = f"{name.replace(' ', '-')}-round{r}"
        self.srv = start(self.log).__enter__()

    def attempt(self, workload, c, call):
        try:
            call(self.srv)
        except Exception as exc:
            self.failures.append({"server": self.name, "workload": workload, "c": c,
                                  "round": self.r, "exit_code": self.srv.proc.poll(),
                                  "error": f"{type(exc).__name__}: {exc}"[:300]})
            if self.srv.proc.poll() is not None:
                self.srv.__exit__(None, None, None)
                self.srv = self.start(f"{self.log}-restart{len(self.failures)}").__enter__()

    def stop(self):
        self.srv.__exit__(None, None, None)


def run(servers: dict, levels: list[int], rounds: int, workloads: list[str]) -> dict:
    """servers: name (of SERVERS) -> (a function of a log path starting it, is_dgr);
    workloads: names in WORKLOADS. Returns rows of (round, workload, c, server, decode
    tok/s), dgr auto's acceptance, the bitwise checks, and the runs that failed (a
    server that fails is reported and restarted, not hidden).

    dgr off and dgr auto run as a pair: both nodes up, each cell run on one and then
    on the other back to back, which first alternating cell by cell and round by
    round. Their ratio is the finest the case reports (auto against off, a few
    percent at c >= 8), and a pair's runs are seconds apart, where one server's run
    of a cell and the next server's were minutes apart (this machine drifts by
    10-30 % within a run). The other servers run one at a time."""
    rows, texts, acceptance, failures = [], {}, {}, []
    cells = [(workload, c) for workload in workloads for c in levels]
    pair = [name for name in (OFF, AUTO) if name in servers]
    units = ([pair] if pair else []) + [[name] for name in servers if name not in pair]
    for r in range(rounds):
        # reversed every other round: the machine's drift within a round weighs on
        # each pair of servers both ways
        for unit in units if r % 2 == 0 else units[::-1]:
            up = []
            try:
                for name in unit:
                    up.append(_Up(name, *servers[name], r, failures))
                for server in up:
                    server.attempt("warm-up", max(levels),
                                   lambda srv: _warm_up(srv, server.is_dgr, max(levels)))
                for i, (workload, c) in enumerate(cells):
                    offset = 100 * r + 1000 * c  # every request's prompt its own
                    for server in up if (r + i) % 2 == 0 else up[::-1]:
                        server.attempt(workload, c, lambda srv: _run_one(
                            srv, server.name, server.is_dgr, workload, c, r, offset, rows, texts,
                            acceptance))
            finally:
                for server in up:
                    server.stop()
    bitwise = [{"workload": w, "c": c, "round": r, "equal": texts[(OFF, w, c, r)] == auto}
               for (name, w, c, r), auto in texts.items()
               if name == AUTO and (OFF, w, c, r) in texts]
    return {"rows": rows, "bitwise": bitwise, "failures": failures,
            "acceptance": [{"workload": w, "c": c, "round": r, "drafted": d, "accepted": a}
                           for (w, c, r), (d, a) in acceptance.items()]}


def _warm_up(srv, is_dgr, c):
    """An untimed run of the first workload at c on a fresh server: a node's first
    burst of prompts is scheduled before it has measured its steps (dgr prefills
    them in fixed chunks until its step-time model is fitted, then within the
    decoders' stall bound), so the first timed run would be unlike the others."""
    trio.run(run_level, srv.url, next(iter(WORKLOADS)), c, is_dgr,
             {"speculation": "off"} if is_dgr else None, 90_000)


def _run_one(srv, name, is_dgr, workload, c, r, offset, rows, texts, acceptance):
    before = _spec_counts(srv.url) if name == AUTO else None
    out = trio.run(run_level, srv.url, workload, c, is_dgr, None, offset)
    rows.append({"round": r, "workload": workload, "c": c, "server": name,
                 "decode_tok_s": out["decode_tok_s"], "wall_tok_s": out["wall_tok_s"],
                 "first_s": out["first_s"]})
    if is_dgr:
        texts[(name, workload, c, r)] = out["texts"]
    if before is not None:
        after = _spec_counts(srv.url)
        acceptance[(workload, c, r)] = (after[0] - before[0], after[1] - before[1])


def markdown(result: dict) -> list[str]:
    return (_table(result, "decode_tok_s", "decode") + _table(result, "wall_tok_s", "wall")
            + [f"\n{f['server']} failed on {f['workload']} at c = {f['c']} (round {f['round']}, "
               f"exit code {f['exit_code']}): {f['error']}" for f in result.get("failures", [])])


def _table(result: dict, key: str, label: str) -> list[str]:
    rows = result["rows"]
    servers = list(dict.fromkeys(row["server"] for row in rows))
    cells = {}
    for row in rows:
        cells.setdefault((row["workload"], row["c"], row["server"]), []).append(row[key])
    med = {k: statistics.median(v) for k, v in cells.items()}
    # auto / off: the median of the rounds' pairs (`run` runs a pair back to back)
    by_round = {}
    for row in rows:
        by_round.setdefault((row["workload"], row["c"], row["round"]), {})[row["server"]] = row[key]
    paired = {}
    for (workload, c, _), v in by_round.items():
        if v.get(AUTO) and v.get(OFF):
            paired.setdefault((workload, c), []).append(v[AUTO] / v[OFF])
    acc = {}
    for a in result["acceptance"]:
        d, n = acc.get((a["workload"], a["c"]), (0.0, 0.0))
        acc[(a["workload"], a["c"])] = (d + a["drafted"], n + a["accepted"])
    equal = {}
    for b in result["bitwise"]:
        equal[(b["workload"], b["c"])] = equal.get((b["workload"], b["c"]), True) and b["equal"]
    head = " | ".join(f"{s} tok/s" for s in servers)
    lines = ["", f"| speculation case ({label} tok/s): workload | c | {head} | "
             "auto / off (median of rounds) | auto / llama-server | "
             "auto / best llama-server n-gram | dgr drafted, accepted | auto = off |",
             "|---|---|" + "---|" * (len(servers) + 6)]
    for workload, c in dict.fromkeys((row["workload"], row["c"]) for row in rows):
        v = {s: med.get((workload, c, s)) for s in servers}
        auto = v.get(AUTO)
        plain = v.get("llama-server")
        ngram = max((v[s] for s in servers if s.startswith("llama-server ") and v[s]), default=None)

        def ratio(a, b):
            return f"{a / b:.2f}" if a and b else "-"

        pair = (f"{statistics.median(paired[(workload, c)]):.2f}" if (workload, c) in paired
                else "-")
        d, n = acc.get((workload, c), (0, 0))
        lines.append(f"| {workload} | {c} | " + " | ".join(f"{v[s]:.1f}" if v[s] else "-" for s in servers)
                     + f" | {pair} | {ratio(auto, plain)} | {ratio(auto, ngram)} | "
                     f"{int(d)}, {int(n)} | {'yes' if equal.get((workload, c)) else 'NO'} |")
    return lines
