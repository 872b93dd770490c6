"""Learner update on a tiny randomly initialised Qwen2: logprobs, micro-batching, training."""

import copy
import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import agentgym.learner.update as update_mod  # noqa: E402
from agentgym.data import STOP_CODES, pack  # noqa: E402
from agentgym.learner.microbatch import collate, make_micro_batches  # noqa: E402
from agentgym.learner.update import (  # noqa: E402
    LearnerConfig,
    compute_logprobs,
    make_optimizer,
    policy_update,
)
from tests.helpers import make_trajectory  # noqa: E402

VOCAB = 32
GOOD, BAD = 5, 6  # the two "actions" the policy may emit


def tiny_qwen2(seed=0, token_classifier=False):
    torch.manual_seed(seed)
    cfg = transformers.Qwen2Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
        tie_word_embeddings=False, num_labels=1,
    )
    cls = (transformers.Qwen2ForTokenClassification if token_classifier
           else transformers.Qwen2ForCausalLM)
    model = cls(cfg).float()
    model.eval()
    return model


def model_logprobs(model, batch):
    """float32[T]: the model's logprob of each packed token at model tokens, 0 elsewhere."""
    lp = np.zeros(batch.num_tokens, np.float32)
    with torch.no_grad():
        for mb in make_micro_batches(batch, max_tokens_per_microbatch=10_000):
            logp, _ = compute_logprobs(model, mb, with_entropy=False)
            for row, b in enumerate(mb.indices):
                s, n = batch.offsets[b], mb.lengths[row]
                lp[s + 1 : s + n] = logp[row, : n - 1].numpy()
    return (lp * batch.loss_mask).astype(np.float32)


def behaviour_logprobs(model, batch, jitter=0.0, seed=0):
    """Fill the batch's behaviour logprobs with the model's own (on-policy); ``jitter``
    moves each by up to that much, so PPO ratios spread over (and beyond) the clip range."""
    lp = model_logprobs(model, batch)
    if jitter:
        noise = np.random.default_rng(seed).uniform(-jitter, jitter, batch.num_tokens)
        lp = lp + noise.astype(np.float32) * batch.loss_mask
    batch.logprobs = lp.astype(np.float32)
    return batch


def sgd_delta(base, batch, cfg, **kwargs):
    """Parameter change of one ``policy_update`` with plain SGD (lr 1) from a copy of
    ``base``, and its metrics: linear in the loss gradient."""
    model = copy.deepcopy(base)
    before = [p.detach().clone() for p in model.parameters()]
    m = policy_update(model, torch.optim.SGD(model.parameters(), lr=1.0), batch, cfg, **kwargs)
    return [p.detach() - b for p, b in zip(model.parameters(), before, strict=True)], m


def assert_deltas_close(d1, d2, scale=1.0):
    for a, b in zip(d1, d2, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6 * scale, rtol=1e-4)


def spy_advantages(monkeypatch):
    """Record every AdvantageResult ``policy_update`` computes (the real estimator runs)."""
    seen = []
    real = update_mod.compute_advantages

    def spy(*args, **kwargs):
        seen.append(real(*args, **kwargs))
        return seen[-1]

    monkeypatch.setattr(update_mod, "compute_advantages", spy)
    return seen


def two_turn_trajs(n_groups=2, per_group=4, seed=0):
    """Prompt, model action, observation, model action; reward 1 if both actions are GOOD."""
    rng = np.random.default_rng(seed)
    trajs = []
    for g in range(n_groups):
        for i in range(per_group):
            prompt = list(rng.integers(10, VOCAB, size=3 + (i % 3)))
            a1, a2 = (GOOD, GOOD) if i % 2 == 0 else (BAD, BAD)
            obs = list(rng.integers(10, VOCAB, size=2))
            ids = prompt + [a1, 1] + obs + [a2, 1]
            mask = [0] * len(prompt) + [1, 1] + [0] * len(obs) + [1, 1]
            r = 1.0 if a1 == GOOD else 0.0
            trajs.append(make_trajectory(ids, mask, reward=r, turn_rewards=[0.0, r],
                                         group_id=g, sample_index=i))
    return trajs


