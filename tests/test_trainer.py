"""Trainer: horizon stages inside the loop, weight sync, exact resume, learning, outputs."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import agentgym  # noqa: E402
from agentgym.envs import BaseEnv  # noqa: E402
from agentgym.learner.checkpoint import find_checkpoint  # noqa: E402
from agentgym.learner.tracking import read_jsonl  # noqa: E402
from agentgym.learner.trainer import Trainer, TrainerConfig, make_schedule  # noqa: E402

pytestmark = pytest.mark.timeout(240)


class EndlessEnv(BaseEnv):
    """Never ends by itself: every episode runs to the horizon. Reward 0.1 per 'north'."""

    instructions = "Say a direction."
    num_tasks = 1000

    def reset(self, task=None, seed=None):
        return f"Task {task}. Go."

    def step(self, action):
        return "Again.", 0.1 if "north" in action else 0.0, False, {}

    def valid_actions(self):
        return ["move north", "move south"]


class PickEnv(BaseEnv):
    """One turn: reward 1 for 'move east', else 0 (a bandit the policy must learn)."""

    instructions = "Maze. Reply with Action: move north, move south, move east or move west."
    num_tasks = 1000

    def reset(self, task=None, seed=None):
        return "North: open. South: open. East: open. West: open."

    def step(self, action):
        ok = action.strip().lower().endswith("east")
        return ("You reached the goal!" if ok else "Nothing here."), float(ok), True, {}

    def valid_actions(self):
        return ["move north", "move south", "move east", "move west"]


agentgym.register("_trainer_endless", EndlessEnv, override=True)
agentgym.register("_trainer_pick", PickEnv, override=True)


def _scripted(tiny_model_dir):
    from transformers import AutoTokenizer

    from agentgym.backends.scripted import ScriptedBackend

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    return ScriptedBackend(tok, policy="random", seed=0)


def _cfg(tmp_path, tiny_model_dir, **kw):
    base = dict(model=tiny_model_dir, env="_trainer_endless", method="GRPO", max_turns=2,
                max_steps=2, tasks_per_step=2, n_samples=2, max_new_tokens=8, eval_every=0,
                save_every=0, warmup=None, output_dir=str(tmp_path / "run"), progress=False,
                tensorboard=False, torch_threads=1, learner={"lr": 1e-3, "use_kl_loss": False})
    base.update(kw)
    return TrainerConfig.from_dict(base)


def test_config_validation_and_methods():
    with pytest.raises(ValueError, match="unknown method"):
        TrainerConfig(method="DQN")
    with pytest.raises(ValueError, match="unknown TrainerConfig keys"):
        TrainerConfig.from_dict({"lr": 1.0})
    assert TrainerConfig(method="PPO").adv_estimator == "gae"
    assert TrainerConfig(method="REINFORCE++").adv_estimator == "reinforce_pp"
    assert TrainerConfig(method="rloo").adv_estimator == "rloo"
    sched = make_schedule(TrainerConfig(env="textcraft", method="ScalingInter-RL"))
    assert [s.max_turns for s in sched.stages] == [10, 20, 30]
    assert make_schedule(TrainerConfig(method="GRPO", max_turns=7)).max_turns(10**6) == 7
    staged = make_schedule(TrainerConfig(method="ScalingInter-RL", horizon=[2, 5],
                                         steps_per_stage=3))
    assert [staged.max_turns(s) for s in range(5)] == [2, 2, 2, 5, 5]


def test_horizon_switches_at_stage_boundary(tmp_path, tiny_model_dir):
    cfg = _cfg(tmp_path, tiny_model_dir, method="ScalingInter-RL", horizon=[1, 3],
               steps_per_stage=2, max_steps=4)
    trainer = Trainer(cfg, backend=_scripted(tiny_model_dir))
    seen: list[int] = []

    async def go():
        await trainer.setup()
        orig = trainer.engine.collect

        async def spy(*a, **k):
            batch = await orig(*a, **k)
            seen.append(k["max_turns"])
            assert {t.num_turns for t in batch.trajectories} == {k["max_turns"]}
            return batch

        trainer.engine.collect = spy
        try:
            return await trainer.train_async()
        finally:
            await trainer.aclose()

    asyncio.run(go())
    assert seen == [1, 1, 3, 3]
    assert [r["horizon/max_turns"] for r in trainer.history] == [1, 1, 3, 3]
    assert [r["num_turns/mean"] for r in trainer.history] == [1, 1, 3, 3]


def test_weight_sync_changes_backend_outputs_and_bumps_version(tmp_path, tiny_model_dir):
    from agentgym.backends import SamplingParams

    cfg = _cfg(tmp_path, tiny_model_dir)
    trainer = Trainer(cfg)

    async def go():
        await trainer.setup()
        be = trainer.backend
        prompt = trainer.tokenizer.encode("North: open. South: wall.")
        sp = SamplingParams(max_new_tokens=6, temperature=0.0)
        before = (await be.generate(prompt, sp)).token_ids
        v0 = be.policy_version
        with torch.no_grad():
            trainer.model.lm_head.weight.mul_(-1.0)
        await trainer.sync_weights()
        after = await be.generate(prompt, sp)
        await trainer.aclose()
        return before, after, v0

    before, after, v0 = asyncio.run(go())
    assert after.token_ids != before
    assert after.policy_version == v0 + 1


def _params(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_resume_continues_identically(tmp_path, tiny_model_dir):
    full = Trainer(_cfg(tmp_path / "a", tiny_model_dir, max_steps=4, save_every=2),
                   backend=_scripted(tiny_model_dir))
    full.train()
    ckpt = find_checkpoint(tmp_path / "a" / "run" / "checkpoints" / "step_2")
    resumed = Trainer(_cfg(tmp_path / "b", tiny_model_dir, max_steps=4, save_every=2,
                           resume=str(ckpt)), backend=_scripted(tiny_model_dir))
    resumed.train()
    assert resumed.step == 4
    keys = ["reward/mean", "actor/pg_loss", "actor/grad_norm", "horizon/max_turns"]
    for a, b in zip(full.history[2:], resumed.history):
        for k in keys:
            if k in a:
                assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-7), k
    pa, pb = _params(full.model), _params(resumed.model)
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    sa, sb = full.optimizer.state_dict(), resumed.optimizer.state_dict()
    assert sa["state"][0]["step"] == sb["state"][0]["step"]
    assert full.schedule.state_dict() == resumed.schedule.state_dict()
    # the global RNGs continue from the checkpoint, not from the seed
    assert full.task_rng.bit_generator.state == resumed.task_rng.bit_generator.state


def test_outputs_metrics_eval_rows_plot_checkpoint(tmp_path, tiny_model_dir):
    cfg = _cfg(tmp_path, tiny_model_dir, max_steps=2, eval_every=1, eval_tasks=3,
               save_every=2)
    summary = Trainer(cfg, backend=_scripted(tiny_model_dir)).train()
    rows = read_jsonl(summary["metrics"])
    train = [r for r in rows if r["type"] == "train"]
    evals = [r for r in rows if r["type"] == "eval"]
    assert [r["step"] for r in train] == [1, 2]
    assert [r["step"] for r in evals] == [0, 1, 2]
    for key in ("reward/mean", "success_rate", "num_turns/mean", "horizon/max_turns",
                "actor/entropy", "actor/pg_loss", "timing_s/gen", "timing_s/update",
                "timing_s/sync", "perf/tokens_per_s"):
        assert key in train[0], key
    assert all(0.0 <= r["success_rate"] <= 1.0 for r in evals)
    out = tmp_path / "run"
    assert (out / "learning_curve.png").stat().st_size > 0
    assert (out / "metrics.csv").read_text().startswith("step,")
    assert (find_checkpoint(out) / "model" / "config.json").is_file()
    assert json.loads(json.dumps(summary))["steps"] == 2


def test_async_rollouts_keep_behaviour_versions(tmp_path, tiny_model_dir):
    cfg = _cfg(tmp_path, tiny_model_dir, max_steps=3, async_rollouts=True, max_staleness=1)
    trainer = Trainer(cfg, backend=_scripted(tiny_model_dir))
    trainer.train()
    assert trainer.step == 3
    # step k+1's rollout started before step k's weights were synced: one version behind
    assert trainer.history[-1]["policy_version"] == 3
    assert trainer.learner_config.max_staleness == 1


def test_ppo_trains_with_a_critic(tmp_path, tiny_model_dir):
    cfg = _cfg(tmp_path, tiny_model_dir, method="PPO", max_steps=1,
               learner={"lr": 1e-3, "use_kl_loss": False, "critic_lr": 1e-3})
    trainer = Trainer(cfg, backend=_scripted(tiny_model_dir))
    trainer.train()
    assert trainer.critic is not None
    assert "critic/vf_loss" in trainer.history[0]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_training_improves_reward_far_beyond_noise(tmp_path, tiny_model_dir):
    """A one-turn bandit after a random-policy warm-up: GRPO lifts the reward from ~0.25."""
    cfg = _cfg(tmp_path, tiny_model_dir, env="_trainer_pick", method="GRPO", max_turns=1,
               max_steps=20, tasks_per_step=4, n_samples=8, max_new_tokens=8,
               eval_every=20, eval_tasks=32, eval_temperature=1.0, model="tiny",
               warmup={"episodes": 64, "steps": 30, "batch_size": 16, "lr": 5e-3},
               learner={"lr": 1e-3, "use_kl_loss": False}, seed=1)
    trainer = Trainer(cfg)
    summary = trainer.train()
    start, end = summary["eval_success_start"], summary["eval_success_end"]
    first = np.mean([r["reward/mean"] for r in trainer.history[:3]])
    last = np.mean([r["reward/mean"] for r in trainer.history[-3:]])
    # random over four moves is 0.25 (binomial sd over 32 episodes ~0.08)
    assert start < 0.5
    assert end >= start + 0.4
    assert last >= first + 0.4


def test_cli_builds_the_main_job_and_overrides(tmp_path):
    import argparse

    from agentgym.train_cli import MAIN_JOB, _train_config, add_train_args

    p = argparse.ArgumentParser()
    add_train_args(p)
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
