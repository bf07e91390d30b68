"""The steps a node times as it opens (dgr.engine.measure_row_times) on the default
model, at 1 and 16 slots: each probe's rows and milliseconds, and their sum.

    PYTHONPATH=. python3 evidence/DGR-026/row_probes.py > evidence/DGR-026/row-probes.txt
"""
import dgr
from dgr.engine import load_engine, resolve_model_path

for slots in (1, 16):
    engine, _, probes = load_engine(dgr.NodeConfig(model_path=resolve_model_path(None),
                                                   max_running=slots, n_ctx=1024 * slots))
    engine.close()
    print(f"{slots} slot(s): " + ", ".join(f"{rows} rows {s * 1e3:.1f} ms" for rows, s in probes)
          + f"; in all {sum(s for _, s in probes):.2f} s")
