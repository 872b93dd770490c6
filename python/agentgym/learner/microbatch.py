"""Padded micro-batches of a packed trajectory batch.

A :class:`~agentgym.data.trajectories.PackedBatch` lays B multi-turn trajectories end to
end in flat numpy arrays. The learner turns it into *micro-batches*: right-padded ``[n, L]``
tensors sized to a token budget, with every per-token quantity shifted by one so that column
``j`` of ``loss_mask``, ``old_logprobs``, ``advantages`` ... describes the prediction of
``input_ids[:, j + 1]`` from ``logits[:, j]`` (the next-token alignment of a causal LM).

Sequences are sorted by length before packing so that each micro-batch holds sequences
of similar length, which keeps padding small.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agentgym.data.trajectories import BatchFormatError, PackedBatch

__all__ = [
    "MicroBatch",
    "collate",
    "make_micro_batches",
    "plan_micro_batches",
    "scatter_to_packed",
]


@dataclass
class MicroBatch:
    """Right-padded tensors for one forward/backward pass.

    ``input_ids``/``attention_mask`` are ``[n, L]``; every other per-token tensor is
    ``[n, L - 1]`` and shifted: column ``j`` refers to the target token
    ``input_ids[:, j + 1]`` predicted by ``logits[:, j]``. ``loss_mask`` is 1 exactly at
    model-generated targets (observation, prompt and padding tokens are 0).
    ``indices`` are the trajectories' rows in the packed batch. ``images``: the pictures of
    the rows' image placeholder spans, row by row in token order (the packed batch's frame
    arrays, not copies; empty without image observations).
    """

    input_ids: Any
    attention_mask: Any
    loss_mask: Any
    old_logprobs: Any
    advantages: Any
    indices: np.ndarray
    lengths: np.ndarray
    extras: dict[str, Any] = field(default_factory=dict)
    images: list[np.ndarray] = field(default_factory=list)

    @property
    def num_sequences(self) -> int:
        return int(self.indices.shape[0])

    @property
    def num_model_tokens(self) -> int:
        return int(self.loss_mask.sum().item())

    def __getattr__(self, name: str) -> Any:
        # Optional shifted tensors (ref_logprobs, returns, values, weights ...).
        extras = self.__dict__.get("extras", {})
        if name in extras:
            return extras[name]
        raise AttributeError(name)

    def get(self, name: str, default: Any = None) -> Any:
        """An optional tensor by name (``ref_logprobs``, ``returns``, ``values`` ...)."""
        return self.extras.get(name, default)

    def to(self, device: Any) -> MicroBatch:
        """Move every tensor to ``device`` (returns a new MicroBatch)."""
        return MicroBatch(
            input_ids=self.input_ids.to(device),
            attention_mask=self.attention_mask.to(device),
            loss_mask=self.loss_mask.to(device),
            old_logprobs=self.old_logprobs.to(device),
            advantages=self.advantages.to(device),
            indices=self.indices,
            lengths=self.lengths,
            extras={k: v.to(device) for k, v in self.extras.items()},
            images=self.images,
        )


def plan_micro_batches(
    lengths: np.ndarray,
    max_tokens_per_microbatch: int,
    *,
    max_seqs_per_microbatch: int | None = None,
    indices: np.ndarray | None = None,
) -> list[np.ndarray]:
    """Group sequences into micro-batches of at most ``max_tokens_per_microbatch`` *padded*
    tokens (``n * max_len``) and at most ``max_seqs_per_microbatch`` sequences.

    Sequences are taken longest first, so each group holds similar lengths. A sequence
    longer than the budget gets a micro-batch of its own. ``indices`` restricts the plan
    to those rows (default: all). Returns arrays of row indices.
    """
    if max_tokens_per_microbatch <= 0:
        raise ValueError("max_tokens_per_microbatch must be positive")
    if max_seqs_per_microbatch is not None and max_seqs_per_microbatch <= 0:
        raise ValueError("max_seqs_per_microbatch must be positive")
    lengths = np.asarray(lengths, dtype=np.int64)
    rows = np.arange(lengths.shape[0]) if indices is None else np.asarray(indices, np.int64)
    order = rows[np.argsort(-lengths[rows], kind="stable")]
    groups: list[np.ndarray] = []
    current: list[int] = []
    cur_max = 0
    for r in order:
        ln = int(lengths[r])
        new_max = max(cur_max, ln)
        full = max_seqs_per_microbatch is not None and len(current) >= max_seqs_per_microbatch
        if current and (full or new_max * (len(current) + 1) > max_tokens_per_microbatch):
            groups.append(np.asarray(current, dtype=np.int64))
            current, new_max = [], ln
        current.append(int(r))
        cur_max = new_max
    if current:
        groups.append(np.asarray(current, dtype=np.int64))
    return groups


def collate(
    batch: PackedBatch,
    indices: np.ndarray,
    token_arrays: Mapping[str, np.ndarray | None] | None = None,
    *,
    pad_token_id: int = 0,
    device: Any = None,
) -> MicroBatch:
    """Pad trajectories ``indices`` of ``batch`` into a :class:`MicroBatch`.

    ``token_arrays`` maps names to float arrays of length T (per packed token, e.g.
    ``advantages``, ``ref_logprobs``, ``returns``, ``values``, ``weights``); each is
    shifted like ``loss_mask``. ``advantages`` is zeros when not given.
    """
    import torch

    indices = np.asarray(indices, dtype=np.int64)
    lengths = batch.lengths[indices]
    n = indices.shape[0]
    width = max(int(lengths.max()) if n else 1, 1)
    pos = np.arange(width)
    valid = pos[None, :] < lengths[:, None]  # [n, L]
    gather = np.where(valid, batch.offsets[indices][:, None] + pos[None, :], 0)
    gather = np.minimum(gather, max(batch.num_tokens - 1, 0))

    def take(arr: np.ndarray, fill: float, dtype: Any) -> np.ndarray:
        if arr.shape[0] == 0:
            return np.full((n, width), fill, dtype=dtype)
        return np.where(valid, arr[gather], fill).astype(dtype, copy=False)

    ids = take(batch.token_ids, pad_token_id, np.int64)
    mask = valid.astype(np.int64)
    lmask = take(batch.loss_mask, 0, np.float32)[:, 1:]
    old = take(batch.logprobs, 0.0, np.float32)[:, 1:] * lmask
    arrays = dict(token_arrays or {})
    adv_src = arrays.pop("advantages", None)
    adv = take(adv_src, 0.0, np.float32)[:, 1:] * lmask if adv_src is not None else None
    if adv is None:
        adv = np.zeros_like(lmask)
    extras = {}
    for name, arr in arrays.items():
        if arr is None:
            continue
        arr = np.asarray(arr, dtype=np.float32)
        if arr.shape[0] != batch.num_tokens:
            raise BatchFormatError(f"token array {name!r} must have T = {batch.num_tokens}")
        extras[name] = torch.from_numpy(take(arr, 0.0, np.float32)[:, 1:] * lmask)

    mb = MicroBatch(
        input_ids=torch.from_numpy(ids),
        attention_mask=torch.from_numpy(mask),
        loss_mask=torch.from_numpy(np.ascontiguousarray(lmask)),
        old_logprobs=torch.from_numpy(np.ascontiguousarray(old)),
        advantages=torch.from_numpy(np.ascontiguousarray(adv)),
        indices=indices,
        lengths=lengths,
        extras=extras,
        images=[] if batch.images is None else
        [f.array() for b in indices.tolist() for f in batch.images[b].spans()],
    )
    return mb.to(device) if device is not None else mb


def make_micro_batches(
    batch: PackedBatch,
    token_arrays: Mapping[str, np.ndarray | None] | None = None,
    *,
    max_tokens_per_microbatch: int = 8192,
    max_seqs_per_microbatch: int | None = None,
    indices: np.ndarray | None = None,
    pad_token_id: int = 0,
    device: Any = None,
) -> list[MicroBatch]:
    """Plan and collate: a packed batch into a list of micro-batches.

    See :func:`plan_micro_batches` for the grouping and :func:`collate` for the tensors.
    """
    plan = plan_micro_batches(
        batch.lengths,
        max_tokens_per_microbatch,
        max_seqs_per_microbatch=max_seqs_per_microbatch,
        indices=indices,
    )
    return [
        collate(batch, rows, token_arrays, pad_token_id=pad_token_id, device=device)
        for rows in plan
    ]


def scatter_to_packed(
    batch: PackedBatch, mb: MicroBatch, values: Any, out: np.ndarray | None = None
) -> np.ndarray:
    """Write a shifted ``[n, L - 1]`` tensor of a micro-batch back into a float32[T] array
    indexed by packed token (column ``j`` goes to token ``j + 1``). Token 0 of each
    trajectory has no prediction and keeps its previous value (0 for a new array)."""
    if out is None:
        out = np.zeros(batch.num_tokens, dtype=np.float32)
    vals = values.detach().float().cpu().numpy() if hasattr(values, "detach") else values
    for row, b in enumerate(mb.indices):
        start, ln = int(batch.offsets[b]), int(mb.lengths[row])
        if ln > 1:
            out[start + 1 : start + ln] = vals[row, : ln - 1]
    return out
