"""``agentgym.EnvPool``: thousands of native episodes stepped in one Rust call per batch."""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np

from agentgym import _core

#: The splitmix64 constants of the episode-seed mix (one mix, an array and a scalar form).
_SEED_MUL, _ID_MUL, _COUNTER_MUL = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_M64 = 0xFFFFFFFFFFFFFFFF
_MASK64 = np.uint64(_M64)


def episode_seeds(seed: int, ids: np.ndarray, counters: np.ndarray) -> np.ndarray:
    """Deterministic per-episode seeds from (pool seed, slot, episode counter): a splitmix64
    mix, vectorised, so the same pool seed always replays the same episodes."""
    u = np.uint64
    with np.errstate(over="ignore"):
        z = (u(seed & _M64) * u(_SEED_MUL) + ids.astype(u) * u(_ID_MUL)
             + counters.astype(u) * u(_COUNTER_MUL))
        z = (z ^ (z >> u(30))) * u(_ID_MUL)
        z = (z ^ (z >> u(27))) * u(_COUNTER_MUL)
        z = z ^ (z >> u(31))
    return z & _MASK64


def episode_seed(seed: int, id: int, counter: int) -> int:
    """:func:`episode_seeds` of one episode, in Python ints (no array overhead: the engine
    derives a streamed request's seed as it arrives)."""
    z = ((seed & _M64) * _SEED_MUL + (id & _M64) * _ID_MUL
         + (counter & _M64) * _COUNTER_MUL) & _M64
    z = ((z ^ (z >> 30)) * _ID_MUL) & _M64
    z = ((z ^ (z >> 27)) * _COUNTER_MUL) & _M64
    return z ^ (z >> 31)


def _as_id_list(ids) -> list[int]:
    if isinstance(ids, np.ndarray):
        return ids.tolist()
    return list(ids)


class NativeEnvInfo:
    """What a native env says about itself, read from the ``_core.EnvPool`` held in
    ``self._pool`` (shared by :class:`EnvPool` and the Gymnasium ``NativeEnv``)."""

    _pool: _core.EnvPool

    @property
    def instructions(self) -> str:
        """The env's instructions for the agent (used as the system prompt)."""
        return self._pool.instructions

    @property
    def num_tasks(self) -> int:
        return self._pool.num_tasks


