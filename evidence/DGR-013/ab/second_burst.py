import sys, trio, subprocess, threading, time
sys.path.insert(0, '.')
import benchmarks.concurrency as bc
from dgr.node import resolve_model_path
model = resolve_model_path(None)
srv = bc.dgr_server(model, 16, 1024, 2, bc.free_port())
srv.__enter__()
def spy_later():
    time.sleep(3)
    out = subprocess.run(["py-spy", "dump", "--pid", str(srv.proc.pid)], capture_output=True, text=True)
    print(out.stdout[-6000:], out.stderr[-500:], flush=True)  # where the time goes (py-spy)
for i in range(2):
    t = None
    if i == 1:
        t = threading.Thread(target=spy_later); t.start()
    r = trio.run(bc.run_level, srv.url, 16, 64, True)
    if t: t.join()
    print(f"run {i}: {r['gen_tok_s']:.1f} tok/s decode {r['step_ms_split']['decode']:.1f}", flush=True)
srv.__exit__(None, None, None)
