"""Reasoning Gym through the adapter (``reasoning_gym:<dataset>``): one question, one
answer scored by the dataset itself, train and held-out splits built from disjoint
generator seeds, snapshots, an engine run end to end, and a dataset whose scorer raises
ending only its own episodes."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import reasoning_gym
from reasoning_gym.dataset import ProceduralDataset
from reasoning_gym.factory import DATASETS

from agentgym.envs import registry
from agentgym.envs.registry import make
from agentgym.envs.tasks import plan_tasks, task_set

DATASETS_TRIED = ["basic_arithmetic", "chain_sum", "letter_counting", "word_sorting",
                  "gcd", "spell_backward"]


@pytest.mark.parametrize("name", DATASETS_TRIED)
def test_a_dataset_item_is_one_question_scored_by_its_dataset(name):
    env_id = f"reasoning_gym:{name}"
    assert registry.kind(env_id) == "python" and registry.snapshots(env_id)
    env = make(env_id)
    for task in range(3):
        obs, info = env.reset(seed=0, options={"task": task})
        assert obs and info["task"] == task
        wrong = env.step("certainly not the answer")
        assert wrong[2] and 0.0 <= wrong[1] < 1.0
        env.reset(seed=0, options={"task": task})
        _, reward, done, _, _ = env.step(env.unwrapped.oracle_action())
        assert done and reward == 1.0


def test_the_held_out_split_is_built_from_other_generator_seeds():
    ts = task_set("reasoning_gym:basic_arithmetic")
    assert ts.splits == ("train", "test") and ts.held_out == "test" and ts.num_tasks == 10_000
    plan = plan_tasks("reasoning_gym:basic_arithmetic", {}, eval_tasks=20)
    assert plan.eval_kwargs.get("split") == "test"
    train, test = make("reasoning_gym:basic_arithmetic"), \
        make("reasoning_gym:basic_arithmetic", split="test")
    questions = [(train.reset(options={"task": i})[0], test.reset(options={"task": i})[0])
                 for i in range(20)]
    # other generator seeds: other items (a short question may come up in both)
    assert sum(a != b for a, b in questions) >= 18
    assert len({a for a, _ in questions} & {b for _, b in questions}) <= 2


def test_attempts_and_snapshots():
    env = make("reasoning_gym:gcd", attempts=2)
    env.reset(seed=0, options={"task": 5})
    saved = env.unwrapped.snapshot()
    obs, reward, done, _, _ = env.step("-1")
    assert not done and reward == 0.0 and "1 attempt(s) left" in obs
    env.unwrapped.restore(saved)
    _, reward, done, _, _ = env.step(env.unwrapped.oracle_action())
    assert done and reward == 1.0


def test_bad_settings_name_their_key():
    with pytest.raises(ValueError, match="^split:"):
        make("reasoning_gym:gcd", split="dev")
    with pytest.raises(ValueError, match="^config:"):
        make("reasoning_gym:gcd", config={"no_such_field": 1})


def test_an_engine_run_solves_items_with_the_oracle(engine):
    batch = engine("oracle", max_turns=1).collect_sync(6, "reasoning_gym:chain_sum",
                                                       n_samples=2)
    assert len(batch) == 12
    assert {t.stop_reason for t in batch} == {"done"}
    assert {t.reward for t in batch} == {1.0}
    assert all(t.success for t in batch)


@dataclass
class _FlakyConfig:
    seed: int | None = None
    size: int = 500

    def validate(self) -> None:
        pass


class _FlakyDataset(ProceduralDataset):
    """Odd items' scorer raises: a third-party env that fails."""

    def __init__(self, config: _FlakyConfig):
        super().__init__(config=config, seed=config.seed, size=config.size)

    def __getitem__(self, idx: int) -> dict:
        return {"question": f"What is {idx} + 1?", "answer": str(idx + 1),
                "metadata": {"idx": idx}}

    def score_answer(self, answer, entry) -> float:
        if entry["metadata"]["idx"] % 2:
            raise RuntimeError(f"scorer failed on item {entry['metadata']['idx']}")
        return 1.0 if answer == entry["answer"] else 0.0


def test_a_failing_dataset_ends_only_its_own_episodes(engine):
    if "agentgym_flaky" not in DATASETS:
        reasoning_gym.register_dataset("agentgym_flaky", _FlakyDataset, _FlakyConfig)
    batch = engine("oracle", max_turns=1).collect_sync(list(range(6)),
                                                       "reasoning_gym:agentgym_flaky")
    by_task = {t.task_id: t for t in batch}
    assert sorted(by_task) == list(range(6))
    for task, t in by_task.items():
        if task % 2:
            assert t.stop_reason == "env_error" and "scorer failed" in (t.error or "")
        else:
            assert t.stop_reason == "done" and t.reward == 1.0
