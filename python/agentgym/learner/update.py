"""One learner step: advantages, micro-batched forward/backward, clipping, optimizer step.

Works with any Hugging Face causal LM (``model(input_ids=..., attention_mask=...).logits``)
or any module returning logits of shape ``[n, L, V]``. A value model (PPO/GAE) is any
module returning ``[n, L]`` or ``[n, L, 1]`` scores (or an object with ``.logits`` of
that shape), e.g. ``AutoModelForTokenClassification(num_labels=1)``.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
from collections import defaultdict
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import numpy as np
import torch

from agentgym.data.trajectories import PackedBatch
from agentgym.learner.advantages import (
    ESTIMATORS,
    AdvantageResult,
    compute_advantages,
    validity,
)
from agentgym.learner.forward import policy_of, unit_of
from agentgym.learner.losses import (
    AGG_MODES,
    KL_ESTIMATORS,
    OFF_POLICY_MODES,
    agg_loss,
    behaviour_weights,
    kl_penalty,
    policy_loss,
    staleness_weights,
    value_loss,
)
from agentgym.learner.microbatch import (
    MicroBatch,
    collate,
    plan_micro_batches,
    scatter_to_packed,
)

__all__ = [
    "LearnerConfig",
    "compute_logprobs",
    "compute_values",
    "make_optimizer",
    "policy_update",
]


@dataclass
class LearnerConfig:
    """Every knob of :func:`policy_update`, with defaults from AgentGym-RL/verl recipes."""

    # advantages
    adv_estimator: str = "grpo"  # grpo | rloo | reinforce_pp | reinforce_pp_baseline | gae | rae
    norm_adv_by_std: bool = True  # False: Dr.GRPO (r - group mean)
    adv_eps: float = 1e-6
    # branched groups (RolloutConfig.branch_at): weight of the step-group advantage
    branch_step_weight: float = 1.0
    gamma: float = 1.0
    lam: float = 1.0
    reward_placement: str = "turns"  # turns | outcome (token-level estimators)
    truncated: str = "keep"  # keep | zero | drop | bootstrap (gae only)
    overlong: str = "keep"  # keep | zero | drop (stop_reason 'length')
    whiten_advantages: bool = True  # gae: whiten advantages across the batch (as verl)
    # policy loss
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.28
    clip_ratio_c: float | None = 3.0  # dual clip; None disables
    loss_agg_mode: str = "token-mean"
    loss_norm_constant: float | None = None  # seq-mean-token-sum-norm; None: longest seq
    entropy_coeff: float = 0.0
    temperature: float = 1.0  # logits are divided by the sampling temperature
    # KL to the frozen reference
    use_kl_loss: bool = True
    kl_coef: float = 1e-3
    kl_estimator: str = "low_var_kl"
    use_kl_in_reward: bool = False  # reinforce_pp / gae: reward -= kl_reward_coef * KL
    kl_reward_coef: float = 1e-3
    kl_reward_estimator: str = "kl"
    # critic (gae)
    vf_coef: float = 1.0
    cliprange_value: float | None = 0.5
    # optimisation
    lr: float = 1e-6
    critic_lr: float = 1e-5
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8
    max_grad_norm: float | None = 1.0
    ppo_epochs: int = 1
    num_mini_batches: int = 1  # optimizer steps per epoch
    shuffle: bool = True
    seed: int = 0
    # batching
    max_tokens_per_microbatch: int = 8192  # padded tokens (n * max_len) per forward;
    # with packing, real tokens (the samples' summed lengths)
    max_seqs_per_microbatch: int | None = None
    # lay each micro-batch's samples end to end in one [1, T] row without padding
    # (position_ids restarting per sample; transformers keeps attention inside each sample:
    # microbatch.py). Needs a Hugging Face model; refused with image observations
    packing: bool = False
    pad_token_id: int = 0
    bf16: bool = False  # torch.autocast(bfloat16) for forward passes (CPU or GPU)
    # the most memory (MiB) one chunk of float32 full-vocabulary logits may take: the LM
    # head, log-softmax and entropy run over that many model tokens at a time (recomputed
    # in the backward pass); 256 MiB is 1,365 tokens at a 49,152-token vocabulary and more
    # than any micro-batch at 1,024. 0: all at once
    logprob_chunk_mib: float = 256.0
    # off-policy / staleness
    old_logprob_source: str = "behaviour"  # behaviour | recompute (proximal policy + TIS)
    tis_cap: float | None = 2.0  # behaviour-weight cap when old_logprob_source == "recompute"
    # tokens whose behaviour weight exceeds tis_cap: "tis" truncates the weight at the cap,
    # "decoupled" drops the token (losses.behaviour_weights)
    off_policy: str = "tis"
    max_staleness: int | None = None  # policy versions; None keeps everything
    staleness_mode: str = "drop"  # drop | downweight
    staleness_decay: float = 0.5

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ValueError on inconsistent settings."""
        checks = [
            (self.adv_estimator in ESTIMATORS, f"adv_estimator must be one of {ESTIMATORS}"),
            (self.loss_agg_mode in AGG_MODES, f"loss_agg_mode must be one of {AGG_MODES}"),
            (self.kl_estimator in KL_ESTIMATORS, f"kl_estimator must be one of {KL_ESTIMATORS}"),
            (self.kl_reward_estimator in KL_ESTIMATORS, "unknown kl_reward_estimator"),
            (self.old_logprob_source in ("behaviour", "recompute"),
             "old_logprob_source must be 'behaviour' or 'recompute'"),
            (self.staleness_mode in ("drop", "downweight"), "staleness_mode: drop|downweight"),
            (self.off_policy in OFF_POLICY_MODES,
             f"off_policy must be one of {OFF_POLICY_MODES}"),
            (0 <= self.clip_ratio_low < 1 and self.clip_ratio_high >= 0, "bad clip ratios"),
            (self.clip_ratio_c is None or self.clip_ratio_c > 1, "clip_ratio_c must be > 1"),
            (self.ppo_epochs >= 1 and self.num_mini_batches >= 1, "epochs/mini-batches >= 1"),
            (self.max_tokens_per_microbatch > 0, "max_tokens_per_microbatch must be > 0"),
            (isinstance(self.packing, bool), "packing must be True or False"),
            (self.logprob_chunk_mib >= 0, "logprob_chunk_mib must be >= 0"),
            (0 <= self.gamma <= 1 and 0 <= self.lam <= 1, "gamma and lam must be in [0, 1]"),
            (self.temperature > 0, "temperature must be > 0"),
            (self.truncated != "bootstrap" or self.adv_estimator == "gae",
             "truncated='bootstrap' needs adv_estimator='gae'"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(f"LearnerConfig: {msg}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LearnerConfig:
        """Build from a dict; unknown keys raise ValueError."""
        names = {f.name for f in fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown LearnerConfig keys: {sorted(unknown)}")
        d = dict(d)
        if "betas" in d:
            d["betas"] = tuple(d["betas"])
        return cls(**d)


def make_optimizer(
    model: torch.nn.Module, config: LearnerConfig, *, lr: float | None = None,
    critic: bool = False,
) -> torch.optim.AdamW:
    """AdamW over the trainable parameters with the config's betas/eps/weight decay and
    ``config.lr`` (``config.critic_lr`` with ``critic=True``; ``lr`` overrides both)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if lr is None:
        lr = config.critic_lr if critic else config.lr
    return torch.optim.AdamW(params, lr=lr, betas=config.betas, eps=config.adam_eps,
                             weight_decay=config.weight_decay)


def _autocast(device: torch.device, enabled: bool):
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def _model_device(model: torch.nn.Module) -> torch.device:
    try:
        return next(model.parameters()).device
    except StopIteration:
        return torch.device("cpu")


def _logits(out: Any) -> torch.Tensor:
    return out.logits if hasattr(out, "logits") else out


@functools.lru_cache(maxsize=8)
def _vision_spec(path: str):
    """The vision spec of the model folder ``path`` (read once per folder)."""
    from agentgym.models.vision import VisionSpec

    return VisionSpec.from_model(path)


def _pixel_inputs(model: torch.nn.Module, images: list, device) -> dict[str, torch.Tensor]:
    """The image inputs of ``model`` for ``images`` (its vision spec read from the folder
    it was loaded from); ``ValueError`` where the model has none."""
    path = getattr(getattr(model, "config", None), "_name_or_path", None) or getattr(
        model, "name_or_path", None)
    spec = _vision_spec(str(path)) if path else None
    if spec is None:
        raise ValueError("the batch has images but the model (loaded from "
                         f"{path or 'an unknown folder'}) has no image processor")
    return {k: v.to(device) for k, v in spec.pixel_inputs(images).items()}


def _decoder_and_head(model: torch.nn.Module, pixels: dict | None = None):
    """``(decoder, lm_head)`` of a Hugging Face causal LM whose logits are
    ``lm_head(decoder(...).last_hidden_state)`` (no logit soft-capping or scaling), else
    None. A wrapper whose forward does more than its modules (DDP) gets None. With image
    inputs (``pixels``) the decoder is the vision-language model's base (``model.model``,
    which merges the pictures into the sequence), or None where it has no such base."""
    if pixels:
        base, head = getattr(model, "model", None), getattr(model, "lm_head", None)
        forward = getattr(base, "forward", None)
        if forward is None or not isinstance(head, torch.nn.Linear) or \
                "pixel_values" not in inspect.signature(forward).parameters:
            return None
        return base, head
    get_dec = getattr(model, "get_decoder", None)
    get_head = getattr(model, "get_output_embeddings", None)
    cfg = getattr(model, "config", None)
    if get_dec is None or get_head is None or cfg is None:
        return None
    if getattr(cfg, "final_logit_softcapping", None) or getattr(cfg, "logit_scale", None):
        return None
    try:
        dec, head = get_dec(), get_head()
    except (AttributeError, NotImplementedError):
        return None
    if not isinstance(dec, torch.nn.Module) or not isinstance(head, torch.nn.Linear):
        return None
    return dec, head


def _token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float,
                    with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprob of each row's target and (optionally) the row's entropy, from float32
    ``logits`` ``[..., V]``."""
    if temperature != 1.0:
        logits = logits / temperature
    lse = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    if not with_entropy:
        return logp, None
    probs = torch.softmax(logits, dim=-1)
    return logp, lse - (probs * logits).sum(dim=-1)


def _head_logprobs(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor,
                   temperature: float, with_entropy: bool, bf16: bool, chunk: int
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`_token_logprobs` of ``head(hidden)`` for rows of hidden states, ``chunk`` rows
    at a time: each chunk's ``[chunk, V]`` float32 logits are freed once its logprobs are
    taken, and under autograd recomputed in the backward pass (activation
    checkpointing), so the full ``[rows, V]`` tensor never exists. ``chunk`` 0 (or no more
    rows than it): one pass."""

    def run(h: torch.Tensor, t: torch.Tensor):
        with _autocast(h.device, bf16):
            logits = head(h).float()
        logp, ent = _token_logprobs(logits, t, temperature, with_entropy)
        return (logp, ent) if ent is not None else (logp,)

    n = hidden.shape[0]
    if chunk <= 0 or n <= chunk:
        out = run(hidden, targets)
    else:
        from torch.utils.checkpoint import checkpoint

        grad = torch.is_grad_enabled() and hidden.requires_grad
        parts = [checkpoint(run, hidden[i:i + chunk], targets[i:i + chunk],
                            use_reentrant=False) if grad
                 else run(hidden[i:i + chunk], targets[i:i + chunk])
                 for i in range(0, n, chunk)]
        out = tuple(torch.cat(cols) for cols in zip(*parts))
    return out[0], (out[1] if with_entropy else None)


def compute_logprobs(
    model: torch.nn.Module,
    mb: MicroBatch,
    *,
    temperature: float = 1.0,
    with_entropy: bool = True,
    bf16: bool = False,
    only_model_tokens: bool = True,
    chunk_tokens: int = 0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprobs of the next tokens ``[n, L - 1]`` (float32) and, optionally, the entropy of
    each next-token distribution, from ``model(input_ids, attention_mask).logits``.

    With ``only_model_tokens`` (and a plain Hugging Face causal LM) the LM head and the
    log-softmax run only where ``mb.loss_mask`` is 1 (the model's own tokens) and the
    other columns are 0: the full-vocabulary float32 logits of prompt and observation
    tokens, which nothing reads, are never made; ``chunk_tokens`` > 0 then bounds how many
    model tokens' logits exist at once (:func:`_head_logprobs`).

    A micro-batch with images (``mb.images``) also gives the model the pictures' inputs
    (``pixel_values`` and its mask, from the model's own image processor,
    :meth:`~agentgym.models.vision.VisionSpec.pixel_inputs`): the same inputs the backend
    was sent.

    A packed micro-batch (``mb.packed``) runs one forward over its rows for this model
    (:meth:`MicroBatch.layout`) and returns the same ``[n, L - 1]`` layout, read at
    ``PackedRows.index``."""
    unit = unit_of(model)
    if unit is not None:  # a forward unit (DDP's, FSDP's root): the same call inside it
        return unit(compute_logprobs, mb, temperature=temperature, with_entropy=with_entropy,
                    bf16=bf16, only_model_tokens=only_model_tokens, chunk_tokens=chunk_tokens)
    device = _model_device(model)
    packed = mb.layout(model) if mb.packed else None
    inputs = packed.inputs(device) if packed is not None else mb.model_inputs(device)
    ids = inputs["input_ids"]
    pixels = _pixel_inputs(model, mb.images, device) if mb.images else {}
    parts = _decoder_and_head(model, pixels) if only_model_tokens else None
    if parts is None:
        with _autocast(device, bf16):
            out = model(**inputs, **pixels)
        if packed is None:
            logits, targets = _logits(out)[:, :-1].float(), ids[:, 1:]
            return _token_logprobs(logits, targets, temperature, with_entropy)
        logits = _logits(out).flatten(0, 1)[:-1].float()  # flat over the rows
        logp, entropy = _token_logprobs(logits, ids.flatten()[1:], temperature, with_entropy)
        return packed.take(logp), (packed.take(entropy) if entropy is not None else None)
    decoder, head = parts
    select = mb.loss_mask.to(device) > 0
    with _autocast(device, bf16):
        hidden = decoder(**inputs, **pixels).last_hidden_state
    if packed is not None:  # the model tokens' input positions in the rows
        at = packed.index.to(device)[select]
        rows, targets = hidden.flatten(0, 1)[at], ids.flatten()[at + 1]
    else:
        rows, targets = hidden[:, :-1][select], ids[:, 1:][select]
    logp, entropy = _head_logprobs(head, rows, targets, temperature, with_entropy, bf16,
                                   chunk_tokens)
    logp = _scatter_rows(logp, select)
    entropy = _scatter_rows(entropy, select) if entropy is not None else None
    return logp, entropy


def _chunk_tokens(model: torch.nn.Module, config: LearnerConfig) -> int:
    """Model tokens per log-prob chunk: ``logprob_chunk_mib`` of float32 logits at the
    model's vocabulary size (0: no chunking)."""
    if config.logprob_chunk_mib <= 0:
        return 0
    model = policy_of(model)
    head = getattr(model, "get_output_embeddings", lambda: None)()
    vocab = getattr(head, "out_features", None) or getattr(
        getattr(model, "config", None), "vocab_size", None)
    if not vocab:
        return 0
    return max(1, int(config.logprob_chunk_mib * 2**20) // (4 * int(vocab)))


def _scatter_rows(values: torch.Tensor, select: torch.Tensor) -> torch.Tensor:
    """``values`` (one per True of ``select``) placed into zeros of ``select``'s shape."""
    out = values.new_zeros(select.shape)
    out[select] = values
    return out


def compute_values(value_model: torch.nn.Module, mb: MicroBatch, *, bf16: bool = False
                   ) -> torch.Tensor:
    """Shifted values ``[n, L - 1]``: column ``j`` (critic output at position ``j``) is the
    value of the state before target token ``j + 1`` is emitted. A packed micro-batch runs
    one forward over its rows for this model (:meth:`MicroBatch.layout`), read back at
    ``PackedRows.index`` (0 past each sample)."""
    if unit_of(value_model) is not None:  # a forward unit (FSDP's root): the call inside it
        return value_model(compute_values, mb, bf16=bf16)
    device = _model_device(value_model)
    packed = mb.layout(value_model) if mb.packed else None
    with _autocast(device, bf16):
        out = value_model(**(packed.inputs(device) if packed is not None
                             else mb.model_inputs(device)))
    v = _logits(out).float()
    if v.dim() == 3:
        v = v.squeeze(-1)
    # a new tensor, not a view of the output (an FSDP root hooks its output's backward)
    return packed.take(v.flatten()) if packed is not None else v[:, :-1].clone()


@torch.no_grad()
def _packed_pass(fn, plan, pb: PackedBatch, config: LearnerConfig, dp=None, module=None
                 ) -> np.ndarray:
    """Run ``fn(micro_batch) -> [n, L-1]`` over the plan; scatter into float32[T] (with
    ``dp``, each rank's rows summed into the whole array; under a sharded ``dp`` a rank
    with fewer micro-batches runs idle forwards of ``module`` so every rank runs as many)."""
    out = np.zeros(pb.num_tokens, dtype=np.float32)
    for rows in plan:
        mb = collate(pb, rows, pad_token_id=config.pad_token_id, packing=config.packing)
        scatter_to_packed(pb, mb, fn(mb), out)
    if dp is not None:
        for _ in range(dp.forward_steps(len(plan)) - len(plan)):
            dp.idle_forward(module)
    return out if dp is None else dp.sum_array_(out)


def _to_floats(values: dict[str, Any]) -> dict[str, float]:
    """Scalar tensors (and numbers) as floats, read back from the device in one transfer."""
    if not values:
        return {}
    device = next((v.device for v in values.values() if torch.is_tensor(v)), "cpu")
    stacked = torch.stack([
        v.detach().reshape(()).to(device, torch.float64) if torch.is_tensor(v)
        else torch.tensor(float(v), dtype=torch.float64, device=device)
        for v in values.values()])
    return dict(zip(values, stacked.tolist()))


class _Stats:
    """Weighted running means of metric tensors (weights: model tokens per micro-batch),
    summed on the metrics' device and read back once (``floats``)."""

    def __init__(self) -> None:
        self.sums: dict[str, Any] = {}
        self.weights: dict[str, float] = defaultdict(float)

    def add(self, metrics: dict[str, Any], weight: float) -> None:
        for k, v in metrics.items():
            v = v.detach().to(torch.float64) if torch.is_tensor(v) else float(v)
            self.sums[k] = self.sums[k] + v * weight if k in self.sums else v * weight
            self.weights[k] += weight

    def floats(self) -> None:
        """Read the sums back from the device (one transfer)."""
        self.sums = _to_floats(self.sums)

    def means(self) -> dict[str, float]:
        self.floats()
        return {k: self.sums[k] / self.weights[k] for k in self.sums if self.weights[k] > 0}


def policy_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    packed_batch: PackedBatch,
    config: LearnerConfig | None = None,
    ref_model: torch.nn.Module | None = None,
    value_model: torch.nn.Module | None = None,
    *,
    critic_optimizer: torch.optim.Optimizer | None = None,
    current_version: int | None = None,
    data_parallel: Any = None,
    role_baseline: np.ndarray | None = None,
) -> dict[str, float]:
    """One learner step on a packed batch; returns verl-named metrics.

    Order: staleness weights -> (value pass for ``gae``) -> (reference pass when a KL is
    used) -> advantages -> (proximal pass for ``old_logprob_source="recompute"``) ->
    ``ppo_epochs`` x ``num_mini_batches`` optimizer steps, each accumulating gradients
    over token-budgeted micro-batches. Each micro-batch loss is normalised by the
    mini-batch's *global* token/sequence counts, so accumulation reproduces the loss of
    the whole mini-batch exactly. Invalid (failed, dropped, too stale) trajectories are
    not in any micro-batch. The value loss is added to the same backward pass; its
    parameters are stepped by ``critic_optimizer`` if given (else ``optimizer`` must hold
    them). ``current_version`` defaults to the newest ``policy_version`` in the batch.

    ``data_parallel`` (an :class:`agentgym.distributed.ddp.DataParallel`, on every rank with
    the same batch): each rank runs its token share of every pass and mini-batch, the loss
    normalisers are the whole mini-batch's and the gradients are reduced across ranks, so
    the update equals the single-process one.

    ``role_baseline`` (float[B]): each trajectory's role baseline, for ``adv_estimator="rae"``
    (:class:`~agentgym.learner.advantages.RoleBaseline`).
    """
    config = config or LearnerConfig()
    dp = data_parallel
    pb = packed_batch
    if len(pb) == 0:
        return {"learner/num_trajectories": 0.0}
    use_kl = ref_model is not None and (config.use_kl_loss or config.use_kl_in_reward)
    if config.adv_estimator == "gae" and value_model is None:
        raise ValueError("adv_estimator='gae' needs a value_model")
    version = int(pb.policy_version.max()) if current_version is None else int(current_version)
    stale_w = staleness_weights(pb.policy_version, version, config.max_staleness,
                                mode=config.staleness_mode, decay=config.staleness_decay)
    record = pb
    adv = None
    if pb.has_steps:  # bounded contexts: one sample per reply, the episode's advantages
        adv, pb, stale_w = _step_samples(pb, config, stale_w, role_baseline)
    maybe_valid, all_plan = _pass_plan(pb, config, stale_w, dp)

    was_training = model.training
    values_t = ref_t = None
    fwd, vfwd = (model, value_model) if dp is None else (dp.model, dp.value_model)
    if config.adv_estimator == "gae":
        vfwd.eval()
        values_t = _packed_pass(lambda mb: compute_values(vfwd, mb, bf16=config.bf16),
                                all_plan, pb, config, dp, vfwd)
    if use_kl:
        ref_t = _logprob_pass(ref_model, all_plan, pb, config, dp)
    if adv is None:
        adv = _advantages(pb, config, stale_w, values_t, ref_t, role_baseline)
    prox_t = None
    if config.old_logprob_source == "recompute":
        prox_t = _logprob_pass(fwd, all_plan, pb, config, dp)
    token_arrays = {"advantages": adv.advantages,
                    "weights": np.repeat(stale_w, pb.lengths).astype(np.float32),
                    "ref_logprobs": ref_t, "returns": adv.returns, "values": values_t,
                    "prox_logprobs": prox_t}
    rows = np.flatnonzero(adv.valid & maybe_valid)

    stats, step_stats, n_micro = _optimize(model, optimizer, pb, rows, token_arrays, config,
                                           value_model, critic_optimizer, use_kl, dp)
    if not was_training:
        model.eval()
    metrics = dict(adv.metrics)
    metrics.update(stats.means())
    for k, v in step_stats.items():
        finite = [x for x in v if math.isfinite(x)]
        metrics[k] = float(np.mean(finite)) if finite else float("nan")
        if k.endswith("grad_norm"):
            metrics[k + "_nonfinite_steps"] = float(len(v) - len(finite))
    metrics.update({
        "actor/lr": float(optimizer.param_groups[0]["lr"]),
        "actor/kl_coef": float(config.kl_coef if use_kl and config.use_kl_loss else 0.0),
        "learner/num_trajectories": float(len(record)),
        "learner/num_samples": float(len(pb)),
        "learner/num_trained": float(len(rows)),
        "learner/num_stale_dropped": float((stale_w == 0).sum()),
        "learner/num_model_tokens": float(pb.loss_mask[np.isin(pb.trajectory_index(), rows)]
                                          .sum()),
        "learner/num_tokens": float(pb.lengths[rows].sum() * config.ppo_epochs),
        "learner/num_micro_batches": float(n_micro),
        "learner/policy_version": float(version),
        "response_length/mean": float(record.loss_mask.sum() / max(len(record), 1)),
        "num_turns/mean": float(record.num_turns.mean()),
    })
    return metrics


def _advantages(pb: PackedBatch, config: LearnerConfig, stale_w: np.ndarray, values_t=None,
                ref_t=None, role_baseline: np.ndarray | None = None) -> AdvantageResult:
    return compute_advantages(
        pb, config.adv_estimator, norm_by_std=config.norm_adv_by_std, eps=config.adv_eps,
        gamma=config.gamma, lam=config.lam, truncated=config.truncated,
        overlong=config.overlong, reward_placement=config.reward_placement, values=values_t,
        ref_logprobs=ref_t if config.use_kl_in_reward else None,
        kl_coef=config.kl_reward_coef if config.use_kl_in_reward else 0.0,
        kl_estimator=config.kl_reward_estimator, extra_valid=stale_w > 0,
        whiten_advantages=config.whiten_advantages,
        branch_step_weight=config.branch_step_weight, role_baseline=role_baseline,
    )


def _step_samples(pb: PackedBatch, config: LearnerConfig, stale_w: np.ndarray,
                  role_baseline: np.ndarray | None = None
                  ) -> tuple[AdvantageResult, PackedBatch, np.ndarray]:
    """A batch with steps (``RolloutConfig.context_window``) as one sample per reply: the
    advantages computed over each whole trajectory (its group, its turns, its branches),
    then the samples (:meth:`PackedBatch.step_samples`) with their tokens' advantages and
    their trajectory's validity and staleness weight."""
    if config.adv_estimator == "gae" or config.use_kl_in_reward:
        raise ValueError(
            "trajectories played with a bounded context (context_window) are trained one "
            "sample per reply, and a critic's values or a KL in the reward over the whole "
            "trajectory are not defined there: use a critic-free estimator "
            f"({', '.join(e for e in ESTIMATORS if e != 'gae')}) and use_kl_loss for a KL")
    adv = _advantages(pb, config, stale_w, role_baseline=role_baseline)
    samples, source, row = pb.step_samples()
    adv = replace(
        adv, advantages=adv.advantages[source],
        returns=None if adv.returns is None else adv.returns[source], valid=adv.valid[row],
        scores=adv.scores[row],
        seq_advantages=None if adv.seq_advantages is None else adv.seq_advantages[row])
    return adv, samples, stale_w[row]


def _pass_plan(pb: PackedBatch, config: LearnerConfig, stale_w: np.ndarray, dp
               ) -> tuple[np.ndarray, list[np.ndarray]]:
    """The trajectories that can carry a learning signal (not failed or dropped, not too
    stale, with model tokens) and the micro-batch plan of the forward passes before the
    update (values, reference, proximal) over them (this rank's share under ``dp``)."""
    model_tokens = np.bincount(pb.trajectory_index(), weights=pb.loss_mask, minlength=len(pb))
    maybe_valid = validity(pb.stop_reason, "keep" if config.truncated == "bootstrap"
                           else config.truncated, config.overlong)[0]
    maybe_valid &= (stale_w > 0) & (model_tokens > 0)
    return maybe_valid, _plan(pb, np.flatnonzero(maybe_valid), config, dp)


def _plan(pb: PackedBatch, rows: np.ndarray, config: LearnerConfig, dp) -> list[np.ndarray]:
    """The micro-batches of this rank's share of ``rows`` under the config's token budget
    (padded or packed)."""
    return plan_micro_batches(pb.lengths, config.max_tokens_per_microbatch,
                              max_seqs_per_microbatch=config.max_seqs_per_microbatch,
                              indices=_own(dp, rows, pb), packing=config.packing)


def _logprob_pass(model, plan, pb: PackedBatch, config: LearnerConfig, dp) -> np.ndarray:
    """``model``'s logprobs of every token of the plan's rows (eval mode), packed."""
    model.eval()
    return _packed_pass(
        lambda mb: compute_logprobs(model, mb, temperature=config.temperature,
                                    with_entropy=False, bf16=config.bf16,
                                    chunk_tokens=_chunk_tokens(model, config))[0],
        plan, pb, config, dp, model)


def _optimize(model, optimizer, pb: PackedBatch, rows: np.ndarray,
              token_arrays: dict[str, Any], config: LearnerConfig, value_model,
              critic_optimizer, use_kl: bool, dp) -> tuple[_Stats, dict[str, list[float]], int]:
    """``ppo_epochs`` x ``num_mini_batches`` optimizer steps over ``rows`` (shuffled per
    epoch with ``config.seed``); returns the micro-batch metrics, the per-step losses and
    gradient norms, and the number of micro-batches (all ranks')."""
    model.train()
    if value_model is not None:
        value_model.train()
    rng = np.random.default_rng(config.seed)
    fwd, vfwd = (model, value_model) if dp is None else (dp.model, dp.value_model)
    scale = 1.0 if dp is None else dp.loss_scale
    stats = _Stats()
    step_stats: dict[str, list[float]] = defaultdict(list)
    n_micro = 0
    for _epoch in range(config.ppo_epochs):
        order = rng.permutation(rows) if config.shuffle else rows
        for mini in np.array_split(order, min(config.num_mini_batches, max(len(order), 1))):
            if len(mini) == 0:
                continue
            loss_sums, n = _mini_batch_step(fwd, vfwd, pb, mini, token_arrays, config,
                                            use_kl, scale, stats, dp)
            n_micro += n
            for k, v in loss_sums.items():
                step_stats[k].append(v)
            step_stats["actor/grad_norm"].append(_clip_and_step(optimizer, config))
            if critic_optimizer is not None:
                step_stats["critic/grad_norm"].append(_clip_and_step(critic_optimizer, config))
    if dp is not None:  # every rank's micro-batches
        stats.floats()
        stats.sums = defaultdict(float, dp.sum_dict(stats.sums))
        stats.weights = defaultdict(float, dp.sum_dict(stats.weights))
        n_micro = int(dp.sum_dict({"n": n_micro})["n"])
    return stats, step_stats, n_micro


def _mini_batch_step(fwd, vfwd, pb: PackedBatch, mini: np.ndarray,
                     token_arrays: dict[str, Any], config: LearnerConfig, use_kl: bool,
                     scale: float, stats: _Stats, dp) -> tuple[dict[str, float], int]:
    """The gradients of one mini-batch, accumulated over its token-budgeted micro-batches
    with the whole mini-batch's loss normalisers (all ranks' under ``dp``); returns its
    summed losses (read back once) and its number of micro-batches here."""
    mbs = [collate(pb, r, token_arrays, pad_token_id=config.pad_token_id,
                   packing=config.packing) for r in _plan(pb, mini, config, dp)]
    n_tok = float(sum(mb.num_model_tokens for mb in mbs))
    n_seq = float(sum(int((mb.loss_mask.sum(-1) > 0).sum()) for mb in mbs))
    norm_c = config.loss_norm_constant or float(
        max((int(mb.lengths.max()) for mb in mbs), default=0))
    if dp is not None:
        n_tok, n_seq, norm_c = dp.global_counts(n_tok, n_seq, norm_c)
    loss_sums: dict[str, Any] = {}
    # under dp every rank runs as many steps as dp says (at least one, so that a rank without
    # rows still takes part in the gradient reduction; a sharded model: the most any rank has)
    steps = len(mbs) if dp is None else dp.micro_steps(len(mbs))
    for i in range(steps):
        with _accumulating(dp, i < steps - 1):
            if i >= len(mbs):  # no rows left here: a zero-loss step
                dp.join_backward(config.pad_token_id)
                continue
            mb = mbs[i]
            m, losses = _micro_step(fwd, mb, config, vfwd, n_tok, n_seq, norm_c, use_kl, scale)
        stats.add(m, float(mb.num_model_tokens))
        for k, v in losses.items():
            loss_sums[k] = loss_sums[k] + v if k in loss_sums else v
    loss_sums = _to_floats(loss_sums)  # with the grad norm: one read-back a step
    if dp is not None:
        loss_sums = dp.sum_dict(loss_sums)
    return loss_sums, len(mbs)


def _own(dp, rows: np.ndarray, pb: PackedBatch) -> np.ndarray:
    """The rows of ``rows`` this process trains on: all of them, or its data-parallel share."""
    return np.sort(rows) if dp is None else dp.shard(rows, pb.lengths)


def _accumulating(dp, accumulate: bool):
    return contextlib.nullcontext() if dp is None else dp.accumulating(accumulate)


def _micro_step(model, mb: MicroBatch, config: LearnerConfig, value_model, n_tok: float,
                n_seq: float, norm_c: float, use_kl: bool, loss_scale: float = 1.0
                ) -> tuple[dict[str, float], dict[str, float]]:
    """Forward + backward of one micro-batch (the backward of ``loss_scale`` times its
    loss).

    Returns (token-mean metrics of this micro-batch, its shares of the aggregated losses:
    ``actor/pg_loss``, ``actor/kl_loss``, ``actor/entropy_loss``, ``critic/vf_loss``, which
    sum over micro-batches to the mini-batch losses).
    """
    device = _model_device(model)
    mb = mb.to(device)
    mask = mb.loss_mask
    agg = {"num_tokens": n_tok, "num_seqs": n_seq, "norm_constant": norm_c}
    logp, entropy = compute_logprobs(model, mb, temperature=config.temperature,
                                     with_entropy=True, bf16=config.bf16,
                                     chunk_tokens=_chunk_tokens(model, config))
    weights = mb.get("weights")
    old = mb.old_logprobs
    prox = mb.get("prox_logprobs")
    capped = None
    if prox is not None:
        if config.tis_cap is not None:
            tis, capped = behaviour_weights(prox, old, config.tis_cap, config.off_policy)
            weights = tis if weights is None else weights * tis
        old = prox
    pg, metrics = policy_loss(
        logp, old, mb.advantages, mask, clip_ratio_low=config.clip_ratio_low,
        clip_ratio_high=config.clip_ratio_high, clip_ratio_c=config.clip_ratio_c,
        agg_mode=config.loss_agg_mode, weights=weights, **agg)
    del metrics["actor/pg_loss"]
    if capped is not None:  # tokens over the behaviour-weight cap (truncated or dropped)
        metrics["actor/is_capped_frac"] = (capped * mask).sum() / mask.sum().clamp(min=1)
    losses = {"actor/pg_loss": pg.detach()}
    loss = pg
    local_tok = mask.sum().clamp(min=1)
    metrics["actor/entropy"] = ((entropy.detach() * mask).sum() / local_tok)
    if config.entropy_coeff:
        ent = agg_loss(entropy, mask, config.loss_agg_mode, **agg)
        losses["actor/entropy_loss"] = ent.detach()
        loss = loss - config.entropy_coeff * ent
    if use_kl:
        kl = kl_penalty(logp, mb.ref_logprobs, config.kl_estimator)
        metrics["actor/kl"] = (kl.detach() * mask).sum() / local_tok
        if config.use_kl_loss:
            kl_loss = agg_loss(kl, mask, config.loss_agg_mode, **agg)
            losses["actor/kl_loss"] = kl_loss.detach()
            loss = loss + config.kl_coef * kl_loss
    if value_model is not None and mb.get("returns") is not None:
        vpred = compute_values(value_model, mb, bf16=config.bf16)
        vf, vm = value_loss(vpred, mb.values, mb.returns, mask,
                            cliprange_value=config.cliprange_value,
                            agg_mode=config.loss_agg_mode, **agg)
        losses["critic/vf_loss"] = vm.pop("critic/vf_loss")
        metrics.update(vm)
        loss = loss + config.vf_coef * vf
    (loss if loss_scale == 1.0 else loss * loss_scale).backward()
    return ({k: v.detach() if torch.is_tensor(v) else v for k, v in metrics.items()},
            {k: v.detach() if torch.is_tensor(v) else v for k, v in losses.items()})


def _clip_and_step(optimizer: torch.optim.Optimizer, config: LearnerConfig) -> float:
    """Clip the optimizer's gradients, step unless their norm is non-finite, zero them."""
    params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
    if not params:
        optimizer.zero_grad(set_to_none=True)
        return 0.0
    max_norm = config.max_grad_norm if config.max_grad_norm is not None else float("inf")
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    # sharded gradients (FSDP2's DTensors): the norm over every rank's shards
    norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    if math.isfinite(norm):
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return norm
