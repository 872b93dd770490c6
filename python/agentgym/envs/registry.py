"""The environment registry: ``register``, ``make``, ``list_envs``, ``spec``, ``is_registered``.

Native (Rust) envs are registered at import. Python envs register an entry point, either an
object or a ``"module:attr"`` string resolved on first ``make``; the target may be a
``gymnasium.Env`` class, a :class:`BaseEnv` class (adapted to Gymnasium), or a callable
returning either.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

from agentgym import _core
from agentgym.envs.base import BaseEnv, BaseEnvAdapter
from agentgym.errors import UnknownEnvError


@dataclass(frozen=True)
class EnvSpec:
    """What is registered under ``env_id``: the entry point, the default ``make`` kwargs, the
    description, and whether it is a native (Rust) env."""

    env_id: str
    entry_point: str | Callable[..., Any]
    kwargs: dict[str, Any] = field(default_factory=dict)
    description: str = ""
    native: bool = False


_REGISTRY: dict[str, EnvSpec] = {}


def register(
    env_id: str,
    entry_point: str | Callable[..., Any],
    *,
    description: str = "",
    override: bool = False,
    **kwargs: Any,
) -> None:
    """Register ``env_id``; ``kwargs`` become defaults for :func:`make`."""
    if not isinstance(env_id, str) or not env_id:
        raise ValueError("env_id must be a non-empty str")
    if env_id in _REGISTRY and not override:
        raise ValueError(f"environment {env_id!r} is already registered (pass override=True)")
    _REGISTRY[env_id] = EnvSpec(env_id, entry_point, dict(kwargs), description)


def list_envs() -> list[str]:
    """All registered environment ids, sorted."""
    return sorted(_REGISTRY)


def registered_id(cls: type) -> str | None:
    """The id registered with exactly ``cls`` as its entry point and no default kwargs
    (None if there is none)."""
    name = f"{cls.__module__}:{cls.__qualname__}"
    for entry in _REGISTRY.values():
        if not entry.kwargs and (entry.entry_point is cls or entry.entry_point == name):
            return entry.env_id
    return None


def is_registered(env_id: str) -> bool:
    """Whether ``env_id`` is registered (``remote:ENV`` ids are not: they are made on demand)."""
    return env_id in _REGISTRY


def spec(env_id: str) -> EnvSpec:
    """The :class:`EnvSpec` registered under ``env_id``; :class:`UnknownEnvError` (listing the
    known ids) if there is none."""
    try:
        return _REGISTRY[env_id]
    except KeyError:
        raise UnknownEnvError(
            f"unknown environment id {env_id!r}; known ids: {', '.join(list_envs())}"
        ) from None


def describe(env_id: str) -> str:
    """The one-line description registered with ``env_id``."""
    return spec(env_id).description


def _resolve(entry_point: str | Callable[..., Any]) -> Callable[..., Any]:
    if callable(entry_point):
        return entry_point
    module_name, _, attr = entry_point.partition(":")
    if not attr:
        raise ValueError(f"entry point {entry_point!r} must look like 'package.module:Name'")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def make(env_id: str, **kwargs: Any) -> gym.Env:
    """A Gymnasium env for ``env_id`` (text observations and actions).

    ``max_turns=N`` sets the horizon; other keyword arguments go to the env's constructor.
    ``make("remote:ENV", url=...)`` gives a :class:`~agentgym.serving.client.RemoteEnv` for
    ``ENV`` served over HTTP (AgentGym's env-server protocol).
    """
    if isinstance(env_id, str) and env_id.startswith("remote:"):
        from agentgym.serving.client import RemoteEnv

        if "url" not in kwargs:
            raise ValueError(f"make({env_id!r}) needs url='http://host:port'")
        return RemoteEnv(env_name=env_id.removeprefix("remote:"), **kwargs)
    entry = spec(env_id)
    params = {**entry.kwargs, **kwargs}
    max_turns = params.pop("max_turns", None)
    if entry.native:
        from agentgym.envs.native import NativeEnv

        return NativeEnv(env_id, max_turns=max_turns, **params)
    target = _resolve(entry.entry_point)
    env = target(**params)
    if isinstance(env, BaseEnv):
        return BaseEnvAdapter(env, max_turns=max_turns, env_id=env_id)
    if isinstance(env, gym.Env):
        if max_turns is not None:
            env = gym.wrappers.TimeLimit(env, max_episode_steps=max_turns)
        return env
    raise TypeError(
        f"entry point of {env_id!r} returned {type(env).__name__}, "
        "expected a BaseEnv or gymnasium.Env"
    )


for _native_id in _core.native_env_ids():
    _REGISTRY[_native_id] = EnvSpec(
        _native_id,
        "agentgym.envs.native:NativeEnv",
        description=_core.native_env_description(_native_id),
        native=True,
    )

# Python-written suites register "module:Class" entry points: their modules load on first make.
from agentgym.envs import scenarios as _scenarios  # noqa: E402

_scenarios.register_all()
from agentgym.envs import simulators as _simulators  # noqa: E402

_simulators.register_all()
