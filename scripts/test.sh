#!/usr/bin/env bash
# The README's test command: set up .venv (scripts/setup.sh) and run the Python tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --verl --skyrl
.venv/bin/ruff check python tests bench
.venv/bin/python -m pytest -q "$@"
# The verl adapter's tests, and the verl peer row's bench on a tiny configuration
# (bench/peer_verl.py: verl's own agent-loop worker on .venv's `vllm serve`), in verl's own
# virtualenv (the run above deselects them).
PYTHONPATH="$PWD/python" .venv-verl/bin/python -m pytest -q -m verl tests/integrations/test_verl.py \
    tests/bench/test_peer_verl.py
# The SkyRL adapter's tests against SkyRL's real package, and the SkyRL peer row's bench on a
# tiny configuration, in SkyRL's own virtualenv (CPython 3.12; the main run deselects them).
if [ -x .venv-skyrl/bin/python ]; then
    PYTHONPATH="$PWD/python" .venv-skyrl/bin/python -m pytest -q -m skyrl \
        tests/integrations/test_skyrl.py tests/bench/test_peer_skyrl.py
else
    echo "scripts/test.sh: skipping the SkyRL tests (-m skyrl): no .venv-skyrl, which needs a CPython 3.12 (scripts/setup.sh --skyrl said why)"
fi
