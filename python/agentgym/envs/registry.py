"""The env registry: the one place that knows, for every env id, what it is and how it plays.

An id is one of four kinds (:func:`kind`):

* ``native``: an env of the Rust core (``agentgym._core``), stepped in a Rust ``EnvPool``;
* ``game``: a native multi-seat game (``tictactoe``, ``kuhn_poker``, ``negotiation``), played
  by self-play (docs/selfplay.md), never through :func:`make`;
* ``python``: an env written in Python, a :class:`~agentgym.envs.base.BaseEnv` or
  ``gymnasium.Env`` class, or a factory returning either;
* ``remote``: ``remote:<id>``, an env behind an env server (``make("remote:ID", url=...)``).

A community suite's env (``openspiel:<game>``, ``textarena:<EnvId>``,
``reasoning_gym:<dataset>``; :mod:`agentgym.envs.suites`, docs/suites.md) is a ``python``
env or a ``game`` like any other.

Per id the registry answers (one function per question): :func:`kind`, :func:`is_native`,
:func:`is_game`, :func:`seats`, :func:`roles`, :func:`task_splits`, :func:`family`,
:func:`horizon_preset` (the ScalingInter-RL stages of AgentGym-RL's example scripts),
:func:`default_horizon` (the turns an evaluation plays by default: the env's oracle solves
its held-out tasks within them), :func:`snapshots`, :func:`draws_images` and
:func:`success_rule` (what counts as a solved episode; the engine records each episode's
verdict, ``Trajectory.success``).

How an id is found (:func:`spec`): the ids registered here (the shipped ones at import,
then :func:`register`); a suite id, ``<suite>:<id>`` with a prefix of
:data:`agentgym.envs.suites.SUITES` (checked before any other id holding ``:``, and kept
once built, never listed: ``agentgym-rl list --suite NAME`` lists a suite);
``remote:<id>``; the Rust core's test-only envs and games (once
``_core._register_test_envs()`` ran; never listed); an entry point of the
``agentgym_rl.envs`` group of an installed package (its name the id, its value
``module:attr``), registered on first lookup (and by :func:`list_envs`); last, an id holding
``:`` is imported as ``module:attr`` (a ``BaseEnv`` class, a ``gymnasium.Env`` class or a
factory; a :class:`~agentgym.envs.suites._game.SuiteGame` class is a game) and registered
under that id, so ``--env mypkg.envs:MyEnv`` works wherever an env
id does. Anything else, or a module or attribute that cannot be imported, is
:class:`~agentgym.errors.UnknownEnvError` with one message naming it.
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

import gymnasium as gym

from agentgym import _core
from agentgym.envs.base import BaseEnv, BaseEnvAdapter
from agentgym.errors import UnknownEnvError

__all__ = [
    "DEFAULT_HORIZON",
    "ENTRY_POINT_GROUP",
    "GENERIC_SUCCESS",
    "HORIZON_PRESETS",
    "KINDS",
    "EnvSpec",
    "HorizonPreset",
    "SuccessRule",
    "default_horizon",
    "describe",
    "draws_images",
    "family",
    "game_pool",
    "horizon_preset",
    "is_game",
    "is_native",
    "is_registered",
    "kind",
    "list_envs",
    "make",
    "register",
    "registered_id",
    "roles",
    "seats",
    "snapshots",
    "spec",
    "success_rule",
    "task_splits",
]

#: The kinds of env ids.
KINDS = ("native", "game", "python", "remote")
#: The entry-point group whose entries are env ids (name: the id, value: ``module:attr``).
ENTRY_POINT_GROUP = "agentgym_rl.envs"
#: The default evaluation horizon of an env that declares none.
DEFAULT_HORIZON = 20
_REMOTE = "remote:"


@dataclass(frozen=True)
class SuccessRule:
    """What counts as a solved episode: the env ended it (stop reason ``done``) with a return
    of at least ``threshold`` (less float rounding; an episode that retried under reflection
    is judged on its last attempt's return). ``text`` says what that means for the env."""

    threshold: float = 1.0
    text: str = "the env ends the episode with a return of at least 1"


#: The rule of an env that states none (``agentgym.data.trajectories.solved``).
GENERIC_SUCCESS = SuccessRule()


@dataclass(frozen=True)
class HorizonPreset:
    """A ScalingInter-RL schedule: the turn cap of each stage, switched every
    ``steps_per_stage`` training steps."""

    rounds: tuple[int, ...]
    steps_per_stage: int


#: AgentGym-RL's example training scripts' ScalingInter-RL schedules, by AgentGym family
#: (an env's :func:`family`). ``webarena`` has no env here (``remote:webarena``).
HORIZON_PRESETS: MappingProxyType[str, HorizonPreset] = MappingProxyType({
    "textcraft": HorizonPreset((10, 20, 30), 100),
    "babyai": HorizonPreset((6, 13, 20), 100),
    "searchqa": HorizonPreset((5, 8, 10), 100),
    "sciworld": HorizonPreset((10, 20, 30), 100),
    "webarena": HorizonPreset((8, 12, 15), 80),
})


@dataclass(frozen=True)
class EnvSpec:
    """What is registered under ``env_id``.

    ``entry_point`` builds it (a ``"module:attr"`` string or the object), ``kwargs`` are the
    default ``make`` kwargs, ``kind`` one of :data:`KINDS`; ``seats`` 1 for an env, a game's
    seat count; ``family`` the AgentGym family it belongs to (its server dialect and its
    ScalingInter-RL preset; None: none); ``default_horizon`` the turns an evaluation plays
    by default; ``success`` its :class:`SuccessRule`; ``snapshots`` / ``images`` whether it
    can copy its state / draw pictures (None: not declared, read from the env's class);
    ``target`` the served id of a ``remote:`` id.
    """

    env_id: str
    entry_point: str | Callable[..., Any]
    kwargs: dict[str, Any] = field(default_factory=dict)
    description: str = ""
    kind: str = "python"
    seats: int = 1
    family: str | None = None
    default_horizon: int = DEFAULT_HORIZON
    success: SuccessRule = GENERIC_SUCCESS
    snapshots: bool | None = None
    images: bool | None = None
    target: str | None = None

    @property
    def native(self) -> bool:
        """A native (Rust) env."""
        return self.kind == "native"

    @property
    def horizon(self) -> HorizonPreset | None:
        """The ScalingInter-RL preset of its family (None: none)."""
        return HORIZON_PRESETS.get(self.family) if self.family else None


_REGISTRY: dict[str, EnvSpec] = {}


# ------------------------------------------------------------------------ registration
def register(
    env_id: str,
    entry_point: str | Callable[..., Any],
    *,
    description: str = "",
    override: bool = False,
    success: SuccessRule | float | None = None,
    default_horizon: int | None = None,
    family: str | None = None,
    **kwargs: Any,
) -> None:
    """Register a Python env ``env_id``; ``kwargs`` become defaults for :func:`make`.

    ``success``: its :class:`SuccessRule` (or the threshold alone; default
    :data:`GENERIC_SUCCESS`), ``default_horizon`` its evaluation horizon (default
    :data:`DEFAULT_HORIZON`), ``family`` its AgentGym family (for a horizon preset).
    """
    if not isinstance(env_id, str) or not env_id:
        raise ValueError("env_id must be a non-empty str")
    if env_id.startswith(_REMOTE):
        raise ValueError(f"{env_id!r}: ids starting with 'remote:' name served envs; "
                         "register the env under its own id")
    if env_id in _REGISTRY and not override:
        raise ValueError(f"environment {env_id!r} is already registered (pass override=True)")
    if isinstance(success, (int, float)):
        success = SuccessRule(float(success), f"the env ends the episode with a return of at "
                                              f"least {float(success):g}")
    _REGISTRY[env_id] = EnvSpec(
        env_id, entry_point, dict(kwargs), description, "python", family=family,
        default_horizon=int(default_horizon or DEFAULT_HORIZON),
        success=success or GENERIC_SUCCESS)


def is_registered(env_id: str) -> bool:
    """Whether ``env_id`` is in the table now (no lookup: ``remote:`` ids, entry points and
    ``module:attr`` ids not used yet are not)."""
    return env_id in _REGISTRY


def list_envs(kind: str | Iterable[str] | None = None) -> list[str]:
    """The registered env ids, sorted: envs, games and installed entry points; ``kind``
    keeps those of one kind or several (e.g. ``kind=("native", "python")``: the
    single-agent envs ``make`` builds). Test-only and ``remote:`` ids are never listed."""
    _register_entry_points()
    if kind is None:
        return sorted(_REGISTRY)
    kinds = {kind} if isinstance(kind, str) else set(kind)
    unknown = kinds - set(KINDS)
    if unknown:
        raise ValueError(f"unknown kind(s) {sorted(unknown)}; kinds: {', '.join(KINDS)}")
    return sorted(e for e, s in _REGISTRY.items() if s.kind in kinds)


def registered_id(cls: type) -> str | None:
    """The id registered with exactly ``cls`` as its entry point and no default kwargs
    (None if there is none)."""
    name = f"{cls.__module__}:{cls.__qualname__}"
    for entry in _REGISTRY.values():
        if not entry.kwargs and (entry.entry_point is cls or entry.entry_point == name):
            return entry.env_id
    return None


# ------------------------------------------------------------------------------ lookup
def spec(env_id: str) -> EnvSpec:
    """The :class:`EnvSpec` of ``env_id``, found as the module docstring says;
    :class:`UnknownEnvError` (listing the known ids) if there is none."""
    found = _REGISTRY.get(env_id)
    if found is not None:
        return found
    if not isinstance(env_id, str):
        raise UnknownEnvError(f"env id must be a str, got {type(env_id).__name__}")
    found = _SUITE_SPECS.get(env_id)
    if found is not None:
        return found
    found = _suite_spec(env_id)
    if found is not None:
        _SUITE_SPECS[env_id] = found
        return found
    if env_id.startswith(_REMOTE):
        return _remote_spec(env_id)
    found = _core_test_spec(env_id)
    if found is not None:
        return found
    point = _entry_points().get(env_id)
    if point is not None:
        _register_entry_point(env_id, point)
        return _REGISTRY[env_id]
    if ":" in env_id:
        return _import_spec(env_id)
    raise UnknownEnvError(
        f"unknown environment id {env_id!r}; known ids: {', '.join(list_envs())} "
        "(or remote:ID, or module:Class)")


def describe(env_id: str) -> str:
    """The one-line description of ``env_id`` (a user class's docstring's first line where
    it was registered without one)."""
    s = spec(env_id)
    if s.description or s.kind != "python":
        return s.description
    try:
        doc = inspect.getdoc(_resolve(s.entry_point, env_id)) or ""
    except Exception:  # a plugin that fails to import: listed without a description
        return ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def kind(env_id: str) -> str:
    """``"native"``, ``"game"``, ``"python"`` or ``"remote"``."""
    return spec(env_id).kind


def is_native(env_id: str) -> bool:
    """Whether ``env_id`` is a native (Rust) single-agent env."""
    return kind(env_id) == "native"


def is_game(env_id: str) -> bool:
    """Whether ``env_id`` is a native multi-seat game."""
    return kind(env_id) == "game"


def seats(env_id: str) -> int:
    """How many seats an episode of ``env_id`` has: 1 for an env, a game's seat count (one
    trajectory per seat)."""
    return spec(env_id).seats


def roles(env_id: str) -> tuple[str, ...]:
    """Each seat's role of a game (``("X", "O")``; its length is :func:`seats`); ``()``
    for a single-agent env."""
    s = spec(env_id)
    if s.kind != "game":
        return ()
    return _game_facts(env_id)[1]


def task_splits(env_id: str) -> tuple[tuple[str, ...], str | None]:
    """``(splits, held_out)``: the values of the env's ``split`` kwarg, its default first
    (empty: no splits), and the split kept for evaluation (None: none). A game, a remote
    env and a factory that is not a class declare none here (``tasks.task_set`` builds the
    env and asks it)."""
    s = spec(env_id)
    if s.kind == "native":
        splits, held_out, _ = _core.native_env_tasks(env_id)
        return tuple(splits), held_out
    if s.kind != "python":
        return (), None
    target = _resolve(s.entry_point, env_id)
    if not inspect.isclass(target):
        return (), None
    return tuple(getattr(target, "splits", ()) or ()), getattr(target, "held_out_split", None)


def family(env_id: str) -> str | None:
    """The AgentGym family ``env_id`` belongs to (``search`` is ``searchqa``; a
    ``remote:`` id that of the env it serves); None: none."""
    return spec(env_id).family


def horizon_preset(name: str) -> HorizonPreset | None:
    """The ScalingInter-RL preset of an env id (its family's, :data:`HORIZON_PRESETS`) or
    of a family name (``"webarena"``); None where there is none (also for an unknown name)."""
    if name in HORIZON_PRESETS:
        return HORIZON_PRESETS[name]
    try:
        return spec(name).horizon
    except UnknownEnvError:
        return None


def default_horizon(env_id: str) -> int:
    """The turns an evaluation of ``env_id`` plays by default: the env's documented need
    (its oracle solves the held-out tasks within it), at least its largest preset stage."""
    s = spec(env_id)
    preset = s.horizon
    return max(s.default_horizon, max(preset.rounds) if preset else 0)


def snapshots(env_id: str) -> bool | None:
    """Whether ``env_id``'s state can be copied (undo, reflection retries, branched
    groups): every native env and game can, a remote env cannot; a Python env as its class
    declares (``BaseEnv.supports_snapshots``). None: a factory, not known until built."""
    s = spec(env_id)
    if s.snapshots is not None:
        return s.snapshots
    if s.kind == "native":
        return bool(_core.EnvPool(env_id, 1, "{}").snapshots_supported)
    target = _resolve(s.entry_point, env_id)
    if inspect.isclass(target) and issubclass(target, BaseEnv):
        return target.supports_snapshots()
    if inspect.isclass(target):
        return callable(getattr(target, "snapshot", None))
    return None


def draws_images(env_id: str) -> bool:
    """Whether ``env_id`` can be built with image observations (``obs="image"`` or
    ``"both"``, docs/multimodal.md)."""
    s = spec(env_id)
    if s.images is not None:
        return s.images
    if s.kind == "native":
        try:
            _core.EnvPool(env_id, 1, json.dumps({"obs": "image"}))
        except Exception:
            return False
        return True
    if s.kind != "python":
        return False
    target = _resolve(s.entry_point, env_id)
    return inspect.isclass(target) and issubclass(target, BaseEnv) \
        and target.frame is not BaseEnv.frame


def success_rule(env_id: str) -> SuccessRule:
    """What counts as a solved episode of ``env_id`` (a ``remote:`` id: the served env's
    rule where that id is registered here, else the generic one)."""
    return spec(env_id).success


# -------------------------------------------------------------------------------- make
def _resolve(entry_point: str | Callable[..., Any], env_id: str | None = None
             ) -> Callable[..., Any]:
    """The object an entry point names; a ``"module:attr"`` whose module does not exist or
    lacks the attribute is :class:`UnknownEnvError` naming ``env_id`` and the entry point
    (an import error raised inside an existing module propagates as it is)."""
    if callable(entry_point):
        return entry_point
    module_name, _, attr = entry_point.partition(":")
    if not attr:
        raise ValueError(f"entry point {entry_point!r} must look like 'package.module:Name'")
    what = f"env id {env_id!r}: entry point {entry_point!r}" if env_id else \
        f"entry point {entry_point!r}"
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and (module_name == e.name or module_name.startswith(e.name + ".")):
            raise UnknownEnvError(f"{what}: no module named {module_name!r}") from None
        raise
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UnknownEnvError(f"{what}: module {module_name!r} has no attribute "
                                  f"{attr!r}")
        obj = getattr(obj, part)
    return obj


def make(env_id: str, **kwargs: Any) -> gym.Env:
    """A Gymnasium env for ``env_id`` (text observations and actions).

    ``max_turns=N`` sets the horizon; other keyword arguments go to the env's constructor.
    ``make("remote:ENV", url=...)`` gives a :class:`~agentgym.serving.client.RemoteEnv` for
    ``ENV`` served over HTTP (AgentGym's env-server protocol). A game has no single-agent
    env: :class:`UnknownEnvError` says how it is played.
    """
    entry = spec(env_id)
    params = {**entry.kwargs, **kwargs}
    if entry.kind == "remote":
        if "url" not in params:
            raise ValueError(f"make({env_id!r}) needs url='http://host:port'")
        return _resolve(entry.entry_point, env_id)(**params)
    if entry.kind == "game":
        raise UnknownEnvError(
            f"{env_id!r} is a multi-seat game, not a single-agent env: play it by self-play "
            "(train/collect --env with --opponent, docs/selfplay.md) or as a PettingZoo env "
            "(agentgym.integrations.pettingzoo.GameAEC)")
    max_turns = params.pop("max_turns", None)
    if entry.kind == "native":
        from agentgym.envs.native import NativeEnv

        return NativeEnv(env_id, max_turns=max_turns, **params)
    target = _resolve(entry.entry_point, env_id)
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


# ------------------------------------------------------------- ids found on first use
def _remote_spec(env_id: str) -> EnvSpec:
    """``remote:<target>``: a :class:`~agentgym.serving.client.RemoteEnv` (loaded by its
    entry point, so this module imports nothing of ``agentgym.serving``) with the served
    env's facts where ``target`` is registered here."""
    target = env_id.removeprefix(_REMOTE)
    if not target:
        raise UnknownEnvError(f"{env_id!r}: name the served env after 'remote:'")
    served = _REGISTRY.get(target)
    return EnvSpec(
        env_id, "agentgym.serving.client:RemoteEnv", {"env_name": target},
        f"{target} served over HTTP (AgentGym's env-server protocol)", "remote",
        family=served.family if served else None,
        default_horizon=served.default_horizon if served else DEFAULT_HORIZON,
        success=served.success if served else GENERIC_SUCCESS,
        snapshots=False, images=False, target=target)


def _core_test_spec(env_id: str) -> EnvSpec | None:
    """The Rust core's test-only envs and games (``_core._register_test_envs()``), which
    are never listed."""
    if env_id in _core.native_env_ids():
        return EnvSpec(env_id, "agentgym.envs.native:NativeEnv", kind="native",
                       description=_core.native_env_description(env_id))
    if env_id in _core.native_game_ids():
        return EnvSpec(env_id, "agentgym._core:GamePool", kind="game",
                       seats=_game_facts(env_id)[0],
                       snapshots=True, images=False)
    return None


_GAME_FACTS: dict[str, tuple[int, tuple[str, ...]]] = {}
#: The suite ids looked up so far (:mod:`agentgym.envs.suites`), by id.
_SUITE_SPECS: dict[str, EnvSpec] = {}


def _suite_spec(env_id: str) -> EnvSpec | None:
    from agentgym.envs.suites import suite_spec

    return suite_spec(env_id)


def is_native_game(game_id: str) -> bool:
    """Whether ``game_id`` is a game of the Rust core (its pool steps in Rust; a suite's or
    a ``module:Class`` game is played by Python code)."""
    s = spec(game_id)
    return s.kind == "game" and s.entry_point == "agentgym._core:GamePool"


def game_pool(game_id: str, capacity: int, **kwargs: Any) -> Any:
    """The batched pool that plays game ``game_id``: the Rust core's ``GamePool`` for a
    native game, a :class:`~agentgym.envs.suites._game.SuiteGamePool` for a suite's game
    (``kwargs`` over the spec's defaults)."""
    s = spec(game_id)
    if s.kind != "game":
        raise UnknownEnvError(f"{game_id!r} is not a multi-seat game (kind {s.kind!r})")
    if s.entry_point == "agentgym._core:GamePool":
        return _core.GamePool(game_id, capacity, json.dumps(kwargs))
    from agentgym.envs.suites._game import SuiteGamePool

    return SuiteGamePool(game_id, capacity, _resolve(s.entry_point, game_id),
                         {**s.kwargs, **kwargs})


def _game_facts(game_id: str) -> tuple[int, tuple[str, ...]]:
    """(seats, roles) of a game, asked of its pool once."""
    facts = _GAME_FACTS.get(game_id)
    if facts is None:
        pool = (_core.GamePool(game_id, 0, "{}") if game_id in _core.native_game_ids()
                else game_pool(game_id, 0))
        facts = _GAME_FACTS[game_id] = (int(pool.seats), tuple(pool.roles))
    return facts


_EP_CACHE: tuple[tuple[str, ...], dict[str, Any]] | None = None


def _entry_points() -> dict[str, Any]:
    """The ``agentgym_rl.envs`` entry points of the installed packages, by name (read again
    whenever ``sys.path`` changed)."""
    global _EP_CACHE
    path = tuple(sys.path)
    if _EP_CACHE is None or _EP_CACHE[0] != path:
        from importlib.metadata import entry_points

        _EP_CACHE = (path, {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)})
    return _EP_CACHE[1]


