#!/usr/bin/env bash
# Install dgr and everything it needs on a fresh machine (idempotent).
#
# llama-cpp-python is built from the patched pinned llama.cpp once (about 6
# minutes on 2 cores) and then comes from a wheel cache keyed by the pin and the
# patch stack (scripts/build_llama.py). dgr itself is built without build
# isolation so that its Cython extension links that installed libllama.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

$PY -m pip install --quiet "setuptools>=64" wheel "Cython>=3.0" "numpy>=1.26" scikit-build-core cmake ninja
# vendor/llama.cpp (pristine, headers and peers) and vendor/llama.cpp-patched (patches/series applied)
$PY scripts/vendor_llama.py
# llama-cpp-python from the patched pin: one patched libllama for dgr and llama_cpp (cached wheel)
$PY scripts/build_llama.py
$PY -m pip install --quiet --no-build-isolation -e ".[model,test,bench]"
$PY -c "import dgr._batch, dgr; print('dgr', dgr.__version__, 'installed; llama.cpp engine ok')"
