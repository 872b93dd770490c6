#!/usr/bin/env bash
# The README's test command: set up .venv (scripts/setup.sh) and run the Python tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --verl
.venv/bin/ruff check python tests bench
.venv/bin/python -m pytest -q "$@"
# The verl adapter's tests, in verl's own virtualenv (the run above deselects them).
PYTHONPATH="$PWD/python" .venv-verl/bin/python -m pytest -q -m verl tests/integrations/test_verl.py
