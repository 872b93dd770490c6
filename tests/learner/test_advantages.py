"""Advantage estimators on hand-made packed batches."""

import msgspec
import numpy as np
import pytest

from agentgym.data import pack
from agentgym.learner.advantages import (
    compute_advantages,
    discounted_returns,
    gae,
    grpo_advantages,
    place_token_rewards,
    rloo_advantages,
)
from tests.helpers import make_trajectory


def traj(reward, group=0, stop="done", n_model=2, prompt=2, **kw):
    ids = list(range(1, prompt + n_model + 1))
    mask = [0] * prompt + [1] * n_model
    return make_trajectory(ids, mask, reward=reward, group_id=group, stop_reason=stop,
                           turn_rewards=[reward], **kw)


def test_grpo_group_normalisation_by_hand():
    # group [1, 0, 0, 0]: mean 0.25, unbiased std 0.5 -> 1.5, -0.5, -0.5, -0.5
    adv = grpo_advantages(np.array([1, 0, 0, 0, 2, 4.0]), np.array([7, 7, 7, 7, 9, 9]),
                          eps=0.0)
    assert adv.tolist() == pytest.approx([1.5, -0.5, -0.5, -0.5, -1 / np.sqrt(2),
                                          1 / np.sqrt(2)], abs=1e-6)
    dr = grpo_advantages(np.array([1, 0, 0, 0.0]), np.zeros(4), norm_by_std=False)
    assert dr.tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25])


def test_grpo_identical_rewards_and_singletons_give_zero():
    adv = grpo_advantages(np.array([1.0, 1.0, 0.5]), np.array([0, 0, 1]))
    assert adv.tolist() == [0.0, 0.0, 0.0]


def test_rloo_leave_one_out():
    adv = rloo_advantages(np.array([1, 0, 0, 0.0]), np.zeros(4))
    assert adv.tolist() == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3])


def test_failed_episodes_get_zero_and_leave_group_stats():
    batch = pack([traj(1.0), traj(0.0), traj(0.0), traj(0.0),
                               traj(5.0, stop="env_error"), traj(5.0, stop="backend_error"),
                               traj(5.0, stop="timeout"), traj(5.0, stop="aborted")])
    res = compute_advantages(batch, "grpo", eps=0.0)
    assert res.valid.tolist() == [True] * 4 + [False] * 4
    assert res.seq_advantages.tolist() == pytest.approx([1.5, -0.5, -0.5, -0.5, 0, 0, 0, 0])
    # broadcast to model tokens only (2 prompt tokens, 2 model tokens per trajectory)
    assert res.advantages[:4].tolist() == pytest.approx([0, 0, 1.5, 1.5])
    assert np.all(res.advantages[16:] == 0)


@pytest.mark.parametrize(
    "mode, valid, scores",
    [("keep", [True] * 3, [1.0, 0.0, 1.0]), ("zero", [True] * 3, [1.0, 0.0, 0.0]),
     ("drop", [True, True, False], [1.0, 0.0, 1.0])],
)
def test_truncated_episode_options(mode, valid, scores):
    batch = pack([traj(1.0), traj(0.0), traj(1.0, stop="horizon")])
    res = compute_advantages(batch, "rloo", truncated=mode)
    assert res.valid.tolist() == valid
    assert res.scores.tolist() == scores
    if mode == "drop":
        assert res.seq_advantages.tolist() == pytest.approx([1.0, -1.0, 0.0])


@pytest.mark.parametrize(
    "mode, valid, scores, returns",
    [("keep", [True] * 4, [1.0, 0.0, 1.0, 1.0], [1.0, 1.0]),
     ("zero", [True] * 4, [1.0, 0.0, 1.0, 0.0], [0.0, 0.0]),
     ("drop", [True, True, True, False], [1.0, 0.0, 1.0, 1.0], [0.0, 0.0])],
)
def test_overlong_episode_options(mode, valid, scores, returns):
    """``overlong`` acts on stop reason ``length`` only (the truncated one stays kept)."""
    batch = pack([traj(1.0), traj(0.0), traj(1.0, stop="horizon"),
                               traj(1.0, stop="length")])
    res = compute_advantages(batch, "rloo", overlong=mode)
    assert res.valid.tolist() == valid
    assert res.scores.tolist() == scores
    # r_i - mean of the other valid members
    want = {"keep": [1 / 3, -1.0, 1 / 3, 1 / 3], "zero": [2 / 3, -2 / 3, 2 / 3, -2 / 3],
            "drop": [0.5, -1.0, 0.5, 0.0]}[mode]
    assert res.seq_advantages.tolist() == pytest.approx(want)
    # token-level: the cut episode's turn reward is zeroed too, or it leaves the batch
    tok = compute_advantages(batch, "reinforce_pp", overlong=mode)
    assert tok.returns[14:16].tolist() == pytest.approx(returns)


