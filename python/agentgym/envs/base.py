"""``BaseEnv``: the class users subclass to write an environment in Python.

Exactly the shape of the AgentGym-RL announcement's example::

    class AIOpsEnv(BaseEnv):
        def reset(self):
            return "alert: disk 93% full on db-1"
        def step(self, action):
            ...
            return observation, reward, done, info

``agentgym.make`` adapts it to the Gymnasium API (:class:`BaseEnvAdapter`). ``reset`` may
also accept ``task`` and/or ``seed`` keyword arguments to take a task index (or task text)
and a seed. ``info["truncated"] = True`` marks an ending that is a cut, not a terminal state.
"""

from __future__ import annotations

import copy
import inspect
from typing import Any

import gymnasium as gym
import numpy as np

from agentgym.envs.spaces import TextSpace


def action_line(example: str) -> str:
    """The closing lines of every env's instructions: the reply format, said once, with one
    example (the native envs' ``action_line`` in ``rust/core/src/env.rs`` writes the same)."""
    return ("\nReply with Action: followed by one action, and nothing else. For example:\n"
            f"Action: {example}")


class BaseEnv:
    """A text environment written in Python. Override ``reset`` and ``step``.

    ``init_kwargs`` holds the constructor's arguments by name, so an instance can be
    rebuilt with other settings (``type(env)(**{**env.init_kwargs, "split": "test"})``).
    """

    def __new__(cls, *args: Any, **kwargs: Any):
        self = super().__new__(cls)
        self.init_kwargs = _named_arguments(cls.__init__, args, kwargs)
        return self

    #: What the agent is told about the env and its action format (the system prompt).
    instructions: str = ""
    #: Number of indexed tasks (None when unbounded).
    num_tasks: int | None = None
    #: Values of the constructor's ``split`` argument, its default first (empty: no splits).
    splits: tuple[str, ...] = ()
    #: The split held out for evaluation (None: none; training then holds out task indices).
    held_out_split: str | None = None
    #: A deep copy of the instance's attributes is a complete, independent copy of its
    #: state (it holds no simulator, process, socket or open file): the default
    #: :meth:`snapshot` and :meth:`restore` then work. False: they raise
    #: :class:`~agentgym.errors.SnapshotUnsupportedError` unless the env overrides them.
    snapshot_safe: bool = False

    def reset(self, task: int | str | None = None, seed: int | None = None) -> str:
        raise NotImplementedError

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        raise NotImplementedError

    def valid_actions(self) -> list[str]:
        """Actions meaningful in the current state ([] when open-ended)."""
        return []

    def oracle_action(self) -> str | None:
        """The reference solver's next action, where the env has one."""
        return None

    def frame(self) -> np.ndarray | None:
        """The current state's picture, for an env that observes images: a
        ``(height, width, 3)`` ``uint8`` RGB array (row-major), drawn from the state the env
        holds now, after its last ``reset`` or ``step``; None when the env shows no picture
        (the default, and text mode)."""
        return None

    def snapshot(self) -> Any:
        """An opaque copy of the env's whole state, for :meth:`restore` (any number of
        times, independent of what the env does next). Default: a deep copy of the
        instance's attributes when ``snapshot_safe``; else
        :class:`~agentgym.errors.SnapshotUnsupportedError`."""
        self._check_snapshots()
        return copy.deepcopy(self.__dict__)

    def restore(self, state: Any) -> None:
        """Put the env back in the state :meth:`snapshot` returned."""
        self._check_snapshots()
        self.__dict__.clear()
        self.__dict__.update(copy.deepcopy(state))

    @classmethod
    def supports_snapshots(cls) -> bool:
        """Whether :meth:`snapshot` and :meth:`restore` work (``snapshot_safe``, or both
        overridden): known before any episode starts."""
        overridden = cls.snapshot is not BaseEnv.snapshot and cls.restore is not BaseEnv.restore
        return bool(cls.snapshot_safe) or overridden

    def _check_snapshots(self) -> None:
        if not self.snapshot_safe:
            from agentgym.errors import SnapshotUnsupportedError

            raise SnapshotUnsupportedError(
                f"{type(self).__name__} cannot snapshot its state: it does not declare "
                "snapshot_safe = True and does not override snapshot() and restore()")

    def close(self) -> None:
        pass


