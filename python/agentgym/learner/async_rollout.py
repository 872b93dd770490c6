"""Fully asynchronous rollouts (``TrainerConfig.fully_async``): generation never waits for
the learner, and the learner never waits for the slowest episode.

:class:`AsyncRollouts` keeps one open stream of GRPO groups running on the runner (the
engine's async request feed: a request joins the running stream as soon as a slot frees).
The learner takes a step as soon as ``tasks_per_step`` whole groups have finished, in the
order they finished, and pushes its new weights to the backend while episodes are in
flight. An episode that spans a weight update continues under the new weights (a partial
rollout): each reply records the version that generated it (``Trajectory.version_pos`` /
``version_at``; the backend finishes a running reply under the old weights and starts the
next under the new ones, :class:`~agentgym.backends.base.WeightGate`), so every model token
carries the version and behaviour logprob of the weights that chose it.

The staleness bound ``k`` (``learner.max_staleness``):

- **admission**: group ``g`` starts only while ``started - discarded < (synced + k + 1) x
  tasks_per_step`` (``synced``: the weight versions the learner has pushed), so at most
  ``k + 1`` steps' worth of groups are ever in flight or waiting (the producer waits; it
  never builds an unbounded queue). With ``k = 0`` a step's groups start only after the
  previous update's weights are live: the synchronous loop, with the same tasks, group ids
  and env seeds (the same batches with a deterministic backend).
- **drop**: a finished group whose oldest token (its rows' ``policy_version``, the version
  they began under) is more than ``k`` versions behind the backend when the learner takes
  it is dropped and counted (``async/stale_dropped_groups``), and a fresh group takes its
  place. The learner's per-row rule (:func:`~agentgym.learner.losses.staleness_weights`)
  is the same bound.

The horizon stage (ScalingInter-RL) is decided per episode when its group starts: the stage
of the learner's step at that moment (``EpisodeRequest.max_turns``). Dynamic sampling
(``filter_groups``) drops a finished group whose samples all scored alike and starts another
(its admission freed). Evaluation drains the stream first (the episodes in flight finish and
wait for the next batches), so an evaluation sees one version of the weights.

A checkpoint holds where the task draws stand (the sampler's state before the first batch
of groups not all settled, and the settled groups after it: trained or dropped); a resumed
run starts the groups that were in flight again, with the same tasks and seeds.
"""

from __future__ import annotations

import asyncio
import collections
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from agentgym.engine.episode import EpisodeRequest
from agentgym.envs.registry import seats
from agentgym.learner.advantages import informative_groups

if TYPE_CHECKING:
    from agentgym.data.trajectories import Trajectory

__all__ = ["AsyncRollouts"]


