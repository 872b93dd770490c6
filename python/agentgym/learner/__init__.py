"""The learner: packed trajectory batches -> advantages -> PPO-style policy update, plus the
ScalingInter-RL horizon schedule.

``horizon``, ``advantages`` and ``microbatch`` need only numpy (``collate`` imports torch
when called); ``losses`` and ``update`` need torch and are imported lazily, so ``from
agentgym.learner import HorizonSchedule`` works without torch installed. The packed batch
they consume is ``agentgym.data.PackedBatch``.
"""

from __future__ import annotations

import importlib
from typing import Any

from agentgym.learner.advantages import AdvantageResult, compute_advantages
from agentgym.learner.horizon import (
    AdaptiveHorizonSchedule,
    HorizonSchedule,
    HorizonStage,
    presets,
)
from agentgym.learner.microbatch import (
    MicroBatch,
    collate,
    make_micro_batches,
    plan_micro_batches,
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
    "AdaptiveHorizonSchedule",
    "AdvantageResult",
    "HorizonSchedule",
    "HorizonStage",
    "MicroBatch",
    "collate",
    "compute_advantages",
    "make_micro_batches",
    "plan_micro_batches",
    "presets",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'agentgym.learner' has no attribute {name!r}")