def _register_entry_point(env_id: str, point: Any) -> None:
    if ":" not in point.value:
        raise UnknownEnvError(f"entry point {env_id!r} of group {ENTRY_POINT_GROUP!r} is "
                              f"{point.value!r}; it must be 'module:attr'")
    register(env_id, point.value)


def _register_entry_points() -> None:
    """Register every installed entry point not registered yet (nothing is imported)."""
    for name, point in _entry_points().items():
        if name not in _REGISTRY and not name.startswith(_REMOTE) and ":" in point.value:
            register(name, point.value)


def _import_spec(env_id: str) -> EnvSpec:
    """``module:attr``: import it, check it is an env class or a factory, register it
    under ``env_id`` (its entry point that same string, so worker processes import it
    again); :class:`UnknownEnvError` naming what failed."""
    module_name, _, attr = env_id.partition(":")
    if not module_name or not attr:
        raise UnknownEnvError(f"env id {env_id!r}: expected 'module:attr' "
                              "(e.g. mypkg.envs:MyEnv)")
    try:
        obj: Any = importlib.import_module(module_name)
    except (ImportError, SyntaxError) as e:
        raise UnknownEnvError(f"env id {env_id!r}: cannot import module {module_name!r} "
                              f"({type(e).__name__}: {e})") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UnknownEnvError(f"env id {env_id!r}: module {module_name!r} has no "
                                  f"attribute {attr!r}")
        obj = getattr(obj, part)
    if inspect.isclass(obj):
        from agentgym.envs.suites._game import SuiteGame

        if issubclass(obj, SuiteGame):
            return _game_class_spec(env_id, obj)
        if not issubclass(obj, (BaseEnv, gym.Env)):
            raise UnknownEnvError(f"env id {env_id!r}: {attr} is a class but neither a "
                                  "BaseEnv nor a gymnasium.Env")
    elif not callable(obj):
        raise UnknownEnvError(f"env id {env_id!r}: {attr} is not an env class or a factory "
                              f"(a {type(obj).__name__})")
    register(env_id, env_id)
    return _REGISTRY[env_id]


