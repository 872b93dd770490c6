"""The data-parallel learner: N processes under ``torchrun`` (gloo on CPU, NCCL on GPU).

Every rank holds the whole :class:`~agentgym.data.trajectories.PackedBatch` of a step (rank 0
collects it and broadcasts it), computes the same advantages and the same mini-batch split,
and then trains on its own share of each mini-batch: the rows are split across ranks by
tokens (longest first, each to the rank with the fewest tokens so far). The loss of every
micro-batch is normalised by the counts of the *whole* mini-batch (model tokens, sequences,
the longest sequence: summed or maxed over ranks), so the sum of all ranks' micro-batch
losses is exactly the single-process mini-batch loss. ``DistributedDataParallel`` reduces the
gradients once per mini-batch (micro-batches before the last one accumulate under
``no_sync``); it averages over ranks, so each rank's loss is scaled by the world size and the
reduced gradient is the single-process gradient. A rank with no rows in a mini-batch still
joins the reduction with a zero-loss backward. Gradient clipping and the optimizer step then
see identical gradients on every rank, so the replicas stay equal.

The forward passes before the update (reference, values, proximal logprobs) are sharded the
same way and summed into the per-token arrays every rank needs.

:class:`DataParallel` is what :func:`agentgym.learner.update.policy_update` takes as
``data_parallel``; :func:`init_from_env` joins the process group that ``torchrun`` describes
(``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``).
"""

from __future__ import annotations

import contextlib
import datetime
import os
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from agentgym.learner.forward import ForwardUnit, unit_of

__all__ = ["DataParallel", "init_from_env", "main_first", "shard_rows", "world_from_env"]


