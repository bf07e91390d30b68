"""A/B: one llama_get_logits per call (new) vs one llama_get_logits_ith per row (old),
through one RPC worker and locally, alternating in one run."""
import subprocess, sys, json
CODE = r'''
import sys, json, trio
sys.path.insert(0, sys.argv[1])
import dgr
from benchmarks.rpc import worker, decode_rate
from dgr.engine import resolve_model_path
model = resolve_model_path(None)
def cfg(workers=()):
    return dgr.NodeConfig(model_path=model, max_running=16, max_waiting=16, n_ctx=8192, n_threads=2,
                          rpc_workers=workers)
out = {}
out["local"] = trio.run(decode_rate, cfg(), [1, 8, 16], 32)
with worker(2) as ep:
    out["worker"] = trio.run(decode_rate, cfg([ep]), [1, 8, 16], 32)
print(json.dumps(out))
'''
trees = {"old": "/tmp/bench-old", "new": "/work/main"}
for rep in range(3):
    for name, tree in trees.items():
        r = subprocess.run([sys.executable, "-c", CODE, tree], cwd=tree, capture_output=True, text=True)
        res = json.loads(r.stdout.strip().splitlines()[-1])
        print(f"rep {rep} {name}: " + "  ".join(
            f"{k} " + "/".join(f"{v:.1f}" for v in res[k].values()) for k in res), flush=True)
