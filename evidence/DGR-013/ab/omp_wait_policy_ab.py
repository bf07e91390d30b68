import os, sys, trio
sys.path.insert(0, '.')
from benchmarks.concurrency import dgr_server, run_level, free_port
from dgr.node import resolve_model_path
model = resolve_model_path(None)
for rnd in range(2):
    for policy in (None, "PASSIVE"):
        if policy: os.environ["OMP_WAIT_POLICY"] = policy
        else: os.environ.pop("OMP_WAIT_POLICY", None)
        for c in (1, 16):
            with dgr_server(model, c, 1024, 2, free_port()) as srv:
                r = trio.run(run_level, srv.url, c, 64, True)
            sp = r["step_ms_split"]
            print(f"round {rnd} OMP_WAIT_POLICY={policy} c={c}: {r['gen_tok_s']:.1f} tok/s decode {sp['decode']:.2f} yield {sp['yield']:.2f} handoff {sp['handoff']:.2f}", flush=True)
