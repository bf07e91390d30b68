"""Reads row_context.py's steps: per run the decode-only steps at its c (median
seconds, cells held), then the within-group least squares (each count of rows its
own mean) of the steps' seconds on each candidate measure of their attention.

    python evidence/DGR-026/row-context/fit.py cells.json
"""

import json
import sys

import numpy as np

steps = [s for s in json.load(open(sys.argv[1])) if not s["prefilled"] and s["rows"]]
for run in dict.fromkeys(s["run"] for s in steps):
    c = int(run.rsplit("=", 1)[1])
    at_c = [s for s in steps if s["run"] == run and s["rows"] == c]
    if at_c:
        print(f"{run:22s} {len(at_c):3d} steps of {c} rows: median "
              f"{1e3 * np.median([s['seconds'] for s in at_c]):6.1f} ms, cells held "
              f"{min(s['cells'] for s in at_c)}-{max(s['cells'] for s in at_c)}, own "
              f"{min(s['own_cells'] for s in at_c)}-{max(s['own_cells'] for s in at_c)}")
rows = np.array([s["rows"] for s in steps], float)
seconds = np.array([s["seconds"] for s in steps])
cells = np.array([s["cells"] for s in steps], float) / 1024
own = np.array([s["own_cells"] for s in steps], float) / 1024
print(f"\n{len(steps)} decode-only steps; within each count of rows (3 steps or more):")
for name, xs in [("cells held", [cells]), ("rows x cells held", [rows * cells]),
                 ("own cells", [own]), ("own + rows x cells", [own, rows * cells])]:
    x_parts, y_parts = [], []
    for g in np.unique(rows):
        m = rows == g
        if m.sum() >= 3:
            x_parts.append(np.column_stack([x[m] - x[m].mean() for x in xs]))
            y_parts.append(seconds[m] - seconds[m].mean())
    x, y = np.vstack(x_parts), np.concatenate(y_parts)
    coef = np.linalg.lstsq(x, y, rcond=None)[0]
    r2 = 1 - ((y - x @ coef) ** 2).sum() / (y ** 2).sum()
    print(f"  {name:20s} ms per 1,024: {', '.join(f'{1e3 * v:.3f}' for v in coef):15s} "
          f"share of the variance explained {r2:.2f}")
