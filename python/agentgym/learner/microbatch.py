"""Micro-batches of a packed trajectory batch: padded, or packed without padding.

A :class:`~agentgym.data.trajectories.PackedBatch` lays B multi-turn trajectories end to
end in flat numpy arrays. The learner turns it into *micro-batches* sized to a token budget,
with every per-token quantity shifted by one so that column ``j`` of row ``i`` of
``loss_mask``, ``old_logprobs``, ``advantages`` ... describes the prediction of token
``j + 1`` of the micro-batch's ``i``-th sample from the model's output at its token ``j``
(the next-token alignment of a causal LM). These per-token tensors are ``[n, L - 1]`` in
both layouts, so the losses, their aggregation modes and :func:`scatter_to_packed` are one
code path.

*Padded* (default): the model input is right-padded ``[n, L]`` ``input_ids`` with an
``attention_mask``; the budget counts padded tokens ``n * L``. Sequences are taken longest
first so that each micro-batch holds sequences of similar length, which keeps padding small.

*Packed* (``packing=True``): the samples lie end to end without padding (``T`` = their
summed lengths, which the budget counts) with ``position_ids`` restarting at 0 at each sample
and no attention mask. A Hugging Face model then keeps attention inside each sample by
itself: SDPA, eager and flex attention build a block-diagonal causal mask from the restarts
of ``position_ids`` in each row (``transformers.masking_utils.find_packed_sequence_indices``),
and flash attention runs its variable-length kernel over the sequences that ``position_ids``
delimits in a single row (``_is_packed_sequence``). That detection is skipped where the model
holds a KV cache, so a packed forward passes ``use_cache=False``.

The micro-batch holds the one row ``[1, T]``; :meth:`MicroBatch.layout` lays it out for a
model's forward (:class:`PackedRows`). Flash attention takes the one row, and so does flex
attention, whose block mask skips the blocks between samples. A dense masked kernel (SDPA,
eager) computes attention over the whole row, ``T**2``, however short its samples, so there
the samples go into a few rows ``[R, W]`` (each sample whole in one row,
each row closed by a filler segment whose positions restart at 0 and whose outputs nothing
reads), ``W`` chosen per micro-batch to minimise the estimated cost ``R * W`` tokens of
linear layers plus ``R * W**2`` of attention (:func:`row_width`). ``PackedRows.index`` maps
each per-token column to the position of its input token in the rows, so the model's
outputs become the ``[n, L - 1]`` layout (:meth:`PackedRows.take`); the output at a
sample's last token, whose next token in the row belongs to another sample, has no column
and is never trained on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agentgym.data.trajectories import BatchFormatError, PackedBatch

__all__ = [
    "MicroBatch",
    "PackedRows",
    "check_packable",
    "collate",
    "make_micro_batches",
    "plan_micro_batches",
    "row_width",
    "scatter_to_packed",
]


@dataclass
class MicroBatch:
    """The tensors of one forward/backward pass over ``n`` samples.

    Padded: ``input_ids``/``attention_mask`` are ``[n, L]`` (``L`` the longest sample).
    Packed (``position_ids`` set): ``input_ids``/``position_ids`` are ``[1, T]``, the
    samples end to end, ``attention_mask`` is None and ``token_index`` ``[n, L - 1]`` is the
    position in that row of sample ``i``'s token ``j`` (-1 past its last target);
    :meth:`layout` gives the rows of a model's forward.

    Every other per-token tensor is ``[n, L - 1]`` and shifted in both layouts: column ``j``
    of row ``i`` refers to the target token ``j + 1`` of sample ``i``, predicted from the
    model's output at its token ``j``. ``loss_mask`` is 1 exactly at model-generated
    targets (observation, prompt and padding tokens are 0). ``indices`` are the
    trajectories' rows in the packed batch, ``lengths`` their token counts. ``images``: the
    pictures of the rows' image placeholder spans, row by row in token order (the packed
    batch's frame arrays, not copies; empty without image observations).
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
    position_ids: Any = None
    token_index: Any = None

    @property
    def packed(self) -> bool:
        """True for the packed layout (one ``[1, T]`` row, no padding)."""
        return self.position_ids is not None

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

        def move(t: Any) -> Any:
            return None if t is None else t.to(device)

        return MicroBatch(
            input_ids=self.input_ids.to(device),
            attention_mask=move(self.attention_mask),
            loss_mask=self.loss_mask.to(device),
            old_logprobs=self.old_logprobs.to(device),
            advantages=self.advantages.to(device),
            indices=self.indices,
            lengths=self.lengths,
            extras={k: v.to(device) for k, v in self.extras.items()},
            images=self.images,
            position_ids=move(self.position_ids),
            token_index=move(self.token_index),
        )

    def model_inputs(self, device: Any = None) -> dict[str, Any]:
        """The keyword arguments of the model's forward (on ``device``): ``input_ids`` and
        ``attention_mask`` when padded; when packed, the one row's (:meth:`rows`)."""
        if self.packed:
            return self.rows().inputs(device)
        ids = self.input_ids if device is None else self.input_ids.to(device)
        att = self.attention_mask if device is None else self.attention_mask.to(device)
        return {"input_ids": ids, "attention_mask": att}

    def layout(self, model: Any) -> PackedRows:
        """The rows of a packed micro-batch for one forward of ``model``: the one row for
        flash attention, else :func:`row_width`'s rows. ValueError where ``model`` is not a
        Hugging Face model (:func:`check_packable`)."""
        return self.rows(row_width(self.lengths, check_packable(model)))

    def rows(self, width: int | None = None) -> PackedRows:
        """The packed samples in rows of ``width`` tokens (at least the longest sample's
        length): whole samples, longest first, each into the first row with room for it;
        each row's free end is a filler segment (token 0, positions restarting at 0), a
        sample of its own to the model whose outputs nothing reads. None: the one row
        ``[1, T]`` without filler."""
        if width is None:
            return PackedRows(self.input_ids, self.position_ids, self.token_index)
        import torch

        lengths = np.asarray(self.lengths, dtype=np.int64)
        if width < lengths.max():
            raise ValueError(f"row width {width} is under the longest sample, {lengths.max()}")
        groups = _first_fit(np.argsort(-lengths, kind="stable"), lengths, width, None)
        n_rows, n = len(groups), lengths.shape[0]
        start = np.zeros(n, dtype=np.int64)  # each sample's first position in the rows
        fill = np.zeros(n_rows, dtype=np.int64)
        for r, g in enumerate(groups):
            start[g] = r * width + np.cumsum(lengths[g]) - lengths[g]
            fill[r] = lengths[g].sum()
        seg = np.repeat(np.arange(n), lengths)
        within = np.arange(seg.shape[0]) - (np.cumsum(lengths) - lengths)[seg]
        new = start[seg] + within  # each packed token's position in the rows
        pos = np.arange(n_rows * width) % width - np.repeat(fill, width)  # filler: from 0
        pos[new] = within
        cols = np.arange(max(int(lengths.max()) - 1, 0))
        index = np.where(cols[None, :] < lengths[:, None] - 1, start[:, None] + cols[None, :],
                         -1)
        device = self.input_ids.device
        ids = self.input_ids.new_zeros(n_rows * width)
        ids[torch.from_numpy(new).to(device)] = self.input_ids[0]
        return PackedRows(ids.view(n_rows, width),
                          torch.from_numpy(pos.reshape(n_rows, width)).to(device),
                          torch.from_numpy(index).to(device))


