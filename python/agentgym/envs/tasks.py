"""Tasks of envs: how many each env id has per split (:func:`task_set`, one answer for
native and Python envs), where training and evaluation draw them (:func:`plan_tasks`), and
the split helpers of the Python-written envs (:class:`TaskSplits`, :data:`SCENARIO_SPLITS`,
:func:`parse_task`)."""

from __future__ import annotations

import dataclasses
import json
import random
from dataclasses import dataclass
from typing import Any

from agentgym.errors import InvalidTaskError

#: The splits of the generated business-scenario envs (``office``, ``project_planning``,
#: ``ecommerce_service``): tasks 0-799 train, 800-999 test.
SCENARIO_SPLITS: dict[str, tuple[int, int]] = {"train": (0, 800), "test": (800, 1000)}


class TaskSplits:
    """``splits`` maps ``"train"``/``"test"`` to ``(lo, hi)`` ranges of global task numbers;
    ``"all"`` spans from 0 to the end of the last one. Task ``i`` of a split is global task
    ``lo + i``."""

    def __init__(self, env_name: str, splits: dict[str, tuple[int, int]], split: str):
        if split not in splits and split != "all":
            raise ValueError(f"split must be 'train', 'test' or 'all', got {split!r}")
        self.env_name = env_name
        self.split = split
        self.lo, hi = splits[split] if split != "all" else (0, max(h for _, h in splits.values()))
        self.num_tasks = hi - self.lo

    def resolve(self, task: int | str | None, seed: int | None) -> int:
        """The global task number of ``task`` (drawn from ``seed`` when None); a clear
        ``InvalidTaskError`` for anything else than an index inside the split."""
        if task is None:
            task = random.Random(seed).randrange(self.num_tasks)
        try:
            index = int(task)
        except (TypeError, ValueError):
            raise InvalidTaskError(f"{self.env_name}: bad task {task!r}") from None
        if not 0 <= index < self.num_tasks:
            raise InvalidTaskError(f"{self.env_name}[{self.split}]: task {index} not in "
                                   f"[0, {self.num_tasks})")
        return self.lo + index


def parse_task(task, seed: int | None, num_tasks: int, what: str, form: str):
    """Normalise a task given as an index, a digit string or ``"name:number"`` text.

    Returns an ``int`` index (``seed % num_tasks`` when ``task`` is None; numpy integers
    accepted) or a ``(name, number)`` pair for the text form; ``InvalidTaskError`` names
    ``what`` and the expected ``form`` otherwise. Range checks are the caller's.
    """
    if task is None:
        task = int(seed or 0) % num_tasks
    if not isinstance(task, (int, str, float)) and hasattr(task, "__index__"):
        task = task.__index__()  # numpy integers
    if isinstance(task, str):
        text = task.strip()
        if text.isdigit():
            return int(text)
        name, sep, number = text.rpartition(":")
        if not sep or not number.strip().isdigit():
            raise InvalidTaskError(f"{what} task {task!r}: expected an index or {form!r}")
        return name.strip(), int(number)
    return task


#: Task counts at or above this are procedural (the Rust core reports ``u64::MAX``).
_UNBOUNDED = 2**62

#: Held-out indices of an unbounded env without a held-out split start here.
HELD_OUT_BASE = 10**7


@dataclass(frozen=True)
class TaskSet:
    """The tasks of one env id under one set of constructor kwargs.

    ``num_tasks`` counts the task indices ``0 .. num_tasks - 1`` that ``reset`` accepts
    (None: unbounded, every non-negative index is a task; ``tasks`` says how an index maps
    to one). ``splits`` are the values of the env's ``split`` kwarg, its default first
    (empty: no splits), ``split`` the one these kwargs select, ``held_out`` the split kept
    for evaluation (it has a ``"train"`` split beside it).
    """

    env_id: str
    kwargs: dict[str, Any]
    num_tasks: int | None
    splits: tuple[str, ...] = ()
    split: str | None = None
    held_out: str | None = None
    tasks: str = ""

    def with_split(self, split: str) -> TaskSet:
        """The task set of ``split`` (same env, same other kwargs)."""
        if split not in self.splits:
            raise ValueError(f"{self.env_id} has no split {split!r} (splits: "
                             f"{', '.join(self.splits) or 'none'})")
        return task_set(self.env_id, **{**self.kwargs, "split": split})


