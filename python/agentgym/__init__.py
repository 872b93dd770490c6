"""agentgym-rl: multi-turn reinforcement learning for LLM agents.

Native environments and the episode pool live in the Rust extension ``agentgym._core``;
this package adds the registry (``make``/``register``/``list_envs``), the Gymnasium adapters,
and (in their own subpackages) the rollout engine, backends and learner.
"""

from agentgym import errors
from agentgym._core import __version__
from agentgym.envs.registry import list_envs, make, register
from agentgym.envs.tasks import task_set
from agentgym.errors import *  # noqa: F403  (the named exceptions: errors.__all__)
from agentgym.pool import EnvPool

__all__ = ["EnvPool", "__version__", "list_envs", "make", "register", "task_set"]
__all__ += errors.__all__


def __getattr__(name: str):
    # ``agentgym.collect`` / ``agentgym.Collector`` without importing pyarrow at import time.
    if name in ("collect", "Collector"):
        from agentgym import collection

        return getattr(collection, name)
    raise AttributeError(f"module 'agentgym' has no attribute {name!r}")