class AsyncRollouts:
    """The producer of a fully asynchronous run of ``trainer`` (a
    :class:`~agentgym.learner.trainer.Trainer`) with staleness bound
    ``bound`` (versions); ``state``: a checkpoint's :meth:`state_dict` to resume from."""

    def __init__(self, trainer: Any, bound: int, state: dict | None = None):
        if bound < 0:
            raise ValueError(f"max_staleness must be >= 0, got {bound}")
        cfg = trainer.cfg
        self.trainer = trainer
        self.bound = int(bound)
        self.per_batch = cfg.tasks_per_step
        self.group_rows = cfg.n_samples * max(1, seats(cfg.env))
        self.filtering = bool(cfg.max_draws)
        #: Weight versions pushed by the learner since the run began (its steps).
        self.synced = trainer.step
        st = state or {"batch": trainer.step, "rng": trainer.task_rng.bit_generator.state,
                       "settled": [], "discarded": 0}
        trainer.task_rng.bit_generator.state = st["rng"]
        #: The next group number to start (group id = number; batch = number // per_batch).
        self.next_group = int(st["batch"]) * self.per_batch
        self.discarded = int(st["discarded"])
        #: Groups at or after the oldest open batch that were trained or dropped.
        self.settled: set[int] = {int(g) for g in st["settled"]}
        self._skip = set(self.settled)  # a resumed run does not play them again
        self._draws: dict[int, tuple[dict, list[int]]] = {}  # batch -> (rng before, tasks)
        self._partial: dict[int, list] = {}
        self._ready: collections.deque[list] = collections.deque()
        self._changed = asyncio.Event()
        self._paused = False
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._idle = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._t_batch = time.perf_counter()
        self.stats = collections.Counter()

    # -- the stream ------------------------------------------------------------------------
    def start(self) -> None:
        """Start generating (the stream runs until :meth:`close`)."""
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        t = self.trainer
        while True:
            await self._resumed.wait()
            self._idle.clear()
            try:
                async for traj in t.runner.stream_requests(
                        self._feed(), t.cfg.env, env_kwargs=t.train_env_kwargs,
                        n_samples=t.cfg.n_samples):
                    self._arrived(traj)
            finally:
                self._idle.set()

    def _admissible(self) -> bool:
        started = self.next_group - self.discarded
        return started < (self.synced + self.bound + 1) * self.per_batch

    async def _feed(self):
        """The requests, group by group, as admission allows; ends when paused."""
        t, n = self.trainer, self.trainer.cfg.n_samples
        while True:
            while not self._paused and not self._admissible():
                self._changed.clear()
                t0 = time.perf_counter()
                await self._changed.wait()
                self.stats["throttled_s"] += time.perf_counter() - t0
            if self._paused:
                return
            g = self.next_group
            batch, i = divmod(g, self.per_batch)
            if batch not in self._draws:  # the sync loop's draw for the step of that number
                before = t.task_rng.bit_generator.state
                tasks = t.task_rng.integers(0, t.train_task_hi, self.per_batch).tolist()
                self._draws[batch] = (before, tasks)
            self.next_group += 1
            if g in self._skip:  # settled before the checkpoint this run resumed from
                self._skip.discard(g)
                continue
            horizon = t.schedule.max_turns(t.step)  # the stage at the episode's start
            self.stats["groups_started"] += 1
            task = self._draws[batch][1][i]
            for s in range(n):
                yield EpisodeRequest(task, g, s, max_turns=horizon)

    def _arrived(self, traj: Trajectory) -> None:
        rows = self._partial.setdefault(traj.group_id, [])
        rows.append(traj)
        if len(rows) < self.group_rows:
            return
        del self._partial[traj.group_id]
        rows.sort(key=lambda r: (r.sample_index, r.seat))
        if self.filtering and not self._informative(rows):
            self.stats["uninformative_groups"] += 1
            self._discard(traj.group_id)
            return
        self._ready.append(rows)
        self._changed.set()

    def _informative(self, rows: list) -> bool:
        return bool(informative_groups(rows, self.trainer.cfg.format_penalty))

    def _discard(self, group: int) -> None:
        self.discarded += 1
        self.settled.add(group)
        self._changed.set()


    # -- what the learner calls ------------------------------------------------------------
    async def next_batch(self) -> tuple[list[Trajectory], dict[str, float]]:
        """The next ``tasks_per_step`` finished groups within the bound (in the order they
        finished), their trajectories ordered by (group, sample, seat), and the producer's
        metrics since the last batch."""
        self.start()
        t0 = time.perf_counter()
        version = self.trainer.runner.policy_version
        groups: list[list] = []
        stale = 0
        while len(groups) < self.per_batch:
            if self._task.done():  # the stream failed: surface its error
                self._task.result()
                raise RuntimeError("the asynchronous rollout stream ended")
            if not self._ready:
                self._changed.clear()
                waiter = asyncio.ensure_future(self._changed.wait())
                try:
                    await asyncio.wait([waiter, self._task],
                                       return_when=asyncio.FIRST_COMPLETED)
                finally:
                    waiter.cancel()
                continue
            rows = self._ready.popleft()
            if version - min(r.policy_version for r in rows) > self.bound:
                stale += 1
                self._discard(rows[0].group_id)
                continue
            groups.append(rows)
        self.settled.update(rows[0].group_id for rows in groups)
        self.stats["stale_dropped_groups"] += stale
        trajs = sorted((r for g in groups for r in g),
                       key=lambda r: (r.group_id, r.sample_index, r.seat))
        return trajs, self._metrics(trajs, version, time.perf_counter() - t0)

    def _metrics(self, trajs: list, version: int, waited: float) -> dict[str, float]:
        from agentgym.engine.metrics import batch_metrics

        now = time.perf_counter()
        m = batch_metrics(trajs, now - self._t_batch)  # the trained groups, as a sync step's
        self._t_batch = now
        lags = np.concatenate([version - t.token_versions()[np.asarray(t.loss_mask, bool)]
                               .astype(np.int64) for t in trajs]) if trajs else np.zeros(0)
        m.update({
            "async/learner_wait_s": waited,
            "async/groups_in_flight": float(len(self._partial)),
            "async/groups_ready": float(len(self._ready)),
            "async/stale_dropped_groups": float(self.stats.pop("stale_dropped_groups", 0)),
            "async/uninformative_groups": float(self.stats.pop("uninformative_groups", 0)),
            "async/groups_started": float(self.stats.pop("groups_started", 0)),
            "async/throttled_s": float(self.stats.pop("throttled_s", 0.0)),
            "async/lag_mean": float(lags.mean()) if lags.size else 0.0,
            "async/lag_max": float(lags.max()) if lags.size else 0.0,
            # episodes that spanned a weight update (partial rollouts) in the batch
            "async/partial_share": float(np.mean([bool(t.version_at) for t in trajs]))
            if trajs else 0.0,
        })
        for lag, count in zip(*np.unique(lags, return_counts=True)):
            m[f"async/tokens_lag{int(lag)}"] = float(count)
        return m

    def synced_weights(self) -> None:
        """The learner pushed new weights: one more step's groups may start."""
        self.synced += 1
        self._changed.set()

    async def pause(self) -> None:
        """Stop starting groups and wait until the episodes in flight have finished (they
        wait for the next batches); :meth:`resume` starts the stream again."""
        if self._task is None or self._task.done():
            return
        self._paused = True
        self._resumed.clear()
        self._changed.set()
        await self._idle.wait()

    def resume(self) -> None:
        self._paused = False
        self._resumed.set()

    async def close(self) -> None:
        """Stop the stream; episodes in flight are aborted (a resumed run plays them
        again)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def state_dict(self) -> dict[str, Any]:
        """Where the task draws stand: the oldest drawn batch with a group not settled (else
        the next batch to draw), the task sampler's state before its draw, and the groups
        settled from it on. Batches before it are forgotten (no resume needs them)."""
        per = self.per_batch
        unsettled = [b for b in sorted(self._draws)
                     if not self.settled.issuperset(range(b * per, (b + 1) * per))]
        if unsettled:
            first = unsettled[0]
            rng = self._draws[first][0]
        else:
            first = max(self._draws) + 1 if self._draws else self.next_group // per
            rng = self.trainer.task_rng.bit_generator.state
        for b in [b for b in self._draws if b < first]:
            del self._draws[b]
        self.settled = {g for g in self.settled if g >= first * per}
        return {"batch": first, "rng": rng, "settled": sorted(self.settled),
                "discarded": self.discarded}