def task_set(env_id: str, **env_kwargs: Any) -> TaskSet:
    """How many tasks ``env_id`` has under ``env_kwargs`` and how they are split.

    One answer for native and Python envs alike: native envs report their counts and splits
    from the Rust registry; Python envs (:class:`~agentgym.envs.BaseEnv` subclasses or
    Gymnasium envs) through their ``num_tasks``, ``splits`` and ``held_out_split``
    attributes. Constructor errors (bad kwargs) propagate.
    """
    from agentgym import _core
    from agentgym.envs.registry import kind, make

    env_kind = kind(env_id)
    if env_kind == "game":  # a multi-seat game: openings or deals, no splits
        from agentgym.envs.registry import game_pool

        pool = game_pool(env_id, 1, **env_kwargs)
        n = pool.num_tasks
        n = _UNBOUNDED if n is None else int(n)
        close = getattr(pool, "close", None)
        if close is not None:
            close()
        return TaskSet(env_id, dict(env_kwargs), None if n >= _UNBOUNDED else n, (), None,
                       None, "openings or deals (see the game's README)")
    if env_kind == "native":
        splits, held_out, tasks = _core.native_env_tasks(env_id)
        n = int(_core.EnvPool(env_id, 1, json.dumps(env_kwargs)).num_tasks)
        split = env_kwargs.get("split", splits[0]) if splits else None
        return TaskSet(env_id, dict(env_kwargs), None if n >= _UNBOUNDED else n,
                       tuple(splits), split, held_out, tasks)
    from agentgym.envs.base import BaseEnvAdapter

    env = make(env_id, **env_kwargs)
    try:
        owner = env.unwrapped
        if isinstance(owner, BaseEnvAdapter):
            owner = owner.env
        n = getattr(owner, "num_tasks", None)
        splits = tuple(getattr(owner, "splits", ()) or ())
        split = getattr(owner, "split", None) if splits else None
        held_out = getattr(owner, "held_out_split", None)
        tasks = getattr(owner, "tasks_doc", "") or ""
    finally:
        env.close()
    n = None if n is None or int(n) >= _UNBOUNDED else int(n)
    if not tasks:
        tasks = (f"index i is task i of {n}" if n is not None else
                 "unbounded: any non-negative index is passed to reset(task=...)")
    return TaskSet(env_id, dict(env_kwargs), n, splits, split, held_out, tasks)


@dataclass(frozen=True)
class TaskPlan:
    """Where a training run draws its tasks: train indices ``[0, train_hi)`` under
    ``train_kwargs``; held-out evaluation tasks ``eval_ids`` under ``eval_kwargs``."""

    train_kwargs: dict[str, Any]
    train_hi: int
    eval_kwargs: dict[str, Any]
    eval_ids: list[int]
    note: str


def plan_tasks(env_id: str, env_kwargs: dict[str, Any], eval_tasks: int,
               eval_env_kwargs: dict[str, Any] | None = None,
               num_train_tasks: int | None = None) -> TaskPlan:
    """Train and held-out eval tasks of ``env_id``, shared by training and inference.

    - Envs with a held-out split train on ``split="train"`` (unless ``env_kwargs`` names a
      split) and evaluate on the first ``eval_tasks`` tasks of the held-out split.
    - ``eval_env_kwargs`` (merged over ``env_kwargs``) select the eval tasks explicitly.
    - Bounded envs without splits hold out their last ``eval_tasks`` indices.
    - Unbounded envs without splits evaluate on indices from :data:`HELD_OUT_BASE` up, and
      train below it.
    """
    ts = task_set(env_id, **env_kwargs)
    if ts.held_out is not None and "split" not in env_kwargs:
        ts = ts.with_split("train")
    kwargs = ts.kwargs
    if eval_env_kwargs is not None or (ts.held_out is not None and ts.split != ts.held_out):
        ev_kwargs = {**kwargs, **(eval_env_kwargs if eval_env_kwargs is not None
                                  else {"split": ts.held_out})}
        ev = task_set(env_id, **ev_kwargs)
        n_eval = eval_tasks if ev.num_tasks is None else min(eval_tasks, ev.num_tasks)
        hi = ts.num_tasks if ts.num_tasks is not None else HELD_OUT_BASE
        plan = TaskPlan(kwargs, hi, ev_kwargs, list(range(n_eval)),
                        f"train: {_describe(ts)}; eval: first {n_eval} of {_describe(ev)}")
    elif ts.num_tasks is None:
        plan = TaskPlan(kwargs, HELD_OUT_BASE, kwargs,
                        list(range(HELD_OUT_BASE, HELD_OUT_BASE + eval_tasks)),
                        f"train: indices below {HELD_OUT_BASE} ({ts.tasks}); eval: "
                        f"{eval_tasks} indices from {HELD_OUT_BASE}")
    else:
        n = ts.num_tasks
        if n <= eval_tasks:
            raise ValueError(f"{env_id} has {n} tasks: too few to hold out {eval_tasks} for "
                             "evaluation; lower eval_tasks or pass eval_env_kwargs")
        plan = TaskPlan(kwargs, n - eval_tasks, kwargs, list(range(n - eval_tasks, n)),
                        f"train: tasks 0..{n - eval_tasks - 1} of {_describe(ts)}; eval: "
                        f"the last {eval_tasks}")
    if num_train_tasks:
        plan = dataclasses.replace(plan, train_hi=min(plan.train_hi, num_train_tasks))
    return plan


def _describe(ts: TaskSet) -> str:
    count = "unbounded" if ts.num_tasks is None else f"{ts.num_tasks} tasks"
    split = f"[{ts.split}]" if ts.split else ""
    return f"{ts.env_id}{split} ({count})"
