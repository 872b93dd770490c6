"""The learner's memory planner: what one rank of a training run holds on its GPU, before
any weight is loaded.

:func:`plan_memory` takes a :class:`~agentgym.learner.train_config.TrainerConfig` (or its
dict), the number of ranks and nodes and the GPU's memory, builds the model from its
``config.json`` on the meta device (``AutoModelForCausalLM.from_config`` under
``torch.device("meta")``: shapes only, no weights, no network) and returns a
:class:`MemoryPlan`: one :class:`MemoryLine` per kind of memory, the total, whether it fits
and, when it does not, the settings that would make it fit (each checked by planning again
with that change). :meth:`MemoryPlan.render` is the text table ``agentgym-rl plan`` prints;
:func:`check_fits` raises :class:`PlanError` (a ``ValueError``) with a one-line message
naming the setting to change, for a trainer to call before it loads weights.

The model named by ``model`` is found as a local folder with a ``config.json``, as a hub id
with a bundled config (``configs/agentgym_rl/models/<hub id>/config.json``), as ``tiny``
(the ``tiny_model`` architecture) or as a named local model
(:func:`agentgym.models.resolve_model`, e.g. ``smollm2-135m``).

What a rank holds (bytes; ``P`` parameters, ``P_t`` trainable ones, ``S`` the shard group:
1 under ``ddp``, every rank under ``fsdp``, the ranks of a node under ``hsdp``; ``c`` the
compute dtype's bytes, ``s`` the residual stream's bytes, ``r`` the reduce dtype's,
``P_max`` the largest trainable parameter tensor's elements):

* parameters ``4 (P + P_lora) / S``: float32, sharded under fsdp/hsdp (LoRA: the frozen
  base stays float32 too);
* gradients ``4 P_t / S``: float32; under fsdp/hsdp every micro-batch's backward
  reduce-scatters its gradients and they accumulate sharded, so a rank holds its shard
  whatever the number of micro-batches; under ``ddp`` with more than one rank also DDP's
  reducer buckets, another ``4 P_t`` (``gradient_as_bucket_view`` is off);
* optimizer ``8 P_t / S``: AdamW's two moments in float32;
* reference model ``4 P / S`` when a KL to a frozen reference is used (``use_ref_model``
  and ``use_kl_loss`` with ``kl_coef > 0``, or ``use_kl_in_reward``): the float32 copy
  the trainer makes, sharded like the policy; 0 with LoRA (the base with the adapter off);
* critic ``16 P_critic / S`` for ``gae`` (a second backbone with a scalar head);
* gathered weights: under fsdp/hsdp ``c (P_root + 2 P_layer)``, the root (embeddings,
  final norm, LM head: gathered for the whole forward and backward) and two decoder layers
  (the running one and the prefetched next one); under ddp with bf16 autocast
  ``2 P_linear``, the bfloat16 copies of the Linear weights autocast keeps for the
  backward;
* gradients in flight, during a micro-batch's backward: under fsdp/hsdp ``c V h + (c + r)
  P_layer`` (the LM head's unsharded gradient, held until the root reduce-scatters at the
  end of the backward, and one decoder layer's unsharded gradient with its reduce-dtype
  copy, until its reduce-scatter adds it to the sharded gradients; with LoRA only the
  adapter's); under ddp ``8 P_max`` (the fresh gradients of the largest parameters, the LM
  head's and the embeddings', before they are added to the accumulated ones);
* activations of one micro-batch of ``T`` tokens, ``T = max(
  learner.max_tokens_per_microbatch, max_total_tokens)`` (a trajectory longer than the
  budget gets a micro-batch of its own), ``m`` of them model tokens (the plan takes
  ``m = T``). Per token and Llama/Qwen2-style decoder layer, with SDPA/flash attention (no
  ``T^2`` term; k and v at their own head count; the attention output doubles as
  ``o_proj``'s input), ``h`` hidden, ``i`` intermediate, ``a = heads * head_dim``,
  ``kv = kv_heads * head_dim``, a layer saves::

      A = 2 (4 h + s h + c h)               two RMSNorms: float32 input, normalised
                                            input, weighted output (the projections' input)
        + c (2 a + 2 kv) + 4 heads          roped q and k, v, attention output; the
                                            float32 log-sum-exp
        + 4 c i                             gate, SiLU(gate), up, their product
        + sum_lora (c r + [dropout] (c + 1) in)   LoRA's A output (and dropout input)

  The layers keep ``K = L A`` a token, or ``K = L s h`` with activation checkpointing
  (each layer's input; the layer is recomputed in the backward). The backward starts with
  ``saved = T (K + 4 h + s h) + m c h`` (the final norm, the LM head's input rows) and the
  logits below; the decoder layers' backward then holds ``T (K [+ A when checkpointed] + c
  i + 4 s h)`` (the gradient of the MLP's product and of the residual stream); the
  ``backward working set`` line is how far that exceeds the first. A critic (``gae``)
  doubles both;
* logits: ``m' V (20 + c)`` (``20 V`` in float32) for the ``m' = min(m, chunk)`` model
  tokens whose logits exist at once (``learner.logprob_chunk_mib`` of float32 logits;
  all of them when 0): the float32 logits and softmax kept for the backward, the
  backward's gradients of both, and the compute-dtype head output;
* after the backward, once the activations are freed: the root's reduce-scatter
  ``(c + r) P_root`` (fsdp/hsdp) or AdamW's step temporaries (torch's foreach
  implementation on CUDA: ``4 P_t / S``, a float32 square root of every second moment;
  one tensor at a time on CPU: ``8 P_max``), counted only as far as it exceeds the
  backward's lines above;
* the backend's share where it runs beside the learner on rank 0's GPU: vLLM
  (``backend: vllm``, no Ray rollout workers) takes ``gpu_memory_utilization`` (its
  ``backend_kwargs`` or ``engine_kwargs``; vLLM's default 0.9) of the GPU; the
  transformers backend its own weights (``backend_kwargs.dtype``, float32 by default) and
  a KV cache for ``min(max_concurrency, max_batch_size)`` contexts of ``max_total_tokens``.

``s`` is ``c`` under fsdp/hsdp (the layers compute in ``param_dtype``) and 4 under ddp
(float32 weights: the embeddings and residual adds stay float32 even under autocast).
The total is the sum of the lines (the peak of one step: the static memory plus the
larger of the backward's and the after-backward's transients); the CUDA context, NCCL
buffers and allocator fragmentation come on top, so keep a margin.
``bench/planner_check.py`` compares these
figures with the measured peak of a real learner step on CPU.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentgym.learner.train_config import CONFIGS_DIR, RunConfigError

__all__ = [
    "GIB",
    "MemoryLine",
    "MemoryPlan",
    "ModelShape",
    "PlanError",
    "bundled_model_dir",
    "check_fits",
    "model_shape",
    "plan_memory",
]

GIB = 2**30
#: Where the bundled model configs live: ``<hub id>/config.json`` below it.
BUNDLED_MODELS_DIR = CONFIGS_DIR / "agentgym_rl" / "models"
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
#: vLLM's own default ``gpu_memory_utilization``.
VLLM_DEFAULT_UTILIZATION = 0.9
#: TransformersBackend's default ``max_batch_size``.
_TRANSFORMERS_MAX_BATCH = 64


class PlanError(RunConfigError):
    """The run does not fit its GPUs; the message names the setting to change."""


# ----------------------------------------------------------------------------- the model
@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder-only causal LM that the plan needs, counted on a meta build."""

    name: str
    params: int  # unique parameters (tied embeddings counted once)
    layer_params: int  # the largest decoder layer's parameters
    root_params: int  # everything outside the decoder layers
    linear_params: int  # parameters of every nn.Linear (weights and biases)
    largest_param: int  # elements of the largest parameter tensor
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    #: (module name, in_features, out_features) of every Linear in one decoder layer
    layer_linears: tuple[tuple[str, int, int], ...] = field(default=())

    def lora_linears(self, target_modules: str | list[str]) -> list[tuple[int, int]]:
        """``(in, out)`` of the Linears of one decoder layer that LoRA adapts:
        ``"all-linear"`` is every one; a list matches a module name or its last part."""
        if target_modules == "all-linear":
            return [(i, o) for _, i, o in self.layer_linears]
        names = set(target_modules)
        return [(i, o) for n, i, o in self.layer_linears
                if n in names or n.rsplit(".", 1)[-1] in names]


