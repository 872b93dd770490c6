"""Policy, KL, entropy and value losses (torch), with verl's aggregation modes and names.

Every loss works on shifted per-token tensors ``[n, L - 1]`` (see
:class:`agentgym.learner.microbatch.MicroBatch`) and a ``mask`` that is 1 exactly at model
tokens, so prompt, observation and padding tokens never count.

Aggregation (``agg_mode``), with ``l`` the per-token loss and ``m`` the mask:

* ``token-mean``: ``sum(l * m) / sum(m)`` -- every model token of the batch weighs the same.
* ``seq-mean-token-sum``: ``mean_over_seqs(sum_t l * m)`` -- each sequence's summed loss,
  averaged over sequences (long sequences weigh more).
* ``seq-mean-token-mean``: ``mean_over_seqs(sum_t l * m / sum_t m)`` -- each sequence's mean
  token loss, averaged over sequences (GRPO paper).
* ``seq-mean-token-sum-norm``: ``sum(l * m) / (num_seqs * norm_constant)`` -- Dr.GRPO's
  constant normaliser (``norm_constant``: e.g. the maximum response length).

Only sequences with at least one model token count in ``num_seqs``. For gradient
accumulation, pass the *global* ``num_tokens``/``num_seqs`` of the whole mini-batch: each
micro-batch's loss is then its exact share, and the sum of micro-batch losses equals the
loss of the whole mini-batch computed at once.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from agentgym.data.trajectories import PackedBatch

__all__ = [
    "AGG_MODES",
    "KL_ESTIMATORS",
    "agg_loss",
    "entropy_from_logits",
    "filter_stale",
    "kl_penalty",
    "policy_loss",
    "stale_mask",
    "staleness_weights",
    "truncated_is_weights",
    "behaviour_weights",
    "OFF_POLICY_MODES",
    "value_loss",
]

AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
KL_ESTIMATORS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")


def agg_loss(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    agg_mode: str = "token-mean",
    *,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    norm_constant: float | None = None,
) -> torch.Tensor:
    """Aggregate a ``[n, L]`` per-token loss to a scalar (see the module docstring).

    ``num_tokens``/``num_seqs`` default to this tensor's own counts; pass global counts
    when the batch is split into micro-batches.
    """
    mask = mask.to(loss_mat.dtype)
    masked = loss_mat * mask
    if agg_mode == "token-mean":
        denom = mask.sum() if num_tokens is None else num_tokens
        return masked.sum() / _clamp_den(denom)
    seq_tokens = mask.sum(dim=-1)
    if num_seqs is None:
        num_seqs = (seq_tokens > 0).sum()
    if agg_mode == "seq-mean-token-sum":
        return masked.sum() / _clamp_den(num_seqs)
    if agg_mode == "seq-mean-token-mean":
        per_seq = masked.sum(dim=-1) / seq_tokens.clamp(min=1)
        return per_seq.sum() / _clamp_den(num_seqs)
    if agg_mode == "seq-mean-token-sum-norm":
        if norm_constant is None:
            raise ValueError("seq-mean-token-sum-norm needs norm_constant (e.g. max length)")
        return masked.sum() / (_clamp_den(num_seqs) * float(norm_constant))
    raise ValueError(f"unknown loss aggregation mode {agg_mode!r}; choose from {AGG_MODES}")


def _clamp_den(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.clamp(min=1)
    return max(float(x), 1.0)


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    mask = mask.to(x.dtype)
    return (x * mask).sum() / mask.sum().clamp(min=1)


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.28,
    clip_ratio_c: float | None = 3.0,
    agg_mode: str = "token-mean",
    weights: torch.Tensor | None = None,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    norm_constant: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO-clip policy-gradient loss against ``old_logprobs`` (behaviour or proximal).

    Per token: ``ratio = exp(logp - old)``, ``l = max(-A * ratio, -A * clip(ratio,
    1 - clip_ratio_low, 1 + clip_ratio_high))``; with dual clip (``clip_ratio_c`` > 1, Ye et
    al. 2020) tokens with ``A < 0`` are further bounded by ``-A * clip_ratio_c``.
    ``weights`` (detached, per token) multiply the loss: truncated importance weights or
    staleness down-weighting. Returns the aggregated loss and token-mean metrics
    ``actor/pg_loss``, ``actor/pg_clipfrac``, ``actor/pg_clipfrac_lower``, ``actor/ppo_kl``.
    """
    if clip_ratio_c is not None and clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 for dual clip, got {clip_ratio_c}")
    log_ratio = torch.clamp(logprobs - old_logprobs, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    loss1 = -advantages * ratio
    loss2 = -advantages * torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    clipped = torch.maximum(loss1, loss2)
    lower = torch.zeros_like(clipped, dtype=torch.bool)
    if clip_ratio_c is not None:
        loss3 = -advantages * clip_ratio_c
        neg = advantages < 0
        lower = neg & (clipped > loss3)
        clipped = torch.where(neg, torch.minimum(clipped, loss3), clipped)
    per_token = clipped if weights is None else clipped * weights
    loss = agg_loss(per_token, mask, agg_mode, num_tokens=num_tokens, num_seqs=num_seqs,
                    norm_constant=norm_constant)
    with torch.no_grad():
        metrics = {
            "actor/pg_loss": loss.detach(),
            "actor/pg_clipfrac": _masked_mean((loss2 > loss1).float(), mask),
            "actor/pg_clipfrac_lower": _masked_mean(lower.float(), mask),
            "actor/ppo_kl": _masked_mean(-log_ratio, mask),
        }
    return loss, metrics


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str = "low_var_kl"
               ) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from sampled-token logprobs.

    ``kl``/``k1``: ``logp - ref``. ``abs``: ``|logp - ref|``. ``mse``/``k2``:
    ``0.5 * (logp - ref)^2``. ``low_var_kl``/``k3``: ``exp(ref - logp) - (ref - logp) - 1``
    with ``ref - logp`` clamped to [-20, 20] and the result to [-10, 10] (as verl).
    """
    d = logprobs - ref_logprobs
    if estimator in ("kl", "k1"):
        return d
    if estimator == "abs":
        return d.abs()
    if estimator in ("mse", "k2"):
        return 0.5 * d.square()
    if estimator in ("low_var_kl", "k3"):
        k = torch.clamp(-d, min=-20.0, max=20.0)
        return torch.clamp(torch.exp(k) - k - 1.0, min=-10.0, max=10.0)
    raise ValueError(f"unknown KL estimator {estimator!r}; choose from {KL_ESTIMATORS}")


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the softmax over the last dim: ``logsumexp(z) - sum(softmax(z) * z)``."""
    logits = logits.float()
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    *,
    cliprange_value: float | None = 0.5,
    agg_mode: str = "token-mean",
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    norm_constant: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped value loss ``0.5 * max((V - R)^2, (clip(V, V_old +- c) - R)^2)`` (PPO).

    ``cliprange_value=None`` disables clipping. Metrics: ``critic/vf_loss``,
    ``critic/vf_clipfrac``, ``critic/vpred_mean``.
    """
    err1 = (values - returns).square()
    if cliprange_value is None:
        per_token = 0.5 * err1
        clipfrac = torch.zeros((), device=values.device)
    else:
        clipped = old_values + torch.clamp(values - old_values, -cliprange_value, cliprange_value)
        err2 = (clipped - returns).square()
        per_token = 0.5 * torch.maximum(err1, err2)
        with torch.no_grad():
            clipfrac = _masked_mean((err2 > err1).float(), mask)
    loss = agg_loss(per_token, mask, agg_mode, num_tokens=num_tokens, num_seqs=num_seqs,
                    norm_constant=norm_constant)
    with torch.no_grad():
        metrics = {
            "critic/vf_loss": loss.detach(),
            "critic/vf_clipfrac": clipfrac,
            "critic/vpred_mean": _masked_mean(values.detach(), mask),
        }
    return loss, metrics


def truncated_is_weights(
    proximal_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, cap: float = 2.0
) -> torch.Tensor:
    """Truncated importance weights ``min(exp(prox - behaviour), cap)`` (detached): the TIS
    correction of Yao et al. (2025), :func:`behaviour_weights` with ``mode="tis"``."""
    return behaviour_weights(proximal_logprobs, behaviour_logprobs, cap, "tis")[0]


def behaviour_weights(
    proximal_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, cap: float = 2.0,
    mode: str = "tis",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token importance weights ``exp(prox - behaviour)`` of the decoupled objective
    (the ratio is clipped against the proximal policy; this weight corrects for the
    behaviour policy that sampled the token) and the tokens whose weight exceeds ``cap``.

    ``mode="tis"`` truncates those at ``cap`` (truncated importance sampling, as verl's TIS);
    ``"decoupled"`` drops them (weight 0, as AReaL's decoupled PPO with a behaviour-weight
    cap). Both detached."""
    if mode not in OFF_POLICY_MODES:
        raise ValueError(f"off_policy must be one of {OFF_POLICY_MODES}, got {mode!r}")
    with torch.no_grad():
        w = torch.exp(torch.clamp(proximal_logprobs - behaviour_logprobs, max=20.0))
        over = w > cap
        w = torch.clamp(w, max=cap) if mode == "tis" else torch.where(over, 0.0, w)
        return w, over


