"""``bench/peer_verl.py`` on a tiny configuration (four episodes, three turns), so that the
peer row cannot rot: verl's ``AgentLoopWorker`` running the bench's registered multi-turn
agent loop and the agentgym engine play the same maze episodes on one ``vllm serve`` and the
JSON has its rows. Runs in .venv-verl (marker ``verl``, scripts/test.sh); the server runs
from .venv's vLLM. Wall-clock numbers are not asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = ROOT / ".venv" / "bin" / "python"

pytestmark = pytest.mark.verl


def _has_vllm(python: Path) -> bool:
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    return python.exists() and subprocess.run([str(python), "-c", probe]).returncode == 0


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_verls_loop_and_engine_play_the_same_episodes(tmp_path):
    pytest.importorskip("verl.experimental.agent_loop.agent_loop",
                        reason="verl's package is absent (run in .venv-verl)")
    if not _has_vllm(VLLM_PYTHON):
        pytest.skip(f"no vLLM in {VLLM_PYTHON} to serve the model "
                    "(scripts/setup.sh without --no-vllm installs it)")
    out = tmp_path / "peer.json"
    episodes, turns = 4, 3
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python")}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "peer_verl.py"), "--episodes", str(episodes),
         "--concurrency", "2", "--max-turns", str(turns), "--max-tokens", "8",
         "--repeats", "1", "--vllm-python", str(VLLM_PYTHON), "--out", str(out)],
        capture_output=True, text=True, env=env, timeout=1700)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(out.read_text())
    assert "skipped" not in report
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == report
    (row,) = report["rows"]
    assert row["concurrency"] == 2
    (verl_row,), (engine_row,) = row["runs"]["verl"], row["runs"]["engine"]
    for arm in (verl_row, engine_row):
        assert arm["trajectories"] == episodes
        # long-tailed horizons capped at --max-turns: every episode plays 1..turns turns
        assert episodes <= arm["turns"] <= episodes * turns
        assert arm["generated_tokens"] > 0 and arm["trajectories_per_s"] > 0
        assert 0.0 <= arm["under_half_in_flight_share"] <= 1.0
    # the same episodes: the maze's horizons are per task, and the tiny random model never
    # solves one, so both arms play the same number of turns
    assert verl_row["turns"] == engine_row["turns"]
    # verl's episodes hold exactly the tokens the server sent, one request id an episode
    assert row["token_exact"] and verl_row["token_exact"]
    assert verl_row["episodes_per_request_id"]
    (block,) = report["comparisons"]
    assert block["numerator"] == "engine" and block["denominator"] == "verl"
    assert block["ratio"]["median"] == pytest.approx(
        engine_row["trajectories_per_s"] / verl_row["trajectories_per_s"])
    assert set(block) >= {"arms", "tie", "load_before", "load_after", "cores", "pinning"}
    assert report["verl_client"] == "aiohttp"