def bundled_model_dir(hub_id: str) -> Path | None:
    """The bundled config folder of the hub id ``hub_id`` (``Org/Name``), if there is one."""
    if "/" not in hub_id or hub_id.startswith(("/", ".")) or ".." in hub_id:
        return None
    d = BUNDLED_MODELS_DIR / hub_id
    return d if (d / "config.json").is_file() else None


def _model_config(model: str, tiny_model: dict[str, Any] | None):
    """The ``transformers`` config of the config's ``model`` (see the module docstring);
    ValueError naming ``model`` when there is none to be had locally."""
    from transformers import AutoConfig

    if model == "tiny":
        from transformers import Qwen2Config

        from agentgym.models.tiny import TinyModelConfig, _hf_config

        arch = dict(tiny_model or {})
        vocab = int(arch.pop("vocab_size", 1024))
        return Qwen2Config(**_hf_config(TinyModelConfig(**arch), vocab, 1, 2))
    path = Path(model).expanduser()
    if (path / "config.json").is_file():
        return AutoConfig.from_pretrained(str(path))
    bundled = bundled_model_dir(model)
    if bundled is not None:
        return AutoConfig.from_pretrained(str(bundled))
    from agentgym.models import is_named_model, resolve_model

    if is_named_model(model):
        return AutoConfig.from_pretrained(resolve_model(model))
    raise ValueError(f"model {model!r}: no local folder with a config.json and no bundled "
                     f"config for this hub id (bundled: {', '.join(_bundled_ids()) or 'none'});"
                     " pass a local model folder as model")


