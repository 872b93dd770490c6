"""Training stops with a clear error when its episodes keep failing (``FailureGuard``)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import agentgym  # noqa: E402
from agentgym.envs import BaseEnv  # noqa: E402
from agentgym.learner.failures import FailureGuard, TrainingAbortedError  # noqa: E402
from agentgym.learner.trainer import Trainer, TrainerConfig  # noqa: E402

pytestmark = pytest.mark.timeout(240)


class BrokenEnv(BaseEnv):
    """Every reset raises."""

    num_tasks = 100

    def reset(self, task=None, seed=None):
        raise RuntimeError(f"database unreachable for task {task}")

    def step(self, action):
        return "", 0.0, True, {}


class OddBrokenEnv(BaseEnv):
    """Odd tasks raise on reset; even ones end after one step."""

    num_tasks = 100

    def reset(self, task=None, seed=None):
        if int(task) % 2:
            raise RuntimeError(f"odd task {task}")
        return "Say anything."

    def step(self, action):
        return "ok", 1.0, True, {}


agentgym.register("_failures_broken", BrokenEnv, override=True)
agentgym.register("_failures_odd", OddBrokenEnv, override=True)


def _trainer(tmp_path, tiny_model_dir, env, **kw):
    from transformers import AutoTokenizer

    from agentgym.backends.scripted import ScriptedBackend

    cfg = dict(model=tiny_model_dir, env=env, method="GRPO", max_turns=2, max_steps=6,
               tasks_per_step=4, n_samples=2, max_new_tokens=8, eval_every=0, save_every=0,
               warmup=None, output_dir=str(tmp_path / "run"), progress=False,
               tensorboard=False, plot=False, torch_threads=1,
               learner={"lr": 1e-4, "use_kl_loss": False})
    cfg.update(kw)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    return Trainer(TrainerConfig.from_dict(cfg),
                   backend=ScriptedBackend(tok, policy="random", seed=0))


def test_all_failed_steps_abort_naming_reasons_and_first_error(tmp_path, tiny_model_dir):
    trainer = _trainer(tmp_path, tiny_model_dir, "_failures_broken", abort_after_failed_steps=2)
    with pytest.raises(TrainingAbortedError) as info:
        trainer.train()
    msg = str(info.value)
    assert "step 2" in msg and "env_error=8" in msg
    assert "database unreachable for task" in msg
    assert trainer.step == 1  # the first failed step was logged, the second stopped the run


def test_guard_off_trains_through_failures(tmp_path, tiny_model_dir):
    trainer = _trainer(tmp_path, tiny_model_dir, "_failures_broken", abort_after_failed_steps=0,
                       max_steps=2)
    assert trainer.train()["steps"] == 2
    assert all(r["stop_reason/env_error"] == 1.0 for r in trainer.history)


def test_partial_failures_follow_the_threshold(tmp_path, tiny_model_dir):
    # half the episodes fail: below the default threshold (every episode), the run goes on
    ok = _trainer(tmp_path / "a", tiny_model_dir, "_failures_odd", max_steps=3)
    assert ok.train()["steps"] == 3
    rates = [r["stop_reason/env_error"] for r in ok.history]
    assert all(0.0 < x < 1.0 for x in rates)
    # a threshold at or below the failed share aborts after `patience` such steps
    rates_at = {i + 1: x for i, x in enumerate(rates)}
    bad = _trainer(tmp_path / "b", tiny_model_dir, "_failures_odd", max_steps=3,
                   abort_failure_rate=min(rates_at.values()), abort_after_failed_steps=3)
    with pytest.raises(TrainingAbortedError, match="odd task"):
        bad.train()


def test_failed_evaluation_aborts_at_once(tmp_path, tiny_model_dir):
    trainer = _trainer(tmp_path, tiny_model_dir, "_failures_broken", eval_every=1, eval_tasks=4)
    with pytest.raises(TrainingAbortedError, match="evaluation .* all 4 episodes failed"):
        trainer.train()
    assert trainer.step == 0


def test_guard_streak_resets_on_a_healthy_step():
    class T:
        def __init__(self, reason, error=None):
            self.stop_reason, self.error = reason, error

    guard = FailureGuard("x", patience=2)
    bad, good = [T("env_error", "boom")] * 3, [T("done"), T("env_error", "boom")]
    guard.check_step(bad, 1)
    guard.check_step(good, 2)  # the streak starts over
    guard.check_step(bad, 3)
    with pytest.raises(TrainingAbortedError, match="boom"):
        guard.check_step(bad, 4)
    with pytest.raises(ValueError):
        FailureGuard("x", patience=-1)


def test_scenario_env_trains_on_its_own_tasks(tmp_path, tiny_model_dir):
    """The bug this guards: task ids drawn far outside a Python env's range."""
    trainer = _trainer(tmp_path, tiny_model_dir, "ecommerce_service", max_steps=2,
                       eval_every=2, eval_tasks=4, max_turns=6, max_new_tokens=64)
    trainer.train()
    assert trainer.train_env_kwargs == {"split": "train"} and trainer.train_task_hi == 800
    assert trainer.eval_env_kwargs == {"split": "test"}
    assert trainer.eval_task_ids == [0, 1, 2, 3]
    for row in trainer.history:
        assert row.get("stop_reason/env_error", 0.0) == 0.0
        assert row.get("stop_reason/done", 0.0) + row.get("stop_reason/horizon", 0.0) == 1.0
    assert trainer.eval_history[-1]["num_tasks"] == 4
