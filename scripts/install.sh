#!/usr/bin/env bash
# Install dgr and everything it needs on a fresh machine (idempotent).
#
# Where: into the interpreter named by $PYTHON if set (an environment you
# manage), else into the virtual environment .venv of this checkout, created
# here when missing. What: the exact versions in requirements.lock (pip
# constraints; DGR_UNLOCKED=1 resolves the newest versions pyproject.toml allows,
# which is how scripts/lock.sh refreshes the lock).
#
# llama-cpp-python is built from the patched pinned llama.cpp once (about 6
# minutes on 2 cores) and then comes from a wheel cache keyed by the pin and the
# patch stack (scripts/build_llama.py). dgr itself is built without build
# isolation so that its Cython extension links that installed libllama.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PYTHON:-}" ]; then
    if [ ! -x .venv/bin/python ]; then
        echo "creating the virtual environment .venv"
        python3 -m venv .venv
    fi
    PYTHON=.venv/bin/python
fi
PY=$PYTHON
if [ "${DGR_UNLOCKED:-0}" != 1 ]; then
    # every pip run below, the wheel build's included, installs the locked versions
    export PIP_CONSTRAINT="$PWD/requirements.lock"
fi

$PY -m pip install --quiet "setuptools>=64" wheel "Cython>=3.0" "numpy>=1.26" scikit-build-core cmake ninja
# vendor/llama.cpp (pristine, headers and peers) and vendor/llama.cpp-patched (patches/series applied)
$PY scripts/vendor_llama.py
# llama-cpp-python from the patched pin: one patched libllama for dgr and llama_cpp (cached wheel)
$PY scripts/build_llama.py
$PY -m pip install --quiet --no-build-isolation -e ".[model,test,bench]"
$PY -c "import dgr._batch, dgr; print('dgr', dgr.__version__, 'installed in', __import__('sys').prefix)"
