"""``NativeDriver``: the episodes of a native env in one Rust ``EnvPool``."""

from __future__ import annotations

from collections import defaultdict

from agentgym import _core
from agentgym.data.frames import Frame
from agentgym.engine.drivers.base import NOT_RUNNING, ResetItem, StepOutcome, require_snapshots
from agentgym.engine.drivers.undo import UndoRules
from agentgym.pool import EnvPool


class NativeDriver:
    """Drives ``capacity`` slots of a native env through one ``EnvPool``: the resets and
    steps of one event-loop tick are one Rust call each (GIL released). The engine steps
    ``core_pool`` itself, together with the turn's token bookkeeping. ``undo`` rules are
    the pool's (the Rust pool answers ``undo`` actions inside the same batched step).
    ``restarts`` (reflection retries): each episode's start is kept as a pool snapshot.
    ``forks`` (branched groups): :meth:`fork` copies a running slot into others.
    ``lasts`` (reflection retries back to the failing turn): :meth:`save_lasts` keeps each
    slot's state before its step, :meth:`restore_last` puts it back."""

    def __init__(self, env_id: str, capacity: int, *, undo: UndoRules | None = None,
                 restarts: bool = False, forks: bool = False, lasts: bool = False,
                 **env_kwargs):
        self.env_id = env_id
        self.pool = EnvPool(env_id, capacity, **env_kwargs)
        self.instructions = self.pool.instructions
        self.core_pool: _core.EnvPool = self.pool._pool
        self.has_frames = self.core_pool.frame_shape is not None
        self.undo = undo
        # SnapshotUnsupportedError here, before any episode
        require_snapshots(self.core_pool.snapshots_supported, env_id, undo, restarts, forks)
        if undo is not None:
            self.core_pool.set_undo(undo.max_undos, undo.depth)
        self._oracle = self.core_pool.oracle_action
        #: Each slot's start snapshot handle (``restarts`` only).
        self._starts: dict[int, int] = {}
        #: Each slot's snapshot before its last step (``lasts`` only).
        self._lasts: dict[int, int] = {}

    async def reset_many(self, items: list[ResetItem]) -> list[str | Exception]:
        """Reset many rows in one Rust call; a row whose env refused its task, could not be
        built or panicked gets its exception in place of the observation."""
        slots, tasks, seeds, horizons = zip(*items)
        obs, failed = self.pool.reset(list(slots), tasks=list(tasks), seeds=list(seeds),
                                      max_turns=list(horizons), errors="return")
        for row, error in failed:
            obs[row] = error
        return obs

    async def step_many(self, items: list[tuple[int, str]]) -> list[StepOutcome]:
        """Step many slots in one Rust call (slots no longer running get ``aborted``)."""
        running = self.core_pool.running([slot for slot, _ in items])
        live = [(i, slot, action) for i, ((slot, action), up) in enumerate(zip(items, running))
                if up]
        out = [NOT_RUNNING] * len(items)
        if live:
            _, slots, actions = zip(*live)
            obs, rew, term, trunc = self.pool.step(list(slots), list(actions))
            ended = (term | trunc).nonzero()[0].tolist()
            reasons = dict(zip(ended, self.pool.stop_reasons([slots[k] for k in ended])))
            for k, (i, _, _) in enumerate(live):
                reason = reasons.get(k)
                out[i] = StepOutcome(obs[k], float(rew[k]), bool(term[k]), bool(trunc[k]), reason,
                                     obs[k] if reason == "env_error" else None)
        return out

    def finish(self, items: list[tuple[int, str]]) -> None:
        by_reason: dict[str, list[int]] = defaultdict(list)
        for slot, reason in items:
            by_reason[reason].append(slot)
        for reason, slots in by_reason.items():  # episodes that ended already are left as is
            self.pool.finish(slots, reason)

    async def oracle_action(self, slot: int) -> str | None:
        return self._oracle(slot)

    async def frames(self, slots: list[int]) -> list:
        """Each slot's picture as a :class:`~agentgym.data.frames.Frame`, drawn and its id
        computed in one Rust call (GIL released)."""
        return [Frame(height=r[0], width=r[1], data=r[2], hash=r[3]) if type(r) is tuple else r
                for r in self.core_pool.frame_records(slots)]

    async def valid_actions(self, slot: int) -> list[str]:
        return self.pool.valid_actions(slot)

    async def save_starts(self, slots: list[int]) -> list[Exception | None]:
        """Keep each slot's state (an episode just reset) as its start, for
        :meth:`restart`: one pool snapshot call."""
        self.drop_saved(slots)
        self._starts.update(zip(slots, self.core_pool.snapshot(slots)))
        return [None] * len(slots)

    async def restart(self, slot: int) -> None:
        """Put ``slot`` back at its start (env and episode record: turns, horizon, status,
        return, refused turns, undo history)."""
        self.core_pool.restore([slot], [self._starts[slot]])

    def drop_saved(self, slots: list[int]) -> None:
        """Release the start snapshots of ``slots`` (those that have one), and their
        snapshots before the last step."""
        handles = [self._starts.pop(s) for s in slots if s in self._starts]
        handles += [self._lasts.pop(s) for s in slots if s in self._lasts]
        if handles:
            self.core_pool.release(handles)

    def save_lasts(self, slots: list[int]) -> None:
        """Keep the state of ``slots`` as it is before their next step (one pool snapshot
        call over those still running; each slot's previous one is released)."""
        slots = [s for s, up in zip(slots, self.core_pool.running(slots)) if up]
        old = [self._lasts[s] for s in slots if s in self._lasts]
        self._lasts.update(zip(slots, self.core_pool.snapshot(slots)))
        if old:
            self.core_pool.release(old)

    def has_last(self, slot: int) -> bool:
        return slot in self._lasts

    async def restore_last(self, slot: int) -> None:
        """Put ``slot`` back as it was before its last step (env and episode record:
        turns, status, return, refused turns, undo history)."""
        self.core_pool.restore([slot], [self._lasts[slot]])

    async def fork(self, src: int, targets: list[int]) -> None:
        """Copy running slot ``src`` (env, episode record, undo history) into the free
        slots ``targets``, one Rust call; from then on each steps on its own."""
        self.core_pool.fork(src, targets)

    def close(self) -> None:
        pass
