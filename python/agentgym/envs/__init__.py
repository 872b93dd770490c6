"""Environments: the registry, the Python ``BaseEnv`` and the env classes.

``from agentgym.envs import TextCraftEnv`` gives a Gymnasium env class per registered env; the
Python-written ones live in packages named for their env ids (``agentgym.envs.office``,
``agentgym.envs.code_debug``, ...) and load on first access. ``RemoteEnv`` (an env behind an
AgentGym-protocol server) lives in :mod:`agentgym.serving.client` and is re-exported here.
"""

from agentgym.envs.base import BaseEnv, BaseEnvAdapter
from agentgym.envs.native import NativeEnv
from agentgym.envs.registry import list_envs, make, register
from agentgym.envs.spaces import TextSpace
from agentgym.envs.tasks import TaskSet, plan_tasks, task_set


class _NamedNativeEnv(NativeEnv):
    """A native env class bound to one env id, ``ENV_ID``."""

    ENV_ID: str

    def __init__(self, max_turns: int | None = None, **kwargs):
        super().__init__(self.ENV_ID, max_turns=max_turns, **kwargs)


class TextCraftEnv(_NamedNativeEnv):
    """TextCraft (AgentGym): craft a target item from base items with the given recipes."""

    ENV_ID = "textcraft"


class MazeEnv(_NamedNativeEnv):
    """A grid maze with text observations; reach the goal."""

    ENV_ID = "maze"


class WordleEnv(_NamedNativeEnv):
    """Wordle: guess the hidden five-letter word from per-letter feedback."""

    ENV_ID = "wordle"


class WebShopEnv(_NamedNativeEnv):
    """WebShop-style shopping site: search, open products, pick options, buy."""

    ENV_ID = "webshop"


class SearchEnv(_NamedNativeEnv):
    """Deep search: answer multi-hop questions by searching and reading a local corpus."""

    ENV_ID = "search"


class GridWorldEnv(_NamedNativeEnv):
    """BabyAI-style text grid world (native, for throughput)."""

    ENV_ID = "gridworld"


class Game2048Env(_NamedNativeEnv):
    """2048 as text: slide and merge tiles; random spawns."""

    ENV_ID = "game2048"


#: Env classes of the Python-written suites, imported on first access.
_LAZY = {
    "CodeDebugEnv": "agentgym.envs.code_debug",
    "ECommerceServiceEnv": "agentgym.envs.ecommerce_service",
    "OfficeEnv": "agentgym.envs.office",
    "ProjectPlanningEnv": "agentgym.envs.project_planning",
    "RemoteEnv": "agentgym.serving.client",
    "BabyAIEnv": "agentgym.envs.babyai",
    "SciWorldEnv": "agentgym.envs.sciworld",
    "SuiteGame": "agentgym.envs.suites._game",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'agentgym.envs' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = [
    "BaseEnv",
    "BabyAIEnv",
    "BaseEnvAdapter",
    "CodeDebugEnv",
    "ECommerceServiceEnv",
    "Game2048Env",
    "GridWorldEnv",
    "OfficeEnv",
    "ProjectPlanningEnv",
    "RemoteEnv",
    "SciWorldEnv",
    "SearchEnv",
    "SuiteGame",
    "MazeEnv",
    "NativeEnv",
    "TextCraftEnv",
    "TaskSet",
    "TextSpace",
    "WebShopEnv",
    "WordleEnv",
    "list_envs",
    "make",
    "plan_tasks",
    "register",
    "task_set",
]
