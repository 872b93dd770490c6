"""Gymnasium adapter over one native (Rust) episode: the same code path as ``EnvPool``."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np

from agentgym import _core
from agentgym.envs.base import begin_episode
from agentgym.envs.spaces import TextSpace
from agentgym.pool import NativeEnvInfo


class NativeEnv(NativeEnvInfo, gym.Env):
    """A native env as a Gymnasium env (text observations and actions).

    ``reset(seed=s, options={"task": index_or_text, "max_turns": m})``: without a task, one
    is drawn from the seeded RNG. The env's own randomness (distractors, layouts) is seeded
    from the same RNG, so equal seeds replay equal episodes. The step that reaches
    ``max_turns`` returns ``truncated=True``.

    An env built with image observations (``obs="image"`` or ``"both"``, ``maze`` and
    ``gridworld``) observes ``{"text": str, "image": (h, w, 3) uint8 array}`` in the space
    ``Dict({"text": TextSpace(), "image": Box(0, 255, (h, w, 3), uint8)})``, ``(h, w)`` its
    :attr:`frame_shape`; the picture is drawn after each reset and step (all zeros once an
    env error ended the episode and dropped the env). A failure to draw (an env panic, a
    malformed frame) raises the pool's ``EnvError``; the episode has ended with
    ``env_error``. Text mode observes the text alone, as before.
    """

    metadata = {"render_modes": []}

    def __init__(self, env_id: str, max_turns: int | None = None, **env_kwargs):
        self.env_id = env_id
        self._pool = _core.EnvPool(env_id, 1, json.dumps(env_kwargs))
        self.max_turns = max_turns
        self.frame_shape: tuple[int, int] | None = self._pool.frame_shape
        if self.frame_shape is None:
            self.observation_space = TextSpace()
        else:
            self.observation_space = gym.spaces.Dict({
                "text": TextSpace(),
                "image": gym.spaces.Box(0, 255, (*self.frame_shape, 3), np.uint8),
            })
        self.action_space = TextSpace()
        self._task = None

    def _observe(self, text: str):
        """``text``, or with image observations ``{"text": text, "image": frame}``."""
        if self.frame_shape is None:
            return text
        (frame,) = self._pool.frames([0])
        if isinstance(frame, BaseException):
            raise frame
        if frame is None:  # the env was dropped after an env error (the episode is over)
            frame = np.zeros((*self.frame_shape, 3), np.uint8)
        return {"text": text, "image": frame}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        task, env_seed = begin_episode(self, options, self._pool.num_tasks)
        (obs,) = self._pool.reset([0], [task], [env_seed], [self.max_turns])
        self._task = task
        return self._observe(obs), {"task": task, "seed": env_seed, "turns": 0}

    def step(self, action):
        if not isinstance(action, str):
            raise TypeError(f"action must be a str, got {type(action).__name__}")
        (before,) = self._pool.invalid_turns([0])
        (obs,), rewards, terminated, truncated = self._pool.step([0], [action])
        info = {"turns": int(self._pool.turns()[0])}
        (after,) = self._pool.invalid_turns([0])
        if after > before:  # the env refused the action as unreadable, as a BaseEnv says it
            info["invalid"] = True
        (reason,) = self._pool.stop_reasons([0])
        if reason is not None:
            info["stop_reason"] = reason
        return (self._observe(obs), float(rewards[0]), bool(terminated[0]), bool(truncated[0]),
                info)

    @property
    def supports_snapshots(self) -> bool:
        return self._pool.snapshots_supported

    def snapshot(self) -> int:
        """A handle to a copy of the running episode's whole state (env and episode
        record), for :meth:`restore` until :meth:`release`."""
        (handle,) = self._pool.snapshot([0])
        return handle

    def restore(self, handle: int) -> None:
        """Put the episode back in the state of ``handle``."""
        self._pool.restore([0], [handle])

    def release(self, handle: int) -> None:
        """Free a snapshot."""
        self._pool.release([handle])

    def valid_actions(self) -> list[str]:
        return self._pool.valid_actions(0)

    def oracle_action(self) -> str | None:
        return self._pool.oracle_action(0)
