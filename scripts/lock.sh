#!/usr/bin/env bash
# Refresh requirements.lock: install dgr with the newest versions that
# pyproject.toml's ranges allow into a new, throw-away virtual environment, then
# write the exact version of every package in it (build tools included, pip
# excepted) as pip constraints. Run the test suite on the new lock before
# committing it (bash scripts/install.sh && .venv/bin/python -m pytest -q).
set -euo pipefail
cd "$(dirname "$0")/.."
ENV_DIR=$(mktemp -d)
trap 'rm -rf "$ENV_DIR"' EXIT
python3 -m venv "$ENV_DIR"
DGR_UNLOCKED=1 PYTHON="$ENV_DIR/bin/python" bash scripts/install.sh
{
    echo "# The exact versions dgr is tested with: pip constraints that scripts/install.sh"
    echo "# installs. Refreshed by: bash scripts/lock.sh ($("$ENV_DIR/bin/python" -c \
'import platform; print("Python", platform.python_version())'), $(date -u +%Y-%m-%d))"
    "$ENV_DIR/bin/python" -m pip list --format=freeze --exclude-editable \
        | grep -v -i -E '^(pip|dgr)==' | LC_ALL=C sort -f
} > requirements.lock
echo "requirements.lock: $(grep -c '==' requirements.lock) packages"
