"""The learner on trajectories played with a bounded context (``context_window``): one
sample per reply, the backend's logprobs recomputed over exactly what it was sent, the
episode's advantage on each reply, critics refused."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from agentgym.backends import make_backend  # noqa: E402
from agentgym.data.trajectories import BatchFormatError, PackedBatch, pack  # noqa: E402
from agentgym.engine import RolloutEngine  # noqa: E402
from agentgym.learner.advantages import compute_advantages  # noqa: E402
from agentgym.learner.update import LearnerConfig, make_optimizer, policy_update  # noqa: E402
from tests.learner.test_update import model_logprobs  # noqa: E402


@pytest.fixture(scope="module")
def played(tiny_model_dir):
    """Maze episodes of the tiny model (transformers backend) with a window of one reply."""
    tok = transformers.AutoTokenizer.from_pretrained(tiny_model_dir)
    backend = make_backend("transformers", tiny_model_dir, max_batch_size=8)
    eng = RolloutEngine(backend, tok, max_turns=6, max_new_tokens=8, max_total_tokens=1024,
                        context_window=1, temperature=1.0, own_backend=True)
    batch = eng.collect_sync(2, "maze", n_samples=3)
    eng.close()
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir).float().eval()
    return batch, model


def test_recomputed_logprobs_of_each_step_equal_the_backends(played):
    batch, model = played
    packed = pack(batch.trajectories)
    assert packed.has_steps and packed.step_offsets[-1] == sum(t.num_turns for t in batch)
    samples, source, row = packed.step_samples()
    assert any(t.num_turns > 1 for t in batch)
    # over the samples the learner's logprobs are the backend's (what it was sent)
    lp = model_logprobs(model, samples)
    m = samples.loss_mask.astype(bool)
    assert m.sum() == packed.loss_mask.sum()  # every reply trained once
    np.testing.assert_allclose(lp[m], samples.logprobs[m], atol=2e-4)
    # over the whole record (every reply after the first sees more than its window) not
    late = np.zeros(packed.num_tokens, bool)
    for t_idx, t in enumerate(batch):
        base = packed.offsets[t_idx]
        for s in range(1, len(t.step_reply)):
            late[base + t.step_reply[s]:base + t.step_end[s]] = True
    late &= packed.loss_mask.astype(bool)
    whole = model_logprobs(model, packed)
    assert np.abs(whole[late] - packed.logprobs[late]).max() > 1e-3


def test_each_reply_trains_with_its_episodes_advantage(played):
    batch, model = played
    packed = pack(batch.trajectories)
    rewards = np.arange(len(packed), dtype=np.float32)  # distinct in every group
    packed = packed.with_rewards(rewards)
    adv = compute_advantages(packed, "grpo")
    samples, source, row = packed.step_samples()
    per_sample = adv.advantages[source]
    for k in range(len(samples)):
        lo, hi = samples.offsets[k], samples.offsets[k + 1]
        mask = samples.loss_mask[lo:hi].astype(bool)
        assert np.allclose(per_sample[lo:hi][mask], adv.seq_advantages[row[k]])
    opt = make_optimizer(model, LearnerConfig(lr=1e-3))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    metrics = policy_update(model, opt, packed, LearnerConfig(lr=1e-3, ppo_epochs=1))
    assert metrics["learner/num_trajectories"] == len(packed)
    assert metrics["learner/num_samples"] == len(samples)
    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())


def test_critics_and_kl_rewards_are_refused(played):
    batch, model = played
    packed = pack(batch.trajectories)
    opt = make_optimizer(model, LearnerConfig())
    with pytest.raises(ValueError, match="bounded context"):
        policy_update(model, opt, packed, LearnerConfig(adv_estimator="gae"),
                      value_model=model)
    with pytest.raises(ValueError, match="bounded context"):
        policy_update(model, opt, packed, LearnerConfig(use_kl_in_reward=True),
                      ref_model=model)


def test_steps_survive_select_rows_concat_and_are_checked(played):
    trajs = played[0].trajectories
    packed = pack(trajs)
    picked = packed.select([3, 0])
    assert picked.step_offsets[-1] == trajs[3].num_turns + trajs[0].num_turns
    assert picked.step_reply.tolist() == trajs[3].step_reply + trajs[0].step_reply
    both = PackedBatch.concat([packed.rows(0, 2), packed.rows(2, len(packed))])
    for name in ("step_offsets", "step_context", "step_reply", "step_end"):
        assert np.array_equal(getattr(both, name), getattr(packed, name))
    bad = packed.select([0])
    bad.step_end = bad.step_end + np.uint32(10_000)
    with pytest.raises(BatchFormatError, match="step_end"):
        bad.validate()