def _game_class_spec(env_id: str, cls: type) -> EnvSpec:
    """``module:Class`` naming a :class:`~agentgym.envs.suites._game.SuiteGame`: a
    multi-seat game of its own, registered under ``env_id`` (one instance built to read its
    seats)."""
    game = cls()
    try:
        seats = int(game.seats)
    finally:
        game.close()
    doc = (inspect.getdoc(cls) or "").strip().splitlines()
    _REGISTRY[env_id] = EnvSpec(env_id, env_id, {}, doc[0] if doc else "", "game",
                                seats=seats, snapshots=bool(cls.snapshots), images=False)
    return _REGISTRY[env_id]


# ---------------------------------------------------------------------- shipped envs
def _rule(threshold: float, text: str) -> SuccessRule:
    return SuccessRule(threshold, text)


#: Native envs: id -> (family, default horizon, success rule). Their descriptions, task
#: splits and constructors are the Rust registry's (``rust/core/src/registry.rs``); the
#: horizons are what their oracles need (``envs/<id>/README.md``, ``agentgym.envs.table``).
_NATIVE: dict[str, tuple[str | None, int, SuccessRule]] = {
    "textcraft": ("textcraft", 40, _rule(
        1.0, "the goal item enters the inventory: reward 1, terminated")),
    "maze": (None, 40, _rule(1.0, "the agent reaches the goal: reward 1, terminated")),
    "wordle": (None, DEFAULT_HORIZON, _rule(
        1.0, "the word is guessed within six guesses: reward 1, terminated")),
    "gridworld": (None, DEFAULT_HORIZON, _rule(
        1.0, "the mission is complete: reward 1, terminated")),
    "game2048": (None, 256, _rule(1.0, "a tile reaches the target: reward 1, terminated")),
    "webshop": ("webshop", DEFAULT_HORIZON, _rule(
        1.0, "the purchase scores 1.0: the product, its options, price and rating all "
             "match the goal")),
    "search": ("searchqa", DEFAULT_HORIZON, _rule(
        1.0, "the answer equals the gold answer after normalisation: reward 1 (a partial "
             "token-F1 credit is not a success)")),
}