class EnvPool(NativeEnvInfo):
    """A pool of ``num_envs`` episodes of the native env ``env_id``.

    ``reset`` and ``step`` take slot ids and run the whole batch in Rust, in parallel, with
    the GIL released. By default slot ``i``'s ``k``-th episode plays task ``i + k*num_envs``
    with a seed mixed from ``(seed, i, k)``, so a pool is reproducible from its seed.
    ``max_turns`` is the horizon: an episode that reaches it is ``truncated``.
    """

    def __init__(
        self, env_id: str, num_envs: int, seed: int = 0, max_turns: int | None = None, **env_kwargs
    ):
        self._pool = _core.EnvPool(env_id, int(num_envs), json.dumps(env_kwargs))
        self.env_id = env_id
        self.num_envs = int(num_envs)
        self.seed = int(seed)
        self.max_turns = max_turns
        self._counters = np.zeros(self.num_envs, dtype=np.uint64)

    def __len__(self) -> int:
        return self.num_envs

    def __repr__(self) -> str:
        return f"EnvPool({self.env_id!r}, num_envs={self.num_envs}, seed={self.seed})"

    def reset(
        self,
        ids: Sequence[int] | np.ndarray | None = None,
        tasks: Sequence[int | str] | None = None,
        seeds: Sequence[int] | None = None,
        max_turns: int | None | Sequence[int | None] = ...,  # type: ignore[assignment]
        errors: str = "raise",
    ):
        """Start new episodes in slots ``ids`` (all slots when None); returns observations.

        ``tasks`` are task indices or the env's explicit task text; ``max_turns`` overrides
        the pool's horizon for these episodes (one value or one per slot; None = unlimited).

        The whole batch always runs. With ``errors="raise"`` a task the env refuses raises
        ``InvalidTaskError`` (an env that cannot be built, its named error) once the batch
        is done; those slots end with ``stop_reason == "env_error"``, the others are reset.
        With ``errors="return"`` nothing raises per row: the result is ``(observations,
        failed)``, ``failed`` listing ``(row, exception)`` in row order for each row that
        was refused, could not be built or panicked (its observation is ``""``, or the
        panic's message). Under both, a panic inside an env only ends its own episode, as in
        ``step``. Malformed batches (bad or repeated ids, mismatched lengths) raise.
        """
        id_arr = np.arange(self.num_envs) if ids is None else np.asarray(ids, dtype=np.int64)
        if id_arr.ndim != 1:
            raise ValueError("ids must be one-dimensional")
        # The core checks the ids (IndexError, duplicates) before it resets anything; until
        # then a bad id only reads a clipped, unused counter.
        if tasks is None or seeds is None:
            counters = self._counters.take(id_arr, mode="clip")
        if tasks is None:
            task_list = (id_arr.astype(np.uint64) + counters * np.uint64(self.num_envs)).tolist()
        else:
            task_list = list(tasks)
        if seeds is None:
            seed_list = episode_seeds(self.seed, id_arr, counters).tolist()
        else:
            # The core applies int() to each item of a list itself.
            seed_list = seeds if type(seeds) is list else [int(s) for s in seeds]
        if max_turns is ...:
            max_turns = self.max_turns
        if max_turns is None or isinstance(max_turns, (int, np.integer)):
            horizon = [None if max_turns is None else int(max_turns)] * len(id_arr)
        else:
            horizon = (
                max_turns
                if type(max_turns) is list
                else [None if m is None else int(m) for m in max_turns]
            )
        obs = self._pool.reset(id_arr, task_list, seed_list, horizon, errors)
        if id_arr.size == 1:  # scalar update: a fancy-index add costs microseconds
            self._counters[id_arr[0]] += np.uint64(1)
        else:
            self._counters[id_arr] += np.uint64(1)
        return obs

    def step(self, ids: Sequence[int] | np.ndarray, actions: Sequence[str]):
        """Step slots ``ids`` with one action each.

        Returns ``(observations: list[str], rewards: float32[n], terminated: bool[n],
        truncated: bool[n])``. An env that fails inside a step ends only its own episode
        (``stop_reason == "env_error"``, reported as truncated).
        """
        return self._pool.step(ids, actions)

    def finish(self, ids: Sequence[int], reason: str) -> None:
        """End running episodes from outside (``timeout``, ``aborted``, ``backend_error``, ...)."""
        self._pool.finish(_as_id_list(ids), reason)

    def valid_actions(self, i: int) -> list[str]:
        return self._pool.valid_actions(i)

    def oracle_action(self, i: int) -> str | None:
        return self._pool.oracle_action(i)

    def oracle_actions(self, ids: Sequence[int]) -> list[str | None]:
        return self._pool.oracle_actions(_as_id_list(ids))

    @property
    def turns(self) -> np.ndarray:
        """Turns taken by each slot's current episode (uint32[num_envs])."""
        return self._pool.turns()

    def invalid_turns(self, ids: Sequence[int]) -> list[int]:
        """Steps of each episode in ``ids`` whose action the env refused as unreadable (not
        one of its commands, or one whose arguments do not parse)."""
        return self._pool.invalid_turns(_as_id_list(ids))

    def stop_reasons(self, ids: Sequence[int] | None = None) -> list[str | None]:
        """Stop reason of every slot, or of slots ``ids`` (None while running)."""
        return self._pool.stop_reasons(None if ids is None else _as_id_list(ids))

    def set_max_turns(self, i: int, max_turns: int | None) -> None:
        self._pool.set_max_turns(i, max_turns)

    @property
    def frame_shape(self) -> tuple[int, int] | None:
        """``(height, width)`` of the pictures of an env built with ``obs="image"`` or
        ``"both"`` (None: text observations only)."""
        return self._pool.frame_shape

    def frames(self, ids: Sequence[int]) -> list:
        """Each slot's current picture, a ``(height, width, 3)`` uint8 array, drawn in one
        call (GIL released); None where the env shows none, an ``EnvError`` (returned, not
        raised) where drawing panicked or gave a malformed picture: that slot's running
        episode ends with ``env_error``."""
        return self._pool.frames(_as_id_list(ids))

    def episode(self, i: int) -> dict:
        task, seed, turns, max_turns, stop_reason, total_reward = self._pool.episode(i)
        return {
            "task": task,
            "seed": seed,
            "turns": turns,
            "max_turns": max_turns,
            "stop_reason": stop_reason,
            "total_reward": total_reward,
        }

    # --- snapshots -------------------------------------------------------------------

    @property
    def snapshots_supported(self) -> bool:
        """Whether this env can snapshot its state (``snapshot``, ``restore``, ``fork``);
        known before any episode starts. Every shipped native env can."""
        return self._pool.snapshots_supported

    @property
    def num_snapshots(self) -> int:
        """Snapshots taken and not yet released."""
        return self._pool.num_snapshots

    def snapshot(self, ids: Sequence[int] | np.ndarray) -> list[int]:
        """Save the whole state of each of slots ``ids``: the env's state and the episode's
        bookkeeping (task, seed, turns, horizon, total reward, refused turns). Returns one
        opaque integer handle per slot, valid in this pool until :meth:`release`.

        Each slot must hold a running episode. Raises before saving anything:
        ``SnapshotUnsupportedError`` (the env cannot snapshot), ``EpisodeNotStartedError``
        or ``EpisodeFinishedError`` (a slot without a running episode), ``IndexError`` /
        ``ValueError`` (bad or repeated ids). Runs in Rust with the GIL released.
        """
        return self._pool.snapshot(_as_id_list(ids))

    def restore(self, ids: Sequence[int] | np.ndarray, handles: Sequence[int]) -> None:
        """Put slot ``ids[i]`` back into the state saved under ``handles[i]``, exactly: the
        same actions then give the same observations, rewards and end flags as after the
        snapshot. Whatever the slot held is replaced; a handle can be restored any number of
        times, into any slots, and stays valid. Raises before changing anything:
        ``UnknownSnapshotError`` (never issued, or released), ``IndexError`` /
        ``ValueError`` (bad or repeated ids, unequal lengths).
        """
        self._pool.restore(_as_id_list(ids), [int(h) for h in handles])

    def fork(self, id: int, targets: int | Sequence[int] | np.ndarray) -> list[int]:
        """Copy slot ``id``'s state (a running episode) into other slots; returns their ids.

        The pool has a fixed number of slots, so the children go into free slots: slots that
        hold no running episode (never reset, or finished; a finished episode there is
        replaced). ``targets`` is those slots, or a count ``n``: then the ``n``
        lowest-numbered free slots other than ``id``. Each child starts with the same env
        state and episode bookkeeping as ``id``; from then on every slot (``id`` included)
        steps on its own. Raises before changing anything: ``SnapshotUnsupportedError``,
        ``EpisodeFinishedError`` (``id``'s episode ended, e.g. with ``env_error``) or
        ``EpisodeNotStartedError``, ``ValueError`` (a target holds a running episode, is
        repeated or is ``id``; fewer than ``n`` free slots), ``IndexError``.
        """
        if isinstance(targets, (int, np.integer)):
            n = int(targets)
            if n < 0:
                raise ValueError(f"fork needs a count >= 0, got {n}")
            running = self._pool.running(list(range(self.num_envs)))
            free = [i for i, r in enumerate(running) if not r and i != id]
            if len(free) < n:
                raise ValueError(
                    f"fork of slot {id} needs {n} free slots; {len(free)} of "
                    f"{self.num_envs} hold no running episode"
                )
            target_list = free[:n]
        else:
            target_list = _as_id_list(targets)
        self._pool.fork(int(id), target_list)
        return target_list

    def release(self, handles: Sequence[int]) -> None:
        """Free the snapshots under ``handles``; they become unknown
        (``UnknownSnapshotError`` afterwards). All or nothing: an unknown handle raises
        ``UnknownSnapshotError``, a repeated one ``ValueError``, before anything is freed."""
        self._pool.release([int(h) for h in handles])

    def snapshot_bytes(self, handles: Sequence[int]) -> list[int]:
        """Bytes each snapshot holds: its table entry, the env's struct, the env's own heap
        buffers (capacities) and the task text. Read-only data the env shares with every
        other env of its id (word lists, catalogues, recipe books) is not counted."""
        return self._pool.snapshot_bytes([int(h) for h in handles])
