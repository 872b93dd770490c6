"""``agentgym-rl train``: the main job and the command-line overrides of its config (the
mistakes: test_train_errors.py; the flags against the config tree: test_train_flags.py)."""

import pytest


def test_cli_builds_the_main_job_and_overrides(tmp_path):
    import argparse

    pytest.importorskip("torch")
    from agentgym.cli.train import MAIN_JOB, _train_config, add_args
    from agentgym.learner.trainer import TrainerConfig

    p = argparse.ArgumentParser()
    add_args(p)
    cfg = _train_config(p.parse_args([]))
    assert cfg["env"] == "maze" and cfg["model"] == "tiny" and cfg["output_dir"]
    main = TrainerConfig.from_dict(cfg)  # the main job is a valid config
    assert main.replace(output_dir=None, progress=None) == TrainerConfig.from_dict(MAIN_JOB)
    cfg = _train_config(p.parse_args(["--env", "maze", "--model", "tiny", "--lr", "0.01",
                                      "--horizon", "2,4", "--set", "n_samples=4",
                                      "--max-turns", "3", "--max-new-tokens", "9",
                                      "--set", "rollout.top_p=0.9", "--set",
                                      "max_total_tokens=999", "-o", str(tmp_path)]))
    assert cfg["learner"]["lr"] == 0.01 and cfg["horizon"] == [2, 4]
    assert cfg["learner"]["kl_coef"] == MAIN_JOB["learner"]["kl_coef"]  # the rest kept
    assert cfg["n_samples"] == 4 and cfg["output_dir"] == str(tmp_path)
    assert cfg["env_kwargs"] == MAIN_JOB["env_kwargs"]
    r = TrainerConfig.from_dict(cfg).rollout
    assert (r.max_turns, r.max_new_tokens, r.top_p, r.max_total_tokens) == (3, 9, 0.9, 999)
    assert r.truncated_turn == "end" and r.system_prompt.startswith("Maze.")
    cfg = _train_config(p.parse_args(["--env", "textcraft", "--method", "GRPO"]))
    assert "env_kwargs" not in cfg and cfg["method"] == "GRPO"
    # a mapping given to --set is merged into its section
    cfg = _train_config(p.parse_args(["--set", 'warmup={"steps": 7}']))
    assert cfg["warmup"]["steps"] == 7 and cfg["warmup"]["episodes"] == 256
    assert _train_config(p.parse_args(["--no-warmup"]))["warmup"] is None


def test_cli_ray_flags_set_the_rollout_workers():
    import argparse

    from agentgym.cli.train import _train_config, add_args

    p = argparse.ArgumentParser()
    add_args(p)
    cfg = _train_config(p.parse_args(["--ray", "--num-workers", "3", "--worker-cpus", "2"]))
    assert cfg["num_rollout_workers"] == 3 and cfg["ray_address"] is None
    assert cfg["rollout_worker"] == {"num_cpus": 2.0}
    # the old spelling is a hidden alias
    assert _train_config(p.parse_args(["--ray", "--num-rollout-workers", "4"]))[
        "num_rollout_workers"] == 4
    cfg = _train_config(p.parse_args(["--ray", "10.0.0.5:6379"]))
    assert cfg["num_rollout_workers"] == 2 and cfg["ray_address"] == "10.0.0.5:6379"
    assert "num_rollout_workers" not in _train_config(p.parse_args([]))


def test_cli_opponent_flag_is_collects_spelling():
    import argparse

    from agentgym.cli.train import _train_config, add_args
    from agentgym.learner.train_config import TrainerConfig

    p = argparse.ArgumentParser()
    add_args(p)
    for flag in ("--opponent", "--opponents"):  # the old spelling is a hidden alias
        cfg = _train_config(p.parse_args(["--env", "tictactoe", flag, "solver"]))
        assert cfg["self_play"] and cfg["rollout"]["opponent"] == "solver"
        assert TrainerConfig.from_dict(cfg).rollout.opponent == "solver"
    assert "--opponents" not in p.format_help()
    assert "--num-rollout-workers" not in p.format_help()


#: A short ``agentgym-rl train``: the main job on the tiny model, two steps, a small warm-up.
SHORT_TRAIN = ["train", "--max-steps", "2", "--steps-per-stage", "1", "--tasks-per-step", "2",
               "--n-samples", "2", "--eval-tasks", "4", "--eval-every", "2", "--set",
               'warmup={"episodes": 8, "steps": 12, "batch_size": 8, "max_turns": 8}']


def _train_cli(tmp_path, *extra, env=None):
    """Run a short ``agentgym-rl train`` with stdout and stderr into a log file (not a
    terminal), in ``env`` (default: this process's environment); returns the run folder, the
    exit code and the log's raw text."""
    import os
    import subprocess
    import sys

    out, log_path = tmp_path / "run", tmp_path / "train.log"
    with open(log_path, "wb") as log:
        rc = subprocess.run([sys.executable, "-m", "agentgym.cli", *SHORT_TRAIN, "-o", str(out),
                             *extra], stdout=log, stderr=subprocess.STDOUT, timeout=280,
                            cwd=tmp_path, env=os.environ if env is None else env).returncode
    return out, rc, log_path.read_bytes().decode("utf-8", "replace")