#: Native games: id -> (description, default horizon per seat, success rule of a seat).
_GAMES: dict[str, tuple[str, int, SuccessRule]] = {
    "tictactoe": ("Tic-tac-toe for two seats: three in a row wins (zero-sum, perfect "
                  "information)", 9, _rule(1.0, "the seat wins: reward +1")),
    "kuhn_poker": ("Kuhn poker for two seats: three cards, one private card each, one "
                   "betting round (zero-sum, hidden information)", 3,
                   _rule(1.0, "the seat wins chips: reward at least 1")),
    "negotiation": ("Deal or No Deal for two seats: split books, hats and balls by free-text "
                    "offers (general-sum, private values)", 10,
                    _rule(1.0, "the seat's deal gives it items worth all its 10 points: "
                               "reward 1")),
}

_SCIWORLD_RULE = _rule(1.0, "the task is completed: the score reaches 100, a return of 1")

#: Python envs: id -> spec (their modules load on first make).
_PYTHON: tuple[EnvSpec, ...] = (
    EnvSpec("code_debug", "agentgym.envs.code_debug:CodeDebugEnv",
            description="Fix a buggy Python function so its unit tests pass (sandboxed test "
                        "runs).",
            success=_rule(1.0, "all 8 tests (4 visible, 4 hidden) pass at submit: reward 1 "
                               "(with the default step_penalty and invalid_penalty of 0)"),
            snapshots=True, images=False),
    EnvSpec("ecommerce_service", "agentgym.envs.ecommerce_service:ECommerceServiceEnv",
            description="Customer service for an online shop: classify, look up orders, "
                        "apply the policy.",
            success=_rule(1.0, "category, resolution and reply all right with no wrong "
                               "action: reward 1 (info['solved'])"),
            snapshots=True, images=False),
    EnvSpec("office", "agentgym.envs.office:OfficeEnv",
            description="Meeting notes to to-dos with owners and deadlines.",
            success=_rule(0.999, "the submitted to-dos match the notes': F1 at least 0.999 "
                                 "(info['solved'])"),
            snapshots=True, images=False),
    EnvSpec("project_planning", "agentgym.envs.project_planning:ProjectPlanningEnv",
            description="Schedule a project's tasks under dependencies and earliest dates; "
                        "finish early.",
            success=_rule(0.999, "every task scheduled without breaking a constraint, "
                                 "finishing on the critical-path date: reward at least 0.999 "
                                 "(info['solved'])"),
            snapshots=True, images=False),
    EnvSpec("babyai", "agentgym.envs.babyai:BabyAIEnv",
            description="BabyAI (minigrid): AgentGym's 40 levels, text view of the grid, "
                        "go-to/pickup actions",
            family="babyai", default_horizon=64,
            success=_rule(0.1, "the mission is reached, whatever the reward: minigrid's "
                               "success reward 1 - 0.9 * steps / max_steps is at least 0.1 "
                               "(reward='binary': 1); a failure gives 0"),
            snapshots=True, images=True),
    EnvSpec("sciworld", "agentgym.envs.sciworld:SciWorldEnv",
            description="ScienceWorld: 30 science task families x variations (real "
                        "simulator, needs Java)",
            family="sciworld", default_horizon=200, success=_SCIWORLD_RULE,
            snapshots=False, images=False),
    EnvSpec("sciworld-agentgym", "agentgym.envs.sciworld:SciWorldEnv", {"tasks": "agentgym"},
            description="ScienceWorld with AgentGym's 23 task families (task index = "
                        "AgentGym's data_idx)",
            family="sciworld", default_horizon=200, success=_SCIWORLD_RULE,
            snapshots=False, images=False),
)


