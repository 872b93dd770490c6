#!/usr/bin/env bash
# The GPU check, one script (under 10 minutes on one GPU with torch and no vLLM):
#   1. learner tokens/s and peak memory, ours vs TRL's GRPOTrainer, tiny model and
#      SmolLM2-135M (bench/peer_trl_learner.py on cuda);
#   2. transformers-backend rollout throughput, the engine vs TRL's own generation loop
#      (bench/trl_rollout.py's paths on cuda).
# It runs bench/gpu_check.py and writes gpu_check.json under $OUT when OUT is set (else
# bench/results/). What the two parts measure: bench/gpu_check.py's docstring.
#
#   bench/gpu_check.sh --prepare          # HERE, before a device run: writes .gpu_check/
#   bench/gpu_check.sh                    # on the GPU machine (cuda)
#   bench/gpu_check.sh --device cpu --tiny   # the CPU smoke run (the test runs this)
#
# What a GPU machine without this checkout's build needs, and how it gets it:
#   - the Rust extension agentgym._core: carry python/agentgym/_core.abi3.so (built here by
#     scripts/setup.sh; abi3, x86-64, loads on CPython >= 3.9), or have cargo and maturin
#     there (then it is built into /tmp/gpu_check_site);
#   - TRL and datasets, which the device image lacks: --prepare downloads their wheels for
#     CPython 3.12 (trl, datasets, dill, multiprocess) into .gpu_check/wheels; carry
#     .gpu_check and they are installed into /tmp/gpu_check_site with no index;
#   - SmolLM2-135M: its weights (a 98 MB GGUF) do not fit a device run's 64 MiB; --prepare
#     copies its config and tokenizer to .gpu_check/smollm2-arch and the learner row runs
#     that architecture with random weights (the report says which).
# A device run: carry [".gpu_check", "python/agentgym/_core.abi3.so"], command
# `bash bench/gpu_check.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PREPARE=0
ARGS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --prepare) PREPARE=1 ;;
        *) ARGS+=("$1") ;;
    esac
    shift
done
if [ -n "${PYTHON:-}" ]; then
    PY=$PYTHON
elif [ -x .venv/bin/python ]; then
    PY=.venv/bin/python
else
    PY=python3
fi
CHECK_DIR=$ROOT/.gpu_check

if [ "$PREPARE" = 1 ]; then
    # Here, with the project's .venv: SmolLM2's config and tokenizer, and the wheels the
    # device image lacks (the versions installed here).
    mkdir -p "$CHECK_DIR/smollm2-arch" "$CHECK_DIR/wheels"
    grep -qx '/.gpu_check/' .git/info/exclude 2>/dev/null || echo '/.gpu_check/' >>.git/info/exclude
    SMOL=$("$PY" -c 'from agentgym.models import resolve_model; print(resolve_model("smollm2-135m"))')
    for f in config.json tokenizer.json tokenizer_config.json chat_template.jinja generation_config.json; do
        if [ -f "$SMOL/$f" ]; then cp "$SMOL/$f" "$CHECK_DIR/smollm2-arch/"; fi
    done
    PINS=$("$PY" - <<'EOF'
from importlib.metadata import version
print(" ".join(f"{n}=={version(n)}" for n in ("trl", "datasets", "dill", "multiprocess")))
EOF
)
    "$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform any -d "$CHECK_DIR/wheels" $PINS
    echo "gpu_check: prepared $CHECK_DIR ($(du -sh "$CHECK_DIR" | cut -f1)); carry .gpu_check and python/agentgym/_core.abi3.so"
    exit 0
fi

SITE=/tmp/gpu_check_site
export PYTHONPATH="$ROOT/python:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
if compgen -G "$CHECK_DIR/wheels/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" "$CHECK_DIR"/wheels/*.whl
    export PYTHONPATH="$PYTHONPATH:$SITE"
fi
if ! "$PY" -c 'import agentgym._core' 2>/dev/null; then
    if command -v cargo >/dev/null && "$PY" -m maturin --version >/dev/null 2>&1; then
        echo "gpu_check: building the Rust extension agentgym._core (maturin, release)"
        rm -rf /tmp/gpu_check_wheel
        "$PY" -m maturin build --release -o /tmp/gpu_check_wheel
        "$PY" -m pip install -q --no-index --no-deps --target "$SITE" /tmp/gpu_check_wheel/*.whl
        export PYTHONPATH="$SITE:$PYTHONPATH"
    else
        echo "gpu_check: agentgym._core (the Rust extension) does not import here, and there is" \
             "no Rust toolchain (cargo) with maturin to build it. Carry" \
             "python/agentgym/_core.abi3.so built by scripts/setup.sh on an x86-64 machine, or" \
             "install cargo and 'pip install maturin'. Import error:" >&2
        "$PY" -c 'import agentgym._core' >&2 || true
        exit 3
    fi
fi
if ! "$PY" -c 'import trl, datasets' 2>/dev/null; then
    echo "gpu_check: TRL and datasets do not import here: run 'bench/gpu_check.sh --prepare'" \
         "on a machine with the project's .venv and carry .gpu_check (its wheels)." >&2
    "$PY" -c 'import trl, datasets' >&2 || true
    exit 3
fi
export TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
exec "$PY" bench/gpu_check.py "${ARGS[@]}"
