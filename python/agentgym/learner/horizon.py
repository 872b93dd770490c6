"""Interaction-horizon schedules (ScalingInter-RL).

ScalingInter-RL (AgentGym-RL, Xi et al. 2025) trains with a small cap on interaction turns
first (exploitation: short, stable credit assignment) and raises it in stages (exploration:
planning, reflection, recovery). AgentGym-RL's ``scaling_inter_stepwise`` rounds control
moves to the next stage every ``steps_scaling_inter`` training steps; its example scripts
use the presets that the env registry holds per AgentGym family
(:data:`agentgym.envs.registry.HORIZON_PRESETS`, an env's through
:func:`agentgym.envs.registry.horizon_preset`; :data:`presets` here is their view by family:
TextCraft/SciWorld ``[10, 20, 30]``, BabyAI ``[6, 13, 20]``, SearchQA ``[5, 8, 10]`` every
100 steps, WebArena ``[8, 12, 15]`` every 80).

Step convention: ``step`` is the number of *completed* training steps, i.e. the 0-based
index of the step about to run. With 100 steps per stage, steps 0-99 use stage 0, 100-199
stage 1, 200 onwards stage 2 (AgentGym-RL counts steps from 1: its steps 1-100 are stage 0).

Each :class:`HorizonStage` may also shape rewards: ``turn_penalty`` (subtracted per turn)
and ``reward_discount`` (the score decays by this factor per extra turn), e.g. to favour
short solutions in a middle stage. The presets do not shape rewards.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from types import MappingProxyType
from typing import Any

import numpy as np

from agentgym.envs.registry import HORIZON_PRESETS, horizon_preset

__all__ = [
    "AdaptiveHorizonSchedule",
    "HorizonSchedule",
    "HorizonStage",
    "presets",
]


@dataclass(frozen=True)
class HorizonStage:
    """One stage: the turn cap and optional reward shaping while it is active."""

    max_turns: int
    turn_penalty: float = 0.0
    reward_discount: float = 1.0

    def __post_init__(self) -> None:
        if int(self.max_turns) < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")
        if not 0.0 < self.reward_discount <= 1.0:
            raise ValueError(f"reward_discount must be in (0, 1], got {self.reward_discount}")
        if self.turn_penalty < 0:
            raise ValueError("turn_penalty must be >= 0")

    def shape_rewards(self, rewards: np.ndarray, num_turns: np.ndarray) -> np.ndarray:
        """``r * reward_discount ** (turns - 1) - turn_penalty * turns`` (float32)."""
        r = np.asarray(rewards, dtype=np.float64)
        t = np.asarray(num_turns, dtype=np.float64)
        out = r * self.reward_discount ** np.maximum(t - 1, 0) - self.turn_penalty * t
        return out.astype(np.float32)

    @property
    def shapes_rewards(self) -> bool:
        return self.turn_penalty != 0.0 or self.reward_discount != 1.0


def _as_stage(s: HorizonStage | int | dict) -> HorizonStage:
    if isinstance(s, HorizonStage):
        return s
    if isinstance(s, dict):
        return HorizonStage(**s)
    return HorizonStage(int(s))


presets: MappingProxyType = MappingProxyType({
    name: {"rounds": p.rounds, "steps_per_stage": p.steps_per_stage}
    for name, p in HORIZON_PRESETS.items()
})
"""ScalingInter-RL schedules of AgentGym-RL's example training scripts, by env family (a
view of the env registry's :data:`~agentgym.envs.registry.HORIZON_PRESETS`)."""


