"""Helpers shared by the env test modules (importable as ``helpers`` under pytest)."""

from __future__ import annotations

import random

import numpy as np

import agentgym


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