def test_bad_options_raise():
    batch = pack([traj(1.0), traj(0.0)])
    with pytest.raises(ValueError, match="bootstrap"):
        compute_advantages(batch, "grpo", truncated="bootstrap")
    with pytest.raises(ValueError):
        compute_advantages(batch, "ppo")
    with pytest.raises(ValueError, match="values"):
        compute_advantages(batch, "gae")


def multi_turn_batch(stop="done"):
    # [prompt, prompt, m1, m2, obs, obs, m3]: turn 1 = (m1, m2), turn 2 = (m3)
    return pack([make_trajectory([1, 2, 3, 4, 5, 6, 7], [0, 0, 1, 1, 0, 0, 1],
                                 turn_rewards=[0.5, 1.0], reward=1.5, stop_reason=stop)])


def test_turn_rewards_sit_at_last_model_token_of_each_turn():
    batch = multi_turn_batch()
    assert place_token_rewards(batch).tolist() == [0, 0, 0, 0.5, 0, 0, 1.0]
    assert place_token_rewards(batch, placement="outcome").tolist() == [0, 0, 0, 0, 0, 0, 1.5]
    # reward != sum of turn rewards: the residual goes on the last model token
    batch2 = batch.with_rewards(np.array([2.0]))
    assert place_token_rewards(batch2).tolist() == [0, 0, 0, 0.5, 0, 0, 1.5]


def test_gae_hand_example_skips_observation_tokens():
    batch = multi_turn_batch()
    values = np.array([9, 9, 0.1, 0.2, 9, 9, 0.3], dtype=np.float32)  # 9s are off-policy
    res = compute_advantages(batch, "gae", values=values, gamma=0.9, lam=0.8,
                             whiten_advantages=False)
    # m3: 1.0 - 0.3 = 0.7; m2: 0.5 + 0.9*0.3 - 0.2 + 0.72*0.7 = 1.074;
    # m1: 0 + 0.9*0.2 - 0.1 + 0.72*1.074 = 0.85328
    a = [0, 0, 0.85328, 1.074, 0, 0, 0.7]
    assert res.advantages.tolist() == pytest.approx(a, abs=1e-5)
    assert res.returns.tolist() == pytest.approx([0, 0, 0.95328, 1.274, 0, 0, 1.0], abs=1e-5)


def test_gae_bootstrap_for_truncated_episodes():
    batch = multi_turn_batch(stop="horizon")
    values = np.array([0, 0, 0.1, 0.2, 0, 0, 0.3], dtype=np.float32)
    res = compute_advantages(batch, "gae", values=values, gamma=0.9, lam=0.8,
                             truncated="bootstrap", whiten_advantages=False)
    assert res.advantages[6] == pytest.approx(1.0 + 0.9 * 0.3 - 0.3, abs=1e-6)
    # the low-level function agrees
    adv, _ = gae(np.array([1.0]), np.array([0.3]), np.array([1]), np.array([0, 1]),
                 gamma=0.9, bootstrap=np.array([True]))
    assert adv[0] == pytest.approx(0.97)


def test_reinforce_pp_returns_are_whitened_and_kl_penalised():
    batch = pack([
        make_trajectory([1, 2, 3], [0, 1, 1], reward=1.0, turn_rewards=[1.0],
                        logprobs=[0, -1.0, -1.0]),
        make_trajectory([1, 2, 3], [0, 1, 1], reward=0.0, turn_rewards=[0.0],
                        logprobs=[0, -1.0, -1.0]),
    ])
    res = compute_advantages(batch, "reinforce_pp", gamma=1.0)
    assert res.returns.tolist() == pytest.approx([0, 1, 1, 0, 0, 0])
    model = res.advantages[batch.loss_mask == 1]
    assert model.mean() == pytest.approx(0.0, abs=1e-6)
    assert model.std(ddof=1) == pytest.approx(1.0, abs=1e-4)
    # k1 KL of 0.5 per model token, coefficient 0.1: each token loses 0.05
    ref = batch.logprobs - 0.5 * batch.loss_mask
    res = compute_advantages(batch, "reinforce_pp", ref_logprobs=ref, kl_coef=0.1)
    assert res.returns.tolist() == pytest.approx([0, 0.9, 0.95, 0, -0.1, -0.05], abs=1e-6)


def test_reinforce_pp_baseline_and_metrics():
    batch = pack([traj(1.0), traj(0.0), traj(0.5, group=1), traj(0.5, group=1)])
    res = compute_advantages(batch, "reinforce_pp_baseline")
    model = res.advantages[batch.loss_mask == 1]
    assert model[:2].tolist() == pytest.approx([model[0]] * 2)
    assert model[0] > 0 > model[2] and model[4] == pytest.approx(0.0, abs=1e-6)
    assert res.metrics["critic/score/mean"] == pytest.approx(0.5)
    assert res.metrics["learner/num_valid"] == 4


