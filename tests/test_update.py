"""Learner update on a tiny randomly initialised Qwen2: logprobs, micro-batching, training."""

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from agentgym.learner.batch import collate, make_micro_batches, pack_trajectories  # noqa: E402
from agentgym.learner.update import (  # noqa: E402
    LearnerConfig,
    compute_logprobs,
    make_optimizer,
    policy_update,
)

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


def behaviour_logprobs(model, batch):
    """Fill the batch's behaviour logprobs with the model's own (on-policy)."""
    lp = np.zeros(batch.num_tokens, np.float32)
    with torch.no_grad():
        for mb in make_micro_batches(batch, max_tokens_per_microbatch=10_000):
            logp, _ = compute_logprobs(model, mb, with_entropy=False)
            for row, b in enumerate(mb.indices):
                s, n = batch.offsets[b], mb.lengths[row]
                lp[s + 1 : s + n] = logp[row, : n - 1].numpy()
    batch.logprobs = (lp * batch.loss_mask).astype(np.float32)
    return batch


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
            trajs.append({"token_ids": ids, "loss_mask": mask, "reward": r,
                          "turn_rewards": [0.0, r], "group_id": g, "sample_index": i})
    return trajs


def test_collate_shifts_masks_for_next_token_prediction():
    batch = pack_trajectories([{"token_ids": [11, 12, 13, 14], "loss_mask": [0, 1, 0, 1],
                                "logprobs": [0, -0.5, 0, -0.25]},
                               {"token_ids": [21, 22], "loss_mask": [0, 1],
                                "logprobs": [0, -1.0]}])
    adv = np.arange(6, dtype=np.float32)
    mb = collate(batch, np.array([0, 1]), {"advantages": adv}, pad_token_id=0)
    assert mb.input_ids.tolist() == [[11, 12, 13, 14], [21, 22, 0, 0]]
    assert mb.attention_mask.tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert mb.loss_mask.tolist() == [[1, 0, 1], [1, 0, 0]]
    assert mb.old_logprobs.tolist() == [[-0.5, 0, -0.25], [-1.0, 0, 0]]
    assert mb.advantages.tolist() == [[1, 0, 3], [5, 0, 0]]


def test_compute_logprobs_matches_log_softmax_and_ignores_padding():
    model = tiny_qwen2()
    batch = pack_trajectories(two_turn_trajs(1, 4))
    mb = collate(batch, np.arange(4))
    logp, ent = compute_logprobs(model, mb)
    with torch.no_grad():
        logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits
    ref = torch.log_softmax(logits[:, :-1].float(), -1).gather(
        -1, mb.input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(logp, ref, atol=1e-5, rtol=1e-5)
    assert (ent >= 0).all() and (ent <= np.log(VOCAB) + 1e-4).all()
    # the shortest sequence alone, without padding, gives the same logprobs
    shortest = int(np.argmin(batch.lengths))
    alone, _ = compute_logprobs(model, collate(batch, np.array([shortest])))
    row = list(mb.indices).index(shortest)
    n = int(batch.lengths[shortest]) - 1
    torch.testing.assert_close(alone[0, :n], logp[row, :n], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_micro_batching_gives_the_same_gradient(agg):
    base = tiny_qwen2()
    batch = behaviour_logprobs(base, pack_trajectories(two_turn_trajs(2, 4)))
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
    batch = pack_trajectories(two_turn_trajs(2, 4))
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
    batch = pack_trajectories(two_turn_trajs(2, 4))
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
        t["policy_version"] = 5
    trajs[0]["stop_reason"] = "env_error"
    trajs[1]["policy_version"] = 2  # 3 versions behind: too stale
    batch = behaviour_logprobs(model, pack_trajectories(trajs))
    cfg = LearnerConfig(max_staleness=2, use_kl_loss=False)
    m = policy_update(model, make_optimizer(model, cfg), batch, cfg)
    assert m["learner/num_trajectories"] == 4
    assert m["learner/num_trained"] == 2
    assert m["learner/num_stale_dropped"] == 1
    assert m["learner/policy_version"] == 5


def test_recompute_with_tis_minibatches_and_bf16_autocast():
    model = tiny_qwen2()
    batch = pack_trajectories(two_turn_trajs(2, 4))
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


@pytest.mark.parametrize(
    "overrides",
    [{"adv_estimator": "reinforce_pp", "use_kl_in_reward": True, "kl_reward_coef": 0.1},
     {"adv_estimator": "grpo", "norm_adv_by_std": False,
      "loss_agg_mode": "seq-mean-token-sum-norm", "entropy_coeff": 1e-3, "temperature": 0.7}],
)
def test_kl_in_reward_and_dr_grpo_settings_run(overrides):
    model = tiny_qwen2()
    ref = copy.deepcopy(model)
    batch = behaviour_logprobs(model, pack_trajectories(two_turn_trajs(1, 4)))
    cfg = LearnerConfig(**overrides)
    m = policy_update(model, make_optimizer(model, cfg), batch, cfg, ref_model=ref)
    assert np.isfinite(m["actor/pg_loss"]) and np.isfinite(m["critic/advantages/mean"])
    if cfg.entropy_coeff:
        assert np.isfinite(m["actor/entropy_loss"])


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
        policy_update(model, make_optimizer(model, cfg), pack_trajectories(two_turn_trajs(1, 2)),
                      LearnerConfig(adv_estimator="gae"))
