#!/usr/bin/env bash
# The package on its own, as a user gets it: build the sdist (maturin sdist), build the
# abi3 wheel from that sdist (so both are checked), install the wheel into a fresh virtualenv
# with the extras rl,sims,collect, then, from a folder outside the checkout: list the envs,
# play every registered env with the scripted oracle (no episode may end with env_error),
# collect a few episodes, train two steps, and run the announcement's LLMAgent example.
# Prints each command before it runs it and fails on any error.
# Environment: PYTHON (default python3.11); torch's CPU build as scripts/setup.sh finds it:
# AGENTGYM_TORCH_INDEX, else AGENTGYM_SHARED (default ../shared)/wheels; MATURIN (default
# .venv/bin/maturin); CARGO_TARGET_DIR (default target/, which scripts/setup.sh's release
# build filled: only the two crates of the unpacked sdist compile again); AGENTGYM_WHEEL_KEEP=1
# keeps the temporary folder.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PYTHON=${PYTHON:-python3.11}
MATURIN=${MATURIN:-$ROOT/.venv/bin/maturin}
SHARED=${AGENTGYM_SHARED:-../shared}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
if [ -n "${AGENTGYM_TORCH_INDEX:-}" ]; then
    TORCH_SRC=(--extra-index-url "$AGENTGYM_TORCH_INDEX")
elif compgen -G "$SHARED/wheels/torch-*.whl" >/dev/null; then
    TORCH_SRC=(--find-links "$(cd "$SHARED/wheels" && pwd)")
else
    echo "scripts/test_wheel.sh: no torch wheel in $SHARED/wheels and no AGENTGYM_TORCH_INDEX (see scripts/setup.sh)" >&2
    exit 1
fi
WORK=$(mktemp -d /tmp/agentgym-wheel.XXXXXX)
if [ "${AGENTGYM_WHEEL_KEEP:-0}" != 1 ]; then
    trap 'rm -rf "$WORK"' EXIT
fi
run() {
    echo "+ $*" >&2
    "$@"
}
t0=$SECONDS

echo "== the sdist and the wheel built from it"
run "$MATURIN" sdist --out "$WORK/sdist"
SDIST=$(ls "$WORK"/sdist/agentgym_rl-*.tar.gz)
run tar -xzf "$SDIST" -C "$WORK/sdist"
(cd "$WORK"/sdist/agentgym_rl-*/ && run "$MATURIN" build --release --out "$WORK/dist")
# one abi3 wheel for every CPython >= 3.10
WHEEL=$(ls "$WORK"/dist/agentgym_rl-*-cp310-abi3-*.whl)
echo "wheel: $(basename "$WHEEL") ($(( SECONDS - t0 )) s)"

echo "== a fresh virtualenv with the wheel and its extras rl,sims,collect"
run "$PYTHON" -m venv "$WORK/venv"
PIP=("$WORK/venv/bin/python" -m pip --disable-pip-version-check)
run "${PIP[@]}" install -q -c "$ROOT/requirements/constraints.txt" "${TORCH_SRC[@]}" \
    "$WHEEL[rl,sims,collect]"
# vllm is not installed here, so PyPI's torchvision does not come along; check anyway that
# the ML stack imports beside torch's CPU build
run "$WORK/venv/bin/python" -W ignore -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
echo "ScienceWorld needs Java 17:"
run java -version

echo "== outside the checkout ($WORK/user)"
mkdir "$WORK/user"
cd "$WORK/user"
export PATH="$WORK/venv/bin:$PATH"
AGENTGYM=$WORK/venv/bin/agentgym-rl
# the package, not the checkout, is what gets imported
run "$WORK/venv/bin/python" -c "import agentgym, agentgym._core; assert agentgym.__file__.startswith('$WORK/venv/'), agentgym.__file__; print('agentgym from', agentgym.__file__)"

run "$AGENTGYM" list
# the single-agent envs (the games are played by self-play, not eval)
ENVS=$( { "$AGENTGYM" list --kind native; "$AGENTGYM" list --kind python; } | awk '{print $1}' | paste -sd, -)

run "$AGENTGYM" eval --backend scripted --env "$ENVS" --tasks 3 --max-turns 30 -o eval
run "$WORK/venv/bin/python" - eval/eval.json <<'EOF'
import json, sys

report = json.load(open(sys.argv[1]))
bad = []
for row in report["results"]:
    m = row["metrics"]
    print(f"{row['env']:<20} episodes {row['episodes']}  success {row['success_rate']:.2f}  "
          + "  ".join(f"{k.split('/')[1]}={v:.2f}" for k, v in sorted(m.items())
                      if k.startswith("stop_reason/")))
    if row["episodes"] < 1 or m.get("stop_reason/env_error", 0.0) > 0:
        bad.append(row["env"])
if bad:
    sys.exit(f"env_error or no episodes in: {', '.join(bad)}")
print(f"{len(report['results'])} envs, no env_error")
EOF

run "$AGENTGYM" collect --env textcraft --tasks 0:8 --n-samples 2 --backend scripted \
    --output collected --no-progress --json | tee collect.json
run "$WORK/venv/bin/python" -c "
import json
run = json.load(open('collect.json'))['run']
assert run['rows'] == 16 and run['complete'], run
assert 'env_error' not in run['stop_reasons'], run
print('collected', run['rows'], 'rows:', run['stop_reasons'])"

run "$AGENTGYM" train --max-steps 2 --steps-per-stage 1 --tasks-per-step 2 --n-samples 2 \
    --eval-tasks 4 --eval-every 2 \
    --set 'warmup={"episodes": 8, "steps": 12, "batch_size": 8, "max_turns": 8}' -o train-run
test -f train-run/summary.json && test -f train-run/config.yaml
# the shipped configs, by bare name, outside the checkout
run "$AGENTGYM" plan --config agentgym_rl/textcraft_7b --gpus 8

echo "+ python: the announcement's LLMAgent example" >&2
"$WORK/venv/bin/python" - <<'EOF'
from agentgym.agents import LLMAgent
from agentgym.envs import ECommerceServiceEnv

env = ECommerceServiceEnv()
agent = LLMAgent(base_model="tiny", output_dir="llmagent-run", warmup=None)
summary = agent.train(env, method="ScalingInter-RL", max_steps=1, eval_tasks=2,
                      tasks_per_step=2, n_samples=2)
assert summary["steps"] == 1, summary
result = agent.infer(env, tasks=2)
assert len(result.trajectories) == 2, result
assert not [t for t in result.trajectories if t.stop_reason == "env_error"], result
print("LLMAgent:", summary["steps"], "step;", result)
EOF
echo "== the wheel works on its own ($(( SECONDS - t0 )) s)"