def test_compute_logprobs_matches_log_softmax_and_ignores_padding():
    model = tiny_qwen2()
    batch = pack(two_turn_trajs(1, 4))
    mb = collate(batch, np.arange(4))
    logp, ent = compute_logprobs(model, mb, only_model_tokens=False)
    with torch.no_grad():
        logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits
    ref = torch.log_softmax(logits[:, :-1].float(), -1).gather(
        -1, mb.input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(logp, ref, atol=1e-5, rtol=1e-5)
    assert (ent >= 0).all() and (ent <= np.log(VOCAB) + 1e-4).all()
    # the shortest sequence alone, without padding, gives the same logprobs
    shortest = int(np.argmin(batch.lengths))
    alone, _ = compute_logprobs(model, collate(batch, np.array([shortest])),
                                only_model_tokens=False)
    row = list(mb.indices).index(shortest)
    n = int(batch.lengths[shortest]) - 1
    torch.testing.assert_close(alone[0, :n], logp[row, :n], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("chunk", [0, 3])
def test_logprobs_of_model_tokens_only_equal_the_full_pass_with_its_gradient(chunk):
    """The LM head over model tokens alone gives the full pass's logprobs and entropies
    there (0 elsewhere), and the same gradient of a masked loss; so does the head taken
    ``chunk`` model tokens at a time (recomputed in the backward pass), with and without
    autograd."""
    batch = pack(two_turn_trajs(2, 4))
    mb = collate(batch, np.arange(8))
    mask = mb.loss_mask > 0
    assert mask.any() and (~mask).any()
    assert int(mask.sum()) > 3 * chunk  # several chunks, the last one short
    grads = []
    outs = []
    for only in (False, True):
        model = tiny_qwen2()
        logp, ent = compute_logprobs(model, mb, only_model_tokens=only,
                                     chunk_tokens=chunk if only else 0)
        ((logp * mb.loss_mask).sum() + (ent * mb.loss_mask).sum()).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
        outs.append((logp.detach(), ent.detach()))
        if only:
            with torch.no_grad():
                again, _ = compute_logprobs(model, mb, with_entropy=False,
                                            chunk_tokens=chunk)
            torch.testing.assert_close(again, logp.detach(), atol=1e-6, rtol=1e-6)
    (full_lp, full_ent), (sel_lp, sel_ent) = outs
    torch.testing.assert_close(sel_lp[mask], full_lp[mask], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(sel_ent[mask], full_ent[mask], atol=1e-5, rtol=1e-5)
    assert (sel_lp[~mask] == 0).all() and (sel_ent[~mask] == 0).all()
    for a, b in zip(grads[0], grads[1], strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_micro_batching_gives_the_same_gradient(agg):
    base = tiny_qwen2()
    batch = behaviour_logprobs(base, pack(two_turn_trajs(2, 4)))
    # perturb the behaviour logprobs so that ratios are not all 1
    batch.logprobs = batch.logprobs - 0.1 * batch.loss_mask
    deltas = []
    for budget in (10_000, 12):  # one micro-batch vs one sequence per micro-batch
        model = copy.deepcopy(base)
        before = [p.detach().clone() for p in model.parameters()]
        cfg = LearnerConfig(max_tokens_per_microbatch=budget, loss_agg_mode=agg,
                            max_grad_norm=None, use_kl_loss=False, shuffle=False)
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        m = policy_update(model, opt, batch, cfg)
        deltas.append([p.detach() - b for p, b in zip(model.parameters(), before, strict=True)])
        assert m["learner/num_micro_batches"] == (1 if budget == 10_000 else 8)
    for d1, d2 in zip(*deltas, strict=True):
        torch.testing.assert_close(d1, d2, atol=1e-6, rtol=1e-4)
    assert any(d.abs().max() > 0 for d in deltas[0])


def action_logprobs(model, batch):
    """Mean logprobs the model gives GOOD and BAD at the action positions of the batch."""
    with torch.no_grad():
        mb = collate(batch, np.arange(len(batch)))
        logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits
        lp = torch.log_softmax(logits[:, :-1].float(), -1)
        target = mb.input_ids[:, 1:]
        mask = mb.loss_mask.bool() & ((target == GOOD) | (target == BAD))
        return float(lp[..., GOOD][mask].mean()), float(lp[..., BAD][mask].mean())


@pytest.mark.slow
@pytest.mark.parametrize("estimator", ["grpo", "rloo", "reinforce_pp"])
def test_update_raises_logprob_of_advantaged_tokens(estimator):
    model = tiny_qwen2()
    ref = copy.deepcopy(model)
    batch = pack(two_turn_trajs(2, 4))
    cfg = LearnerConfig(adv_estimator=estimator, lr=3e-3, use_kl_loss=True, kl_coef=1e-3)
    opt = make_optimizer(model, cfg)
    good0, bad0 = action_logprobs(model, batch)
    for _ in range(5):
        behaviour_logprobs(model, batch)
        m = policy_update(model, opt, batch, cfg, ref_model=ref)
    good, bad = action_logprobs(model, batch)
    # rewarded actions become likelier, unrewarded ones less likely
    assert good > good0 + 0.1 and bad < bad0 - 0.05
    for key in ("actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/entropy",
                "actor/kl", "actor/kl_loss", "actor/grad_norm", "actor/lr",
                "critic/advantages/mean", "critic/score/mean"):
        assert np.isfinite(m[key]), key
    assert m["actor/kl"] > 0


@pytest.mark.slow
def test_gae_with_value_model_trains_critic_and_policy():
    model, critic = tiny_qwen2(0), tiny_qwen2(1, token_classifier=True)
    batch = pack(two_turn_trajs(2, 4))
    cfg = LearnerConfig(adv_estimator="gae", lr=3e-3, gamma=1.0, lam=0.95, use_kl_loss=False)
    opt = make_optimizer(model, cfg)
    copt = make_optimizer(critic, cfg, lr=3e-3, critic=True)
    good0, bad0 = action_logprobs(model, batch)
    losses = []
    for _ in range(6):
        behaviour_logprobs(model, batch)
        m = policy_update(model, opt, batch, cfg, value_model=critic, critic_optimizer=copt)
        losses.append(m["critic/vf_loss"])
    assert losses[-1] < losses[0]
    good, bad = action_logprobs(model, batch)
    assert good - bad > good0 - bad0
    assert np.isfinite(m["critic/grad_norm"]) and "critic/vf_clipfrac" in m


def test_failed_and_stale_trajectories_are_not_trained():
    model = tiny_qwen2()
    trajs = two_turn_trajs(1, 4)
    for t in trajs:
        t.policy_version = 5
    trajs[0].stop_reason = "env_error"
    trajs[1].policy_version = 2  # 3 versions behind: too stale
    batch = behaviour_logprobs(model, pack(trajs))
    cfg = LearnerConfig(max_staleness=2, use_kl_loss=False)
    m = policy_update(model, make_optimizer(model, cfg), batch, cfg)
    assert m["learner/num_trajectories"] == 4
    assert m["learner/num_trained"] == 2
    assert m["learner/num_stale_dropped"] == 1
    assert m["learner/policy_version"] == 5


def test_recompute_with_tis_minibatches_and_bf16_autocast():
    model = tiny_qwen2()
    batch = pack(two_turn_trajs(2, 4))
    batch.logprobs = (np.float32(-2.0) * batch.loss_mask).astype(np.float32)  # stale-ish
    cfg = LearnerConfig(old_logprob_source="recompute", tis_cap=2.0, num_mini_batches=2,
                        ppo_epochs=2, bf16=True, use_kl_loss=False, lr=1e-3,
                        max_tokens_per_microbatch=40)
    opt = make_optimizer(model, cfg)
    m = policy_update(model, opt, batch, cfg)
    assert np.isfinite(m["actor/pg_loss"]) and np.isfinite(m["actor/grad_norm"])
    assert m["learner/num_micro_batches"] >= 4
    # recompute before any step: the first ratio is 1, so ppo_kl stays small
    assert abs(m["actor/ppo_kl"]) < 0.5


def test_kl_in_reward_lowers_returns_by_coef_times_kl(monkeypatch):
    """REINFORCE++ with the KL in the reward: each model token's reward drops by
    ``kl_reward_coef * (logp_behaviour - logp_ref)``, so with gamma 1 the returns drop by
    the coefficient times the KL summed from that token to the end of the trajectory."""
    model, ref = tiny_qwen2(0), tiny_qwen2(1)  # a different reference: KL of both signs
    batch = behaviour_logprobs(model, pack(two_turn_trajs(2, 4)))
    kl = batch.logprobs.astype(np.float64) - model_logprobs(ref, batch)
    seen = spy_advantages(monkeypatch)
    coef = 0.1
    for use in (False, True):
        cfg = LearnerConfig(adv_estimator="reinforce_pp", use_kl_loss=False, gamma=1.0,
                            use_kl_in_reward=use, kl_reward_coef=coef, kl_reward_estimator="kl")
        learner = copy.deepcopy(model)
        m = policy_update(learner, make_optimizer(learner, cfg), batch, cfg, ref_model=ref)
        assert np.isfinite(m["actor/pg_loss"])
    free, with_kl = seen
    on = batch.loss_mask == 1
    want = np.zeros(batch.num_tokens)
    for b in range(len(batch)):
        s, e = int(batch.offsets[b]), int(batch.offsets[b + 1])
        idx = s + np.flatnonzero(on[s:e])
        want[idx] = np.cumsum((-coef * kl[idx])[::-1])[::-1]
    assert np.abs(want[on]).max() > 0.05  # the penalty is not negligible
    np.testing.assert_allclose(with_kl.returns - free.returns, want, rtol=0, atol=2e-5)
    # at each trajectory's last model token the difference is exactly -coef * KL there
    last = [s + np.flatnonzero(on[s:e])[-1]
            for s, e in zip(batch.offsets[:-1], batch.offsets[1:], strict=True)]
    np.testing.assert_allclose((with_kl.returns - free.returns)[last], -coef * kl[last],
                               rtol=0, atol=1e-6)


def test_dr_grpo_advantage_is_reward_minus_group_mean(monkeypatch):
    model = tiny_qwen2()
    trajs = two_turn_trajs(2, 4)
    for t, r in zip(trajs, [1.0, 0.0, 0.0, 0.0, 2.0, 1.0, 1.0, 0.0], strict=True):
        t.reward, t.turn_rewards = r, [0.0, r]
    batch = behaviour_logprobs(model, pack(trajs))
    seen = spy_advantages(monkeypatch)
    cfg = LearnerConfig(norm_adv_by_std=False, loss_agg_mode="seq-mean-token-sum-norm",
                        use_kl_loss=False)
    m = policy_update(model, make_optimizer(model, cfg), batch, cfg)
    (res,) = seen
    # group means 0.25 and 1.0; no division by the group's std
    np.testing.assert_allclose(res.seq_advantages,
                               [0.75, -0.25, -0.25, -0.25, 1.0, 0.0, 0.0, -1.0], atol=1e-6)
    traj = batch.trajectory_index()
    np.testing.assert_allclose(
        res.advantages, np.where(batch.loss_mask == 1, res.seq_advantages[traj], 0.0), atol=1e-6)
    assert m["critic/advantages/max"] == pytest.approx(1.0)
    assert m["critic/advantages/min"] == pytest.approx(-1.0)


@pytest.mark.parametrize("mode", ["keep", "zero", "drop"])
def test_overlong_episodes_kept_zeroed_or_dropped(mode):
    """``overlong`` for an episode cut mid-reply (stop reason ``length``): ``keep`` trains
    on it like a finished one, ``zero`` like one with reward 0, ``drop`` like a batch
    without it (also out of its group's baseline)."""
    base = tiny_qwen2()
    batch = behaviour_logprobs(base, pack(two_turn_trajs(2, 4)), jitter=0.4)
    assert batch.rewards[0] == 1.0
    sr = batch.stop_reason.copy()
    sr[0] = STOP_CODES["length"]
    cut = dataclasses.replace(batch, stop_reason=sr)
    if mode == "keep":
        same = batch
    elif mode == "zero":
        same = batch.with_rewards(np.where(np.arange(len(batch)) == 0, 0.0, batch.rewards))
    else:
        same = batch.select(np.arange(1, len(batch)))
    cfg = LearnerConfig(overlong=mode, use_kl_loss=False, max_grad_norm=None, shuffle=False)
    got, m = sgd_delta(base, cut, cfg)
    want, _ = sgd_delta(base, same, cfg)
    assert any(d.abs().max() > 1e-4 for d in got)
    assert 0 < m["actor/pg_clipfrac"] < 1  # real ratios on both sides of the clip range
    assert_deltas_close(got, want)
    assert m["learner/num_trained"] == (7 if mode == "drop" else 8)
    assert m["critic/score/mean"] == pytest.approx(
        {"keep": 4 / 8, "zero": 3 / 8, "drop": 3 / 7}[mode])


def test_staleness_downweight_scales_the_stale_gradient():
    """``staleness_mode="downweight"``: a trajectory two versions older than allowed by
    ``max_staleness=0`` weighs ``decay ** 2`` in the loss. With SGD the update is then
    ``w * keep-all + (1 - w) * (N_fresh / N_all) * drop-stale`` (token-mean losses)."""
    base = tiny_qwen2()
    trajs = two_turn_trajs(2, 4)
    for t in trajs:
        t.policy_version = 7 if t.group_id == 0 else 5
    batch = behaviour_logprobs(base, pack(trajs), jitter=0.4)
    common = dict(use_kl_loss=False, max_grad_norm=None, shuffle=False)
    keep, m_keep = sgd_delta(base, batch, LearnerConfig(**common))
    drop, m_drop = sgd_delta(base, batch, LearnerConfig(max_staleness=0, **common))
    down, m_down = sgd_delta(base, batch, LearnerConfig(
        max_staleness=0, staleness_mode="downweight", staleness_decay=0.5, **common))
    assert m_drop["learner/num_trained"] == 4 and m_drop["learner/num_stale_dropped"] == 4
    assert m_down["learner/num_trained"] == 8 and m_down["learner/num_stale_dropped"] == 0
    w = 0.25
    fresh = batch.loss_mask[np.isin(batch.trajectory_index(), np.arange(4))].sum()
    share = float(fresh) / float(batch.loss_mask.sum())
    want = [w * k + (1 - w) * share * d for k, d in zip(keep, drop, strict=True)]
    assert_deltas_close(down, want)
    # and it is neither of the two
    assert max(float((a - b).abs().max()) for a, b in zip(down, keep, strict=True)) > 1e-4
    assert max(float((a - b).abs().max()) for a, b in zip(down, drop, strict=True)) > 1e-4


def _kl_to(model, ref, batch):
    """Exact KL(model || ref) of the next-token distributions, mean over model tokens."""
    with torch.no_grad():
        mb = collate(batch, np.arange(len(batch)))
        kw = dict(input_ids=mb.input_ids, attention_mask=mb.attention_mask)
        lp = torch.log_softmax(model(**kw).logits[:, :-1].float(), -1)
        lq = torch.log_softmax(ref(**kw).logits[:, :-1].float(), -1)
        kl = (lp.exp() * (lp - lq)).sum(-1)
        return float((kl * mb.loss_mask).sum() / mb.loss_mask.sum())


def test_kl_loss_keeps_the_policy_near_the_reference():
    """Same data and steps, with and without the KL loss: the KL to the reference ends
    far smaller with it."""
    base = tiny_qwen2()
    ref = copy.deepcopy(base)
    batch = pack(two_turn_trajs(2, 4))
    drift = {}
    for use_kl in (False, True):
        model = copy.deepcopy(base)
        cfg = LearnerConfig(lr=1e-2, use_kl_loss=use_kl, kl_coef=1.0, kl_estimator="low_var_kl")
        opt = make_optimizer(model, cfg)
        for _ in range(6):
            behaviour_logprobs(model, batch)
            m = policy_update(model, opt, batch, cfg, ref_model=ref)
        assert ("actor/kl_loss" in m) == use_kl
        drift[use_kl] = _kl_to(model, ref, batch)
    assert drift[False] > 0.05  # the policy did move
    assert drift[True] < 0.5 * drift[False], drift


def test_config_validation_and_round_trip():
    cfg = LearnerConfig(adv_estimator="rloo", clip_ratio_high=0.3)
    assert LearnerConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError):
        LearnerConfig(adv_estimator="ppo2")
    with pytest.raises(ValueError):
        LearnerConfig(truncated="bootstrap")
    with pytest.raises(ValueError):
        LearnerConfig.from_dict({"learning_rate": 1.0})
    model = tiny_qwen2()
    with pytest.raises(ValueError, match="value_model"):
        policy_update(model, make_optimizer(model, cfg), pack(two_turn_trajs(1, 2)),
                      LearnerConfig(adv_estimator="gae"))


def test_log_prob_chunks_are_sized_by_the_memory_of_their_logits():
    """``logprob_chunk_mib`` of float32 logits: 1,365 tokens at SmolLM2's 49,152-token
    vocabulary, more than a micro-batch at a 1,024-token one, and 0 (no chunks) when off."""
    from agentgym.learner.update import LearnerConfig, _chunk_tokens

    big = torch.nn.Module()
    big.get_output_embeddings = lambda: torch.nn.Linear(2, 49_152, bias=False)
    assert _chunk_tokens(big, LearnerConfig()) == 1365
    assert _chunk_tokens(tiny_qwen2(), LearnerConfig()) == 256 * 2**20 // (4 * VOCAB)
    assert _chunk_tokens(big, LearnerConfig(logprob_chunk_mib=0)) == 0
    with pytest.raises(ValueError, match="logprob_chunk_mib"):
        LearnerConfig(logprob_chunk_mib=-1)
