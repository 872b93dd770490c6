"""``agentgym-rl train``: the main job and the command-line overrides of its config."""

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
    TrainerConfig.from_dict(cfg)  # the main job is a valid config
    cfg = _train_config(p.parse_args(["--env", "maze", "--model", "tiny", "--lr", "0.01",
                                      "--horizon", "2,4", "--set", "n_samples=4",
                                      "-o", str(tmp_path)]))
    assert cfg["learner"]["lr"] == 0.01 and cfg["horizon"] == [2, 4]
    assert cfg["n_samples"] == 4 and cfg["output_dir"] == str(tmp_path)
    assert cfg["env_kwargs"] == MAIN_JOB["env_kwargs"]
    cfg = _train_config(p.parse_args(["--env", "textcraft", "--method", "GRPO"]))
    assert "env_kwargs" not in cfg and cfg["method"] == "GRPO"


def test_cli_ray_flags_set_the_rollout_workers():
    import argparse

    from agentgym.cli.train import _train_config, add_args

    p = argparse.ArgumentParser()
    add_args(p)
    cfg = _train_config(p.parse_args(["--ray", "--num-rollout-workers", "3"]))
    assert cfg["num_rollout_workers"] == 3 and cfg["ray_address"] is None
    cfg = _train_config(p.parse_args(["--ray", "10.0.0.5:6379"]))
    assert cfg["num_rollout_workers"] == 2 and cfg["ray_address"] == "10.0.0.5:6379"
    assert "num_rollout_workers" not in _train_config(p.parse_args([]))
