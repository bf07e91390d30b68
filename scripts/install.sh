#!/usr/bin/env bash
# Install dgr and everything it needs on a fresh machine (idempotent).
#
# llama-cpp-python is built from source once (about 8 minutes on 2 cores) and
# then comes from pip's wheel cache. dgr itself is built without build
# isolation so that its Cython extension links that installed libllama.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

$PY -m pip install --quiet "setuptools>=64" wheel "Cython>=3.0" "numpy>=1.26" scikit-build-core cmake ninja
# mtmd (multimodal) is not used by dgr: skipping it trims the build.
CMAKE_ARGS="${CMAKE_ARGS:--DLLAVA_BUILD=OFF}" $PY -m pip install --quiet llama-cpp-python==0.3.36
$PY scripts/vendor_llama.py
$PY -m pip install --quiet --no-build-isolation -e ".[model,test,bench]"
$PY -c "import dgr._batch, dgr; print('dgr', dgr.__version__, 'installed; llama.cpp engine ok')"
