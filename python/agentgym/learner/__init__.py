"""The learner: packed trajectory batches -> advantages -> PPO-style policy update, plus the
ScalingInter-RL horizon schedule.

``horizon``, ``advantages`` and ``batch`` need only numpy; ``losses`` and ``update`` need
torch and are imported lazily, so ``from agentgym.learner import HorizonSchedule`` works
without torch installed.
"""

from __future__ import annotations

import importlib
from typing import Any

from agentgym.learner.advantages import AdvantageResult, compute_advantages
from agentgym.learner.batch import (
    STOP_REASONS,
    BatchFormatError,
    MicroBatch,
    PackedBatch,
    StopReason,
    collate,
    make_micro_batches,
    pack_trajectories,
    plan_micro_batches,
)
from agentgym.learner.horizon import (
    AdaptiveHorizonSchedule,
    HorizonSchedule,
    HorizonStage,
    presets,
)

_LAZY = {
    "LearnerConfig": "agentgym.learner.update",
    "compute_logprobs": "agentgym.learner.update",
    "compute_values": "agentgym.learner.update",
    "make_optimizer": "agentgym.learner.update",
    "policy_update": "agentgym.learner.update",
    "agg_loss": "agentgym.learner.losses",
    "entropy_from_logits": "agentgym.learner.losses",
    "filter_stale": "agentgym.learner.losses",
    "kl_penalty": "agentgym.learner.losses",
    "policy_loss": "agentgym.learner.losses",
    "staleness_weights": "agentgym.learner.losses",
    "value_loss": "agentgym.learner.losses",
}

__all__ = [
    "STOP_REASONS",
    "AdaptiveHorizonSchedule",
    "AdvantageResult",
    "BatchFormatError",
    "HorizonSchedule",
    "HorizonStage",
    "MicroBatch",
    "PackedBatch",
    "StopReason",
    "collate",
    "compute_advantages",
    "make_micro_batches",
    "pack_trajectories",
    "plan_micro_batches",
    "presets",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'agentgym.learner' has no attribute {name!r}")
