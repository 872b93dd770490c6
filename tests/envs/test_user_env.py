"""The user env of docs/environments.md ("Writing your own environment"), taken from the docs
as written: it plays through the CLI by ``module:Class``, its oracle solves it, its random
policy draws from its actions, and the format warm-up learns from it."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def env_dir(tmp_path_factory) -> Path:
    text = (ROOT / "docs" / "environments.md").read_text()
    section = text[text.index("## Writing your own environment"):]
    block = re.search(r"```python\n# guessenv.py\n(.*?)```", section, re.S).group(1)
    out = tmp_path_factory.mktemp("user_env")
    (out / "guessenv.py").write_text(block)
    return out


def _cli(env_dir: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{env_dir}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.run([sys.executable, "-m", "agentgym.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_the_docs_env_plays_by_module_and_class_through_the_cli(env_dir, tmp_path):
    done = _cli(env_dir, "eval", "--env", "guessenv:GuessEnv", "--backend", "scripted",
                "--tasks", "8", "-o", "ev", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (row,) = json.loads((tmp_path / "ev" / "eval.json").read_text())["results"]
    assert row["episodes"] == 8 and row["success_rate"] == 1.0  # binary search finds it
    done = _cli(env_dir, "collect", "--env", "guessenv:GuessEnv", "--tasks", "0:6",
                "--backend", "scripted", "--policy", "random", "--output", "c", "--json",
                "--no-progress", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    run = json.loads(done.stdout)["run"]
    assert run["rows"] == 6 and run["complete"] and "env_error" not in run["stop_reasons"]


def test_the_docs_env_gives_the_warm_up_its_actions(env_dir, monkeypatch):
    monkeypatch.syspath_prepend(str(env_dir))
    from agentgym.learner.warmup import random_policy_transcripts

    stats: dict = {}
    transcripts = random_policy_transcripts("guessenv:GuessEnv", _tokenizer(), episodes=4,
                                            max_turns=4, stats=stats)
    assert transcripts and stats.get("actions", 0) > 0


def _tokenizer():
    from transformers import AutoTokenizer

    from agentgym.models import cached_tiny_model

    return AutoTokenizer.from_pretrained(cached_tiny_model())
