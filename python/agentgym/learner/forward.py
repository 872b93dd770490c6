"""The learner's forward unit: one module whose forward runs any function of the policy.

A data-parallel wrapper (DDP) or an FSDP2 root only does its work (gradient hooks,
all-gathering the root's parameters: embeddings, final norm, LM head) inside its own
``forward``. The learner's log-probabilities do not call the policy's ``forward``: they run
the decoder and then the LM head over the model tokens alone. :class:`ForwardUnit` makes
that one call: ``unit(fn, *args)`` is ``fn(policy, *args)`` run as the unit's forward, so
the same selective path works unwrapped, under DDP and under FSDP2.

:class:`AdapterOff` is the KL reference of a LoRA policy: the same unit with the adapter
disabled for the call (the base weights, no second copy of the model).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["AdapterOff", "ForwardUnit", "adapter_disabled", "policy_of", "unit_of"]


def adapter_disabled(model: Any):
    """Run ``model`` as its base model inside the block (peft's ``disable_adapter``: every
    LoRA layer returns its base layer's output); a model without peft adapters (or a
    wrapper of one, such as DDP) is left as it is, so callers need not check."""
    inner = getattr(model, "module", model)
    if not hasattr(inner, "peft_config") or not hasattr(inner, "disable_adapter"):
        return contextlib.nullcontext()
    return inner.disable_adapter()


class ForwardUnit(torch.nn.Module):
    """``policy`` as a module whose forward runs ``fn(policy, *args, **kwargs)``; with
    ``adapter=False`` the call runs with the policy's LoRA adapter disabled."""

    def __init__(self, policy: torch.nn.Module):
        super().__init__()
        self.policy = policy

    def forward(self, fn: Callable[..., Any], *args: Any, adapter: bool = True,
                **kwargs: Any) -> Any:
        with contextlib.nullcontext() if adapter else adapter_disabled(self.policy):
            return fn(self.policy, *args, **kwargs)


class AdapterOff:
    """The reference policy of a LoRA run: ``unit``'s forward with the adapter disabled.
    Holds no weights of its own; ``eval()``/``train()`` set the unit's mode."""

    def __init__(self, unit: torch.nn.Module):
        self.unit = unit

    def __call__(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self.unit(fn, *args, adapter=False, **kwargs)

    def eval(self) -> AdapterOff:
        self.unit.eval()
        return self

    def train(self, mode: bool = True) -> AdapterOff:
        self.unit.train(mode)
        return self

    def parameters(self):
        return self.unit.parameters()

    def requires_grad_(self, requires_grad: bool = True) -> AdapterOff:
        """Nothing: the weights are the policy's, whose adapter must stay trainable (a
        frozen copy's habitual ``.requires_grad_(False)`` would freeze it); the reference
        pass runs without gradients anyway."""
        return self


def unit_of(model: Any) -> Any:
    """``model`` itself when it runs functions of a policy (a :class:`ForwardUnit`, a
    wrapper of one such as DDP, an :class:`AdapterOff`), else None."""
    if isinstance(model, ForwardUnit | AdapterOff):
        return model
    inner = getattr(model, "module", None)
    return model if isinstance(inner, ForwardUnit) else None


def policy_of(model: Any) -> Any:
    """The policy inside a forward unit (or a wrapper of one, or its reference view);
    ``model`` itself otherwise."""
    unit = unit_of(model)
    if unit is None:
        return model
    unit = unit.unit if isinstance(unit, AdapterOff) else unit
    unit = getattr(unit, "module", unit) if not isinstance(unit, ForwardUnit) else unit
    return unit.policy
