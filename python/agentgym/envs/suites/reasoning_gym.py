"""Reasoning Gym datasets as envs: ``reasoning_gym:<dataset>``.

``<dataset>`` is a name of ``reasoning_gym``'s registry (``reasoning_gym:basic_arithmetic``,
``reasoning_gym:sudoku``); the dataset's config fields are ``make`` keyword arguments
(``make("reasoning_gym:chain_sum", config={"min_terms": 3})``). Every dataset is a
single-agent env (:class:`ReasoningGymEnv`).

What maps onto what:

* the system prompt: answer the question, the final answer only, in the reply format;
* the turn text: the item's ``question``;
* ``valid_actions``: none (free-text answers);
* the reward: the dataset's own ``score_answer(answer, entry)`` (0 to 1), after one answer
  (or, with ``attempts=k``, after a full score or the k-th answer; a wrong answer before then
  is told its score and gets reward 0);
* tasks: ``size`` items per split (default 10000): split ``train`` is the dataset built with
  ``seed=0`` (items 0..size-1), split ``test`` (held out) the dataset built with
  ``seed=2**32``, whose procedural items come from other generator seeds;
* the scripted solver: the item's own ``answer``;
* snapshots: the episode's item, answers left and state (the dataset is immutable).
"""

from __future__ import annotations

from typing import Any

import reasoning_gym
from reasoning_gym.factory import DATASETS

from agentgym.envs.base import BaseEnv, action_line
from agentgym.envs.suites import SPLITS, SuiteEntry, check_split, task_index
from agentgym.errors import EnvError, UnknownEnvError

__all__ = ["ReasoningGymEnv", "entries", "spec"]

HELD_OUT_SEED = 2**32
DEFAULT_SIZE = 10_000

INSTRUCTIONS = ("Solve the problem you are given. Think it through if you need to, then "
                "give only the final answer, in the form the question asks for."
                + action_line("<your final answer>"))


_DATASETS: dict[tuple, Any] = {}


def _dataset(name: str, seed: int, size: int, config: dict[str, Any]) -> Any:
    """The dataset built once per process for each name, seed, size and config (a dataset
    is immutable: its items are generated from their index)."""
    key = (name, seed, size, repr(sorted(config.items())))
    found = _DATASETS.get(key)
    if found is None:
        found = _DATASETS[key] = reasoning_gym.create_dataset(name, seed=seed, size=size,
                                                              **config)
    return found


class ReasoningGymEnv(BaseEnv):
    """One Reasoning Gym item per episode, scored by its dataset (see the module docs)."""

    instructions = INSTRUCTIONS
    splits = SPLITS
    held_out_split = "test"

    def __init__(self, dataset: str, split: str = "train", size: int = DEFAULT_SIZE,
                 attempts: int = 1, config: dict[str, Any] | None = None):
        if dataset not in DATASETS:
            raise ValueError(f"dataset: reasoning_gym has no dataset {dataset!r}")
        check_split(split)
        if int(size) < 1:
            raise ValueError(f"size: must be >= 1, got {size}")
        if int(attempts) < 1:
            raise ValueError(f"attempts: must be >= 1, got {attempts}")
        self.name, self.split = dataset, split
        self.num_tasks = int(size)
        self.attempts = int(attempts)
        self.config = dict(config or {})
        seed = HELD_OUT_SEED if split == "test" else 0
        try:
            self._data = _dataset(dataset, seed, self.num_tasks, self.config)
        except TypeError as e:  # a config key the dataset does not have
            raise ValueError(f"config: {e}") from None
        self.tasks_doc = (f"task i is item i of {dataset} built with seed {seed} (split "
                          f"{split!r}; split 'test' uses seed {HELD_OUT_SEED})")
        self._entry: dict[str, Any] | None = None
        self._left = 0

    def reset(self, task: int | str | None = None, seed: int | None = None) -> str:
        index = task_index(self.name, task, seed, self.num_tasks)
        self._entry = self._data[index]
        self._left = self.attempts
        return str(self._entry["question"])

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        if self._entry is None:
            raise EnvError(f"{self.name}: step before reset")
        score = float(self._data.score_answer(answer=action.strip(), entry=self._entry))
        if not 0.0 <= score <= 1.0:
            raise EnvError(f"{self.name}: score_answer gave {score}, outside [0, 1]")
        self._left -= 1
        if score >= 1.0 or self._left <= 0:
            return (f"Your answer scored {score:g}.", score, True, {"score": score})
        return (f"Your answer scored {score:g}; {self._left} attempt(s) left. Answer again.",
                0.0, False, {"score": score})

    def oracle_action(self) -> str | None:
        return None if self._entry is None else str(self._entry["answer"])

    def snapshot(self) -> Any:
        """The episode's item and the answers it has left."""
        return self._entry, self._left

    def restore(self, state: Any) -> None:
        self._entry, self._left = state


# ------------------------------------------------------------------------------ registry
def spec(env_id: str, name: str):
    """The registry's spec of ``reasoning_gym:<dataset>``."""
    from agentgym.envs.registry import EnvSpec, SuccessRule

    if name not in DATASETS:
        raise UnknownEnvError(f"env id {env_id!r}: reasoning_gym has no dataset {name!r} "
                              "(agentgym-rl list --suite reasoning_gym)")
    cls = DATASETS[name][0]
    doc = (cls.__doc__ or "").strip().splitlines()
    return EnvSpec(env_id, ReasoningGymEnv, {"dataset": name},
                   f"Reasoning Gym {name}" + (f": {doc[0].rstrip('.')}" if doc else ""),
                   "python", default_horizon=1,
                   success=SuccessRule(1.0, "the dataset scores the answer 1 (score_answer)"),
                   snapshots=True, images=False)


def entries() -> list[SuiteEntry]:
    """Every dataset Reasoning Gym registers."""
    return [SuiteEntry(f"reasoning_gym:{name}", "python", 1,
                       f"{cls.__module__}:{cls.__qualname__}")
            for name, (cls, _) in DATASETS.items()]