@dataclass
class PackedRows:
    """Packed samples as the rows of one forward: ``input_ids``/``position_ids``
    ``[R, W]`` (positions restarting at 0 at each sample and filler segment), and
    ``index`` ``[n, L - 1]``, the flat position (``row * W + column``) of sample ``i``'s
    token ``j`` (-1 past its last target), whose target is at the next position."""

    input_ids: Any
    position_ids: Any
    index: Any

    def inputs(self, device: Any = None) -> dict[str, Any]:
        """The forward's keyword arguments (on ``device``): ``input_ids``, ``position_ids``
        and ``use_cache=False`` (without an attention mask and a cache, transformers derives
        the per-sample causal mask from ``position_ids``)."""
        ids, pos = self.input_ids, self.position_ids
        if device is not None:
            ids, pos = ids.to(device), pos.to(device)
        return {"input_ids": ids, "position_ids": pos, "use_cache": False}

    def take(self, values: Any) -> Any:
        """Per-position outputs, flat over the rows (``[P, ...]``, ``P`` >= R * W - 1), in
        the shifted ``[n, L - 1, ...]`` layout: column ``j`` of row ``i`` is the output at
        sample ``i``'s token ``j``; columns past a sample's last target are 0.
        Differentiable."""
        idx = self.index.to(values.device)
        valid = idx >= 0
        out = values[idx.clamp(min=0)]
        return out.masked_fill(~valid.view(valid.shape + (1,) * (out.dim() - 2)), 0)


