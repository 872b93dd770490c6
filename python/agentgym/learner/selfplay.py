"""The trainer's self-play part: who the learning policy plays, what it trains on, the role
baseline, the opponent pool, the ratings and the game outcomes in the metrics.

A training run on a multi-seat game (``TrainerConfig.self_play``, or any game env) plays
each step's episodes with ``opponents``:

* ``"self"``: the policy plays every seat; every seat's trajectory trains;
* ``"solver"`` / ``"random"``: the policy plays one seat (``group_id % seats``) against the
  game's reference strategy or a random legal move;
* ``"pool"``: the policy plays one seat against a frozen earlier checkpoint of itself, one
  per episode from a FIFO pool of the last ``opponent_pool_size`` snapshots (one every
  ``opponent_pool_every`` steps, the starting weights first), each its own backend.

Only the policy's rows train (the others are kept in the rollout's metrics). With
``adv_estimator="rae"`` (the self-play default) each row's advantage is its return less its
role's baseline (:class:`~agentgym.learner.advantages.RoleBaseline`, an EMA per
``(env, role)``; ``role_baseline=False``: no baseline, plain REINFORCE). Every opponent the
policy met has an OpenSkill rating (Plackett-Luce, from the ``openskill`` package) updated
from each step's games; the ratings, the role baselines and the pool's weights are
checkpointed with the run.

Outcomes: in each episode the policy's seat wins where its reward is above every other
seat's, draws where it ties the best of them, loses otherwise; an episode that failed
(``env_error``, ``backend_error``, ...) counts as failed.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any

import numpy as np

from agentgym.data.trajectories import FAILED_STOP_REASONS, Trajectory
from agentgym.learner.advantages import RoleBaseline

__all__ = ["OPPONENT_KINDS", "SelfPlay", "outcomes"]

#: ``TrainerConfig.opponents``.
OPPONENT_KINDS = ("self", "solver", "random", "pool")


def _episodes(trajs: Sequence[Trajectory]) -> list[list[Trajectory]]:
    """The game rows of ``trajs`` by episode (seat order)."""
    by: dict[int, list[Trajectory]] = collections.defaultdict(list)
    for t in trajs:
        if t.episode_id is not None:
            by[t.episode_id].append(t)
    return [sorted(rows, key=lambda t: t.seat) for rows in by.values()]


def outcomes(trajs: Sequence[Trajectory], prefix: str = "") -> dict[str, float]:
    """Win, draw, loss and failure rates of the policy's seats over the game episodes in
    ``trajs`` (module docs), overall and per seat: ``{prefix}win_rate``,
    ``{prefix}seat{s}/win_rate``, ... and ``{prefix}games``."""
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for rows in _episodes(trajs):
        for t in rows:
            if t.player != "policy":
                continue
            if any(r.stop_reason in FAILED_STOP_REASONS for r in rows):
                result = "failed"
            else:
                best = max((r.reward for r in rows if r is not t), default=float("-inf"))
                result = "win" if t.reward > best + 1e-6 else \
                    "draw" if t.reward >= best - 1e-6 else "loss"
            for key in ("", f"seat{t.seat}/"):
                counts[key][result] += 1
    out: dict[str, float] = {}
    for key, c in sorted(counts.items()):
        n = sum(c.values())
        for result in ("win", "draw", "loss", "failed"):
            out[f"{prefix}{key}{result}_rate"] = c[result] / n
        out[f"{prefix}{key}games"] = float(n)
    return out


class SelfPlay:
    """One run's self-play state (module docs). ``roles``: the game's role of each seat."""

    def __init__(self, env: str, roles: Sequence[str], opponents: str = "self", *,
                 role_baseline: bool = True, role_baseline_decay: float = 0.95,
                 pool_size: int = 4, pool_every: int = 10):
        if opponents not in OPPONENT_KINDS:
            raise ValueError(f"opponents must be one of {OPPONENT_KINDS}, got {opponents!r}")
        if pool_size < 1 or pool_every < 1:
            raise ValueError("opponent_pool_size and opponent_pool_every must be >= 1")
        self.env, self.roles, self.opponents = env, list(roles), opponents
        self.use_baseline = role_baseline
        self.baseline = RoleBaseline(role_baseline_decay)
        self.pool_size, self.pool_every = pool_size, pool_every
        #: The pool's snapshots, oldest first: (name, CPU state dict).
        self.pool: collections.deque[tuple[str, dict]] = collections.deque()
        self.ratings: dict[str, tuple[float, float]] = {}
        self._model = None

    # -- training rows and the role baseline -------------------------------------------
    @staticmethod
    def train_rows(trajs: Sequence[Trajectory]) -> list[Trajectory]:
        """The rows the policy played (the only ones with loss mask 1)."""
        return [t for t in trajs if t.player in (None, "policy")]

    def role_keys(self, seats: np.ndarray) -> list[str]:
        return [f"{self.env}:{self.roles[int(s)]}" for s in seats]

    def baselines(self, seats: np.ndarray) -> np.ndarray | None:
        """Each row's role baseline (None: ``role_baseline`` is off)."""
        return self.baseline.of(self.role_keys(seats)) if self.use_baseline else None

    def update_baseline(self, seats: np.ndarray, scores: np.ndarray, valid: np.ndarray) -> None:
        if self.use_baseline:
            self.baseline.update(self.role_keys(seats), scores, valid)

    def metrics(self) -> dict[str, float]:
        out = {f"role_baseline/{k.split(':', 1)[1]}": v for k, v in self.baseline.values.items()}
        for name, (mu, sigma) in sorted(self.ratings.items()):
            out[f"rating/{name}"] = mu - 3 * sigma  # the conservative ordinal
        return out

    # -- the opponent pool -------------------------------------------------------------
    def snapshot_due(self, step: int) -> bool:
        """The pool takes a snapshot after this step (the starting weights at step 0)."""
        return self.opponents == "pool" and step % self.pool_every == 0

    def add_snapshot(self, name: str, state_dict: dict) -> str | None:
        """Add a snapshot; returns the name of the one it evicted (FIFO), if any."""
        self.pool.append((name, state_dict))
        return self.pool.popleft()[0] if len(self.pool) > self.pool_size else None

    # -- ratings -----------------------------------------------------------------------
    def rate(self, trajs: Sequence[Trajectory]) -> None:
        """Update the OpenSkill ratings with the step's games between the policy and an
        opponent (self-play games rate nobody)."""
        games = [rows for rows in _episodes(trajs)
                 if len({r.player for r in rows}) > 1  # the policy and an opponent
                 and not any(r.stop_reason in FAILED_STOP_REASONS for r in rows)]
        if not games:
            return
        if self._model is None:
            from openskill.models import PlackettLuce

            self._model = PlackettLuce()
        model = self._model
        for rows in games:
            names = [r.player for r in rows]
            teams = [[model.rating(*self.ratings.get(n, (model.mu, model.sigma)), name=n)]
                     for n in names]
            scores = [r.reward for r in rows]
            rated = model.rate(teams, scores=scores)
            for n, [r] in zip(names, rated):
                self.ratings[n] = (r.mu, r.sigma)

    # -- checkpoint --------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"baseline": self.baseline.state_dict(), "ratings": dict(self.ratings),
                "pool": list(self.pool)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.baseline.load_state_dict(state["baseline"])
        self.ratings = {k: tuple(v) for k, v in state["ratings"].items()}
        self.pool = collections.deque(tuple(x) for x in state["pool"])
