"""Scale-out: rollout workers on Ray and a data-parallel learner on torch.distributed.

* :mod:`agentgym.distributed.rollout_workers` -- :class:`RayRolloutPool`, a driver over Ray
  actors that each own a :class:`~agentgym.engine.RolloutEngine` and a backend, with the
  engine's ``stream_requests``/``collect`` interface, dynamic load balancing, re-runs of a
  dead worker's episodes and weight sync;
* :mod:`agentgym.distributed.ddp` -- :class:`DataParallel`, one rank of a data-parallel
  learner under ``torchrun`` (DDP; gloo on CPU, NCCL on GPU).

Both import their engines (ray, torch) lazily: ``import agentgym.distributed`` needs neither.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "RayRolloutPool": "agentgym.distributed.rollout_workers",
    "WorkerSpec": "agentgym.distributed.rollout_workers",
    "RolloutWorkerError": "agentgym.distributed.rollout_workers",
    "DataParallel": "agentgym.distributed.ddp",
    "init_from_env": "agentgym.distributed.ddp",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'agentgym.distributed' has no attribute {name!r}")
