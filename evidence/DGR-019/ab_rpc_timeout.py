import sys, time, trio
sys.path.insert(0, "/work/main")
import dgr
from benchmarks.rpc import worker, decode_rate
from dgr.engine import resolve_model_path
model = resolve_model_path(None)
def cfg(workers=(), t=60.0):
    return dgr.NodeConfig(model_path=model, max_running=16, max_waiting=16, n_ctx=8192, n_threads=2,
                          rpc_workers=workers, rpc_timeout_s=t)
for rep in range(3):
    local = trio.run(decode_rate, cfg(), [1, 8], 32)
    with worker(2) as ep:
        t60 = trio.run(decode_rate, cfg([ep], 60.0), [1, 8], 32)
    with worker(2) as ep:
        t0 = trio.run(decode_rate, cfg([ep], 0.0), [1, 8], 32)
    print(f"rep {rep}: local {local[1]:.1f}/{local[8]:.1f}  worker(timeout 60) {t60[1]:.1f}/{t60[8]:.1f} "
          f"({t60[1]/local[1]:.2f}x/{t60[8]/local[8]:.2f}x)  worker(no timeout) {t0[1]:.1f}/{t0[8]:.1f} "
          f"({t0[1]/local[1]:.2f}x/{t0[8]/local[8]:.2f}x)", flush=True)