def _gae_per_token(r, v, mask, offsets, gamma, lam, bootstrap):
    """The recursion token by token, trajectory by trajectory (the reference)."""
    adv, ret = np.zeros(len(r), np.float32), np.zeros(len(r), np.float32)
    for b in range(len(offsets) - 1):
        idx = [i for i in range(offsets[b], offsets[b + 1]) if mask[i]]
        if not idx:
            continue
        nxt = float(v[idx[-1]]) if bootstrap is not None and bootstrap[b] else 0.0
        acc = 0.0
        for i in reversed(idx):
            acc = float(r[i]) + gamma * nxt - float(v[i]) + gamma * lam * acc
            adv[i], ret[i], nxt = acc, acc + float(v[i]), float(v[i])
    return adv, ret


@pytest.mark.parametrize("seed", range(5))
def test_vectorised_gae_and_returns_equal_the_per_token_recursion(seed):
    rng = np.random.default_rng(seed)
    lens = rng.integers(0, 40, 9)
    offsets = np.concatenate(([0], np.cumsum(lens))).astype(np.int64)
    mask = (rng.random(int(offsets[-1])) < 0.6).astype(np.int8)
    r = rng.normal(size=mask.size).astype(np.float32)
    v = rng.normal(size=mask.size).astype(np.float32)
    boot = rng.random(9) < 0.5
    for gamma, lam in ((1.0, 1.0), (0.99, 0.95), (0.9, 1.0)):
        for bs in (None, boot):
            want_adv, want_ret = _gae_per_token(r, v, mask, offsets, gamma, lam, bs)
            adv, ret = gae(r, v, mask, offsets, gamma=gamma, lam=lam, bootstrap=bs)
            np.testing.assert_allclose(adv, want_adv, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(ret, want_ret, rtol=1e-5, atol=1e-5)
        g, _ = gae(r, np.zeros_like(v), mask, offsets, gamma=gamma, lam=1.0)
        np.testing.assert_allclose(discounted_returns(r, mask, offsets, gamma), g,
                                   rtol=1e-5, atol=1e-5)


def _tree_row(sample, reward, parent, root: bool, group=0):
    """A row of a hand-built tree: a 4-token prefix (2 prompt, 2 model tokens; masked in a
    child's copy) forked after turn 1, then 2 tokens of its own."""
    prefix_mask = [0, 0, 1, 1] if root else [0, 0, 0, 0]
    return make_trajectory([1, 2, 3, 4, 5 + sample, 9], prefix_mask + [1, 1], reward=reward,
                           group_id=group, sample_index=sample, turn_rewards=[0.0, reward],
                           branch_parent=parent, branch_turn=1, branch_pos=4)


def test_branched_advantages_on_a_hand_built_tree():
    rows = [_tree_row(0, 1.0, 0, True), _tree_row(1, 0.0, 0, False),
            _tree_row(2, 1.0, 2, True), _tree_row(3, 1.0, 2, False),
            traj(1.0, group=1, sample_index=0), traj(0.0, group=1, sample_index=1)]
    pb = pack(rows)
    assert pb.branch_parent.tolist() == [0, 0, 2, 2, 0, 1]
    res = compute_advantages(pb, "grpo", norm_by_std=False)
    # Episode group 0 (Dr.GRPO): mean 0.75 -> 0.25, -0.75, 0.25, 0.25. Step groups: {0, 1}
    # mean 0.5 -> +0.5, -0.5; {2, 3} -> 0, 0. Prefixes: root 0 trains its family's mean
    # episode advantage (0.25 - 0.75) / 2 = -0.25, root 2 (0.25 + 0.25) / 2 = 0.25; the
    # children's copies are masked.
    want = [0, 0, -0.25, -0.25, 0.75, 0.75,
            0, 0, 0, 0, -1.25, -1.25,
            0, 0, 0.25, 0.25, 0.25, 0.25,
            0, 0, 0, 0, 0.25, 0.25,
            0, 0, 0.5, 0.5, 0, 0, -0.5, -0.5]
    assert res.advantages.tolist() == pytest.approx(want)
    no_step = compute_advantages(pb, "grpo", norm_by_std=False, branch_step_weight=0.0)
    assert no_step.advantages[4:6].tolist() == pytest.approx([0.25, 0.25])
    assert no_step.advantages[10:12].tolist() == pytest.approx([-0.75, -0.75])
    # A failed child leaves both groups' statistics: its family is the root alone.
    rows[1] = msgspec.structs.replace(rows[1], stop_reason="env_error", loss_mask=[0] * 6)
    failed = compute_advantages(pack(rows), "grpo", norm_by_std=False)
    # group 0's valid rewards 1, 1, 1: every advantage 0
    assert not failed.advantages[:24].any()