def world_from_env() -> int:
    """The world size ``torchrun`` set (``WORLD_SIZE``), 1 outside it."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def init_from_env(timeout_s: float = 1800.0) -> bool:
    """Join the process group of a ``torchrun`` launch (NCCL when CUDA is available, else
    gloo). Returns False (and does nothing) in a single process; True when the group is up
    (already initialised counts)."""
    if dist.is_available() and dist.is_initialized():
        return True
    if world_from_env() <= 1:
        return False
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    return True


def shard_rows(rows: np.ndarray, lengths: np.ndarray, world_size: int, rank: int) -> np.ndarray:
    """Rank ``rank``'s share of ``rows``, sorted: rows are dealt longest first, each to the
    rank holding the fewest tokens so far (ties to the lowest rank). Deterministic, so every
    rank computes the same split."""
    rows = np.asarray(rows, np.int64)
    if world_size == 1:
        return np.sort(rows)
    lengths = np.asarray(lengths, np.int64)
    order = rows[np.argsort(-lengths[rows], kind="stable")]
    load = np.zeros(world_size, np.int64)
    owner = np.empty(order.shape[0], np.int64)
    for i, r in enumerate(order):
        k = int(np.argmin(load))
        owner[i] = k
        load[k] += lengths[r]
    return np.sort(order[owner == rank])


class DataParallel:
    """One rank of a data-parallel learner: ``model`` in a
    :class:`~agentgym.learner.forward.ForwardUnit` (so the learner's selective log-prob
    path runs inside DDP's forward) and ``value_model``, each wrapped in
    ``DistributedDataParallel`` in the current process group.

    The wrapped modules share their parameters with the plain ones, so the optimizer, the
    checkpoints and the weight sync keep using the plain modules. Buffers are not broadcast
    on forward (ranks run different numbers of micro-batches; every buffer is
    deterministic from the weights).
    """

    def __init__(self, model: torch.nn.Module, value_model: torch.nn.Module | None = None):
        if not dist.is_initialized():
            raise RuntimeError("DataParallel needs an initialised torch.distributed process "
                               "group (launch with torchrun, or call init_from_env())")
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.module = model
        self.model = self._wrap(ForwardUnit(model))
        self.value_model = self._wrap(value_model) if value_model is not None else None

    @staticmethod
    def _wrap(module: torch.nn.Module) -> DistributedDataParallel:
        device = next(module.parameters()).device
        kw: dict[str, Any] = {"forward_sync_buffers": False}
        if device.type == "cuda":
            kw["device_ids"] = [device.index]
        return DistributedDataParallel(module, **kw)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def device(self) -> torch.device:
        return next(self.module.parameters()).device

    # -- splitting the work ----------------------------------------------------------------
    def shard(self, rows: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """This rank's share of ``rows`` (:func:`shard_rows`)."""
        return shard_rows(rows, lengths, self.world_size, self.rank)

    @property
    def loss_scale(self) -> float:
        """DDP averages gradients over ranks: scaling each rank's loss by the world size
        makes the reduced gradient the sum, i.e. the gradient of the global loss."""
        return float(self.world_size)

    def accumulating(self, accumulate: bool):
        """``no_sync`` while gradients only accumulate; the last micro-batch's backward of a
        mini-batch reduces them."""
        if not accumulate:
            return contextlib.nullcontext()
        stack = contextlib.ExitStack()
        stack.enter_context(self.model.no_sync())
        if self.value_model is not None:
            stack.enter_context(self.value_model.no_sync())
        return stack

    def join_backward(self, pad_token_id: int = 0) -> None:
        """A zero-loss forward and backward, so that a rank without rows in a mini-batch
        takes part in its gradient reduction (adds nothing to the sum)."""
        ids = torch.full((1, 2), int(pad_token_id), dtype=torch.long, device=self.device)
        loss = zero_forward(self.model, ids)
        if self.value_model is not None:
            loss = loss + zero_forward(self.value_model, ids)
        loss.backward()

    def micro_steps(self, n_local: int) -> int:
        """The forward-backward steps this rank runs for a mini-batch: its micro-batches,
        or one zero-loss step without any (DDP reduces once, at the last backward)."""
        return max(n_local, 1)

    def forward_steps(self, n_local: int) -> int:
        """The forward passes this rank runs for a no-grad pass: its own (a DDP forward
        needs no other rank)."""
        return n_local

    def idle_forward(self, module) -> None:
        """Nothing: a DDP rank's no-grad forwards are its own."""

    # -- collectives -----------------------------------------------------------------------
    def _tensor(self, values, dtype=torch.float64) -> torch.Tensor:
        # NCCL reduces only CUDA tensors; gloo takes CPU ones.
        dev = self.device if dist.get_backend() == "nccl" else torch.device("cpu")
        return torch.as_tensor(values, dtype=dtype, device=dev)

    def global_counts(self, n_tok: float, n_seq: float, norm_c: float
                      ) -> tuple[float, float, float]:
        """The mini-batch's model tokens and sequences (summed over ranks) and its longest
        sequence (maxed)."""
        sums = self._tensor([n_tok, n_seq])
        dist.all_reduce(sums)
        top = self._tensor([norm_c])
        dist.all_reduce(top, op=dist.ReduceOp.MAX)
        return float(sums[0]), float(sums[1]), float(top[0])

    def sum_array_(self, arr: np.ndarray) -> np.ndarray:
        """Sum a float array over ranks, in place (a per-token array each rank filled at its
        own rows, zeros elsewhere, becomes the whole array)."""
        t = self._tensor(arr, dtype=torch.float32)
        dist.all_reduce(t)
        arr[...] = t.cpu().numpy()
        return arr

    def sum_dict(self, values: dict[str, float]) -> dict[str, float]:
        """Key-wise sums of float dicts over ranks (a key missing on a rank counts 0)."""
        parts: list[Any] = [None] * self.world_size
        dist.all_gather_object(parts, dict(values))
        out: dict[str, float] = {}
        for p in parts:
            for k, v in p.items():
                out[k] = out.get(k, 0.0) + float(v)
        return out

    def broadcast_object(self, obj: Any = None, src: int = 0) -> Any:
        """``obj`` of rank ``src`` on every rank (pickled)."""
        box = [obj]
        dist.broadcast_object_list(box, src=src)
        return box[0]


def zero_forward(module, ids: torch.Tensor) -> torch.Tensor:
    """``0 * sum(output)`` of one plain forward of ``module`` on ``ids`` (a forward unit, or
    a wrapper of one, runs its policy's forward): a step that adds nothing to any gradient
    but takes part in every collective of a forward and backward."""
    mask = torch.ones_like(ids)

    def plain(policy, i, m):
        out = policy(input_ids=i, attention_mask=m)
        return (out.logits if hasattr(out, "logits") else out).float().sum() * 0.0

    return module(plain, ids, mask) if unit_of(module) is not None else plain(module, ids, mask)


def main_first(fn):
    """``fn()`` run on rank 0 only, its result broadcast to every rank (work that must
    happen once, such as building the model folder)."""
    box = [fn() if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]