def _named_arguments(init, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The arguments of a call of ``init`` by parameter name (``**kwargs`` flattened,
    ``*args`` dropped); the keyword arguments alone when they do not bind."""
    sig = inspect.signature(init)
    try:
        bound = sig.bind(None, *args, **kwargs)
    except TypeError:  # __init__ raises its own error for these arguments
        return dict(kwargs)
    out: dict[str, Any] = {}
    for name, value in list(bound.arguments.items())[1:]:
        kind = sig.parameters[name].kind
        if kind is inspect.Parameter.VAR_KEYWORD:
            out.update(value)
        elif kind is not inspect.Parameter.VAR_POSITIONAL:
            out[name] = value
    return out


def _reset_kwargs(env: BaseEnv) -> set[str]:
    params = inspect.signature(env.reset).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return {"task", "seed"}
    return {name for name in ("task", "seed") if name in params}



def begin_episode(adapter: gym.Env, options: dict | None, num_tasks: int | None) -> tuple[Any, int]:
    """The common start of a Gymnasium adapter's ``reset``, after ``super().reset(seed=...)``.

    Takes ``options["max_turns"]`` (when given) into ``adapter.max_turns`` and returns
    ``(task, env_seed)``: ``options["task"]``, else a task drawn from ``adapter.np_random``
    among ``num_tasks`` (None when the env declares none), and the seed of the env's own
    randomness, drawn next from the same RNG, so equal seeds replay equal episodes.
    """
    options = options or {}
    if "max_turns" in options:
        adapter.max_turns = options["max_turns"]
    task = options.get("task")
    if task is None and num_tasks:
        task = int(adapter.np_random.integers(min(num_tasks, 2**63 - 1)))
    return task, int(adapter.np_random.integers(2**63))

def env_method(env: Any, name: str) -> Any:
    """Method ``name`` of a Gymnasium env, or of the env it wraps (``unwrapped``); None
    when neither has it."""
    fn = getattr(env, name, None)
    if fn is None:
        fn = getattr(getattr(env, "unwrapped", None), name, None)
    return fn


class BaseEnvAdapter(gym.Env):
    """Gymnasium view of a :class:`BaseEnv` (text observations and actions).

    ``max_turns`` is the horizon: the step that reaches it returns ``truncated=True``.
    ``reset(seed=s, options={"task": t, "max_turns": m})``; without a task, one is drawn
    from the seeded RNG when the env declares ``num_tasks``.
    """

    metadata = {"render_modes": []}

    def __init__(self, env: BaseEnv, max_turns: int | None = None, env_id: str | None = None):
        if not isinstance(env, BaseEnv):
            raise TypeError(f"expected a BaseEnv instance, got {type(env).__name__}")
        self.env = env
        self.env_id = env_id or type(env).__name__
        self.max_turns = max_turns
        self.observation_space = TextSpace()
        self.action_space = TextSpace()
        self._accepts = _reset_kwargs(env)
        self._turns = 0
        self._done = True

    @property
    def instructions(self) -> str:
        return self.env.instructions

    @property
    def num_tasks(self) -> int | None:
        return self.env.num_tasks

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        task, env_seed = begin_episode(self, options, self.env.num_tasks)
        kwargs = {}
        if "task" in self._accepts:
            kwargs["task"] = task
        if "seed" in self._accepts:
            kwargs["seed"] = env_seed
        obs = self.env.reset(**kwargs)
        if not isinstance(obs, str):
            raise TypeError(f"{self.env_id}.reset() must return a str, got {type(obs).__name__}")
        self._turns = 0
        self._done = False
        return obs, {"task": task, "turns": 0}

    def step(self, action):
        if not isinstance(action, str):
            raise TypeError(f"action must be a str, got {type(action).__name__}")
        if self._done:
            from agentgym.errors import EpisodeFinishedError

            raise EpisodeFinishedError(f"{self.env_id}: episode has finished; call reset()")
        result = self.env.step(action)
        if not (isinstance(result, tuple) and len(result) == 4):
            raise TypeError(
                f"{self.env_id}.step() must return (observation, reward, done, info), "
                f"got {result!r:.200}"
            )
        obs, reward, done, info = result
        info = dict(info or {})
        self._turns += 1
        cut = bool(info.pop("truncated", False))
        terminated = bool(done) and not cut
        truncated = cut or (
            not terminated and self.max_turns is not None and self._turns >= self.max_turns
        )
        self._done = terminated or truncated
        info["turns"] = self._turns
        return str(obs), float(reward), terminated, truncated, info

    def valid_actions(self) -> list[str]:
        return self.env.valid_actions()

    def oracle_action(self) -> str | None:
        return self.env.oracle_action()

    def frame(self) -> np.ndarray | None:
        """The env's :meth:`BaseEnv.frame`: its current picture, or None."""
        return self.env.frame()

    @property
    def supports_snapshots(self) -> bool:
        return self.env.supports_snapshots()

    def snapshot(self) -> Any:
        """The env's :meth:`BaseEnv.snapshot` with this adapter's turn count."""
        return (self.env.snapshot(), self._turns, self._done)

    def restore(self, state: Any) -> None:
        """Put the env and the turn count back as :meth:`snapshot` saw them."""
        env_state, turns, done = state
        self.env.restore(env_state)
        self._turns, self._done = turns, done

    def close(self) -> None:
        self.env.close()
