"""``bench/peer_skyrl.py`` on a tiny configuration (four tasks per env, two turns), so that the
peer row cannot rot: SkyRL's ``SkyRLGymGenerator`` and the agentgym engine play the same
episodes on one vLLM server and the JSON has its rows. Runs in .venv-skyrl (marker
``skyrl``); the server runs from .venv's vLLM. Wall-clock numbers are not asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = ROOT / ".venv" / "bin" / "python"

pytestmark = pytest.mark.skyrl


def _has_vllm(python: Path) -> bool:
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    return python.exists() and subprocess.run([str(python), "-c", probe]).returncode == 0


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_both_rows_play_the_same_episodes(tmp_path):
    pytest.importorskip("skyrl.train.generators.skyrl_gym_generator",
                        reason="SkyRL's package is absent (run in .venv-skyrl)")
    if not _has_vllm(VLLM_PYTHON):
        pytest.skip(f"no vLLM in {VLLM_PYTHON} to serve the model "
                    "(scripts/setup.sh without --no-vllm installs it)")
    out = tmp_path / "peer.json"
    tasks, turns, tokens = 4, 2, 8
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "peer_skyrl.py"), "--envs", "maze", "textcraft",
         "--tasks", str(tasks), "--max-turns", str(turns), "--max-new-tokens", str(tokens),
         "--repeats", "1", "--vllm-python", str(VLLM_PYTHON), "--out", str(out)],
        capture_output=True, text=True, timeout=840,
        env={**os.environ, "PYTHONPATH": str(ROOT / "python")})
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == json.loads(out.read_text())
    assert result["bench"] == "peer_skyrl"
    assert result["settings"]["max_turns"] == turns
    assert result["settings"]["concurrency"] == tasks  # default: every episode at once
    assert set(result["envs"]) == {"maze", "textcraft"}
    for env in result["envs"].values():
        assert env["episodes"] == [[t, 1000 + t] for t in range(tasks)]
        assert env["same_first_prompts"] is True  # token for token, every episode
        for name in ("skyrl", "agentgym"):
            (run,) = env["runs"][name]
            assert run["trajectories"] == tasks
            assert tasks <= run["turns"] <= tasks * turns
            assert 0 < run["generated_tokens"] <= run["turns"] * tokens
            assert run["trajectories_per_s"] > 0 and run["generated_tokens_per_s"] > 0
            assert len(env[name]["wall_s_rounds"]) == 1
            assert "errors" not in env[name]
        assert env["agentgym_over_skyrl"]["median"] > 0
    assert [b["env"] for b in result["comparisons"]] == ["maze", "textcraft"]
    for block in result["comparisons"]:
        assert block["numerator"] == "agentgym" and block["denominator"] == "skyrl"
        assert set(block) >= {"ratio", "arms", "tie", "load_before", "cores", "pinning"}
