#!/usr/bin/env bash
# The README's test command: set up .venv (scripts/setup.sh) and run the Python tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check python tests bench
.venv/bin/python -m pytest -q "$@"
