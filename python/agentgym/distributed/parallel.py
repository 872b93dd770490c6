"""How the learner spreads over processes: the ``parallel`` section of a training config.

``strategy`` picks the layout of the learner's model under ``torchrun`` (one process without
it):

* ``ddp``: every rank holds the whole model, its gradients and the optimizer state
  (:class:`~agentgym.distributed.ddp.DataParallel`);
* ``fsdp``: FSDP2 (``torch.distributed.fsdp.fully_shard``) over all ranks, per decoder layer
  and the root: parameters, gradients and optimizer state are sharded, a layer's parameters
  are gathered only while it runs (:mod:`agentgym.distributed.fsdp`);
* ``hsdp``: FSDP2 on a 2-D mesh, sharded within a node and replicated across nodes
  (``replicate`` replica groups, default the number of nodes ``torchrun`` started).

Under every strategy the rows of a step are split across ranks and the loss normalised as
the data-parallel learner does, so the update is the one-process update.
"""

from __future__ import annotations

from typing import ClassVar

from agentgym.engine.config import ConfigError, ConfigSection

__all__ = ["STRATEGIES", "ParallelConfig"]

STRATEGIES = ("ddp", "fsdp", "hsdp")
_DTYPES = ("float32", "bfloat16", "float16")


class ParallelConfig(ConfigSection):
    """The learner's parallel layout and memory savers (see the module docstring): the
    ``parallel`` section of a training config (a typed section: an unknown key or a wrong
    type is refused where the config is loaded, named ``parallel.<key>``)."""

    config_path: ClassVar[str] = "parallel"

    strategy: str = "ddp"
    # hsdp: the number of replica groups (the mesh's first dimension); None: the number of
    # nodes (WORLD_SIZE / LOCAL_WORLD_SIZE)
    replicate: int | None = None
    # recompute each decoder layer's activations in the backward pass (saves all but the
    # layer inputs)
    activation_checkpointing: bool = False
    # the dtype the sharded layers compute in (MixedPrecisionPolicy.param_dtype); the
    # parameters, gradients and optimizer state stay float32. None: bfloat16 on CUDA,
    # float32 on CPU
    param_dtype: str | None = None
    # the dtype gradients are reduced in (MixedPrecisionPolicy.reduce_dtype)
    reduce_dtype: str = "float32"
    # free a layer's gathered parameters after its forward (gather again for the backward);
    # False keeps them until the backward, trading memory for one all-gather a layer
    reshard_after_forward: bool = True

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"parallel.strategy must be one of {', '.join(STRATEGIES)}, "
                             f"got {self.strategy!r}")
        for name in ("param_dtype", "reduce_dtype"):
            v = getattr(self, name)
            if v is not None and v not in _DTYPES:
                raise ConfigError(f"parallel.{name} must be one of {', '.join(_DTYPES)}, "
                                 f"got {v!r}")
        if self.replicate is not None and (self.strategy != "hsdp" or self.replicate < 1):
            raise ConfigError("parallel.replicate is the number of hsdp replica groups (>= 1, "
                             "with strategy: hsdp)")

    @property
    def sharded(self) -> bool:
        """Whether parameters, gradients and optimizer state are sharded (fsdp, hsdp)."""
        return self.strategy in ("fsdp", "hsdp")

    def compute_dtype(self, device_type: str) -> str:
        """The dtype the layers compute in on ``device_type`` (``param_dtype`` or its
        default)."""
        if self.param_dtype is not None:
            return self.param_dtype
        return "bfloat16" if device_type == "cuda" else "float32"