@pytest.mark.slow
def test_train_log_in_a_file_has_plain_progress_lines(tmp_path):
    pytest.importorskip("torch")
    import time

    t0 = time.perf_counter()
    out, rc, log = _train_cli(tmp_path)
    wall = time.perf_counter() - t0
    assert rc == 0, log
    assert "\r" not in log and "\x1b" not in log, log  # no redrawn frames, no cursor moves
    bar_lines = [ln for ln in log.splitlines() if " step (" in ln]
    # two bars (warm-up, training), each a first and a last line plus one per 30 s at most
    assert bar_lines and len(bar_lines) <= 2 * (2 + wall / 30), log
    assert "Loading weights" not in log  # the libraries' own bars are off in a log
    assert "done: 2 steps" in log and f"summary:    {out / 'summary.json'}" in log


def test_report_to_sets_the_trackers():
    from agentgym.cli.train import _report_to
    from agentgym.errors import ConfigError

    assert _report_to("wandb", None) == {"tensorboard": False, "wandb": True}
    assert _report_to("tensorboard, wandb", {"project": "p"}) == {
        "tensorboard": True, "wandb": {"project": "p"}}
    assert _report_to("none", True) == {"tensorboard": False, "wandb": False}
    for bad in ("", "mlflow", "none,wandb"):
        with pytest.raises(ConfigError, match="--report-to"):
            _report_to(bad, None)


@pytest.mark.slow
def test_train_reports_to_wandb_offline_under_the_run_folder(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("wandb")
    import os

    from tests.helpers import read_wandb_history

    # no WANDB_* settings: offline is the default
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    out, rc, log = _train_cli(tmp_path, "--report-to", "tensorboard,wandb", env=env)
    assert rc == 0, log
    assert "\r" not in log, log
    (run_dir,) = (out / "wandb").glob("offline-run-*")
    assert (out / "tensorboard").is_dir()
    rows = read_wandb_history(run_dir, at_least=3)  # two train rows and an eval row
    train = [r for r in rows if "reward/mean" in r]
    assert [r["_step"] for r in train] == [1, 2]
    assert {"success_rate", "horizon/max_turns", "timing_s/step"} <= set(train[-1])
    assert any("eval/success_rate" in r for r in rows)


def test_undo_flag_turns_the_mechanism_on_in_the_rollout_settings():
    import argparse

    from agentgym.cli.train import _train_config, add_args
    from agentgym.learner.trainer import TrainerConfig

    p = argparse.ArgumentParser()
    add_args(p)
    cfg = _train_config(p.parse_args(["--undo"]))
    assert cfg["rollout"]["undo"] is True and cfg["rollout"]["max_undos"] == 3
    assert cfg["rollout"]["truncated_turn"] == "end"  # the main job's own setting kept
    TrainerConfig.from_dict(cfg)
    assert _train_config(p.parse_args(["--undo", "1"]))["rollout"]["max_undos"] == 1
    assert "undo" not in _train_config(p.parse_args([])).get("rollout", {})


def test_mechanism_flags_set_the_rollout_settings():
    import argparse

    from agentgym.cli.collect import add_args as collect_args
    from agentgym.cli.train import _train_config, add_args
    from agentgym.learner.trainer import TrainerConfig

    p = argparse.ArgumentParser()
    add_args(p)
    cfg = _train_config(p.parse_args(["--reflection", "2", "--undo"]))
    assert cfg["rollout"]["reflection"] == 2 and cfg["rollout"]["undo"] is True
    assert TrainerConfig.from_dict(cfg).rollout["reflection"] == 2
    assert "reflection" not in _train_config(p.parse_args([])).get("rollout", {})
    c = argparse.ArgumentParser()
    collect_args(c)
    args = c.parse_args(["--env", "maze", "--tasks", "2", "--out", "x", "--reflection", "1"])
    assert args.reflection == 1
    cfg = _train_config(p.parse_args(["--branch-at", "3", "--branch-width", "4"]))
    assert (cfg["rollout"]["branch_at"], cfg["rollout"]["branch_width"]) == (3, 4)
    cfg = _train_config(p.parse_args(["--plan", "4"]))
    assert (cfg["rollout"]["plan"], cfg["rollout"]["replan_every"]) == (True, 4)
    assert _train_config(p.parse_args(["--plan"]))["rollout"]["replan_every"] == 0
    assert _train_config(p.parse_args(["--context-window", "3"]))["rollout"][
        "context_window"] == 3
    from agentgym.errors import ConfigError

    with pytest.raises(ConfigError, match="--branch-at"):
        _train_config(p.parse_args(["--branch-width", "4"]))