class _ScheduleBase:
    """Shared API: ``stage``/``max_turns``/``shape_rewards``/``metrics`` at a step."""

    stages: tuple[HorizonStage, ...]
    current_step: int

    def stage_index(self, step: int | None = None) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def stage(self, step: int | None = None) -> HorizonStage:
        """The :class:`HorizonStage` in force at ``step`` (default: the current step)."""
        return self.stages[self.stage_index(step)]

    def max_turns(self, step: int | None = None) -> int:
        """The turn cap for rollouts of training step ``step`` (default: current)."""
        return int(self.stage(step).max_turns)

    def shape_rewards(
        self, rewards: np.ndarray, num_turns: np.ndarray, step: int | None = None
    ) -> np.ndarray:
        """Apply the stage's reward shaping (identity for stages without shaping)."""
        return self.stage(step).shape_rewards(rewards, num_turns)

    def metrics(self, step: int | None = None) -> dict[str, float]:
        """``horizon/max_turns`` and ``horizon/stage`` at ``step``."""
        return {"horizon/max_turns": float(self.max_turns(step)),
                "horizon/stage": float(self.stage_index(step))}

    @property
    def num_stages(self) -> int:
        return len(self.stages)


class HorizonSchedule(_ScheduleBase):
    """Stages of maximum turns switched at fixed training-step boundaries.

    ``HorizonSchedule([10, 20, 30], steps_per_stage=100)`` is AgentGym-RL's
    ``scaling_inter_stepwise``; ``steps_per_stage`` may also list each stage's length
    (the last stage lasts for ever; its entry may be omitted). A single stage is a fixed
    horizon: :meth:`fixed`. Stages may be ints or :class:`HorizonStage`.
    """

    def __init__(
        self,
        stages: Sequence[HorizonStage | int | dict],
        steps_per_stage: int | Sequence[int] | None = None,
    ) -> None:
        self.stages = tuple(_as_stage(s) for s in stages)
        if not self.stages:
            raise ValueError("a horizon schedule needs at least one stage")
        n = len(self.stages)
        if steps_per_stage is None:
            if n > 1:
                raise ValueError("steps_per_stage is required with more than one stage")
            lengths: list[int] = []
        elif isinstance(steps_per_stage, int):
            lengths = [steps_per_stage] * (n - 1)
        else:
            lengths = [int(x) for x in steps_per_stage]
            if len(lengths) == n:
                lengths = lengths[:-1]
            if len(lengths) != n - 1:
                raise ValueError(f"steps_per_stage needs {n - 1} or {n} entries")
        if any(x < 1 for x in lengths):
            raise ValueError("every stage must last at least one step")
        self.steps_per_stage = tuple(lengths)
        self.boundaries = tuple(int(x) for x in np.cumsum(lengths)) if lengths else ()
        """Steps at which stages 1, 2, ... begin."""
        self.current_step = 0

    @classmethod
    def fixed(cls, max_turns: int) -> HorizonSchedule:
        """A one-stage schedule (AgentGym-RL's ``rounds_ctrl.type=fixed``)."""
        return cls([max_turns])

    @classmethod
    def from_preset(cls, env_family: str) -> HorizonSchedule:
        """The AgentGym-RL ScalingInter-RL schedule of an env family (see :data:`presets`)
        or of an env id (its family's: ``search`` is ``searchqa``'s); ``KeyError`` where
        there is none."""
        p = horizon_preset(env_family) or horizon_preset(env_family.lower())
        if p is None:
            raise KeyError(f"no horizon preset for {env_family!r}; known: {sorted(presets)}")
        return cls(list(p.rounds), p.steps_per_stage)

    def stage_index(self, step: int | None = None) -> int:
        step = self.current_step if step is None else int(step)
        if step < 0:
            raise ValueError("step must be >= 0")
        return int(np.searchsorted(self.boundaries, step, side="right"))

    def update(self, step: int, success_rate: float | None = None) -> bool:
        """Record that training has reached ``step``; True if the stage changed."""
        before = self.stage_index()
        self.current_step = int(step)
        return self.stage_index() != before

    def state_dict(self) -> dict[str, Any]:
        return {
            "type": "stepwise",
            "stages": [asdict(s) for s in self.stages],
            "steps_per_stage": list(self.steps_per_stage),
            "current_step": self.current_step,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the step; the stages in ``state`` must match this schedule's."""
        if state.get("type") != "stepwise":
            raise ValueError(f"cannot load a {state.get('type')!r} schedule state")
        stages = tuple(_as_stage(s) for s in state["stages"])
        if stages != self.stages or tuple(state["steps_per_stage"]) != self.steps_per_stage:
            raise ValueError("checkpointed horizon stages differ from this schedule's")
        self.current_step = int(state["current_step"])

    def __repr__(self) -> str:
        turns = [s.max_turns for s in self.stages]
        return f"HorizonSchedule({turns}, steps_per_stage={list(self.steps_per_stage)})"


class AdaptiveHorizonSchedule(_ScheduleBase):
    """Advance a stage when the success rate at the current horizon plateaus or is high.

    Call :meth:`update` after each training step with that step's success rate. The stage
    advances when at least ``min_steps_per_stage`` steps were spent in it and either

    * the mean success over the last ``window`` steps is ``>= success_threshold``, or
    * it improved by less than ``min_improvement`` over the ``window`` steps before them
      (a plateau; needs ``2 * window`` steps in the stage), or
    * ``max_steps_per_stage`` steps were spent in it (if set).
    """

    def __init__(
        self,
        stages: Sequence[HorizonStage | int | dict],
        *,
        window: int = 10,
        min_improvement: float = 0.01,
        success_threshold: float | None = 0.8,
        min_steps_per_stage: int = 0,
        max_steps_per_stage: int | None = None,
    ) -> None:
        self.stages = tuple(_as_stage(s) for s in stages)
        if not self.stages:
            raise ValueError("a horizon schedule needs at least one stage")
        if window < 1:
            raise ValueError("window must be >= 1")
        self.window = int(window)
        self.min_improvement = float(min_improvement)
        self.success_threshold = success_threshold
        self.min_steps_per_stage = int(min_steps_per_stage)
        self.max_steps_per_stage = max_steps_per_stage
        self.current_step = 0
        self.stage_starts: list[int] = [0]
        """Step at which each reached stage began."""
        self.history: list[float] = []
        """Success rates recorded during the current stage."""

    def stage_index(self, step: int | None = None) -> int:
        if step is None:
            return len(self.stage_starts) - 1
        return int(np.searchsorted(self.stage_starts, int(step), side="right")) - 1

    def _should_advance(self) -> bool:
        h, w = self.history, self.window
        if len(h) < max(self.min_steps_per_stage, 1):
            return False
        if self.max_steps_per_stage is not None and len(h) >= self.max_steps_per_stage:
            return True
        if len(h) >= w and self.success_threshold is not None:
            if float(np.mean(h[-w:])) >= self.success_threshold:
                return True
        if len(h) >= 2 * w:
            return float(np.mean(h[-w:]) - np.mean(h[-2 * w : -w])) < self.min_improvement
        return False

    def update(self, step: int, success_rate: float | None = None) -> bool:
        """Record the success rate of the step that just finished (``step`` = number of
        completed steps). Returns True when this moved to the next stage, which then
        applies from ``step`` on."""
        self.current_step = int(step)
        if success_rate is None:
            return False
        if not np.isfinite(success_rate):
            raise ValueError(f"success_rate must be finite, got {success_rate}")
        self.history.append(float(success_rate))
        if len(self.stage_starts) < len(self.stages) and self._should_advance():
            self.stage_starts.append(self.current_step)
            self.history = []
            return True
        return False

    def state_dict(self) -> dict[str, Any]:
        return {
            "type": "adaptive",
            "stages": [asdict(s) for s in self.stages],
            "current_step": self.current_step,
            "stage_starts": list(self.stage_starts),
            "history": list(self.history),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore progress; the stages in ``state`` must match this schedule's."""
        if state.get("type") != "adaptive":
            raise ValueError(f"cannot load a {state.get('type')!r} schedule state")
        if tuple(_as_stage(s) for s in state["stages"]) != self.stages:
            raise ValueError("checkpointed horizon stages differ from this schedule's")
        self.current_step = int(state["current_step"])
        self.stage_starts = [int(x) for x in state["stage_starts"]]
        self.history = [float(x) for x in state["history"]]

    def __repr__(self) -> str:
        turns = [s.max_turns for s in self.stages]
        return f"AdaptiveHorizonSchedule({turns}, stage={self.stage_index()})"