def row_width(lengths: np.ndarray, config: Any) -> int | None:
    """The row width for packed samples of ``lengths`` in a forward of a model with
    ``config`` (a transformers config): None (the one row) for flash attention, whose
    variable-length kernel needs a single row and attends within each sample anyway, for
    flex attention, whose block mask skips the blocks between samples, and where one row
    is cheapest; else (SDPA, eager) the width that minimises the estimated cost
    ``R * W * (4 d + 3 i + 2 W)`` (the linear layers' and attention's multiply-adds per
    ``d``; ``d``, ``i``: hidden and MLP sizes) over the widths that pack the samples into
    ``R = 1, 2, ...`` rows."""
    lengths = np.asarray(lengths, dtype=np.int64)
    impl = str(getattr(config, "_attn_implementation", "") or "")
    if "flash" in impl or impl == "flex_attention" or lengths.shape[0] < 2:
        return None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    d = int(getattr(text, "hidden_size", 0) or 1024)
    linear = 4 * d + 3 * int(getattr(text, "intermediate_size", 0) or 4 * d)
    total, longest = int(lengths.sum()), int(lengths.max())
    order = np.argsort(-lengths, kind="stable")
    best, best_cost = None, total * (linear + 2 * total)
    most = -(-total // longest)
    widths = {longest}
    for r in np.unique(np.geomspace(2, max(most, 2), num=24).astype(np.int64)):
        base = max(longest, -(-total // int(r)))
        widths |= {base, base + base // 20, base + base // 10}
    for w in sorted(widths):
        if w >= total:
            continue
        cost = len(_first_fit(order, lengths, w, None)) * w * (linear + 2 * w)
        if cost < best_cost:
            best, best_cost = w, cost
    return best


def plan_micro_batches(
    lengths: np.ndarray,
    max_tokens_per_microbatch: int,
    *,
    max_seqs_per_microbatch: int | None = None,
    indices: np.ndarray | None = None,
    packing: bool = False,
) -> list[np.ndarray]:
    """Group sequences into micro-batches of at most ``max_tokens_per_microbatch`` tokens
    and at most ``max_seqs_per_microbatch`` sequences.

    Padded (default): the budget counts *padded* tokens (``n * max_len``); sequences are
    taken longest first and cut into consecutive groups, so each group holds similar
    lengths. Packed (``packing=True``): the budget counts *real* tokens (the summed
    lengths); sequences, longest first, each go to the first group they fit in (first-fit
    decreasing bin packing), so short ones fill the room the long ones leave. Either way a
    sequence longer than the budget gets a micro-batch of its own. ``indices`` restricts
    the plan to those rows (default: all). Returns arrays of row indices.
    """
    if max_tokens_per_microbatch <= 0:
        raise ValueError("max_tokens_per_microbatch must be positive")
    if max_seqs_per_microbatch is not None and max_seqs_per_microbatch <= 0:
        raise ValueError("max_seqs_per_microbatch must be positive")
    lengths = np.asarray(lengths, dtype=np.int64)
    rows = np.arange(lengths.shape[0]) if indices is None else np.asarray(indices, np.int64)
    order = rows[np.argsort(-lengths[rows], kind="stable")]
    if packing:
        return _first_fit(order, lengths, max_tokens_per_microbatch, max_seqs_per_microbatch)
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


def _first_fit(order: np.ndarray, lengths: np.ndarray, budget: int, max_seqs: int | None
               ) -> list[np.ndarray]:
    """Rows ``order`` (longest first) into groups of at most ``budget`` summed lengths and
    ``max_seqs`` rows: each row joins the first group with room for it, else opens one."""
    n = order.shape[0]
    tokens = np.zeros(n, dtype=np.int64)
    counts = np.zeros(n, dtype=np.int64)
    cap = n if max_seqs is None else max_seqs
    groups: list[list[int]] = []
    for r in order.tolist():
        ln = int(lengths[r])
        k = len(groups)
        fits = np.flatnonzero((tokens[:k] + ln <= budget) & (counts[:k] < cap))
        g = int(fits[0]) if fits.size else k
        if g == k:
            groups.append([])
        groups[g].append(r)
        tokens[g] += ln
        counts[g] += 1
    return [np.asarray(g, dtype=np.int64) for g in groups]


def check_packable(model: Any) -> Any:
    """The transformers config of ``model`` (or of the module a wrapper holds: DDP's
    ``module``, a compiled model's ``_orig_mod``, a forward unit's ``policy``, peft's
    ``base_model``); ValueError unless it is a Hugging Face transformers model, the one kind
    whose attention a packed micro-batch can rely on to stay inside each sample (see the
    module docstring)."""
    seen = model
    for _ in range(4):
        cfg = getattr(seen, "config", None)
        if cfg is not None and hasattr(cfg, "_attn_implementation"):
            return cfg
        seen = next((getattr(seen, a) for a in ("module", "_orig_mod", "policy", "unit",
                                                  "base_model") if hasattr(seen, a)), None)
        if seen is None:
            break
    raise ValueError(
        f"packed micro-batches (LearnerConfig.packing) need a Hugging Face transformers "
        f"model, which keeps attention inside each packed sample from position_ids; got "
        f"{type(model).__name__}: set packing=False")


def collate(
    batch: PackedBatch,
    indices: np.ndarray,
    token_arrays: Mapping[str, np.ndarray | None] | None = None,
    *,
    pad_token_id: int = 0,
    device: Any = None,
    packing: bool = False,
) -> MicroBatch:
    """Trajectories ``indices`` of ``batch`` as a :class:`MicroBatch`: right-padded, or with
    ``packing`` end to end in one row (``pad_token_id`` is then unused).

    ``token_arrays`` maps names to float arrays of length T (per packed token, e.g.
    ``advantages``, ``ref_logprobs``, ``returns``, ``values``, ``weights``); each is
    shifted like ``loss_mask``. ``advantages`` is zeros when not given. Packing refuses
    rows with images (ValueError): vision-language inputs keep the padded layout.
    """
    import torch

    indices = np.asarray(indices, dtype=np.int64)
    if packing and batch.images is not None and any(
            batch.images[b].refs for b in indices.tolist()):
        raise ValueError(
            "packed micro-batches (LearnerConfig.packing) do not take image observations: "
            "a vision-language model's inputs keep the padded layout; set packing=False")
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

    position_ids = token_index = None
    if packing:
        starts = (np.cumsum(lengths) - lengths).astype(np.int64)
        flat = (batch.offsets[indices][:, None] + pos[None, :])[valid]  # row-major
        ids = batch.token_ids[flat].astype(np.int64)[None, :]
        position_ids = torch.from_numpy(np.broadcast_to(pos, valid.shape)[valid][None, :])
        # column j of row i: the packed position of sample i's token j (the target j + 1
        # is in the same sample), -1 past the sample's last target
        token_index = torch.from_numpy(np.where(
            pos[None, :-1] < (lengths[:, None] - 1), starts[:, None] + pos[None, :-1], -1))
        mask = None
    mb = MicroBatch(
        input_ids=torch.from_numpy(ids),
        attention_mask=None if mask is None else torch.from_numpy(mask),
        loss_mask=torch.from_numpy(np.ascontiguousarray(lmask)),
        old_logprobs=torch.from_numpy(np.ascontiguousarray(old)),
        advantages=torch.from_numpy(np.ascontiguousarray(adv)),
        indices=indices,
        lengths=lengths,
        extras=extras,
        images=[] if batch.images is None else
        [f.array() for b in indices.tolist() for f in batch.images[b].spans()],
        position_ids=position_ids,
        token_index=token_index,
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
    packing: bool = False,
) -> list[MicroBatch]:
    """Plan and collate: a packed batch into a list of micro-batches (padded, or packed
    with ``packing``).

    See :func:`plan_micro_batches` for the grouping and :func:`collate` for the tensors.
    """
    plan = plan_micro_batches(
        batch.lengths,
        max_tokens_per_microbatch,
        max_seqs_per_microbatch=max_seqs_per_microbatch,
        indices=indices,
        packing=packing,
    )
    return [
        collate(batch, rows, token_arrays, pad_token_id=pad_token_id, device=device,
                packing=packing)
        for rows in plan
    ]


def scatter_to_packed(
    batch: PackedBatch, mb: MicroBatch, values: Any, out: np.ndarray | None = None
) -> np.ndarray:
    """Write a shifted ``[n, L - 1]`` tensor of a micro-batch (either layout) back into a
    float32[T] array indexed by the batch's token (row ``i``'s column ``j`` goes to token
    ``j + 1`` of trajectory ``mb.indices[i]``). Token 0 of each trajectory has no prediction
    and keeps its previous value (0 for a new array)."""
    if out is None:
        out = np.zeros(batch.num_tokens, dtype=np.float32)
    vals = values.detach().float().cpu().numpy() if hasattr(values, "detach") else values
    for row, b in enumerate(mb.indices):
        start, ln = int(batch.offsets[b]), int(mb.lengths[row])
        if ln > 1:
            out[start + 1 : start + ln] = vals[row, : ln - 1]
    return out
