"""Helpers shared by the test modules (``from tests.helpers import ...``)."""

from __future__ import annotations

import random
import threading

import numpy as np

import agentgym
from agentgym.data import Trajectory
from agentgym.envs import BaseEnv

# A textcraft task the env refuses (``InvalidTaskError``).
BAD_TEXTCRAFT = "this is not a textcraft task"


def make_trajectory(token_ids, loss_mask, **fields) -> Trajectory:
    """A ``Trajectory`` with ``token_ids`` and ``loss_mask`` and defaults for every other
    field: logprobs 0.0, reward 0, no turn rewards, ``num_turns`` = number of model-token
    runs, ``prompt_len`` = tokens before the first model token, stop reason ``done``, group,
    sample, policy version and task 0."""
    mask = [int(m) for m in loss_mask]
    runs = sum(1 for i, m in enumerate(mask) if m and (i == 0 or not mask[i - 1]))
    prompt_len = next((i for i, m in enumerate(mask) if m), len(mask))
    defaults = dict(task_id=0, env_id="test", group_id=0, sample_index=0,
                    logprobs=[0.0] * len(mask), prompt_len=prompt_len, turn_rewards=[],
                    reward=0.0, num_turns=runs, stop_reason="done", policy_version=0)
    return Trajectory(token_ids=list(token_ids), loss_mask=mask, **{**defaults, **fields})


def play_to_end(pool: agentgym.EnvPool, policy: str, rng: random.Random) -> np.ndarray:
    """Play every slot of a reset pool to the end with the env's oracle (``"oracle"``) or a
    uniformly random valid action (``"random"``); returns the total reward per slot."""
    alive = list(range(len(pool)))
    total = np.zeros(len(pool))
    while alive:
        if policy == "oracle":
            actions = pool.oracle_actions(alive)
        else:
            actions = [rng.choice(pool.valid_actions(i)) for i in alive]
        _, rewards, terminated, truncated = pool.step(alive, actions)
        total[alive] += rewards
        alive = [i for i, t, u in zip(alive, terminated, truncated, strict=True) if not (t or u)]
    return total


def run_policy(pool: agentgym.EnvPool, choose, max_steps: int):
    """Reset ``pool`` and play every slot with ``choose(pool, live) -> actions`` for at most
    ``max_steps`` turns; returns (total reward per slot, trace of step outputs, turns)."""
    trace = [pool.reset()]
    live = list(range(pool.num_envs))
    rewards = np.zeros(pool.num_envs, dtype=np.float32)
    for _ in range(max_steps):
        obs, rew, term, trunc = pool.step(live, choose(pool, live))
        trace.append((obs, rew.tolist(), term.tolist()))
        rewards[live] += rew
        live = [i for i, done in zip(live, term | trunc, strict=True) if not done]
        if not live:
            break
    return rewards, trace, pool.turns.copy()


class ThreadProbeEnv(BaseEnv):
    """Records the thread of every step; ends after three turns."""

    instructions = "Say anything."
    num_tasks = 100
    threads: set = set()
    step_threads: list = []

    def reset(self, task=None, seed=None):
        self.t = 0
        return "start"

    def step(self, action):
        ThreadProbeEnv.threads.add(threading.get_ident())
        ThreadProbeEnv.step_threads.append(threading.get_ident())
        self.t += 1
        return f"turn {self.t}", 0.0, self.t >= 3, {}