def _register_shipped() -> None:
    """The shipped ids (the core's test-only ones, named ``_...``, are found on lookup and
    never listed)."""
    for env_id in _core.native_env_ids():
        if env_id.startswith("_"):
            continue
        fam, horizon, rule = _NATIVE.get(env_id, (None, DEFAULT_HORIZON, GENERIC_SUCCESS))
        _REGISTRY[env_id] = EnvSpec(
            env_id, "agentgym.envs.native:NativeEnv",
            description=_core.native_env_description(env_id), kind="native", family=fam,
            default_horizon=horizon, success=rule, snapshots=True)
    for game_id in _core.native_game_ids():
        if game_id.startswith("_"):
            continue
        description, horizon, rule = _GAMES.get(game_id, ("", DEFAULT_HORIZON,
                                                          GENERIC_SUCCESS))
        _REGISTRY[game_id] = EnvSpec(
            game_id, "agentgym._core:GamePool", description=description, kind="game",
            seats=_game_facts(game_id)[0], default_horizon=horizon, success=rule,
            snapshots=True, images=False)
    for s in _PYTHON:
        _REGISTRY[s.env_id] = replace(s, kwargs=dict(s.kwargs))


_register_shipped()


def _reregister(env_ids: Iterable[str], override: bool) -> list[str]:
    """Register the shipped Python specs of ``env_ids`` again (ids registered now are kept
    unless ``override``); the ids registered."""
    done = []
    for s in _PYTHON:
        if s.env_id in env_ids and (override or s.env_id not in _REGISTRY):
            _REGISTRY[s.env_id] = replace(s, kwargs=dict(s.kwargs))
            done.append(s.env_id)
    return done
