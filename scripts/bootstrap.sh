#!/usr/bin/env bash
# Create the project's virtual environment and install splitflow with its pinned
# development dependencies (pyproject.toml is the one place versions are pinned).
set -euo pipefail
py="${1:-python3}"
venv="${2:-.venv}"
"$py" - <<'PYCHECK'
import sys
if sys.version_info < (3, 11):
    sys.exit(f"splitflow needs Python 3.11 or newer; {sys.executable} is {sys.version.split()[0]}")
PYCHECK
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet -e ".[dev,spark]"
