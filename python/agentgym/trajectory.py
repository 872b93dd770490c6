"""Token-exact trajectories of live episodes (``TrajectoryStore``) and their packed export
(``PackedBatch``).

The store lives in Rust (``agentgym._core.TrajectoryStore``). Per live episode, keyed by a
``u64`` (a pool slot or an episode id), it holds metadata, the concatenated token ids of its
segments (prompt/observation tokens: loss mask 0, logprob 0.0; model tokens: loss mask 1 and
the behaviour logprob as sampled) and one reward per turn. ``finish`` queues the episode
(its key is free again at once); ``drain`` packs the queue into one ``PackedBatch`` of flat
numpy arrays with offsets, created from Rust vectors without per-element Python objects.
An episode that ends in failure (``env_error``, ``backend_error``, ``timeout``, ``aborted``)
keeps its tokens but gets an all-zero loss mask, so the batch keeps its shape.

Batched methods validate the whole batch first: a bad batch raises ``TrajectoryError``
(unknown key, finished episode, mismatched lengths, duplicate begin) and changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

import numpy as np

from agentgym import _core

if TYPE_CHECKING:
    import torch

__all__ = [
    "FAILURE_REASONS",
    "STOP_REASONS",
    "PackedBatch",
    "TrajectoryStore",
    "TrajectoryView",
]

#: Stop reason names; a reason's code in ``PackedBatch.stop_reason`` is its index here.
STOP_REASONS: tuple[str, ...] = tuple(_core.STOP_REASONS)
#: Stop reasons that mark a failed rollout (loss mask zeroed on finish).
FAILURE_REASONS: frozenset[str] = frozenset({"env_error", "backend_error", "timeout", "aborted"})


def _array(x: Any, dtype: type[np.generic], name: str) -> np.ndarray:
    """``x`` as a contiguous 1-D array of ``dtype``; integers are range-checked (no wrap)."""
    arr = np.asarray(x)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {arr.shape}")
    if arr.dtype == dtype:
        return np.ascontiguousarray(arr)
    if np.issubdtype(dtype, np.integer):
        if arr.size == 0:
            return np.zeros(0, dtype=dtype)
        if arr.dtype.kind not in "iu":
            raise ValueError(f"{name} must hold integers, got dtype {arr.dtype}")
        info = np.iinfo(dtype)
        lo, hi = int(arr.min()), int(arr.max())
        if lo < info.min or hi > info.max:
            raise ValueError(f"{name} has values outside [{info.min}, {info.max}]: {lo}..{hi}")
    return np.ascontiguousarray(arr, dtype=dtype)


def _segment(s: Any) -> np.ndarray:
    """One token segment as an integer array (an empty list is not float64)."""
    return s if isinstance(s, np.ndarray) else np.asarray(s, dtype=np.int64)


def _column(x: Any, n: int, dtype: type[np.generic], name: str) -> np.ndarray:
    """A per-episode column: a scalar is broadcast to ``n`` entries."""
    if np.ndim(x) == 0:
        return np.full(n, x, dtype=dtype) if n else np.zeros(0, dtype=dtype)
    return _array(x, dtype, name)


@dataclass(frozen=True)
class TrajectoryView:
    """One trajectory of a ``PackedBatch``: array fields are views into the batch."""

    key: int
    group_id: int
    sample_index: int
    policy_version: int
    task_id: int
    token_ids: np.ndarray
    loss_mask: np.ndarray
    logprobs: np.ndarray
    turn_rewards: np.ndarray
    reward: float
    num_turns: int
    stop_reason: str
    prompt_len: int


@dataclass(frozen=True)
class PackedBatch:
    """Completed trajectories packed into flat arrays.

    Trajectory ``b`` owns tokens ``offsets[b]:offsets[b+1]`` of ``token_ids``, ``loss_mask``
    (1 = model token) and ``logprobs`` (behaviour logprobs, 0.0 elsewhere), and turns
    ``turn_offsets[b]:turn_offsets[b+1]`` of ``turn_rewards``. ``rewards`` is the sum of the
    turn rewards unless ``finish`` overrode it. ``stop_reason`` holds codes into
    ``STOP_REASONS``; ``prompt_len`` counts the tokens before the first model token.
    """

    keys: np.ndarray  # u64[B]
    group_id: np.ndarray  # u64[B]
    sample_index: np.ndarray  # u32[B]
    policy_version: np.ndarray  # u32[B]
    task_id: np.ndarray  # u64[B]
    token_ids: np.ndarray  # u32[T]
    offsets: np.ndarray  # i64[B+1]
    loss_mask: np.ndarray  # u8[T]
    logprobs: np.ndarray  # f32[T]
    rewards: np.ndarray  # f32[B]
    turn_rewards: np.ndarray  # f32[total_turns]
    turn_offsets: np.ndarray  # i64[B+1]
    num_turns: np.ndarray  # u32[B]
    stop_reason: np.ndarray  # u8[B]
    prompt_len: np.ndarray  # u32[B]

    @classmethod
    def from_dict(cls, d: dict[str, np.ndarray]) -> PackedBatch:
        return cls(**{f.name: d[f.name] for f in fields(cls)})

    @classmethod
    def empty(cls) -> PackedBatch:
        """A batch of no trajectories."""
        return cls.from_dict(_core.TrajectoryStore().drain())

    @classmethod
    def concat(cls, batches: Sequence[PackedBatch]) -> PackedBatch:
        """One batch holding the trajectories of ``batches`` in order (copies)."""
        if not batches:
            return cls.empty()
        if len(batches) == 1:
            return batches[0]
        out: dict[str, np.ndarray] = {}
        for f in fields(cls):
            parts = [getattr(b, f.name) for b in batches]
            if f.name in ("offsets", "turn_offsets"):
                shifted, base = [parts[0][:1]], 0
                for p in parts:
                    shifted.append(p[1:] + base)
                    base += int(p[-1])
                out[f.name] = np.concatenate(shifted)
            else:
                out[f.name] = np.concatenate(parts)
        return cls.from_dict(out)

    def __len__(self) -> int:
        return int(self.keys.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.shape[0])

    @property
    def lengths(self) -> np.ndarray:
        """Tokens per trajectory (i64[B])."""
        return np.diff(self.offsets)

    @property
    def failed(self) -> np.ndarray:
        """bool[B]: the rollout ended in failure (its loss mask is all zero)."""
        codes = [STOP_REASONS.index(r) for r in FAILURE_REASONS]
        return np.isin(self.stop_reason, np.array(codes, dtype=np.uint8))

    def stop_reason_names(self) -> list[str]:
        return [STOP_REASONS[c] for c in self.stop_reason.tolist()]

    def trajectory(self, i: int) -> TrajectoryView:
        """Trajectory ``i`` (negative indices count from the end); arrays are views."""
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"trajectory index {i} out of range for a batch of {n}")
        i %= n
        a, z = int(self.offsets[i]), int(self.offsets[i + 1])
        ta, tz = int(self.turn_offsets[i]), int(self.turn_offsets[i + 1])
        return TrajectoryView(
            key=int(self.keys[i]),
            group_id=int(self.group_id[i]),
            sample_index=int(self.sample_index[i]),
            policy_version=int(self.policy_version[i]),
            task_id=int(self.task_id[i]),
            token_ids=self.token_ids[a:z],
            loss_mask=self.loss_mask[a:z],
            logprobs=self.logprobs[a:z],
            turn_rewards=self.turn_rewards[ta:tz],
            reward=float(self.rewards[i]),
            num_turns=int(self.num_turns[i]),
            stop_reason=STOP_REASONS[int(self.stop_reason[i])],
            prompt_len=int(self.prompt_len[i]),
        )

    def __iter__(self) -> Iterator[TrajectoryView]:
        return (self.trajectory(i) for i in range(len(self)))

    def to_padded(self, pad_token_id: int = 0, max_len: int | None = None) -> dict[str, np.ndarray]:
        """Right-padded ``[B, L]`` arrays: ``input_ids`` (i64), ``attention_mask``, ``loss_mask``
        (u8) and ``logprobs`` (f32). ``L`` is the longest trajectory, or ``max_len`` (longer
        trajectories are cut)."""
        lengths = self.lengths
        width = int(lengths.max(initial=0)) if max_len is None else int(max_len)
        cols = np.arange(width)
        valid = cols[None, :] < lengths[:, None]
        idx = np.where(valid, self.offsets[:-1, None] + cols[None, :], 0)
        src_ok = self.num_tokens > 0
        ids = np.full((len(self), width), pad_token_id, dtype=np.int64)
        mask = np.zeros((len(self), width), dtype=np.uint8)
        lps = np.zeros((len(self), width), dtype=np.float32)
        if src_ok:
            ids[valid] = self.token_ids[idx[valid]]
            mask[valid] = self.loss_mask[idx[valid]]
            lps[valid] = self.logprobs[idx[valid]]
        return {
            "input_ids": ids,
            "attention_mask": valid.astype(np.uint8),
            "loss_mask": mask,
            "logprobs": lps,
        }

    def to_torch(self) -> dict[str, torch.Tensor]:
        """Every array as a torch tensor sharing its memory (``torch.from_numpy``, no copy).
        ``token_ids`` stays ``torch.uint32`` (call ``.long()`` for embedding lookups)."""
        import torch

        return {f.name: torch.from_numpy(getattr(self, f.name)) for f in fields(self)}


class TrajectoryStore:
    """Trajectories of live episodes, keyed by an int in ``[0, 2**64)``.

    Typical use per turn: ``append_batch`` the observation tokens (``is_model=False``) and the
    generated tokens with their logprobs (``is_model=True``), ``add_turns`` with the env
    rewards; ``finish_batch`` when episodes end; ``drain()`` for the learner.
    """

    def __init__(self) -> None:
        self._inner = _core.TrajectoryStore()

    def begin(
        self,
        key: int,
        *,
        group_id: int = 0,
        sample_index: int = 0,
        policy_version: int = 0,
        task_id: int = 0,
    ) -> None:
        """Start an episode under ``key`` (a live key is an error)."""
        self._inner.begin(key, group_id, sample_index, policy_version, task_id)

    def begin_batch(
        self,
        keys: Sequence[int] | np.ndarray,
        *,
        group_ids: int | Sequence[int] | np.ndarray = 0,
        sample_indices: int | Sequence[int] | np.ndarray = 0,
        policy_versions: int | Sequence[int] | np.ndarray = 0,
        task_ids: int | Sequence[int] | np.ndarray = 0,
    ) -> None:
        """Start many episodes; each metadata column is one value per key or a scalar."""
        k = _array(keys, np.uint64, "keys")
        n = k.shape[0]
        self._inner.begin_batch(
            k,
            _column(group_ids, n, np.uint64, "group_ids"),
            _column(sample_indices, n, np.uint32, "sample_indices"),
            _column(policy_versions, n, np.uint32, "policy_versions"),
            _column(task_ids, n, np.uint64, "task_ids"),
        )

    def append(
        self,
        key: int,
        tokens: Sequence[int] | np.ndarray,
        is_model: bool = False,
        logprobs: Sequence[float] | np.ndarray | None = None,
    ) -> None:
        """Append one segment. ``logprobs`` (one per token) is kept for model segments only;
        None stores 0.0."""
        lp = None if logprobs is None else _array(logprobs, np.float32, "logprobs")
        self._inner.append(key, _array(tokens, np.uint32, "tokens"), bool(is_model), lp)

    def append_batch(
        self,
        keys: Sequence[int] | np.ndarray,
        flat_tokens: Sequence[int] | np.ndarray,
        offsets: Sequence[int] | np.ndarray,
        is_model: bool | Sequence[bool] | np.ndarray,
        flat_logprobs: Sequence[float] | np.ndarray | None = None,
    ) -> None:
        """Append segment ``i`` = ``flat_tokens[offsets[i]:offsets[i+1]]`` to ``keys[i]``, in
        order (a key may repeat). ``offsets`` has ``len(keys) + 1`` entries from 0 to
        ``len(flat_tokens)``; ``is_model`` is per segment (or one bool for all);
        ``flat_logprobs`` is aligned with ``flat_tokens`` or None (all 0.0)."""
        k = _array(keys, np.uint64, "keys")
        lp = None if flat_logprobs is None else _array(flat_logprobs, np.float32, "flat_logprobs")
        self._inner.append_batch(
            k,
            _array(flat_tokens, np.uint32, "flat_tokens"),
            _array(offsets, np.int64, "offsets"),
            _column(is_model, k.shape[0], np.bool_, "is_model"),
            lp,
        )

    def append_segments(
        self,
        keys: Sequence[int] | np.ndarray,
        segments: Sequence[Sequence[int] | np.ndarray],
        is_model: bool | Sequence[bool] | np.ndarray,
        logprobs: Sequence[Sequence[float] | np.ndarray] | None = None,
    ) -> None:
        """``append_batch`` from one token list per key (flattened here)."""
        lengths = np.fromiter((len(s) for s in segments), dtype=np.int64, count=len(segments))
        offsets = np.zeros(len(segments) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        flat = np.concatenate([_segment(s) for s in segments]) if len(segments) else []
        flat_lp = None
        if logprobs is not None:
            flat_lp = (
                np.concatenate([np.asarray(x, np.float32) for x in logprobs])
                if len(logprobs)
                else np.zeros(0, np.float32)
            )
        self.append_batch(keys, flat, offsets, is_model, flat_lp)

    def add_turn(self, key: int, reward: float) -> None:
        """Close the current turn of ``key`` with its reward."""
        self._inner.add_turn(key, reward)

    def add_turns(
        self, keys: Sequence[int] | np.ndarray, rewards: Sequence[float] | np.ndarray
    ) -> None:
        """Close one turn per key with its reward."""
        self._inner.add_turns(
            _array(keys, np.uint64, "keys"), _array(rewards, np.float32, "rewards")
        )

    def finish(self, key: int, stop_reason: str, reward_override: float | None = None) -> None:
        """End ``key`` (one of ``STOP_REASONS``); its reward is the sum of its turn rewards
        unless ``reward_override`` is given. The key is free again at once."""
        self._inner.finish(key, stop_reason, reward_override)

    def finish_batch(
        self,
        keys: Sequence[int] | np.ndarray,
        stop_reasons: str | Sequence[str],
        reward_overrides: Sequence[float | None] | np.ndarray | None = None,
    ) -> None:
        """End many episodes: one stop reason for all or one per key; overrides one per key
        (None or NaN = sum of turn rewards) or None."""
        over = None
        if isinstance(reward_overrides, np.ndarray):
            over = _array(reward_overrides, np.float32, "reward_overrides")
        elif reward_overrides is not None:
            over = np.array(
                [np.nan if r is None else r for r in reward_overrides], dtype=np.float32
            )
        reasons = stop_reasons if isinstance(stop_reasons, str) else list(stop_reasons)
        self._inner.finish_batch(_array(keys, np.uint64, "keys"), reasons, over)

    def discard(self, key: int) -> None:
        """Drop a live episode without producing a trajectory."""
        self._inner.discard(key)

    def finish_all(self, stop_reason: str = "aborted") -> int:
        """Finish every live episode (e.g. at shutdown); returns how many."""
        return self._inner.finish_all(stop_reason)

    def drain(self, max: int | None = None) -> PackedBatch:
        """Pack the completed episodes (the oldest ``max``, or all) in finish order."""
        return PackedBatch.from_dict(self._inner.drain(max))

    def __contains__(self, key: int) -> bool:
        return self._inner.is_live(key)

    def num_tokens(self, key: int) -> int:
        """Tokens held by live episode ``key``."""
        return self._inner.num_tokens(key)

    def num_turns(self, key: int) -> int:
        """Turns closed so far by live episode ``key``."""
        return self._inner.num_turns(key)

    @property
    def num_live(self) -> int:
        return self._inner.num_live

    @property
    def num_completed(self) -> int:
        return self._inner.num_completed

    def heap_bytes(self) -> int:
        """Approximate bytes held by the store's buffers and bookkeeping."""
        return self._inner.heap_bytes()

    @staticmethod
    def idle_bytes_per_episode() -> int:
        """Bytes a live episode costs before its first token (buffers grow with tokens:
        9 bytes per token, 4 per turn)."""
        return _core.TrajectoryStore.idle_bytes_per_episode()
