"""Loss functions of the learner against values computed by hand."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from agentgym.data import pack  # noqa: E402
from agentgym.learner.losses import (  # noqa: E402
    agg_loss,
    entropy_from_logits,
    filter_stale,
    kl_penalty,
    policy_loss,
    stale_mask,
    staleness_weights,
    truncated_is_weights,
    value_loss,
)
from tests.helpers import make_trajectory  # noqa: E402


def t(x):
    return torch.tensor(x, dtype=torch.float32)


def test_policy_loss_clips_both_sides_and_ignores_masked_tokens():
    ratios = [1.5, 0.5, 1.1, 0.5, 7.0]
    logp = t([[math.log(r) for r in ratios]])
    old = torch.zeros_like(logp)
    adv = t([[1.0, 1.0, -1.0, -1.0, 50.0]])
    mask = t([[1, 1, 1, 1, 0]])  # last token is an observation token
    loss, m = policy_loss(logp, old, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.28,
                          clip_ratio_c=None)
    # token 0: max(-1.5, -1.28) = -1.28 (clipped high); token 1: max(-0.5, -0.8) = -0.5;
    # token 2: 1.1; token 3: max(0.5, 0.8) = 0.8 (clipped low). Mean over 4 model tokens.
    assert loss.item() == pytest.approx((-1.28 - 0.5 + 1.1 + 0.8) / 4, abs=1e-6)
    assert m["actor/pg_clipfrac"].item() == pytest.approx(0.5)
    expected_kl = -sum(math.log(r) for r in ratios[:4]) / 4
    assert m["actor/ppo_kl"].item() == pytest.approx(expected_kl, abs=1e-6)


def test_dual_clip_bounds_negative_advantages():
    logp = t([[math.log(5.0), math.log(5.0)]])
    old = torch.zeros_like(logp)
    adv = t([[-1.0, 1.0]])
    mask = t([[1, 1]])
    loss, m = policy_loss(logp, old, adv, mask, clip_ratio_c=3.0)
    # A<0, ratio 5: max(5, 1.28) = 5, bounded by 3 * |A| = 3. A>0: max(-5, -1.28) = -1.28.
    assert loss.item() == pytest.approx((3.0 - 1.28) / 2, abs=1e-6)
    assert m["actor/pg_clipfrac_lower"].item() == pytest.approx(0.5)
    with pytest.raises(ValueError):
        policy_loss(logp, old, adv, mask, clip_ratio_c=0.5)


def test_policy_gradient_direction_and_weights():
    logp = torch.zeros(1, 3, requires_grad=True)
    adv = t([[1.0, -1.0, 0.0]])
    w = t([[2.0, 1.0, 1.0]])
    loss, _ = policy_loss(logp, torch.zeros(1, 3), adv, torch.ones(1, 3), weights=w)
    loss.backward()
    # d/dlogp of -A * ratio at ratio 1 is -A * w / 3.
    assert logp.grad.tolist()[0] == pytest.approx([-2 / 3, 1 / 3, 0.0], abs=1e-6)


LOSS = [[1.0, 2.0, 3.0, 100.0], [4.0, 100.0, 100.0, 100.0], [9.0, 9.0, 9.0, 9.0]]
MASK = [[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]]  # third row: no model tokens


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", (1 + 2 + 3 + 4) / 4),
        ("seq-mean-token-sum", (6 + 4) / 2),
        ("seq-mean-token-mean", (2 + 4) / 2),
        ("seq-mean-token-sum-norm", 10 / (2 * 4)),
    ],
)
def test_aggregation_modes(mode, expected):
    loss = agg_loss(t(LOSS), t(MASK), mode, norm_constant=4)
    assert loss.item() == pytest.approx(expected)
    # Split into micro-batches with the global counts: the shares sum to the whole.
    parts = [
        agg_loss(t(LOSS)[i : i + 1], t(MASK)[i : i + 1], mode, num_tokens=4, num_seqs=2,
                 norm_constant=4)
        for i in range(3)
    ]
    assert sum(p.item() for p in parts) == pytest.approx(expected)


def test_aggregation_rejects_unknown_mode_and_missing_constant():
    with pytest.raises(ValueError):
        agg_loss(t(LOSS), t(MASK), "seq-mean")
    with pytest.raises(ValueError):
        agg_loss(t(LOSS), t(MASK), "seq-mean-token-sum-norm")


def test_kl_estimators_by_hand():
    logp, ref = t([math.log(0.5)]), t([math.log(0.25)])
    d = math.log(2.0)
    assert kl_penalty(logp, ref, "kl").item() == pytest.approx(d, abs=1e-6)
    assert kl_penalty(logp, ref, "k1").item() == pytest.approx(d, abs=1e-6)
    assert kl_penalty(logp, ref, "abs").item() == pytest.approx(d, abs=1e-6)
    assert kl_penalty(logp, ref, "mse").item() == pytest.approx(0.5 * d * d, abs=1e-6)
    # k3: exp(ref - logp) - (ref - logp) - 1 = 0.5 + ln 2 - 1
    assert kl_penalty(logp, ref, "low_var_kl").item() == pytest.approx(0.5 + d - 1, abs=1e-6)
    # clamped as verl: ref - logp clipped to 20, the estimate to 10
    assert kl_penalty(t([-30.0]), t([0.0]), "low_var_kl").item() == pytest.approx(10.0)
    assert kl_penalty(t([0.0]), t([0.0]), "low_var_kl").item() == pytest.approx(0.0)
    with pytest.raises(ValueError):
        kl_penalty(logp, ref, "k4")


def test_entropy_from_logits():
    logits = torch.log(t([[0.5, 0.25, 0.25], [1 / 3, 1 / 3, 1 / 3]]))
    h = entropy_from_logits(logits)
    assert h[0].item() == pytest.approx(0.5 * math.log(2) + 0.5 * math.log(4), abs=1e-6)
    assert h[1].item() == pytest.approx(math.log(3), abs=1e-6)


def test_value_loss_clipped():
    values, old, ret = t([[1.0, 0.2, 5.0]]), t([[0.0, 0.0, 0.0]]), t([[2.0, 0.0, 0.0]])
    mask = t([[1, 1, 0]])
    loss, m = value_loss(values, old, ret, mask, cliprange_value=0.5)
    # token 0: clipped V = 0.5, 0.5 * max(1, 2.25) = 1.125; token 1: 0.5 * 0.04 = 0.02
    assert loss.item() == pytest.approx((1.125 + 0.02) / 2, abs=1e-6)
    assert m["critic/vf_clipfrac"].item() == pytest.approx(0.5)
    loss, _ = value_loss(values, old, ret, mask, cliprange_value=None)
    assert loss.item() == pytest.approx((0.5 + 0.02) / 2, abs=1e-6)


def test_truncated_importance_weights():
    w = truncated_is_weights(torch.log(t([3.0, 0.5, 1.0])), torch.zeros(3), cap=2.0)
    assert w.tolist() == pytest.approx([2.0, 0.5, 1.0], abs=1e-6)
    assert not w.requires_grad


def test_staleness_weights_drop_and_downweight():
    versions = np.array([5, 4, 2, 0])
    assert staleness_weights(versions, 5, 2).tolist() == [1, 1, 0, 0]
    assert staleness_weights(versions, 5, 2, mode="downweight", decay=0.5).tolist() == [
        1, 1, 0.5, 0.125]
    assert staleness_weights(versions, 5, None).tolist() == [1, 1, 1, 1]
    assert stale_mask(versions, 5, 1).tolist() == [True, True, False, False]
    with pytest.raises(ValueError):
        staleness_weights(versions, 5, 1, mode="keep")


def test_filter_stale_keeps_recent_trajectories():
    trajs = [
        make_trajectory([1, 2, 3], [0, 1, 1], reward=1.0, policy_version=3, turn_rewards=[1.0]),
        make_trajectory([4, 5], [0, 1], reward=2.0, policy_version=0, turn_rewards=[0.5, 1.5]),
        make_trajectory([6, 7, 8, 9], [0, 0, 1, 1], reward=3.0, policy_version=2),
    ]
    batch = pack(trajs)
    kept_batch, kept = filter_stale(batch, current_version=3, max_staleness=1)
    assert kept.tolist() == [0, 2]
    assert kept_batch.token_ids.tolist() == [1, 2, 3, 6, 7, 8, 9]
    assert kept_batch.offsets.tolist() == [0, 3, 7]
    assert kept_batch.rewards.tolist() == [1.0, 3.0]
    assert kept_batch.turn_rewards.tolist() == [1.0]
    assert kept_batch.turn_offsets.tolist() == [0, 1, 1]
