"""The sharded learner: FSDP2 (``torch.distributed.fsdp.fully_shard``) under ``torchrun``.

Each decoder layer is one FSDP unit and the learner's :class:`~agentgym.learner.forward.
ForwardUnit` (the policy's embeddings, final norm and LM head) is the root: parameters,
gradients and AdamW's moments live sharded (1/N of the model a rank, float32), and a layer's
parameters are all-gathered in the compute dtype only while it runs. ``hsdp`` shards within a
node and replicates across nodes (a 2-D mesh). The data-parallel rules are
:class:`~agentgym.distributed.ddp.DataParallel`'s (the same row split, the same whole-mini-
batch loss normalisers, the loss scaled by the world size against FSDP's averaging
reduce-scatter), so the update equals the one-process update.

What FSDP adds to the data-parallel contract: every rank must run the same sequence of
forwards and backwards (each one all-gathers, each backward reduce-scatters its gradients,
which accumulate sharded), so a rank with fewer micro-batches than
another runs idle ones (:meth:`ShardedDataParallel.micro_steps`, :meth:`~ShardedDataParallel.
forward_steps`), and the full weights (weight sync, a Hugging Face export) are gathered
tensor by tensor, every rank taking part and rank 0 alone keeping a CPU copy.

Models are built on the meta device on every rank, sharded, given empty storage, then filled
from rank 0's one load of the weights (:func:`build_sharded`): a rank never holds the whole
model. Buffers the state dict does not carry (the rotary ``inv_freq``) are broadcast from
rank 0's loaded copy, since an empty buffer is not recomputed.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from agentgym.distributed.ddp import DataParallel, zero_forward
from agentgym.distributed.parallel import ParallelConfig

__all__ = ["ShardedDataParallel", "build_sharded", "decoder_layers", "gather_state_dict",
           "init_single_process", "make_mesh"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def init_single_process() -> bool:
    """A one-rank gloo (or NCCL) process group, so that a sharded strategy runs in one
    process too (one shard: the whole model, with the same code path and checkpoint format).
    Returns True when it created the group."""
    if dist.is_initialized():
        return False
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return True


def make_mesh(config: ParallelConfig, device_type: str):
    """The device mesh of ``config``: 1-D over every rank for ``fsdp``; for ``hsdp``
    ``(replicate, shard)`` with ``replicate`` the config's, else the number of nodes."""
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()
    if config.strategy != "hsdp":
        return init_device_mesh(device_type, (world,))
    replicate = config.replicate
    if replicate is None:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        replicate = max(1, world // max(local, 1))
    if world % replicate:
        raise ValueError(f"parallel.replicate ({replicate}) must divide the world size "
                         f"({world})")
    return init_device_mesh(device_type, (replicate, world // replicate),
                           mesh_dim_names=("replicate", "shard"))


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks of ``model``: the entries of every ``ModuleList`` named
    ``layers`` (a decoder's layers; a vision-language model's vision layers too)."""
    out: list[torch.nn.Module] = []
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.ModuleList) and name.rsplit(".", 1)[-1] == "layers":
            out.extend(mod)
    return out


def shard_module(module: torch.nn.Module, config: ParallelConfig, mesh, device_type: str
                 ) -> torch.nn.Module:
    """``fully_shard`` each decoder layer of ``module``, then ``module`` itself (the root),
    with the config's mixed precision; returns ``module`` (now an FSDP module)."""
    param = _DTYPES[config.compute_dtype(device_type)]
    mp = MixedPrecisionPolicy(param_dtype=None if param == torch.float32 else param,
                              reduce_dtype=_DTYPES[config.reduce_dtype])
    for layer in decoder_layers(module):
        fully_shard(layer, mesh=mesh, mp_policy=mp,
                    reshard_after_forward=config.reshard_after_forward)
    # the root's parameters (embeddings, norm, head) are used until the backward ends
    fully_shard(module, mesh=mesh, mp_policy=mp, reshard_after_forward=False)
    return module


def build_sharded(make: Callable[[], torch.nn.Module], load: Callable[[], torch.nn.Module] | None,
                  wrap: Callable[[torch.nn.Module], torch.nn.Module], config: ParallelConfig,
                  device: torch.device, mesh) -> torch.nn.Module:
    """A sharded module whose weights are rank 0's: ``make()`` builds the architecture
    (called under the meta device on every rank), ``wrap`` turns it into the module to shard
    (e.g. a :class:`~agentgym.learner.forward.ForwardUnit`), and ``load()`` (rank 0 only)
    returns the same architecture with its weights, whose state and buffers are broadcast
    into every rank's shards. The returned module is sharded, on ``device``, in float32."""
    with torch.device("meta"):
        root = wrap(make())
    shard_module(root, config, mesh, device.type)
    root.to_empty(device=device)
    full: dict[str, torch.Tensor] = {}
    src_buffers: dict[str, torch.Tensor] = {}
    if dist.get_rank() == 0:
        if load is None:
            raise ValueError("build_sharded needs load() on rank 0")
        loaded = wrap(load())
        full = {k: v.to(torch.float32) if v.is_floating_point() else v
                for k, v in loaded.state_dict().items()}
        src_buffers = dict(loaded.named_buffers())
        del loaded
    set_model_state_dict(root, full, options=StateDictOptions(
        full_state_dict=True, broadcast_from_rank0=True))
    full.clear()
    # buffers outside the state dict (rotary inv_freq, ...) are rank 0's loaded values
    with torch.no_grad():
        for name, buf in root.named_buffers():
            if dist.get_rank() == 0:
                buf.copy_(src_buffers[name].to(buf.dtype))
            comm = buf if _gloo_or_device(buf) else buf.cpu()
            dist.broadcast(comm, src=0)
            if comm is not buf:
                buf.copy_(comm)
    return root


def _gloo_or_device(t: torch.Tensor) -> bool:
    """Whether ``t`` can go through the group's collectives as it is (NCCL needs CUDA)."""
    return dist.get_backend() != "nccl" or t.is_cuda


def gather_state_dict(module: torch.nn.Module, *, keep: bool) -> Iterator[tuple[str, torch.Tensor]]:
    """``module``'s state dict with every sharded tensor gathered, one tensor at a time
    (every rank must iterate it, in the same order). With ``keep`` (rank 0) each full
    tensor is yielded as a CPU copy; the other ranks take part in the gathers and yield
    nothing. A tensor shared by two names (tied embeddings) is gathered once, and the second
    name gets its own copy (safetensors, which backends write, refuses shared storage)."""
    seen: dict[int, torch.Tensor] = {}
    for name, value in module.state_dict().items():
        key = id(value)
        if key in seen:
            if keep:
                yield name, seen[key].clone()
            continue
        full = value.full_tensor() if isinstance(value, DTensor) else value
        if keep:
            cpu = full.detach().to("cpu", copy=True)
            seen[key] = cpu
            yield name, cpu
        else:
            seen[key] = torch.empty(0)
        del full


class ShardedDataParallel(DataParallel):
    """One rank of an FSDP2 learner over ``unit`` (a sharded
    :class:`~agentgym.learner.forward.ForwardUnit`) and optionally a sharded value model.

    Same interface as :class:`~agentgym.distributed.ddp.DataParallel`: ``model`` and
    ``value_model`` are what forwards and backwards go through (the sharded forward units
    themselves), ``module`` the policy inside the unit."""

    def __init__(self, unit: torch.nn.Module, value_model: torch.nn.Module | None = None):
        if not isinstance(unit, FSDPModule):
            raise TypeError("ShardedDataParallel takes a module sharded by fully_shard")
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.module = unit.policy
        self.model = unit
        self.value_model = value_model

    def accumulating(self, accumulate: bool):
        """Nothing: every micro-batch's backward reduce-scatters its gradients, which then
        accumulate sharded. Skipping the reduce-scatter until the last micro-batch (FSDP2's
        ``set_requires_gradient_sync(False)``) would keep every layer's unsharded gradient
        on every rank until then: the whole model's gradients in float32 (28 GiB a GPU for
        Qwen2.5-7B), what sharding exists to avoid."""
        return contextlib.nullcontext()

    def micro_steps(self, n_local: int) -> int:
        """The number of forward-backward steps every rank runs for a mini-batch: the most
        micro-batches any rank has (at least one); a rank with fewer runs idle ones."""
        t = self._tensor([max(n_local, 1)], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t[0])

    def forward_steps(self, n_local: int) -> int:
        """The number of forward passes every rank runs for a no-grad pass (at least
        ``n_local``)."""
        t = self._tensor([n_local], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t[0])

    def idle_forward(self, module) -> None:
        """A no-grad forward of ``module`` (the unit, its reference view or the value model)
        on two pad tokens: a rank's share of a pass's all-gathers when it has no rows
        left."""
        ids = torch.zeros((1, 2), dtype=torch.long, device=self.device)
        with torch.no_grad():
            zero_forward(module, ids)

    def join_backward(self, pad_token_id: int = 0) -> None:
        ids = torch.full((1, 2), int(pad_token_id), dtype=torch.long, device=self.device)
        loss = zero_forward(self.model, ids)
        if self.value_model is not None:
            loss = loss + zero_forward(self.value_model, ids)
        loss.backward()

    def state_dict(self, *, critic: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
        """The policy's (or the critic's) full state dict, tensor by tensor
        (:func:`gather_state_dict`; every rank must iterate it; rank 0 gets the tensors)."""
        if critic:
            return gather_state_dict(self.value_model.policy, keep=self.is_main)
        return gather_state_dict(self.module, keep=self.is_main)
