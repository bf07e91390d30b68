"""The speculation case's schedule (benchmarks/speculation.py `run`): dgr off and
auto run each cell back to back, which first alternating, the peers one at a
time; a server that dies is recorded and replaced."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from benchmarks import speculation  # noqa: E402
from benchmarks.speculation import AUTO, OFF  # noqa: E402


class FakeServer:
    def __init__(self, name, log, events):
        self.name, self.log, self.events = name, log, events
        self.proc = self
        self.dead = False

    def poll(self):
        return 1 if self.dead else None

    def __enter__(self):
        self.events.append(("start", self.name, self.log))
        return self

    def __exit__(self, *exc):
        self.events.append(("stop", self.name, self.log))


def schedule(monkeypatch, names, rounds, dies=None):
    """The events of `run` over fake servers: starts, stops and runs in order;
    `dies`: (server, workload, c) whose run fails with its server dead."""
    events = []
    servers = {name: ((lambda log, name=name: FakeServer(name, log, events)), "dgr" in name)
               for name in names}

    def run_one(srv, name, is_dgr, workload, c, r, offset, rows, texts, acceptance):
        events.append(("run", name, workload, c, r))
        if (name, workload, c) == dies and r == 0:
            srv.dead = True
            raise RuntimeError("gone")
        rows.append({"round": r, "workload": workload, "c": c, "server": name,
                     "decode_tok_s": 1.0, "wall_tok_s": 1.0, "first_s": [0.0]})
        if is_dgr:
            texts[(name, workload, c, r)] = ["same"]

    monkeypatch.setattr(speculation, "_run_one", run_one)
    monkeypatch.setattr(speculation, "_warm_up", lambda srv, is_dgr, c: None)
    result = speculation.run(servers, [1, 8], rounds, ["code edit", "natural text"])
    return events, result


def test_dgr_off_and_auto_run_each_cell_back_to_back_which_first_alternating(monkeypatch):
    events, result = schedule(monkeypatch, [OFF, AUTO, "llama-server"], 2)
    runs = [e[1:] for e in events if e[0] == "run"]
    # round 0: the pair, then llama-server; round 1 reversed
    assert runs[:8] == [(OFF, "code edit", 1, 0), (AUTO, "code edit", 1, 0),
                        (AUTO, "code edit", 8, 0), (OFF, "code edit", 8, 0),
                        (OFF, "natural text", 1, 0), (AUTO, "natural text", 1, 0),
                        (AUTO, "natural text", 8, 0), (OFF, "natural text", 8, 0)]
    assert [e[0] for e in runs[8:12]] == ["llama-server"] * 4
    assert [e[0] for e in runs[12:16]] == ["llama-server"] * 4
    assert runs[16:18] == [(AUTO, "code edit", 1, 1), (OFF, "code edit", 1, 1)]
    # both nodes are up for the pair's runs, and each server is stopped
    first_run = events.index(("run", OFF, "code edit", 1, 0))
    assert [e[1] for e in events[:first_run] if e[0] == "start"] == [OFF, AUTO]
    assert sum(e[0] == "start" for e in events) == sum(e[0] == "stop" for e in events) == 6
    assert len(result["bitwise"]) == 8 and all(b["equal"] for b in result["bitwise"])


def test_a_server_that_dies_is_recorded_and_replaced_and_the_pair_goes_on(monkeypatch):
    events, result = schedule(monkeypatch, [OFF, AUTO], 1, dies=(AUTO, "code edit", 8))
    assert [(f["server"], f["workload"], f["c"], f["exit_code"]) for f in result["failures"]] \
        == [(AUTO, "code edit", 8, 1)]
    restarted = [e for e in events if e[0] == "start" and "restart" in e[2]]
    assert [e[1] for e in restarted] == [AUTO]
    # every other run happened, on the fresh auto node after the failure
    assert len([e for e in events if e[0] == "run"]) == 8
    assert sum(e[0] == "start" for e in events) == sum(e[0] == "stop" for e in events) == 3


def test_the_tables_auto_over_off_is_the_median_of_the_rounds_pairs():
    # per round auto / off: 2.0, 0.5, 1.5 -> median 1.5; the medians' ratio would be
    # 5 / 3 = 1.67
    tok_s = {OFF: [1.0, 4.0, 3.0], AUTO: [2.0, 2.0, 4.5]}
    rows = [{"round": r, "workload": "code edit", "c": 1, "server": name,
             "decode_tok_s": tok_s[name][r], "wall_tok_s": 1.0, "first_s": [0.0]}
            for r in range(3) for name in (OFF, AUTO)]
    lines = speculation.markdown({"rows": rows, "acceptance": [], "bitwise": []})
    decode_row = next(line for line in lines if line.startswith("| code edit | 1 |"))
    assert decode_row.split(" | ")[4] == "1.50"
