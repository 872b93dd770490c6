"""The learner's models under the run's parallel strategy: policy, KL reference, critic,
their optimizers and the data-parallel rank.

:func:`build_learner` is the one place they are made:

* the policy (optionally LoRA adapters over it, :mod:`agentgym.learner.lora`, and
  activation checkpointing) — loaded whole on each rank under ``ddp`` (and in one process),
  or built on the meta device and filled from rank 0's one load under ``fsdp``/``hsdp``
  (:func:`~agentgym.distributed.fsdp.build_sharded`);
* the reference for the KL loss: the LoRA policy with its adapter disabled (no second
  copy), else a frozen copy, sharded like the policy;
* the critic (``gae``), sharded like the policy;
* AdamW over the trainable parameters (only the adapter under LoRA; sharded state under
  FSDP).

:class:`LearnerModels` then answers the questions whose answer depends on the strategy: the
full weights for a weight sync or an export (gathered tensor by tensor under FSDP, merged
under LoRA), and the sharded state a DCP checkpoint holds.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agentgym.distributed.parallel import ParallelConfig
from agentgym.learner.forward import AdapterOff, ForwardUnit

__all__ = ["LearnerModels", "build_learner"]


@dataclass
class LearnerModels:
    """What :func:`build_learner` made (see the module docstring). ``model`` is the policy
    (a peft model under LoRA; its parameters sharded under FSDP), ``unit`` its forward unit
    (the FSDP root under a sharded strategy), ``ref`` what the KL reference pass runs, ``dp``
    the data-parallel rank (None in one process without a sharded strategy)."""

    model: torch.nn.Module
    unit: torch.nn.Module
    optimizer: torch.optim.Optimizer
    parallel: ParallelConfig
    ref: Any = None
    critic: torch.nn.Module | None = None
    critic_optimizer: torch.optim.Optimizer | None = None
    dp: Any = None
    lora: Any = None  # LoraSettings when the policy trains adapters
    critic_unit: Any = None  # the critic's forward unit (the FSDP root) under a sharded strategy

    @property
    def sharded(self) -> bool:
        return self.parallel.sharded and self.dp is not None

    @property
    def is_main(self) -> bool:
        return self.dp is None or self.dp.is_main

    # -- full weights --------------------------------------------------------------------
    def full_weights(self, merge: bool = True) -> dict[str, torch.Tensor] | None:
        """The policy's weights as the base model's Hugging Face state dict (LoRA merged
        into the base weights; ``merge=False``: peft's own names, adapter included), CPU
        copies, on rank 0; None on the other ranks. Under a sharded strategy every rank must
        call it (each tensor is all-gathered in turn)."""
        sd = dict(self.dp.state_dict() if self.sharded else _cpu_copy(self.model))
        if not self.is_main:
            return None
        return self.merge(sd) if merge else sd

    def merge(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The base model's state dict of a full policy state dict (the LoRA adapter merged
        into its base weights; the state itself without LoRA)."""
        if self.lora is None:
            return state
        from agentgym.learner.lora import merged_state_dict

        return merged_state_dict(state, self.lora)

    def save_adapter(self, folder: Path, state: dict[str, torch.Tensor]) -> None:
        """Write the LoRA adapter of ``state`` (the policy's unmerged full state dict, as
        :meth:`full_weights` gives it with ``merge=False``) as peft's adapter folder, which
        peft and vLLM's LoRA requests load."""
        self.model.save_pretrained(str(folder), state_dict=state, safe_serialization=True)

    def critic_weights(self) -> dict[str, torch.Tensor] | None:
        """The critic's state dict (gathered under FSDP; every rank calls it), on rank 0."""
        if self.critic is None:
            return None
        sd = dict(self.dp.state_dict(critic=True) if self.sharded else _cpu_copy(self.critic))
        return sd if self.is_main else None

    # -- sharded checkpoints ---------------------------------------------------------------
    def _dcp_state(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        msd, osd = get_state_dict(self.unit, self.optimizer)
        state = {"model": msd, "optim": osd}
        if self.critic is not None:
            csd, cosd = get_state_dict(self.critic_unit, self.critic_optimizer)
            state.update(critic=csd, critic_optim=cosd)
        return state

    def save_shards(self, path: str | Path) -> None:
        """Every rank writes its shards of the policy, the optimizer (and the critic's) with
        ``torch.distributed.checkpoint`` into ``path`` (a collective)."""
        import torch.distributed.checkpoint as dcp

        dcp.save(self._dcp_state(), checkpoint_id=str(path))

    def load_shards(self, path: str | Path) -> None:
        """Read a checkpoint written by :meth:`save_shards` at any world size into this
        run's shards (a collective)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        state = self._dcp_state()
        dcp.load(state, checkpoint_id=str(path))
        set_state_dict(self.unit, self.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
        if self.critic is not None:
            set_state_dict(self.critic_unit, self.critic_optimizer,
                           model_state_dict=state["critic"],
                           optim_state_dict=state["critic_optim"])


def build_learner(model_dir: str, learner_config, *, device: torch.device,
                  parallel: ParallelConfig, lora: dict | None = None, use_ref: bool = False,
                  critic: bool = False, distributed: bool = False,
                  critic_state: dict | None = None, ref_dir: str | None = None,
                  adapter_dir: str | Path | None = None) -> LearnerModels:
    """The learner's models for ``model_dir`` (see the module docstring). ``use_ref``: a KL
    reference is wanted, with the weights of ``ref_dir`` (default ``model_dir``; a LoRA
    policy's reference is its base); ``critic``: a value model (``gae``), ``critic_state``
    its saved weights; ``adapter_dir``: a saved LoRA adapter to continue (one process and
    ``ddp``; a sharded run reads its adapter from its DCP shards); ``distributed``: running
    under ``torchrun`` (a sharded strategy in one process gets a one-rank group)."""
    from agentgym.learner.update import make_optimizer
    from agentgym.models.vision import policy_class

    settings = None
    if lora is not None:
        from agentgym.learner.lora import LoraSettings

        settings = LoraSettings.from_dict(lora)
    cls = policy_class(model_dir)

    ref_dir = ref_dir or model_dir

    def prepare(m: torch.nn.Module) -> torch.nn.Module:
        if settings is not None:
            from agentgym.learner.lora import apply_lora

            m = apply_lora(m, settings)
            if adapter_dir is not None and not parallel.sharded:
                from agentgym.learner.lora import load_adapter_into

                load_adapter_into(m, adapter_dir)
        if parallel.activation_checkpointing:
            _checkpointing(m)
        return m

    def load_policy() -> torch.nn.Module:
        return cls.from_pretrained(model_dir, dtype=torch.float32)

    def load_ref() -> torch.nn.Module:
        return cls.from_pretrained(ref_dir, dtype=torch.float32)

    if parallel.sharded:
        return _build_sharded(model_dir, cls, load_policy, load_ref, prepare, learner_config,
                              device=device, parallel=parallel, settings=settings,
                              use_ref=use_ref, critic=critic, distributed=distributed,
                              critic_state=critic_state)
    model = prepare(load_policy()).to(device)
    unit = ForwardUnit(model)
    ref = None
    if use_ref and settings is not None:
        ref = AdapterOff(unit)
    elif use_ref:
        ref = (copy.deepcopy(model) if ref_dir == model_dir else load_ref().to(device))
        ref.eval().requires_grad_(False)
    value = value_opt = None
    if critic:
        value = _load_critic(model_dir).to(device)
        if critic_state is not None:
            value.load_state_dict(critic_state)
        value_opt = make_optimizer(value, learner_config, critic=True)
    dp = None
    if distributed:
        from agentgym.distributed.ddp import DataParallel

        dp = DataParallel(model, value)
    return LearnerModels(model=model, unit=unit, optimizer=make_optimizer(model, learner_config),
                         parallel=parallel, ref=ref, critic=value, critic_optimizer=value_opt,
                         dp=dp, lora=settings)


def _build_sharded(model_dir, cls, load_policy, load_ref, prepare, learner_config, *, device,
                   parallel,
                   settings, use_ref, critic, distributed, critic_state) -> LearnerModels:
    import torch.distributed as dist
    from transformers import AutoConfig

    from agentgym.distributed.fsdp import (
        ShardedDataParallel,
        build_sharded,
        init_single_process,
        make_mesh,
    )
    from agentgym.learner.update import make_optimizer

    if not distributed:
        init_single_process()
    mesh = make_mesh(parallel, device.type)
    config = AutoConfig.from_pretrained(model_dir)
    main = dist.get_rank() == 0

    def make_policy() -> torch.nn.Module:
        return cls.from_config(config, dtype=torch.float32)

    unit = build_sharded(lambda: prepare(make_policy()),
                         (lambda: prepare(load_policy())) if main else None,
                         ForwardUnit, parallel, device, mesh)
    model = unit.policy
    ref = None
    if use_ref and settings is not None:
        ref = AdapterOff(unit)
    elif use_ref:
        ref = build_sharded(make_policy, load_ref if main else None, ForwardUnit,
                            parallel, device, mesh)
        ref.eval().requires_grad_(False)
    value = value_opt = None
    if critic:
        def load_critic():
            c = _load_critic(model_dir)
            if critic_state is not None:
                c.load_state_dict(critic_state)
            return c

        value = build_sharded(lambda: _critic_from_config(config), load_critic if main else None,
                              ForwardUnit, parallel, device, mesh)
        value_opt = make_optimizer(value, learner_config, critic=True)
    dp = ShardedDataParallel(unit, value)
    return LearnerModels(model=model, unit=unit, optimizer=make_optimizer(model, learner_config),
                         parallel=parallel, ref=ref,
                         critic=value.policy if value is not None else None,
                         critic_optimizer=value_opt, dp=dp, lora=settings,
                         critic_unit=value)


def _cpu_copy(module: torch.nn.Module):
    """``module``'s state dict as CPU copies, name by name."""
    return ((k, v.detach().to("cpu", copy=True)) for k, v in module.state_dict().items())


def _checkpointing(model: torch.nn.Module) -> None:
    """Recompute each decoder layer in the backward pass (non-reentrant checkpoints)."""
    enable: Callable | None = getattr(model, "gradient_checkpointing_enable", None)
    if enable is None:
        raise ValueError("parallel.activation_checkpointing: the model has no "
                         "gradient_checkpointing_enable (not a Hugging Face model)")
    enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def _load_critic(model_dir: str) -> torch.nn.Module:
    """The critic: the model folder's decoder under a fresh one-output head, the head drawn
    from its own seed (the same whatever the strategy drew before it), without dropout (a
    value is a function of the state: the same on every rank and in every pass)."""
    from transformers import AutoConfig, AutoModelForTokenClassification

    config = _critic_config(AutoConfig.from_pretrained(model_dir))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return AutoModelForTokenClassification.from_pretrained(model_dir, config=config,
                                                               dtype=torch.float32)


def _critic_config(config):
    """``config`` for a critic: one output, no dropout before it."""
    cfg = copy.deepcopy(config)
    cfg.num_labels, cfg.classifier_dropout = 1, 0.0
    return cfg


def _critic_from_config(config) -> torch.nn.Module:
    from transformers import AutoModelForTokenClassification

    return AutoModelForTokenClassification.from_config(_critic_config(config),
                                                       dtype=torch.float32)
