"""Task splits for Python-written envs: a split names a contiguous range of task numbers."""

from __future__ import annotations

import random

from agentgym.errors import InvalidTaskError


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