#: How tokens whose behaviour weight exceeds the cap are treated (:func:`behaviour_weights`).
OFF_POLICY_MODES = ("tis", "decoupled")


def staleness_weights(
    policy_version: np.ndarray,
    current_version: int,
    max_staleness: int | None,
    *,
    mode: str = "drop",
    decay: float = 0.5,
) -> np.ndarray:
    """float32[B] per-trajectory weights from staleness ``current - policy_version``.

    Trajectories at most ``max_staleness`` versions old weigh 1. Older ones weigh 0 under
    ``mode="drop"``, and ``decay ** (staleness - max_staleness)`` under ``"downweight"``.
    ``max_staleness=None`` keeps everything at weight 1.
    """
    pv = np.asarray(policy_version, dtype=np.int64)
    w = np.ones(pv.shape, dtype=np.float32)
    if max_staleness is None:
        return w
    if max_staleness < 0:
        raise ValueError("max_staleness must be >= 0")
    stale = np.maximum(int(current_version) - pv, 0)
    over = stale > max_staleness
    if mode == "drop":
        w[over] = 0.0
    elif mode == "downweight":
        if not 0.0 <= decay <= 1.0:
            raise ValueError("staleness decay must be in [0, 1]")
        w[over] = (decay ** (stale[over] - max_staleness)).astype(np.float32)
    else:
        raise ValueError(f"staleness mode must be 'drop' or 'downweight', got {mode!r}")
    return w


def stale_mask(policy_version: np.ndarray, current_version: int, max_staleness: int) -> np.ndarray:
    """bool[B]: True for trajectories at most ``max_staleness`` versions behind (kept)."""
    return staleness_weights(policy_version, current_version, max_staleness) > 0


def filter_stale(
    batch: PackedBatch, current_version: int, max_staleness: int
) -> tuple[PackedBatch, np.ndarray]:
    """Drop trajectories more than ``max_staleness`` policy versions old.

    Returns the filtered :class:`PackedBatch` and the kept rows of the input.
    """
    kept = np.flatnonzero(stale_mask(batch.policy_version, current_version, max_staleness))
    return batch.select(kept), kept
