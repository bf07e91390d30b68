"""dgr off and dgr auto paired: both nodes up at once, each cell run on one and then
the other back to back (the order alternating by round and cell), many rounds, so
that the machine's drift weighs on a pair for seconds, not for the minutes between
the bench's runs of one server and the next.

    python evidence/DGR-026/paired/paired.py OUT ROUNDS LEVELS WORKLOADS
    e.g. paired.py /tmp/p/paired 12 8,16 "templated burst,natural text"

Prints each round's auto / off per cell and, per cell, their median, geometric mean
and the geometric mean's 95 % interval from a bootstrap over rounds; writes every
run's figures to OUT/paired.json."""

import json
import math
import pathlib
import random
import statistics
import sys

import trio

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))

from benchmarks import speculation as spec  # noqa: E402
from benchmarks.servers import dgr_server, free_port  # noqa: E402
from dgr.engine import resolve_model_path  # noqa: E402

out = pathlib.Path(sys.argv[1])
rounds = int(sys.argv[2])
levels = [int(x) for x in sys.argv[3].split(",")]
workloads = sys.argv[4].split(",")
out.mkdir(parents=True, exist_ok=True)
model = resolve_model_path(None)
threads = 2

rows = []
with dgr_server(model, 16, 2048, threads, free_port(), ["--speculation", "off"],
                log=out / "off.log") as off, \
        dgr_server(model, 16, 2048, threads, free_port(), ["--speculation", "auto"],
                   log=out / "auto.log") as auto:
    nodes = {spec.OFF: off, spec.AUTO: auto}
    for srv in (off, auto):  # the bench's warm-up, untimed
        trio.run(spec.run_level, srv.url, next(iter(spec.WORKLOADS)), max(levels), True,
                 {"speculation": "off"}, 90_000)
    for r in range(rounds):
        for cell, (workload, c) in enumerate((w, c) for w in workloads for c in levels):
            offset = 100 * r + 1000 * c
            order = [spec.OFF, spec.AUTO] if (r + cell) % 2 == 0 else [spec.AUTO, spec.OFF]
            got, row = {}, {}
            for name in order:
                before = spec._spec_counts(nodes[name].url)
                res = trio.run(spec.run_level, nodes[name].url, workload, c, True, None,
                               offset)
                after = spec._spec_counts(nodes[name].url)
                got[name] = res
                row[name] = {"round": r, "workload": workload, "c": c, "server": name,
                             "first": name == order[0],
                             "decode_tok_s": res["decode_tok_s"],
                             "wall_tok_s": res["wall_tok_s"],
                             "drafted": after[0] - before[0],
                             "accepted": after[1] - before[1]}
            same = got[spec.OFF]["texts"] == got[spec.AUTO]["texts"]
            for name in order:
                rows.append(row[name] | {"equal": same})
            ratio = got[spec.AUTO]["decode_tok_s"] / got[spec.OFF]["decode_tok_s"]
            print(f"round {r} {workload} c={c} ({order[0]} first): off "
                  f"{got[spec.OFF]['decode_tok_s']:.1f} auto "
                  f"{got[spec.AUTO]['decode_tok_s']:.1f} ratio {ratio:.3f} "
                  f"drafted/accepted {row[spec.AUTO]['drafted']:.0f}/"
                  f"{row[spec.AUTO]['accepted']:.0f} "
                  f"equal {same}", flush=True)
(out / "paired.json").write_text(json.dumps(rows, indent=1))

rng = random.Random(0)
print("\n| workload | c | rounds | median auto/off | geometric mean | 95 % interval "
      "(bootstrap) | drafted, accepted | auto = off |")
print("|---|---|---|---|---|---|---|---|")
for workload in workloads:
    for c in levels:
        pairs = {}
        for row in rows:
            if row["workload"] == workload and row["c"] == c:
                pairs.setdefault(row["round"], {})[row["server"]] = row
        logs = [math.log(p[spec.AUTO]["decode_tok_s"] / p[spec.OFF]["decode_tok_s"])
                for p in pairs.values()]
        means = sorted(statistics.fmean(rng.choices(logs, k=len(logs))) for _ in range(10_000))
        drafted = sum(p[spec.AUTO]["drafted"] for p in pairs.values())
        accepted = sum(p[spec.AUTO]["accepted"] for p in pairs.values())
        print(f"| {workload} | {c} | {len(logs)} | {math.exp(statistics.median(logs)):.3f} | "
              f"{math.exp(statistics.fmean(logs)):.3f} | {math.exp(means[250]):.3f}-"
              f"{math.exp(means[9750]):.3f} | {drafted:.0f}, {accepted:.0f} | "
              f"{all(p[spec.AUTO]['equal'] for p in pairs.values())} |")
