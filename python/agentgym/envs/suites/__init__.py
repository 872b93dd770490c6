"""Community environment suites as this project's envs and games, named ``suite:id``.

One adapter module per suite turns the suite's own environments into what the registry
serves (docs/suites.md):

* ``openspiel:<game>`` (:mod:`.openspiel`, package ``open_spiel``): a one-player OpenSpiel
  game is a single-agent env, a game of two or more players a multi-seat game, each seat
  seeing only its own ``observation_string(player)`` (or ``information_state_string``);
  game parameters ride in the id as OpenSpiel writes them (``openspiel:leduc_poker(players=3)``);
* ``textarena:<EnvId>`` (:mod:`.textarena`, package ``textarena``): a one-player TextArena
  env is a single-agent env, a multi-player one a game with TextArena's per-player
  observations (``textarena:Poker-v0@4``: four seats where the env takes several counts);
* ``reasoning_gym:<dataset>`` (:mod:`.reasoning_gym`, package ``reasoning-gym``): one
  question, one answer, scored by the dataset's own ``score_answer``.
* ``verifiers:<taskset>`` or ``verifiers:<env>+<taskset>`` (:mod:`.verifiers`, package
  ``verifiers`` 0.4, its ``verifiers.v1`` stack): verifiers' own ``Env.run_episode`` with its
  one seat played by the policy, the task's rewards scoring the finished rollout on the
  final turn; what needs an LLM judge, a sandbox, network or a second model is refused.
* ``openenv:<module.path:EnvClass>`` or ``openenv:http://host:port`` (:mod:`.openenv`,
  package ``openenv-core``): an OpenEnv ``Environment`` built in-process, or a running
  OpenEnv server driven by OpenEnv's own client, as a single-agent env.

:func:`suite_spec` is what :func:`agentgym.envs.registry.spec` asks first for an id whose
prefix names a suite (before ``remote:`` ids, entry points and ``module:attr`` ids);
:func:`list_suite` answers ``agentgym-rl list --suite NAME``. A suite whose package is not
installed is :class:`~agentgym.errors.UnknownEnvError` naming the extra that installs it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from agentgym.errors import EnvError, UnknownEnvError

__all__ = ["HELD_OUT_BASE", "SPLITS", "SUITES", "Suite", "SuiteEntry", "check_split",
           "chance_seed", "list_suite", "split_id", "suite_spec", "task_index"]

#: The task splits of a suite's env; ``test`` draws its chance from seeds
#: ``HELD_OUT_BASE + i`` (``train``'s from ``i``).
SPLITS = ("train", "test")
HELD_OUT_BASE = 2**32


def check_split(split: str) -> str:
    """``split`` if it is one of :data:`SPLITS`; a one-line ValueError naming it else."""
    if split not in SPLITS:
        raise ValueError(f"split: must be one of {', '.join(SPLITS)}, got {split!r}")
    return split


def chance_seed(name: str, split: str, task: int | str | None, seed: int) -> int:
    """The seed an episode's chance is drawn from: task ``i`` of ``split`` (``i``, or
    ``HELD_OUT_BASE + i`` for ``test``), else the episode's ``seed``; a task that is not a
    non-negative index is an :class:`~agentgym.errors.EnvError` naming ``name``."""
    if task is None:
        return int(seed)
    try:
        index = int(task)
    except (TypeError, ValueError):
        raise EnvError(f"{name}: task must be an index, got {task!r}") from None
    if index < 0:
        raise EnvError(f"{name}: task must be >= 0, got {index}")
    return (HELD_OUT_BASE if split == "test" else 0) + index


def task_index(name: str, task: int | str | None, seed: int | None, num_tasks: int) -> int:
    """The index of an episode's task among ``num_tasks``: ``task`` (checked), else the
    episode's ``seed`` modulo ``num_tasks``; a bad task is an
    :class:`~agentgym.errors.EnvError` naming ``name``."""
    if task is None:
        return (seed or 0) % num_tasks
    try:
        index = int(task)
    except (TypeError, ValueError):
        raise EnvError(f"{name}: task must be an index, got {task!r}") from None
    if not 0 <= index < num_tasks:
        raise EnvError(f"{name}: task {index} out of range (0..{num_tasks - 1})")
    return index


@dataclass(frozen=True)
class Suite:
    """One suite: its adapter module, the package it imports and the PyPI name that
    installs it."""

    name: str
    module: str
    package: str
    pypi: str


@dataclass(frozen=True)
class SuiteEntry:
    """One listed env of a suite: its full id, its kind (``python``: single-agent, ``game``:
    multi-seat), its seat count where known without building it, and where it comes from."""

    env_id: str
    kind: str
    seats: int | None
    source: str


#: The suites, by the prefix of their ids.
SUITES: dict[str, Suite] = {
    "openspiel": Suite("openspiel", "agentgym.envs.suites.openspiel", "pyspiel", "open-spiel"),
    "textarena": Suite("textarena", "agentgym.envs.suites.textarena", "textarena", "textarena"),
    "reasoning_gym": Suite("reasoning_gym", "agentgym.envs.suites.reasoning_gym",
                           "reasoning_gym", "reasoning-gym"),
    "verifiers": Suite("verifiers", "agentgym.envs.suites.verifiers", "verifiers.v1",
                       "verifiers"),
    "openenv": Suite("openenv", "agentgym.envs.suites.openenv", "openenv", "openenv-core"),
}


def split_id(env_id: str) -> tuple[Suite, str] | None:
    """``(suite, id within it)`` of a ``suite:id`` name; None when the prefix names no
    suite (so ``remote:ID`` and ``module:attr`` ids pass through untouched)."""
    prefix, sep, rest = env_id.partition(":")
    if not sep or prefix not in SUITES:
        return None
    if not rest:
        raise UnknownEnvError(f"env id {env_id!r}: name the {prefix} env after '{prefix}:' "
                              f"(agentgym-rl list --suite {prefix})")
    return SUITES[prefix], rest


def adapter(suite: Suite) -> Any:
    """The adapter module of ``suite``; :class:`UnknownEnvError` naming the extra when the
    suite's package is not installed."""
    try:
        importlib.import_module(suite.package)
    except ImportError as e:
        raise UnknownEnvError(
            f"suite {suite.name!r} needs the {suite.pypi!r} package ({type(e).__name__}: {e}); "
            "install it with pip install 'agentgym-rl[suites]'") from None
    return importlib.import_module(suite.module)


def suite_spec(env_id: str):
    """The :class:`~agentgym.envs.registry.EnvSpec` of suite id ``env_id`` (None when its
    prefix names no suite); :class:`UnknownEnvError` when the suite has no such env."""
    found = split_id(env_id)
    if found is None:
        return None
    suite, local = found
    return adapter(suite).spec(env_id, local)


def list_suite(name: str) -> list[SuiteEntry]:
    """Every env of suite ``name`` that its package registers, sorted by id."""
    if name not in SUITES:
        raise ValueError(f"--suite: unknown suite {name!r}; suites: {', '.join(SUITES)}")
    return sorted(adapter(SUITES[name]).entries(), key=lambda e: e.env_id)
