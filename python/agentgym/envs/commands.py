"""The action syntax of the business-scenario envs (``office``, ``project_planning``,
``ecommerce_service``): one command per turn, ``name`` or ``name[arguments]``; and
:class:`CommandEnv`, their common base (splits and the step's command dispatch)."""

from __future__ import annotations

import re
from typing import Any

from agentgym.envs.base import BaseEnv
from agentgym.envs.tasks import SCENARIO_SPLITS, TaskSplits
from agentgym.errors import EpisodeFinishedError

_COMMAND = re.compile(r"^\s*([a-z_]+)\s*(?:\[(.*)\])?\s*$", re.S | re.I)

#: The observation for an action that is not a command (the step also sets ``info["invalid"]``).
BAD_FORMAT = "Invalid action format. Use name[arguments]."


def parse_command(action: str) -> tuple[str, str] | None:
    """``(name, argument)`` of ``action``: the name lower-cased, the text between the brackets
    stripped (``""`` without brackets); None when ``action`` is not a command."""
    m = _COMMAND.match(action)
    if not m:
        return None
    return m.group(1).lower(), (m.group(2) or "").strip()


class CommandEnv(BaseEnv):
    """A business-scenario env: tasks split by :data:`~agentgym.envs.tasks.SCENARIO_SPLITS`
    (``train``, ``test`` or ``all``; the task a ``reset`` plays is ``self._tasks.resolve(task,
    seed)``), one command per turn. ``step`` refuses an episode that has not started or has
    ended (``EpisodeFinishedError``), answers :data:`BAD_FORMAT` (``info["invalid"]``) to an
    action that is not a command, and hands a command to :meth:`command`. ``reset`` sets
    ``done`` to False once its episode is ready."""

    #: The env's registered id (in the split's task errors and the step's refusal).
    env_name: str = ""
    splits = ("train", "test", "all")
    held_out_split = "test"

    def __init__(self, split: str = "train"):
        self._tasks = TaskSplits(self.env_name, SCENARIO_SPLITS, split)
        self.split, self.num_tasks = split, self._tasks.num_tasks
        self.done = True

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        if self.done:
            raise EpisodeFinishedError(f"{self.env_name}: call reset() first")
        command = parse_command(action)
        if command is None:
            return BAD_FORMAT, 0.0, False, {"invalid": True}
        return self.command(*command)

    def command(self, name: str, arg: str) -> tuple[str, float, bool, dict[str, Any]]:
        """One turn's command ``name[arg]`` (see :func:`parse_command`): the step's result."""
        raise NotImplementedError
