"""Advantage estimators over packed multi-turn trajectories (numpy, no torch needed).

Estimators (``estimator=``):

* ``grpo`` -- group-normalised outcome advantage ``(r - mean_g) / (std_g + eps)`` over the
  samples sharing a ``group_id`` (unbiased std, as verl). ``norm_by_std=False`` gives
  Dr.GRPO's ``r - mean_g``. The sequence advantage is broadcast to every model token.
* ``rloo`` -- leave-one-out baseline ``r_i - mean_{j != i} r_j`` (broadcast).
* ``reinforce_pp`` -- REINFORCE++: token rewards (optionally minus ``kl_coef * KL`` per
  token), discounted returns over model tokens, whitened across the batch's model tokens.
* ``reinforce_pp_baseline`` -- outcome minus group mean, broadcast, then batch-whitened.
* ``gae`` -- PPO's GAE(gamma, lambda) over per-token values, whitened across the batch.
* ``rae`` -- role-conditioned advantage estimation (SPIRAL): ``r - b_role``, the return
  less a running baseline of the row's role (``role_baseline``, float[B], from a
  :class:`RoleBaseline`; None: 0, plain REINFORCE), broadcast. Self-play trains both seats
  of a zero-sum game with one policy: without a per-role baseline the seats' returns pull
  against each other.

Rows of a multi-seat game (``PackedBatch.seat``) form their groups per seat: the outcome
estimators group by ``(group_id, seat)``, so the samples of one deal played from one seat
are compared with each other, never with the other seat's.

Multi-turn conventions (token-level estimators ``reinforce_pp`` and ``gae``):

* Turn ``k``'s model tokens are the ``k``-th maximal run of ``loss_mask == 1``. With
  ``reward_placement="turns"`` the reward of turn ``k`` sits at the last model token of
  that run (extra turn rewards, beyond the runs, go on the last run), and the residual
  ``reward - sum(turn_rewards)`` sits at the trajectory's last model token, so the token
  rewards always sum to ``rewards[b]`` (the episode score, after any shaping). With
  ``reward_placement="outcome"`` only ``rewards[b]`` is placed, at the last model token.
* The recursion runs over model tokens only: observation/prompt tokens are skipped, the
  step from the last token of one turn to the first of the next counts as one step
  (one factor of gamma, not one per observation token). ``values[t]`` is the critic's
  estimate of the state *before* model token ``t`` is emitted (the critic's output at
  position ``t - 1``); values off model tokens are ignored.

Episode outcomes (``stop_reason``):

* failed rollouts (env_error, backend_error, timeout, aborted) are invalid: advantage 0,
  left out of every group/batch statistic, and dropped from the loss by the learner.
* ``truncated`` (stop_reason ``horizon``): ``"keep"`` scores them as returned, ``"zero"``
  sets their reward (and turn rewards) to 0, ``"drop"`` treats them as invalid,
  ``"bootstrap"`` (``gae`` only) keeps them and bootstraps the return after the last
  model token with that token's value instead of 0.
* ``overlong`` (stop_reason ``length``): ``"keep" | "zero" | "drop"`` likewise.

Groups with a single valid member get advantage 0 under ``grpo``/``rloo`` (no baseline).

Branched groups (rows with ``branch_pos > 0``: a group played as trees, see
``RolloutConfig.branch_at``), under the outcome estimators (``grpo``, ``rloo``,
``reinforce_pp_baseline``):

* every row's own tokens (from ``branch_pos`` on) get its episode-group advantage plus
  ``branch_step_weight`` times its *step-group* advantage: the same estimator over the rows
  that continued from the same fork (``(group_id, branch_parent)``), which compares
  children of one env state with each other (GiGPO's step groups, on states that were
  forked, not found equal by chance);
* the shared prefix is trained once, through the root (the row whose ``sample_index`` is
  its ``branch_parent``; the children's copies have loss mask 0), with the mean episode
  advantage of the family's valid rows: the prefix's value is its children's, as in
  Tree-GRPO. One root and all its children in one group: the prefix gets 0.

The token-level estimators train the prefix once through the root as well (the loss mask)
and use no step groups.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from agentgym.data.trajectories import FAILED_STOP_CODES, STOP_CODES, PackedBatch

__all__ = [
    "ESTIMATORS",
    "AdvantageResult",
    "RoleBaseline",
    "compute_advantages",
    "discounted_returns",
    "gae",
    "grpo_advantages",
    "informative_groups",
    "model_token_runs",
    "place_token_rewards",
    "rloo_advantages",
    "validity",
    "whiten",
]

ESTIMATORS = ("grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "gae", "rae")
_OUTCOME_MODES = ("keep", "zero", "drop")
_HORIZON, _LENGTH = STOP_CODES["horizon"], STOP_CODES["length"]


@dataclass
class AdvantageResult:
    """Output of :func:`compute_advantages`.

    ``advantages``: float32[T], per packed token (0 off model tokens and for invalid
    trajectories). ``returns``: float32[T] value targets (``gae``/``reinforce_pp``) or None.
    ``valid``: bool[B], trajectories that carry a learning signal. ``scores``: float32[B],
    the rewards after truncation handling. ``seq_advantages``: float32[B] for outcome
    estimators, else None. ``metrics``: verl-style scalars (``critic/score/mean`` ...).
    """

    advantages: np.ndarray
    returns: np.ndarray | None
    valid: np.ndarray
    scores: np.ndarray
    seq_advantages: np.ndarray | None
    metrics: dict[str, float] = field(default_factory=dict)


def validity(
    stop_reason: np.ndarray, truncated: str = "keep", overlong: str = "keep"
) -> tuple[np.ndarray, np.ndarray]:
    """Per-trajectory (valid, zero_reward) flags from stop reasons and the options."""
    sr = np.asarray(stop_reason)
    valid = ~np.isin(sr, FAILED_STOP_CODES)
    zero = np.zeros_like(valid)
    for code, mode in ((_HORIZON, truncated), (_LENGTH, overlong)):
        hit = sr == code
        if mode == "drop":
            valid &= ~hit
        elif mode == "zero":
            zero |= hit
    return valid, zero


def _group_stats(scores: np.ndarray, group_id: np.ndarray, valid: np.ndarray):
    """(inverse index, count, mean, unbiased std) per group, over valid members only."""
    _, inv = np.unique(group_id, return_inverse=True)
    inv = inv.reshape(-1)
    w = valid.astype(np.float64)
    s = scores.astype(np.float64) * w
    n = np.bincount(inv, weights=w).astype(np.float64)
    total = np.bincount(inv, weights=s).astype(np.float64)
    sq = np.bincount(inv, weights=s * scores).astype(np.float64)
    mean = np.divide(total, n, out=np.zeros_like(total), where=n > 0)
    var = np.divide(sq - n * mean**2, n - 1, out=np.zeros_like(total), where=n > 1)
    return inv, n, mean, np.sqrt(np.maximum(var, 0.0))


def informative_groups(trajs, format_penalty: float = 0.0) -> list[list]:
    """The GRPO groups of the trajectories ``trajs`` (by ``group_id`` and seat, in
    first-seen order) whose scores are not all equal, i.e. that have an advantage (dynamic
    sampling keeps these): the score is the episode reward, less ``format_penalty`` for an
    episode cut mid-turn (``length``); a failed episode scores as its reward."""
    groups: dict[tuple[int, int], list] = {}
    for t in trajs:
        groups.setdefault((t.group_id, t.seat), []).append(t)
    out = []
    for g in groups.values():
        scores = {round(t.reward - format_penalty * (t.stop_reason == "length"), 6) for t in g}
        if len(scores) > 1:
            out.append(g)
    return out


def grpo_advantages(
    scores: np.ndarray,
    group_id: np.ndarray,
    valid: np.ndarray | None = None,
    *,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> np.ndarray:
    """GRPO sequence advantages: ``(r - mean_g) / (std_g + eps)`` (or ``r - mean_g``)."""
    scores = np.asarray(scores, dtype=np.float64)
    valid = np.ones(scores.shape, bool) if valid is None else np.asarray(valid, bool)
    inv, n, mean, std = _group_stats(scores, np.asarray(group_id), valid)
    adv = scores - mean[inv]
    if norm_by_std:
        adv = adv / (std[inv] + eps)
    adv = np.where(valid & (n[inv] > 1), adv, 0.0)
    return adv.astype(np.float32)


def rloo_advantages(
    scores: np.ndarray, group_id: np.ndarray, valid: np.ndarray | None = None
) -> np.ndarray:
    """RLOO sequence advantages: ``r_i - mean_{j != i} r_j`` within each group."""
    scores = np.asarray(scores, dtype=np.float64)
    valid = np.ones(scores.shape, bool) if valid is None else np.asarray(valid, bool)
    inv, n, mean, _ = _group_stats(scores, np.asarray(group_id), valid)
    ng = n[inv]
    others = np.divide(mean[inv] * ng - scores, ng - 1, out=np.zeros_like(scores), where=ng > 1)
    adv = np.where(valid & (ng > 1), scores - others, 0.0)
    return adv.astype(np.float32)


def whiten(x: np.ndarray, mask: np.ndarray, eps: float = 1e-8) -> np.ndarray:
    """``(x - mean) / sqrt(var + eps)`` over ``mask`` (verl's masked_whiten); 0 off mask."""
    m = np.asarray(mask, bool)
    out = np.zeros(x.shape, dtype=np.float32)
    if m.sum() == 0:
        return out
    sel = x[m].astype(np.float64)
    mean = sel.mean()
    var = sel.var(ddof=1) if sel.size > 1 else 0.0
    out[m] = ((sel - mean) / np.sqrt(var + eps)).astype(np.float32)
    return out


def model_token_runs(loss_mask: np.ndarray, start: int, end: int) -> list[tuple[int, int]]:
    """Maximal runs ``[s, e)`` of model tokens within ``loss_mask[start:end]`` (absolute)."""
    m = np.asarray(loss_mask[start:end], dtype=np.int8)
    if m.size == 0:
        return []
    d = np.diff(np.concatenate([[0], m, [0]]))
    starts = np.flatnonzero(d == 1)
    ends = np.flatnonzero(d == -1)
    return [(start + int(s), start + int(e)) for s, e in zip(starts, ends, strict=True)]


def place_token_rewards(
    batch: PackedBatch,
    rewards: np.ndarray | None = None,
    *,
    placement: str = "turns",
    turn_rewards: np.ndarray | None = None,
) -> np.ndarray:
    """float32[T] token rewards (see the module docstring for where rewards go)."""
    if placement not in ("turns", "outcome"):
        raise ValueError(f"reward_placement must be 'turns' or 'outcome', got {placement!r}")
    rewards = batch.rewards if rewards is None else rewards
    turn_rewards = batch.turn_rewards if turn_rewards is None else turn_rewards
    out = np.zeros(batch.num_tokens, dtype=np.float64)
    for b in range(len(batch)):
        runs = model_token_runs(batch.loss_mask, int(batch.offsets[b]), int(batch.offsets[b + 1]))
        if not runs:
            continue
        last = runs[-1][1] - 1
        if placement == "outcome":
            out[last] += rewards[b]
            continue
        tr = turn_rewards[int(batch.turn_offsets[b]) : int(batch.turn_offsets[b + 1])]
        for k, r in enumerate(tr):
            out[runs[min(k, len(runs) - 1)][1] - 1] += r
        out[last] += float(rewards[b]) - float(np.sum(tr, dtype=np.float64))
    return out.astype(np.float32)


def _model_token_grid(loss_mask: np.ndarray, offsets: np.ndarray):
    """Each trajectory's model tokens as one row of a right-padded ``[B, L]`` grid: the flat
    indices of the model tokens, their row and column, and ``L``."""
    m = np.asarray(loss_mask, bool)
    idx = np.flatnonzero(m)
    row = np.searchsorted(offsets, idx, side="right") - 1
    counts = np.bincount(row, minlength=offsets.shape[0] - 1)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    col = np.arange(idx.size) - starts[row]
    width = int(counts.max()) if counts.size else 0
    return idx, row, col, width


def _reverse_scan(x: np.ndarray, c: float) -> np.ndarray:
    """``y[:, k] = x[:, k] + c * y[:, k + 1]`` along each row (float64; zero padding on the
    right keeps every row's own recursion): one vectorised step per column."""
    y = np.zeros_like(x)
    acc = np.zeros(x.shape[0], dtype=x.dtype)
    for k in range(x.shape[1] - 1, -1, -1):
        acc = x[:, k] + c * acc
        y[:, k] = acc
    return y


def discounted_returns(
    token_rewards: np.ndarray, loss_mask: np.ndarray, offsets: np.ndarray, gamma: float = 1.0
) -> np.ndarray:
    """float32[T]: ``G_t = r_t + gamma * G_next`` over each trajectory's model tokens."""
    out = np.zeros(token_rewards.shape[0], dtype=np.float32)
    idx, row, col, width = _model_token_grid(loss_mask, offsets)
    if idx.size == 0:
        return out
    r = np.zeros((offsets.shape[0] - 1, width))
    r[row, col] = token_rewards[idx]
    out[idx] = _reverse_scan(r, gamma)[row, col]
    return out


def gae(
    token_rewards: np.ndarray,
    values: np.ndarray,
    loss_mask: np.ndarray,
    offsets: np.ndarray,
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
    bootstrap: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """GAE over each trajectory's model tokens; returns (advantages, returns), float32[T].

    ``delta_k = r_k + gamma * V_{k+1} - V_k`` and ``A_k = delta_k + gamma * lam * A_{k+1}``
    with ``k`` running over model tokens only; after the last model token ``V = 0``, or
    that token's own value where ``bootstrap[b]`` is True. Vectorised over the batch: one
    numpy step per token position, not per token.
    """
    adv = np.zeros(token_rewards.shape[0], dtype=np.float32)
    ret = np.zeros_like(adv)
    idx, row, col, width = _model_token_grid(loss_mask, offsets)
    if idx.size == 0:
        return adv, ret
    n = offsets.shape[0] - 1
    r = np.zeros((n, width))
    v = np.zeros((n, width))
    r[row, col] = token_rewards[idx]
    v[row, col] = values[idx]
    v_next = np.zeros((n, width))
    v_next[:, :-1] = v[:, 1:]
    counts = np.bincount(row, minlength=n)
    last = counts > 0
    tail = np.zeros(n)
    if bootstrap is not None:  # V after the last model token: that token's own value
        boot = last & np.asarray(bootstrap, bool)
        tail[boot] = v[boot, counts[boot] - 1]
    v_next[last, counts[last] - 1] = tail[last]
    a = _reverse_scan(r + gamma * v_next - v, gamma * lam)
    adv[idx] = a[row, col]
    ret[idx] = (a + v)[row, col]
    return adv, ret


def _kl_np(logp: np.ndarray, ref: np.ndarray, estimator: str) -> np.ndarray:
    """Per-token KL estimate (numpy mirror of :func:`agentgym.learner.losses.kl_penalty`)."""
    d = logp.astype(np.float64) - ref.astype(np.float64)
    if estimator == "kl":
        return d
    if estimator == "abs":
        return np.abs(d)
    if estimator == "mse":
        return 0.5 * d * d
    if estimator == "low_var_kl":
        k = np.clip(-d, -20.0, 20.0)
        return np.clip(np.exp(k) - k - 1.0, -10.0, 10.0)
    raise ValueError(f"unknown KL estimator {estimator!r}")


def compute_advantages(
    batch: PackedBatch,
    estimator: str = "grpo",
    *,
    norm_by_std: bool = True,
    eps: float = 1e-6,
    gamma: float = 1.0,
    lam: float = 1.0,
    truncated: str = "keep",
    overlong: str = "keep",
    reward_placement: str = "turns",
    values: np.ndarray | None = None,
    ref_logprobs: np.ndarray | None = None,
    kl_coef: float = 0.0,
    kl_estimator: str = "kl",
    whiten_advantages: bool = True,
    extra_valid: np.ndarray | None = None,
    branch_step_weight: float = 1.0,
    role_baseline: np.ndarray | None = None,
) -> AdvantageResult:
    """Advantages for a packed batch (see the module docstring for every option).

    ``values`` (float32[T]) is required for ``gae``. ``ref_logprobs`` with ``kl_coef > 0``
    subtracts ``kl_coef * KL(behaviour || ref)`` from each model token's reward for the
    token-level estimators (``reinforce_pp``, ``gae``). ``extra_valid`` (bool[B]) marks
    further trajectories as invalid (e.g. too stale). ``whiten_advantages`` applies to
    ``gae`` (``reinforce_pp*`` always whiten, as defined). ``branch_step_weight``: the
    step-group term of branched rows. ``role_baseline`` (float[B]): each row's role
    baseline under ``rae``.
    """
    pb = batch
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {estimator!r}; choose from {ESTIMATORS}")
    if truncated not in (*_OUTCOME_MODES, "bootstrap"):
        raise ValueError(f"truncated must be keep|zero|drop|bootstrap, got {truncated!r}")
    if truncated == "bootstrap" and estimator != "gae":
        raise ValueError("truncated='bootstrap' needs a critic: use it with estimator='gae'")
    if overlong not in _OUTCOME_MODES:
        raise ValueError(f"overlong must be keep|zero|drop, got {overlong!r}")

    valid, zero = validity(pb.stop_reason, "keep" if truncated == "bootstrap" else truncated,
                           overlong)
    if extra_valid is not None:
        valid &= np.asarray(extra_valid, bool)
    scores = np.where(zero, 0.0, pb.rewards).astype(np.float32)
    traj = pb.trajectory_index()
    tok_valid = valid[traj] & (pb.loss_mask == 1) if pb.num_tokens else np.zeros(0, bool)

    seq_adv = None
    returns = None
    if estimator in ("grpo", "rloo", "reinforce_pp_baseline"):
        if estimator == "grpo":
            def outcome(s, g, v):
                return grpo_advantages(s, g, v, norm_by_std=norm_by_std, eps=eps)
        elif estimator == "rloo":
            outcome = rloo_advantages
        else:
            def outcome(s, g, v):
                return grpo_advantages(s, g, v, norm_by_std=False)
        seq_adv = outcome(scores, _groups(pb), valid)
        if pb.num_tokens and (pb.branch_pos > 0).any():
            tok_adv = _branched(pb, traj, scores, valid, seq_adv, outcome, branch_step_weight)
        else:
            tok_adv = seq_adv[traj] if pb.num_tokens else 0.0
        adv = np.where(tok_valid, tok_adv, 0.0)
        if estimator == "reinforce_pp_baseline":
            adv = whiten(adv, tok_valid)
        adv = adv.astype(np.float32)
    elif estimator == "rae":
        base = 0.0 if role_baseline is None else np.asarray(role_baseline, np.float64)
        seq_adv = np.where(valid, scores - base, 0.0).astype(np.float32)
        adv = np.where(tok_valid, seq_adv[traj], 0.0).astype(np.float32) if pb.num_tokens \
            else np.zeros(0, np.float32)
    else:
        turn_rw = pb.turn_rewards.copy()
        if zero.any():
            tlen = np.diff(pb.turn_offsets)
            turn_rw[np.repeat(zero, tlen)] = 0.0
        tok_r = place_token_rewards(pb, scores, placement=reward_placement,
                                    turn_rewards=turn_rw).astype(np.float64)
        if ref_logprobs is not None and kl_coef:
            kl = _kl_np(pb.logprobs, np.asarray(ref_logprobs, np.float32), kl_estimator)
            tok_r = tok_r - kl_coef * np.where(pb.loss_mask == 1, kl, 0.0)
        tok_r = tok_r.astype(np.float32)
        if estimator == "reinforce_pp":
            returns = discounted_returns(tok_r, pb.loss_mask, pb.offsets, gamma)
            returns = np.where(tok_valid, returns, 0.0).astype(np.float32)
            adv = whiten(returns, tok_valid)
        else:
            if values is None:
                raise ValueError("estimator='gae' needs per-token values (a value model)")
            values = np.asarray(values, dtype=np.float32)
            if values.shape[0] != pb.num_tokens:
                raise ValueError(f"values must have T = {pb.num_tokens} entries")
            boot = (pb.stop_reason == _HORIZON) if truncated == "bootstrap" else None
            adv, returns = gae(tok_r, values, pb.loss_mask, pb.offsets, gamma=gamma, lam=lam,
                               bootstrap=boot)
            adv = np.where(tok_valid, adv, 0.0).astype(np.float32)
            returns = np.where(tok_valid, returns, 0.0).astype(np.float32)
            if whiten_advantages:
                adv = whiten(adv, tok_valid)

    metrics = _metrics(scores, valid, adv, tok_valid, returns, pb)
    return AdvantageResult(adv.astype(np.float32), returns, valid, scores, seq_adv, metrics)


def _groups(pb: PackedBatch) -> np.ndarray:
    """Each row's outcome group: its ``group_id``, split by seat where the batch holds rows
    of a game's seats."""
    if not pb.seat.any():
        return pb.group_id
    keys = np.stack([pb.group_id.astype(np.uint64), pb.seat.astype(np.uint64)], axis=1)
    return np.unique(keys, axis=0, return_inverse=True)[1].reshape(-1)


class RoleBaseline:
    """SPIRAL's role baseline: per role key (e.g. ``(env, role)``), an exponential moving
    average of the returns, ``b <- decay * b + (1 - decay) * mean(returns of the batch's
    valid rows of that role)``, starting at 0. Its state is a plain dict
    (``state_dict``/``load_state_dict``), checkpointed with the run."""

    def __init__(self, decay: float = 0.95):
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"role baseline decay must be in [0, 1), got {decay}")
        self.decay = float(decay)
        self.values: dict[str, float] = {}

    def of(self, roles: list[str]) -> np.ndarray:
        """The baseline of each row's role, float32[B]."""
        return np.array([self.values.get(r, 0.0) for r in roles], np.float32)

    def update(self, roles: list[str], scores: np.ndarray, valid: np.ndarray) -> None:
        """Move each role's baseline toward the mean return of its valid rows."""
        names, which = np.unique(np.asarray(roles, object), return_inverse=True)
        valid = np.asarray(valid, bool)
        n = np.bincount(which[valid], minlength=len(names))
        total = np.bincount(which[valid], weights=np.asarray(scores, np.float64)[valid],
                            minlength=len(names))
        for role, k, t in zip(names.tolist(), n, total):
            if k:
                b = self.values.get(role, 0.0)
                self.values[role] = self.decay * b + (1 - self.decay) * t / k

    def state_dict(self) -> dict:
        return {"decay": self.decay, "values": dict(self.values)}

    def load_state_dict(self, state: dict) -> None:
        self.decay = float(state["decay"])
        self.values = {str(k): float(v) for k, v in state["values"].items()}


def _branched(pb: PackedBatch, traj: np.ndarray, scores: np.ndarray, valid: np.ndarray,
              seq_adv: np.ndarray, outcome, step_weight: float) -> np.ndarray:
    """Per-token advantages of a batch with branched rows (module docs): own tokens
    ``seq_adv + step_weight * step``, the root's prefix tokens its family's mean
    ``seq_adv``."""
    br = pb.branch_pos > 0
    rows = np.flatnonzero(br)
    keys = np.stack([pb.group_id[rows].astype(np.uint64),
                     pb.branch_parent[rows].astype(np.uint64)], axis=1)
    _, fam = np.unique(keys, axis=0, return_inverse=True)
    fam = fam.reshape(-1)
    step = np.zeros(len(pb), np.float64)
    step[rows] = outcome(scores[rows], fam, valid[rows])
    w = valid[rows].astype(np.float64)
    n = np.bincount(fam, weights=w)
    total = np.bincount(fam, weights=seq_adv[rows] * w)
    prefix = np.zeros(len(pb), np.float64)
    prefix[rows] = np.divide(total, n, out=np.zeros_like(total), where=n > 0)[fam]
    in_prefix = br[traj] & (np.arange(pb.num_tokens) - pb.offsets[traj] < pb.branch_pos[traj])
    own = seq_adv[traj] + step_weight * step[traj]
    return np.where(in_prefix, prefix[traj], own)


def _metrics(scores, valid, adv, tok_valid, returns, pb: PackedBatch) -> dict[str, float]:
    out: dict[str, float] = {}
    if valid.any():
        sv = scores[valid]
        out.update({"critic/score/mean": float(sv.mean()), "critic/score/max": float(sv.max()),
                    "critic/score/min": float(sv.min())})
    if tok_valid.any():
        av = adv[tok_valid]
        out.update({"critic/advantages/mean": float(av.mean()),
                    "critic/advantages/max": float(av.max()),
                    "critic/advantages/min": float(av.min())})
        if returns is not None:
            out["critic/returns/mean"] = float(returns[tok_valid].mean())
    out["learner/num_valid"] = float(valid.sum())
    out["learner/num_invalid"] = float((~valid).sum())
    out["learner/num_truncated"] = float((pb.stop_reason == _HORIZON).sum())
    return out
