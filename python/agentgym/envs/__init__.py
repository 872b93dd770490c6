"""Environments: the registry, the Python ``BaseEnv`` and the env classes.

``from agentgym.envs import TextCraftEnv`` gives a Gymnasium env class per registered env.
"""

from agentgym.envs.base import BaseEnv, BaseEnvAdapter
from agentgym.envs.native import NativeEnv
from agentgym.envs.registry import list_envs, make, register
from agentgym.envs.spaces import TextSpace


class TextCraftEnv(NativeEnv):
    """TextCraft (AgentGym): craft a target item from base items with the given recipes."""

    def __init__(self, max_turns: int | None = None, **kwargs):
        super().__init__("textcraft", max_turns=max_turns, **kwargs)


class MazeEnv(NativeEnv):
    """A grid maze with text observations; reach the goal."""

    def __init__(self, max_turns: int | None = None, **kwargs):
        super().__init__("maze", max_turns=max_turns, **kwargs)


class WordleEnv(NativeEnv):
    """Wordle: guess the hidden five-letter word from per-letter feedback."""

    def __init__(self, max_turns: int | None = None, **kwargs):
        super().__init__("wordle", max_turns=max_turns, **kwargs)


class WebShopEnv(NativeEnv):
    """WebShop-style shopping site: search, open products, pick options, buy."""

    def __init__(self, max_turns: int | None = None, **kwargs):
        super().__init__("webshop", max_turns=max_turns, **kwargs)


class SearchEnv(NativeEnv):
    """Deep search: answer multi-hop questions by searching and reading a local corpus."""

    def __init__(self, max_turns: int | None = None, **kwargs):
        super().__init__("search", max_turns=max_turns, **kwargs)


class GridWorldEnv(NativeEnv):
    """BabyAI-style text grid world (native, for throughput)."""

    def __init__(self, max_turns: int | None = None, **kwargs):
        super().__init__("gridworld", max_turns=max_turns, **kwargs)


class Game2048Env(NativeEnv):
    """2048 as text: slide and merge tiles; random spawns."""

    def __init__(self, max_turns: int | None = None, **kwargs):
        super().__init__("game2048", max_turns=max_turns, **kwargs)


#: Env classes of the Python-written suites, imported on first access.
_LAZY = {
    "CodeDebugEnv": "agentgym.envs.code_debug",
    "ECommerceServiceEnv": "agentgym.envs.ecommerce",
    "OfficeEnv": "agentgym.envs.office",
    "ProjectPlanningEnv": "agentgym.envs.office",
    "RemoteEnv": "agentgym.envs.remote",
    "BabyAIEnv": "agentgym.envs.babyai",
    "SciWorldEnv": "agentgym.envs.sciworld",
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
    "MazeEnv",
    "NativeEnv",
    "TextCraftEnv",
    "TextSpace",
    "WebShopEnv",
    "WordleEnv",
    "list_envs",
    "make",
    "register",
]
