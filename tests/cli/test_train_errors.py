"""Every mistake ``agentgym-rl train`` can meet is one line on stderr naming the key or
flag, exit status 2, no traceback, and nothing written; Ctrl-C saves a checkpoint and the
summary and exits 130, and ``--resume`` continues the curve in the same folder."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentgym.cli import main

ROOT = Path(__file__).resolve().parents[2]


def _setup(case: str, tmp: Path) -> list[str]:
    """The argv of ``case`` (its files made under ``tmp``)."""
    run = tmp / "run"
    if case == "yaml_key_typo":
        (tmp / "c.yaml").write_text("max_steps: 2\nrollout: {max_turnz: 3}\n")
        return ["--config", str(tmp / "c.yaml"), "-o", str(run)]
    if case == "yaml_wrong_type":
        (tmp / "c.yaml").write_text("max_steps: three\n")
        return ["--config", str(tmp / "c.yaml"), "-o", str(run)]
    if case == "yaml_old_and_new_spelling":
        (tmp / "c.yaml").write_text("max_new_tokens: 6\nrollout: {max_new_tokens: 3}\n")
        return ["--config", str(tmp / "c.yaml"), "-o", str(run)]
    if case == "yaml_syntax":
        (tmp / "c.yaml").write_text("rollout: {max_turns: [\n")
        return ["--config", str(tmp / "c.yaml"), "-o", str(run)]
    if case == "set_key_typo":
        return ["--set", "max_stepz=3", "-o", str(run)]
    if case == "set_wrong_type":
        return ["--set", "learner.lr=fast", "-o", str(run)]
    if case == "no_such_config":
        return ["--config", "smollm3_maze", "-o", str(run)]
    if case == "unknown_env":
        return ["--env", "nosuchenv", "-o", str(run)]
    if case == "game_without_self_play":
        return ["--env", "tictactoe", "--set", "self_play=false", "-o", str(run)]
    if case == "flag_value":
        return ["--max-steps", "-1", "-o", str(run)]
    if case == "output_not_empty":
        run.mkdir()
        (run / "metrics.jsonl").write_text("{}\n")
        return ["-o", str(run)]
    if case == "overwrite_not_a_run":
        run.mkdir()
        (run / "notes.txt").write_text("mine\n")
        return ["-o", str(run), "--overwrite"]
    if case == "output_is_a_file":
        run.write_text("a file\n")
        return ["-o", str(run)]
    if case == "resume_without_checkpoint":
        run.mkdir()
        (run / "metrics.jsonl").write_text("")
        return ["--resume", str(run)]
    if case == "resume_and_overwrite":
        (run / "checkpoints" / "step_1").mkdir(parents=True)
        (run / "checkpoints" / "step_1" / "trainer_state.pt").write_bytes(b"")
        (run / "checkpoints" / "latest").write_text("step_1\n")
        return ["--resume", str(run), "--overwrite"]
    raise AssertionError(case)


#: case -> what its one line names
CASES = {
    "yaml_key_typo": ["rollout.max_turnz", "rollout.max_turns"],
    "yaml_wrong_type": ["max_steps", "integer", "three"],
    "yaml_old_and_new_spelling": ["max_new_tokens", "rollout.max_new_tokens"],
    "yaml_syntax": ["c.yaml", "not valid YAML"],
    "set_key_typo": ["max_stepz", "max_steps"],
    "set_wrong_type": ["learner.lr", "number", "fast"],
    "no_such_config": ["smollm3_maze", "smollm2_maze_cpu"],
    "unknown_env": ["nosuchenv"],
    "game_without_self_play": ["tictactoe", "--self-play"],
    "flag_value": ["--max-steps", "-1"],
    "output_not_empty": ["--output", "not empty", "--resume", "--overwrite"],
    "overwrite_not_a_run": ["--output", "holds no run"],
    "output_is_a_file": ["--output", "file"],
    "resume_without_checkpoint": ["--resume", "no checkpoint"],
    "resume_and_overwrite": ["--resume", "--overwrite"],
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_train_mistake_is_one_line_and_exit_2(case, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = _setup(case, tmp_path)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    try:
        rc = main(["train", *argv])
    except SystemExit as e:  # refused while parsing the flags
        rc = e.code
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2, err
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert lines[0].startswith("agentgym-rl train: error:"), lines[0]
    for word in CASES[case]:
        assert word in lines[0], (word, lines[0])
    # refused before anything was built or written
    assert sorted(p.name for p in tmp_path.rglob("*")) == before
    assert not (tmp_path / "runs").exists()


def test_the_real_command_line_says_a_yaml_typo_in_one_line(tmp_path):
    (tmp_path / "c.yaml").write_text("warmup: {stepz: 3}\n")
    proc = subprocess.run([sys.executable, "-m", "agentgym.cli", "train", "--config",
                           str(tmp_path / "c.yaml")], capture_output=True, text=True,
                          cwd=tmp_path, timeout=240)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "agentgym-rl train: error: unknown key warmup.stepz (did you mean warmup.steps?)"]
    assert not (tmp_path / "runs").exists()


def test_a_shipped_config_runs_by_name_outside_the_checkout(tmp_path, capsys, monkeypatch):
    """``--config configs/smollm2_maze_cpu.yaml`` (the checkout's spelling) and the bare
    name are found in the package outside the checkout; here a typo in --set stops the
    run before anything is built, after the config was found and read."""
    monkeypatch.chdir(tmp_path)
    for name in ("configs/smollm2_maze_cpu.yaml", "smollm2_maze_cpu"):
        rc = main(["train", "--config", name, "--set", "rollout.reply_prefx=x"])
        err = capsys.readouterr().err
        assert rc == 2 and "rollout.reply_prefx (did you mean rollout.reply_prefix?)" in err


# ------------------------------------------------------------------------------- Ctrl-C
def _train_cmd(model: str, out: Path, *extra: str) -> list[str]:
    """The main job (its fixed stage lengths) on ``model``, small steps, no evaluation."""
    return [sys.executable, "-m", "agentgym.cli", "train", "--config", "main_job",
            "--model", model, "-o", str(out),
            "--tasks-per-step", "2", "--n-samples", "2", "--eval-every", "0",
            "--set", "torch_threads=1", "--report-to", "none", *extra]


def _train_steps(out: Path) -> list[int]:
    path = out / "metrics.jsonl"
    if not path.exists():
        return []
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return [r["step"] for r in rows if r.get("type") == "train"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_ctrl_c_saves_a_checkpoint_and_resume_continues_the_curve(tmp_path, tiny_model_dir):
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(tmp_path / "log1", "wb") as log:
        proc = subprocess.Popen(_train_cmd(tiny_model_dir, out, "--max-steps", "200"),
                                stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path, env=env)
        try:
            deadline = time.time() + 400
            while len(_train_steps(out)) < 2 and proc.poll() is None:
                assert time.time() < deadline, (tmp_path / "log1").read_text()
                time.sleep(0.5)
            proc.send_signal(signal.SIGINT)
            rc = proc.wait(timeout=180)
        finally:
            if proc.poll() is None:
                proc.kill()
    log1 = (tmp_path / "log1").read_text()
    assert rc == 130, log1
    assert "Traceback" not in log1, log1
    steps = _train_steps(out)
    k = len(steps)
    assert k >= 2 and steps == list(range(1, k + 1)), steps
    latest = (out / "checkpoints" / "latest").read_text().strip()
    assert latest == f"step_{k}", (latest, steps)  # save_every 50: only Ctrl-C saved it
    assert (out / "checkpoints" / latest / "config.yaml").is_file()
    assert (out / "config.yaml").is_file()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["steps"] == k
    assert f"--resume {out}" in log1

    # --resume RUN: the same folder, the run's own config (no flags repeated), the curve
    # going on from the checkpoint
    proc = subprocess.run([sys.executable, "-m", "agentgym.cli", "train", "--resume", str(out),
                           "--max-steps", str(k + 2)], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert _train_steps(out) == list(range(1, k + 3))
    assert (out / "checkpoints" / "latest").read_text().strip() == f"step_{k + 2}"
    assert not (tmp_path / "runs").exists()  # no new runs/<time>
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] is False and summary["steps"] == k + 2


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_ctrl_c_in_the_warm_up_stops_it_at_its_next_step(tmp_path):
    """The warm-up runs off the event loop: Ctrl-C stops it within a step, not after it;
    with no policy trained yet there is nothing to resume, and the folder is removed."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "agentgym.cli", "train", "-o", str(out), "--report-to", "none",
           "--set", 'warmup={"steps": 100000, "max_tokens": 1000000000, "episodes": 16}',
           "--set", "torch_threads=1"]
    with open(tmp_path / "log", "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            deadline = time.time() + 300
            while "warm-up" not in (tmp_path / "log").read_text() and proc.poll() is None:
                assert time.time() < deadline, (tmp_path / "log").read_text()
                time.sleep(0.5)
            time.sleep(2)  # inside the warm-up's steps
            t0 = time.time()
            proc.send_signal(signal.SIGINT)
            rc = proc.wait(timeout=120)
            stopped_in = time.time() - t0
        finally:
            if proc.poll() is None:
                proc.kill()
    text = (tmp_path / "log").read_text()
    assert rc == 130, text
    assert "Traceback" not in text, text
    assert stopped_in < 60, (stopped_in, text)
    assert "nothing to resume" in text and not out.exists()