def _bundled_ids() -> list[str]:
    if not BUNDLED_MODELS_DIR.is_dir():
        return []
    return sorted(str(p.parent.relative_to(BUNDLED_MODELS_DIR))
                  for p in BUNDLED_MODELS_DIR.glob("*/*/config.json"))


@functools.lru_cache(maxsize=16)
def _shape_cached(model: str, tiny_json: str) -> ModelShape:
    import torch
    from transformers import AutoModelForCausalLM

    hf = _model_config(model, json.loads(tiny_json))
    with torch.device("meta"):
        try:
            m = AutoModelForCausalLM.from_config(hf)
        except (ValueError, KeyError) as e:
            raise ValueError(f"model {model!r}: the planner takes decoder-only causal LMs "
                             f"({e})") from None
    decoder = m.get_decoder()
    layers = getattr(decoder, "layers", None)
    if layers is None or len(layers) == 0:
        raise ValueError(f"model {model!r}: no decoder layers found (model.layers)")
    params = sum(p.numel() for p in m.parameters())
    per_layer = [sum(p.numel() for p in layer.parameters()) for layer in layers]
    linears = [mod for mod in m.modules() if isinstance(mod, torch.nn.Linear)]
    head = m.get_output_embeddings()
    tc = hf.get_text_config() if hasattr(hf, "get_text_config") else hf
    heads = int(tc.num_attention_heads)
    head_dim = int(getattr(tc, "head_dim", None) or tc.hidden_size // heads)
    return ModelShape(
        name=model, params=params, layer_params=max(per_layer),
        root_params=params - sum(per_layer),
        linear_params=sum(p.numel() for mod in linears for p in mod.parameters(recurse=False)),
        largest_param=max(p.numel() for p in m.parameters()),
        layers=len(layers), hidden=int(tc.hidden_size),
        intermediate=int(tc.intermediate_size), heads=heads,
        kv_heads=int(getattr(tc, "num_key_value_heads", None) or heads), head_dim=head_dim,
        vocab=int(head.out_features), tied=head.weight is m.get_input_embeddings().weight,
        layer_linears=tuple((n, mod.in_features, mod.out_features)
                            for n, mod in layers[0].named_modules()
                            if isinstance(mod, torch.nn.Linear)))


def model_shape(model: str, tiny_model: dict[str, Any] | None = None) -> ModelShape:
    """The :class:`ModelShape` of the config's ``model`` (built once per name on the meta
    device; ``tiny_model`` is the tiny model's architecture overrides)."""
    return _shape_cached(str(model), json.dumps(dict(tiny_model or {}), sort_keys=True))


# ------------------------------------------------------------------------------ the plan
@dataclass
class MemoryLine:
    """One kind of memory on a rank: its bytes and what they are."""

    name: str
    bytes: int
    note: str = ""

    @property
    def gib(self) -> float:
        return self.bytes / GIB


@dataclass
class MemoryPlan:
    """Per-rank memory of a training run (the busiest rank: rank 0, beside the backend).

    ``lines`` sum to ``total``; ``fits`` is ``total <= gpu_memory``; ``margin`` is
    ``gpu_memory - total`` (negative when it does not fit); ``suggestions`` are the
    changes (``key: value``, each with the total it would give) that make it fit.
    ``tokens`` is a micro-batch's tokens, ``logit_tokens`` the model tokens whose logits
    exist at once; ``activations_checkpointed`` / ``activations_full`` are the activations,
    logits and backward working set with activation checkpointing on / off."""

    model: str
    params: int
    trainable: int
    world_size: int
    nodes: int
    shard_group: int
    strategy: str
    compute_dtype: str
    tokens: int
    logit_tokens: int
    activation_checkpointing: bool
    activations_checkpointed: int
    activations_full: int
    lines: list[MemoryLine]
    gpu_memory: int
    backend: str
    suggestions: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(line.bytes for line in self.lines)

    @property
    def margin(self) -> int:
        return self.gpu_memory - self.total

    @property
    def fits(self) -> bool:
        return self.margin >= 0

    def line(self, name: str) -> MemoryLine:
        """The line called ``name`` (KeyError if the plan has none)."""
        for ln in self.lines:
            if ln.name == name:
                return ln
        raise KeyError(name)

    def verdict(self) -> str:
        """One line: fits with its margin, or the shortfall and what to change."""
        head = (f"{self.total / GIB:.2f} GiB of {self.gpu_memory / GIB:g} GiB per GPU")
        if self.fits:
            return f"fits: {head}, margin {self.margin / GIB:.2f} GiB"
        short = f"does not fit: {head} ({-self.margin / GIB:.2f} GiB short)"
        if self.suggestions:
            return f"{short}; change {' or '.join(self.suggestions)}"
        return f"{short}; no single setting makes it fit: use more GPUs or a smaller model"

    def render(self) -> str:
        """The plan as a text table (what ``agentgym-rl plan`` prints)."""
        trained = "all trained" if self.trainable == self.params else \
            f"{self.trainable:,} trained (LoRA)"
        sharding = (f"sharded over {self.shard_group}" if self.shard_group > 1
                    else "not sharded")
        ranks = f"{self.world_size} rank{'s' if self.world_size > 1 else ''}"
        nodes = f"{self.nodes} node{'s' if self.nodes > 1 else ''}"
        out = [f"model {self.model}: {self.params:,} parameters, {trained}",
               f"{ranks} on {nodes}, parallel.strategy {self.strategy} ({sharding}), "
               f"compute {self.compute_dtype}",
               "per GPU (rank 0's: the learner beside the backend):"]
        width = max(len(ln.name) for ln in self.lines) + 2
        for ln in self.lines:
            out.append(f"  {ln.name:<{width}}{ln.gib:>9.2f} GiB  {ln.note}")
        out.append(f"  {'total':<{width}}{self.total / GIB:>9.2f} GiB")
        out.append(self.verdict())
        return "\n".join(out)


def _as_config(cfg: Any):
    from agentgym.learner.train_config import TrainerConfig

    if isinstance(cfg, TrainerConfig):
        return cfg
    if isinstance(cfg, dict):
        return TrainerConfig.from_dict(cfg)
    raise TypeError(f"expected a TrainerConfig or a dict, got {type(cfg).__name__}")


def _backend_share(cfg, shape: ModelShape, gpu_memory: int) -> tuple[int, str]:
    """Bytes the rollout backend takes on rank 0's GPU, and a note saying why."""
    if cfg.num_rollout_workers:
        return 0, f"{cfg.backend} on {cfg.num_rollout_workers} Ray rollout worker(s), not here"
    kw = dict(cfg.backend_kwargs)
    if cfg.backend == "vllm":
        engine = dict(kw.get("engine_kwargs") or {})
        util = engine.get("gpu_memory_utilization", kw.get("gpu_memory_utilization"))
        src = "backend_kwargs.gpu_memory_utilization"
        if util is None:
            util, src = VLLM_DEFAULT_UTILIZATION, "vLLM's default gpu_memory_utilization"
        util = float(util)
        if not 0 < util <= 1:
            raise ValueError(f"backend_kwargs.gpu_memory_utilization must be in (0, 1], "
                             f"got {util!r}")
        return int(util * gpu_memory), f"vLLM colocated: {src} {util:g} of the GPU"
    if cfg.backend == "transformers":
        dtype = str(kw.get("dtype") or "float32").replace("torch.", "")
        b = _DTYPE_BYTES.get(dtype, 4)
        batch = min(int(cfg.max_concurrency), int(kw.get("max_batch_size",
                                                         _TRANSFORMERS_MAX_BATCH)))
        kv = batch * cfg.max_total_tokens * 2 * shape.layers * shape.kv_heads * \
            shape.head_dim * b
        return shape.params * b + kv, (f"transformers backend: {dtype} weights + KV cache "
                                       f"for {batch} x {cfg.max_total_tokens:,} tokens")
    return 0, f"{cfg.backend} backend: not on the learner's GPUs"


@dataclass(frozen=True)
class _Activations:
    """One micro-batch's activation memory (bytes): what is saved when the backward starts,
    the logits, and how far the decoder layers' backward goes beyond those two."""

    saved: int
    logits: int
    working: int

    @property
    def peak(self) -> int:
        return self.saved + self.logits + self.working


def _activations(shape: ModelShape, tokens: int, model_tokens: int, c: int, s: int,
                 checkpointed: bool, lora_extra: int, logit_tokens: int) -> _Activations:
    """The module docstring's activation formula for ``tokens`` tokens, ``model_tokens``
    of them model tokens and ``logit_tokens`` of those with logits at once."""
    h, i, L = shape.hidden, shape.intermediate, shape.layers
    a, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    per_layer = (2 * (4 * h + s * h + c * h) + c * (2 * a + 2 * kv) + 4 * shape.heads
                 + 4 * c * i + lora_extra)
    kept = L * s * h if checkpointed else L * per_layer
    saved = tokens * (kept + 4 * h + s * h) + model_tokens * c * h
    logits = logit_tokens * shape.vocab * (20 + (c if c != 4 else 0))
    layer_phase = tokens * (kept + (per_layer if checkpointed else 0) + c * i + 4 * s * h)
    return _Activations(saved, logits, max(0, layer_phase - saved - logits))


def plan_memory(cfg: Any, world_size: int = 1, gpu_memory_gib: float = 80.0, *,
                nodes: int = 1, device: str = "cuda", model_dir: str | None = None,
                tokens: int | None = None, model_tokens: int | None = None,
                suggest: bool = True) -> MemoryPlan:
    """The :class:`MemoryPlan` of ``cfg`` on ``world_size`` ranks over ``nodes`` nodes with
    ``gpu_memory_gib`` GiB each (see the module docstring for every figure).

    ``device`` is where the learner computes ("cuda": ``param_dtype`` defaults to
    bfloat16; "cpu": float32). ``model_dir`` plans that model folder instead of
    ``cfg.model`` (a trainer that already resolved it). ``tokens`` / ``model_tokens``
    override the micro-batch's tokens and model tokens (default: the config's largest).
    ``suggest`` looks for the settings that make a plan that does not fit fit.
    Bad values raise ValueError naming the setting."""
    from agentgym.learner.lora import LoraSettings
    from agentgym.learner.update import LearnerConfig

    cfg = _as_config(cfg)
    if isinstance(world_size, bool) or int(world_size) < 1:
        raise ValueError(f"world_size (--gpus) must be >= 1, got {world_size!r}")
    if int(nodes) < 1 or world_size % nodes:
        raise ValueError(f"nodes (--nodes) must be >= 1 and divide the {world_size} ranks, "
                         f"got {nodes!r}")
    if not gpu_memory_gib or gpu_memory_gib <= 0:
        raise ValueError(f"gpu memory (--gpu-memory) must be > 0 GiB, got {gpu_memory_gib!r}")
    gpu_memory = int(gpu_memory_gib * GIB)
    par = cfg.parallel_config
    lc = LearnerConfig.from_dict({"adv_estimator": cfg.adv_estimator, "bf16": cfg.bf16,
                                  **cfg.learner})
    shape = model_shape(model_dir or cfg.model, cfg.tiny_model)
    sharded = par.sharded
    if par.strategy == "hsdp":
        replicate = par.replicate or nodes
        if world_size % replicate:
            raise ValueError(f"parallel.replicate ({replicate}) must divide the "
                             f"{world_size} ranks")
        group = world_size // replicate
    else:
        group = world_size if sharded else 1
    if sharded:
        compute = par.compute_dtype(device)
    else:
        compute = "bfloat16" if lc.bf16 else "float32"
    c = _DTYPE_BYTES[compute]
    s = c if sharded else 4
    r = _DTYPE_BYTES[par.reduce_dtype]

    lora = LoraSettings.from_dict(cfg.lora) if cfg.lora is not None else None
    lora_layer = 0
    lora_extra = 0
    if lora is not None:
        targets = shape.lora_linears(lora.target_modules)
        if not targets:
            raise ValueError(f"lora.target_modules {lora.target_modules!r} match no Linear "
                             f"of {shape.name}'s decoder layers")
        lora_layer = sum(lora.r * (i + o) for i, o in targets)
        lora_extra = sum(c * lora.r + ((c + 1) * i if lora.dropout else 0)
                         for i, _ in targets)
    lora_params = lora_layer * shape.layers
    trainable = lora_params if lora is not None else shape.params

    def shard(n: int) -> int:
        return math.ceil(n / group)

    lines: list[MemoryLine] = []
    where = f"sharded 1/{group}" if group > 1 else "whole"
    lines.append(MemoryLine("parameters", 4 * shard(shape.params + lora_params),
                            f"float32, {where}" + (" (frozen base + LoRA)" if lora else "")))
    buckets = 4 * trainable if (not sharded and world_size > 1) else 0
    lines.append(MemoryLine("gradients", 4 * shard(trainable) + buckets,
                            f"float32, {where}" + (" + DDP's reducer buckets" if buckets
                                                   else "")))
    lines.append(MemoryLine("optimizer", 8 * shard(trainable),
                            f"AdamW moments, float32, {where}"))
    wants_kl = (lc.use_kl_loss and lc.kl_coef > 0) or lc.use_kl_in_reward
    if not (cfg.use_ref_model and wants_kl):
        ref, note = 0, "none (no KL to a reference)"
    elif lora is not None:
        ref, note = 0, "the base with the adapter off: no copy"
    else:
        ref, note = 4 * shard(shape.params), f"float32 copy, {where}"
    lines.append(MemoryLine("reference model", ref, note))
    critic = lc.adv_estimator == "gae"
    if critic:
        p_critic = shape.params - (0 if shape.tied else shape.vocab * shape.hidden) + \
            shape.hidden + 1
        lines.append(MemoryLine("critic", 16 * shard(p_critic),
                                f"params + grads + AdamW, float32, {where}"))
    if sharded:
        gathered = c * (shape.root_params + 2 * (shape.layer_params + lora_layer))
        gnote = f"root + 2 decoder layers in {compute}"
    elif c != 4:
        gathered = 2 * shape.linear_params
        gnote = "autocast's bfloat16 copies of the Linear weights"
    else:
        gathered, gnote = 0, "none (float32, unsharded)"
    lines.append(MemoryLine("gathered weights", gathered, gnote))

    longest = int(cfg.max_total_tokens)
    T = int(tokens) if tokens is not None else max(int(lc.max_tokens_per_microbatch), longest)
    chunk = 0
    if lc.logprob_chunk_mib > 0:
        chunk = max(1, int(lc.logprob_chunk_mib * 2**20) // (4 * shape.vocab))
    m_all = T if model_tokens is None else int(model_tokens)
    m = min(m_all, chunk) if chunk else m_all
    m_tok = min(m_all, T)
    act_ck = _activations(shape, T, m_tok, c, s, True, lora_extra, m)
    act_full = _activations(shape, T, m_tok, c, s, False, lora_extra, m)
    ckpt = par.activation_checkpointing
    act = act_ck if ckpt else act_full
    k = 2 if critic else 1  # a critic's backbone runs the same micro-batch
    acts, working, logits = k * act.saved, k * act.working, act.logits

    # gradients held during the backward beyond the sharded (ddp: accumulated) ones, and
    # what comes after it (when the activations are gone): the root's reduce-scatter,
    # AdamW's temporaries
    largest_t = (max(lora.r * max(i, o) for i, o in shape.lora_linears(lora.target_modules))
                 if lora is not None else shape.largest_param)
    if sharded:
        if lora is not None:
            during, after = (c + r) * lora_layer, 0
        else:
            during = c * shape.vocab * shape.hidden + (c + r) * shape.layer_params
            after = (c + r) * shape.root_params
        fnote = "unsharded: the LM head's until the root reduces, one layer's"
    else:
        during, after = 2 * 4 * largest_t, 0
        fnote = "fresh gradients of the largest parameters, before they are accumulated"
    # torch's AdamW: foreach on CUDA (a float32 sqrt of every second moment at once),
    # one parameter at a time elsewhere (two temporaries of the largest one)
    opt_temp = 4 * shard(trainable) if device == "cuda" else 8 * largest_t
    lines.append(MemoryLine("gradients in flight", during, fnote))
    on_off = "on" if ckpt else "off"
    other = act_full if ckpt else act_ck
    lines.append(MemoryLine(
        "activations", acts,
        f"saved for the backward: {T:,} tokens a micro-batch, "
        f"parallel.activation_checkpointing {on_off}" + (" (policy + critic)" if critic else "")))
    lines.append(MemoryLine("logits", logits, f"{m:,} model tokens at once, float32 "
                            f"(learner.logprob_chunk_mib {lc.logprob_chunk_mib:g})"))
    lines.append(MemoryLine(
        "backward working set", working,
        ("a decoder layer recomputed, its gradients" if ckpt else
         "a decoder layer's gradients") + f" (these three lines: {k * act.peak / GIB:.2f} "
        f"GiB; checkpointing {'off' if ckpt else 'on'}: {k * other.peak / GIB:.2f} GiB)"))
    backward = during + acts + logits + working
    later = max(after, opt_temp)
    what = "the root's reduce-scatter" if after >= opt_temp else "AdamW's step temporaries"
    lines.append(MemoryLine("after the backward", max(0, later - backward),
                            f"{what}, {later / GIB:.2f} GiB once the activations are "
                            "freed: what it adds to the backward's peak"))
    backend, bnote = _backend_share(cfg, shape, gpu_memory)
    lines.append(MemoryLine("backend", backend, bnote))
    plan = MemoryPlan(
        model=shape.name, params=shape.params, trainable=trainable, world_size=world_size,
        nodes=nodes, shard_group=group, strategy=par.strategy, compute_dtype=compute,
        tokens=T, logit_tokens=m, activation_checkpointing=ckpt,
        activations_checkpointed=k * act_ck.peak, activations_full=k * act_full.peak,
        lines=lines,
        gpu_memory=gpu_memory, backend=cfg.backend)
    if suggest and not plan.fits:
        plan.suggestions = _suggestions(cfg, plan, world_size, gpu_memory_gib, nodes, device,
                                        model_dir)
    return plan


def _suggestions(cfg, plan: MemoryPlan, world_size: int, gpu_memory_gib: float, nodes: int,
                 device: str, model_dir: str | None) -> list[str]:
    """The single changes that make ``cfg`` fit (each with its total), else the first
    combination of them that does, else more nodes, else none."""

    def fits(overrides: dict[str, Any], world: int = world_size) -> MemoryPlan | None:
        try:
            p = plan_memory(cfg.replace(**overrides), world, gpu_memory_gib, nodes=nodes,
                            device=device, model_dir=model_dir, suggest=False)
        except ValueError:
            return None
        return p if p.fits else None

    def overrides(deltas: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
        """Config overrides of section deltas (``("parallel", {"strategy": "fsdp"})``)."""
        out: dict[str, Any] = {}
        for section, delta in deltas:
            out[section] = {**dict(getattr(cfg, section)), **out.get(section, {}), **delta}
        return out

    longest = int(cfg.max_total_tokens)
    singles: list[tuple[str, tuple[str, dict[str, Any]]]] = []
    if plan.strategy == "ddp" and world_size > 1:
        singles.append(("parallel.strategy: fsdp", ("parallel", {"strategy": "fsdp"})))
    if not plan.activation_checkpointing:
        singles.append(("parallel.activation_checkpointing: true",
                        ("parallel", {"activation_checkpointing": True})))
    found: list[str] = []
    for label, delta in singles:
        p = fits(overrides([delta]))
        if p is not None:
            found.append(_with_total(label, p))
    budget = _largest_budget(cfg, plan, fits)
    if budget:
        found.append(budget)
    util = _largest_utilization(cfg, plan, fits)
    if util:
        found.append(util)
    if cfg.lora is None:
        p = fits({"lora": {}})
        if p is not None:
            found.append(_with_total("lora: {} (r 16, all-linear)", p))
    if found:
        return found
    steps = list(singles)
    if plan.tokens > longest:
        steps.append((f"learner.max_tokens_per_microbatch: {longest}",
                      ("learner", {"max_tokens_per_microbatch": longest})))
    deltas: list[tuple[str, dict[str, Any]]] = []
    labels: list[str] = []
    for label, delta in steps:
        deltas.append(delta)
        labels.append(label)
        p = fits(overrides(deltas))
        if p is not None and len(labels) > 1:
            return [_with_total(" and ".join(labels), p)]
    if plan.strategy != "hsdp":
        over = overrides([*deltas, ("parallel", {"strategy": "fsdp"})])
        per_node = world_size // nodes
        for n in range(nodes + 1, 129):
            p = fits(over, per_node * n)
            if p is not None:
                extra = " and ".join(labels) + " on " if labels else ""
                return [f"{extra}{per_node * n} GPUs (--nodes {n}: "
                        f"{p.total / GIB:.2f} GiB)"]
    return []


def _with_total(label: str, p: MemoryPlan) -> str:
    return f"{label} ({p.total / GIB:.2f} GiB)"


def _largest_budget(cfg, plan: MemoryPlan, fits) -> str | None:
    """``learner.max_tokens_per_microbatch: N`` (the largest N >= ``max_total_tokens``
    that fits, below the current one), else ``max_total_tokens: N`` with that budget."""
    longest = int(cfg.max_total_tokens)
    learner = dict(cfg.learner)
    if plan.tokens > longest and fits({"learner": {**learner,
                                                   "max_tokens_per_microbatch": longest}}):
        lo, hi = longest, plan.tokens
        while hi - lo > 64:
            mid = (lo + hi) // 2
            ok = fits({"learner": {**learner, "max_tokens_per_microbatch": mid}})
            lo, hi = (mid, hi) if ok else (lo, mid)
        if lo > longest:
            p = fits({"learner": {**learner, "max_tokens_per_microbatch": lo}})
            return _with_total(f"learner.max_tokens_per_microbatch: {lo}", p)
        return None
    lo, hi = 0, longest
    while hi - lo > 64:
        mid = (lo + hi) // 2
        ok = fits({"max_total_tokens": mid,
                   "learner": {**learner, "max_tokens_per_microbatch": mid}})
        lo, hi = (mid, hi) if ok else (lo, mid)
    if lo < 256:
        return None
    p = fits({"max_total_tokens": lo, "learner": {**learner, "max_tokens_per_microbatch": lo}})
    return _with_total(f"max_total_tokens: {lo} (and learner.max_tokens_per_microbatch: {lo})",
                       p)


def _largest_utilization(cfg, plan: MemoryPlan, fits) -> str | None:
    """``backend_kwargs.gpu_memory_utilization: U`` (the largest multiple of 0.05 that
    fits) for a colocated vLLM whose share is what does not fit."""
    if cfg.backend != "vllm" or cfg.num_rollout_workers:
        return None
    kw = dict(cfg.backend_kwargs)
    engine = dict(kw.get("engine_kwargs") or {})
    current = plan.line("backend").bytes / plan.gpu_memory
    for pct in range(85, 0, -5):
        util = pct / 100
        if util >= current:
            continue
        over = {**kw, "gpu_memory_utilization": util}
        if "gpu_memory_utilization" in engine:
            over["engine_kwargs"] = {**engine, "gpu_memory_utilization": util}
        p = fits({"backend_kwargs": over})
        if p is not None:
            return _with_total(f"backend_kwargs.gpu_memory_utilization: {util:g}", p)
    return None


def check_fits(cfg: Any, world_size: int, gpu_memory_gib: float, **kwargs: Any) -> MemoryPlan:
    """The plan of ``cfg`` (:func:`plan_memory`, same keyword arguments); raises
    :class:`PlanError` with a one-line message naming the setting to change when it does
    not fit."""
    plan = plan_memory(cfg, world_size, gpu_memory_gib, **kwargs)
    if not plan.fits:
        raise PlanError(f"{plan.model} on {plan.world_size} GPU(s): {plan.verdict()}")
    return plan
