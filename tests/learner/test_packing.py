"""Packed micro-batches (``LearnerConfig.packing``): the samples end to end without padding,
``position_ids`` restarting per sample, in one row ``[1, T]`` or a few rows with filler
segments, against the padded layout, on real randomly initialised Hugging Face models (Qwen2
and Llama).

Measured float32 differences (packed vs padded, these models, CPU, SDPA and eager):
logits <= 1.2e-7 and logprobs <= 2.4e-7 absolute, each loss <= 2e-7 relative, gradients
<= 5e-7 absolute (2e-7 of the largest), one SGD step's parameter change <= 6e-8 absolute
and its metrics <= 4e-7 relative. The tolerances: logits 1e-5, logprobs 5e-6, losses and
metrics 1e-5 relative, gradients and parameter changes 1e-6 absolute plus 1e-4 relative.
"""

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from agentgym.data import pack  # noqa: E402
from agentgym.data.frames import RowImages, frame_of  # noqa: E402
from agentgym.learner.losses import (  # noqa: E402
    AGG_MODES,
    agg_loss,
    kl_penalty,
    policy_loss,
    value_loss,
)
from agentgym.learner.microbatch import (  # noqa: E402
    PackedRows,
    check_packable,
    collate,
    make_micro_batches,
    plan_micro_batches,
    row_width,
    scatter_to_packed,
)
from agentgym.learner.update import (  # noqa: E402
    LearnerConfig,
    compute_logprobs,
    compute_values,
    policy_update,
)
from tests.helpers import make_trajectory  # noqa: E402
from tests.learner.test_context_window import played  # noqa: E402, F401

VOCAB = 48
LOGPROB_ATOL = 5e-6
GRAD_ATOL, GRAD_RTOL = 1e-6, 1e-4


def make_model(arch: str = "qwen2", seed: int = 0, *, critic: bool = False,
               attn: str = "sdpa") -> torch.nn.Module:
    """A small causal LM (or, with ``critic``, a one-label token classifier without
    dropout: a value model) of the Qwen2 or Llama architecture, random weights."""
    torch.manual_seed(seed)
    kw = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
              tie_word_embeddings=False, num_labels=1, classifier_dropout=0.0,
              attn_implementation=attn)
    if arch == "qwen2":
        cfg = transformers.Qwen2Config(**kw)
        cls = (transformers.Qwen2ForTokenClassification if critic
               else transformers.Qwen2ForCausalLM)
    else:
        cfg = transformers.LlamaConfig(**kw)
        cls = (transformers.LlamaForTokenClassification if critic
               else transformers.LlamaForCausalLM)
    return cls(cfg).float().eval()


def skewed_trajs(seed: int = 0, n_short: int = 9, n_long: int = 3):
    """Multi-turn trajectories of very different lengths (``n_short`` of one or two turns,
    ``n_long`` of ten or more), in three groups with rewards that differ inside each group;
    behaviour logprobs are random, so PPO ratios fall on both sides of the clip range."""
    rng = np.random.default_rng(seed)
    trajs = []
    for i in range(n_short + n_long):
        ids = list(rng.integers(2, VOCAB, size=int(rng.integers(3, 7))))
        mask = [0] * len(ids)
        for _ in range(int(rng.integers(10, 14)) if i >= n_short else int(rng.integers(1, 3))):
            reply = int(rng.integers(2, 5))
            obs = int(rng.integers(2, 6))
            ids += list(rng.integers(2, VOCAB, size=reply + obs))
            mask += [1] * reply + [0] * obs
        lp = np.where(np.array(mask) == 1, rng.uniform(-4.5, -3.0, len(mask)), 0.0)
        trajs.append(make_trajectory(ids, mask, logprobs=lp.tolist(), group_id=i % 3,
                                     sample_index=i // 3, reward=float(rng.random())))
    return trajs


def skewed_batch(seed: int = 0):
    batch = pack(skewed_trajs(seed))
    assert batch.lengths.max() > 4 * np.median(batch.lengths)  # length-skewed
    return batch


# -- the model input ----------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["one row", "rows"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_a_packed_forward_gives_each_sample_its_separate_forwards_logits(arch, attn, layout):
    """transformers derives the per-sample causal mask from the packed rows'
    ``position_ids`` (no attention mask, no cache): each sample's logits, in the one row or
    in rows closed by filler segments, are those of a forward over that sample alone."""
    model = make_model(arch, attn=attn)
    assert model.config._attn_implementation == attn
    batch = skewed_batch()
    mb = collate(batch, np.arange(len(batch)), packing=True)
    assert mb.input_ids.shape == (1, batch.num_tokens) and mb.attention_mask is None
    rows = mb.rows(None if layout == "one row" else int(batch.lengths.max()) + 7)
    assert (rows.input_ids.shape[0] == 1) == (layout == "one row")
    with torch.no_grad():
        flat = model(**rows.inputs()).logits.flatten(0, 1)
        for i, b in enumerate(mb.indices):
            s, n = int(batch.offsets[b]), int(batch.lengths[b])
            alone = model(input_ids=torch.from_numpy(
                batch.token_ids[s:s + n].astype(np.int64))[None]).logits[0]
            at = rows.index[i, :n - 1]  # tokens 0 .. n - 2 of sample i in the rows
            torch.testing.assert_close(flat[at], alone[:-1], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(flat[at[-1] + 1], alone[-1], atol=1e-5, rtol=1e-5)


def test_collate_packs_rows_end_to_end_with_the_padded_per_token_layout():
    batch = pack([make_trajectory([11, 12, 13, 14], [0, 1, 0, 1], logprobs=[0, -0.5, 0, -0.25]),
                  make_trajectory([21, 22], [0, 1], logprobs=[0, -1.0]),
                  make_trajectory([31, 32, 33], [0, 1, 1], logprobs=[0, -2.0, -3.0])])
    adv = np.arange(batch.num_tokens, dtype=np.float32)
    rows = np.array([2, 0, 1])
    pad = collate(batch, rows, {"advantages": adv, "returns": adv + 1})
    mb = collate(batch, rows, {"advantages": adv, "returns": adv + 1}, packing=True)
    assert mb.packed and not pad.packed
    assert mb.input_ids.tolist() == [[31, 32, 33, 11, 12, 13, 14, 21, 22]]
    assert mb.position_ids.tolist() == [[0, 1, 2, 0, 1, 2, 3, 0, 1]]
    assert mb.model_inputs()["use_cache"] is False and "attention_mask" not in mb.model_inputs()
    # column j of row i: the packed position of sample i's token j; -1 past its end
    assert mb.token_index.tolist() == [[0, 1, -1], [3, 4, 5], [7, -1, -1]]
    for name in ("loss_mask", "old_logprobs", "advantages", "returns"):
        assert torch.equal(getattr(mb, name), getattr(pad, name)), name
    assert mb.lengths.tolist() == [3, 4, 2] and mb.num_model_tokens == pad.num_model_tokens
    # take reads outputs at the row's positions back into that layout, 0 past each sample
    assert mb.rows().take(torch.arange(9.0) * 10).tolist() == [[0, 10, 0], [30, 40, 50],
                                                                 [70, 0, 0]]
    # rows of width 4: longest first, each into the first row with room; each row's free
    # end a filler segment (token 0) with positions restarting at 0
    rows = mb.rows(4)
    assert isinstance(rows, PackedRows)
    assert rows.input_ids.tolist() == [[11, 12, 13, 14], [31, 32, 33, 0], [21, 22, 0, 0]]
    assert rows.position_ids.tolist() == [[0, 1, 2, 3], [0, 1, 2, 0], [0, 1, 0, 1]]
    assert rows.index.tolist() == [[4, 5, -1], [0, 1, 2], [8, -1, -1]]
    assert rows.inputs()["use_cache"] is False and "attention_mask" not in rows.inputs()
    with pytest.raises(ValueError, match="longest sample"):
        mb.rows(3)


def test_a_samples_target_never_comes_from_the_next_sample():
    """Every trained column's input token and target token are one sample's consecutive
    tokens (the output at a sample's last token has no column), even for a sample whose
    first token is marked as a model token: it has no prediction in either layout."""
    trajs = skewed_trajs()
    trajs[1] = make_trajectory([7, 8, 9, 10], [1, 1, 0, 1], logprobs=[-1.0, -1.0, 0.0, -1.0])
    batch = pack(trajs)
    rows = np.arange(len(batch))
    mb = collate(batch, rows, packing=True)
    pad = collate(batch, rows)
    trained = pad.loss_mask > 0
    segment = np.repeat(np.arange(len(rows)), batch.lengths[rows])
    at = mb.token_index[trained].numpy()
    assert (at >= 0).all() and (segment[at] == segment[at + 1]).all()
    for layout in (mb.rows(), mb.layout(make_model())):  # one row, and a few rows
        at = layout.index[trained]
        pos, ids = layout.position_ids.flatten(), layout.input_ids.flatten()
        assert (pos[at + 1] == pos[at] + 1).all()  # a sample's next token, not a restart
        # the inputs and targets are the padded layout's
        assert torch.equal(ids[at], pad.input_ids[:, :-1][trained])
        assert torch.equal(ids[at + 1], pad.input_ids[:, 1:][trained])
    # token 0 of every sample is never a target: the packed loss mask scattered back is
    # the batch's, except there
    back = scatter_to_packed(batch, mb, mb.loss_mask)
    first = batch.offsets[:-1]
    want = batch.loss_mask.astype(np.float32).copy()
    want[first] = 0
    assert np.array_equal(back, want) and batch.loss_mask[first[1]] == 1


def test_scatter_writes_packed_micro_batch_values_back_to_their_tokens():
    """Values of packed micro-batches in any plan land on the batch's own tokens: the
    model's logprobs scattered from packed micro-batches equal the padded ones."""
    model = make_model()
    batch = skewed_batch()
    flat = {}
    for packing in (False, True):
        out = np.full(batch.num_tokens, np.nan, np.float32)
        for mb in make_micro_batches(batch, max_tokens_per_microbatch=96, packing=packing):
            with torch.no_grad():
                logp, _ = compute_logprobs(model, mb, with_entropy=False,
                                           only_model_tokens=False)
            scatter_to_packed(batch, mb, logp, out)
        flat[packing] = out
    first = batch.offsets[:-1]
    assert np.isnan(flat[True][first]).all()  # no prediction: left as it was
    rest = np.ones(batch.num_tokens, bool)
    rest[first] = False
    assert not np.isnan(flat[True][rest]).any()
    np.testing.assert_allclose(flat[True][rest], flat[False][rest], atol=LOGPROB_ATOL, rtol=0)


# -- the plan ------------------------------------------------------------------------------


def test_the_packed_plan_fills_a_real_token_budget():
    rng = np.random.default_rng(0)
    lengths = np.concatenate([rng.integers(5, 40, 60), [300, 150, 500, 90]])
    budget = 256
    plan = plan_micro_batches(lengths, budget, packing=True)
    got = np.sort(np.concatenate(plan))
    assert np.array_equal(got, np.arange(len(lengths)))  # every row once
    for g in plan:
        # the real-token budget, except a row longer than it, which is alone
        assert lengths[g].sum() <= budget or (len(g) == 1 and lengths[g[0]] > budget)
    alone = [g.tolist() for g in plan if len(g) == 1 and lengths[g[0]] > budget]
    assert sorted(alone) == [[60], [62]]  # the 300 and 500-token rows
    # first-fit decreasing: no two micro-batches could be merged, and packing needs fewer
    # micro-batches than padding under the same budget
    sums = sorted(int(lengths[g].sum()) for g in plan)
    assert sums[0] + sums[1] > budget
    assert len(plan) < len(plan_micro_batches(lengths, budget))
    # the sequence cap and ``indices`` hold as in the padded plan
    capped = plan_micro_batches(lengths, 10_000, max_seqs_per_microbatch=7, packing=True)
    assert max(len(g) for g in capped) <= 7 and sum(len(g) for g in capped) == len(lengths)
    some = np.array([3, 61, 10, 5])
    assert sorted(np.concatenate(plan_micro_batches(lengths, budget, indices=some,
                                                    packing=True)).tolist()) == [3, 5, 10, 61]


def test_rows_are_chosen_per_attention_kernel_and_cost():
    """Flash and flex attention take the one row; a dense masked kernel (SDPA, eager) whose
    cost grows with the row's square gets a few rows as wide as the cost model finds best,
    at least the longest sample."""
    batch = skewed_batch()
    mb = collate(batch, np.arange(len(batch)), packing=True)
    model = make_model("llama", attn="sdpa")
    width = row_width(mb.lengths, model.config)
    assert batch.lengths.max() <= width < batch.num_tokens
    rows = mb.layout(model)
    assert rows.input_ids.shape[1] == width and rows.input_ids.shape[0] >= 2
    assert rows.input_ids.numel() < 1.25 * batch.num_tokens  # little filler
    for impl in ("flash_attention_2", "flex_attention"):
        other = copy.deepcopy(model.config)
        other._attn_implementation = impl
        assert row_width(mb.lengths, other) is None, impl
    assert row_width(mb.lengths[:1], model.config) is None  # one sample: one row
    # a batch of equal samples fills rows exactly: rows, no filler
    even = collate(pack([make_trajectory([5] * 10, [0] * 5 + [1] * 5)] * 8), np.arange(8),
                   packing=True)
    rows = even.layout(model)
    assert rows.input_ids.numel() == 80 and rows.input_ids.shape[0] > 1


def test_packing_refuses_images_and_models_without_packed_attention():
    batch = pack([make_trajectory([1, 2, 3], [0, 1, 1]), make_trajectory([4, 5], [0, 1])])
    frame = frame_of(np.zeros((28, 28, 3), np.uint8))
    batch.images = [RowImages([frame], [0]), RowImages([], [])]
    collate(batch, np.array([1]), packing=True)  # a row without pictures packs
    with pytest.raises(ValueError, match="image observations.*packing=False"):
        collate(batch, np.array([0, 1]), packing=True)
    check_packable(make_model())
    plain = torch.nn.Sequential(torch.nn.Embedding(VOCAB, 4), torch.nn.Linear(4, VOCAB))
    mb = collate(pack([make_trajectory([1, 2, 3], [0, 1, 1])]), np.array([0]), packing=True)
    with pytest.raises(ValueError, match="Hugging Face"):
        compute_logprobs(plain, mb)
    with pytest.raises(ValueError, match="packing must be"):
        LearnerConfig(packing="yes")


# -- losses and gradients ------------------------------------------------------------------


def _losses_and_grads(model, critic, batch, ref_t, agg, packing, budget):
    """Every loss of every micro-batch of ``batch`` under the plan (padded or packed) with
    the whole batch's normalisers, summed; the gradients of their weighted sum; the
    model's logprobs scattered to the batch's tokens."""
    for m in (model, critic):
        m.zero_grad(set_to_none=True)
    returns = np.where(batch.loss_mask == 1, np.linspace(-1, 1, batch.num_tokens), 0)
    arrays = {"advantages": (batch.loss_mask * np.cos(np.arange(batch.num_tokens))),
              "ref_logprobs": ref_t, "returns": returns.astype(np.float32),
              "values": (0.3 * returns).astype(np.float32)}
    mbs = make_micro_batches(batch, arrays, max_tokens_per_microbatch=budget, packing=packing)
    assert all(mb.packed == packing for mb in mbs)
    agg_kw = dict(num_tokens=float(sum(mb.num_model_tokens for mb in mbs)),
                  num_seqs=float(sum(int((mb.loss_mask.sum(-1) > 0).sum()) for mb in mbs)),
                  norm_constant=float(max(int(mb.lengths.max()) for mb in mbs)))
    totals = dict.fromkeys(("pg", "entropy", "kl", "vf"), 0.0)
    flat = np.zeros(batch.num_tokens, np.float32)
    for mb in mbs:
        logp, ent = compute_logprobs(model, mb, chunk_tokens=5)
        mask = mb.loss_mask
        pg, _ = policy_loss(logp, mb.old_logprobs, mb.advantages, mask, agg_mode=agg, **agg_kw)
        ent_l = agg_loss(ent, mask, agg, **agg_kw)
        kl = agg_loss(kl_penalty(logp, mb.ref_logprobs, "low_var_kl"), mask, agg, **agg_kw)
        vf, _ = value_loss(compute_values(critic, mb), mb.values, mb.returns, mask,
                           agg_mode=agg, **agg_kw)
        (pg - 0.01 * ent_l + 0.1 * kl + vf).backward()
        for k, v in zip(totals, (pg, ent_l, kl, vf), strict=True):
            totals[k] += v.item()
        scatter_to_packed(batch, mb, logp, flat)
    grads = [p.grad.clone() for m in (model, critic) for p in m.parameters()]
    return len(mbs), totals, flat, grads


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_packed_losses_and_gradients_equal_the_padded_ones(arch, agg):
    """The same batch in padded and in packed micro-batches (different groupings under the
    same budget): the same logprobs, every loss under every aggregation mode, and the same
    gradients of the policy and of the critic."""
    model, critic = make_model(arch, 0), make_model(arch, 1, critic=True)
    ref = make_model(arch, 2)
    batch = skewed_batch()
    with torch.no_grad():
        ref_t = np.zeros(batch.num_tokens, np.float32)
        for mb in make_micro_batches(batch, max_tokens_per_microbatch=10_000):
            scatter_to_packed(batch, mb, compute_logprobs(ref, mb, with_entropy=False)[0], ref_t)
    n_pad, pad, lp_pad, g_pad = _losses_and_grads(model, critic, batch, ref_t, agg, False, 200)
    n_pk, pk, lp_pk, g_pk = _losses_and_grads(model, critic, batch, ref_t, agg, True, 200)
    assert n_pk < n_pad  # packing needed fewer forwards
    np.testing.assert_allclose(lp_pk, lp_pad, atol=LOGPROB_ATOL, rtol=0)
    for k in pad:
        assert pk[k] == pytest.approx(pad[k], rel=1e-5, abs=1e-7), k
    assert all(abs(v) > 1e-4 for v in pad.values())
    for a, b in zip(g_pk, g_pad, strict=True):
        torch.testing.assert_close(a, b, atol=GRAD_ATOL, rtol=GRAD_RTOL)
    assert max(float(g.abs().max()) for g in g_pad) > 1e-3


# -- the whole update ----------------------------------------------------------------------


def _one_step(model, batch, cfg, **kwargs):
    """Metrics and parameter change of one ``policy_update`` with plain SGD (linear in the
    gradient, so the comparison is not blurred by Adam's first-step normalisation) from a
    copy of ``model`` (and of ``value_model``)."""
    model = copy.deepcopy(model)
    critic = kwargs.pop("value_model", None)
    extra = {}
    if critic is not None:
        critic = copy.deepcopy(critic)
        extra = dict(value_model=critic,
                     critic_optimizer=torch.optim.SGD(critic.parameters(), lr=0.5))
    nets = [model] + ([critic] if critic is not None else [])
    before = [p.detach().clone() for m in nets for p in m.parameters()]
    metrics = policy_update(model, torch.optim.SGD(model.parameters(), lr=0.5), batch, cfg,
                            **kwargs, **extra)
    after = [p.detach() for m in nets for p in m.parameters()]
    return metrics, [a - b for a, b in zip(after, before, strict=True)]


def _assert_same_update(padded, packed):
    (m_pad, d_pad), (m_pk, d_pk) = padded, packed
    assert set(m_pk) == set(m_pad)
    assert m_pk["learner/num_micro_batches"] <= m_pad["learner/num_micro_batches"]
    for k, v in m_pad.items():
        if k != "learner/num_micro_batches":
            assert m_pk[k] == pytest.approx(v, rel=1e-5, abs=1e-6, nan_ok=True), k
    for a, b in zip(d_pk, d_pad, strict=True):
        torch.testing.assert_close(a, b, atol=GRAD_ATOL, rtol=GRAD_RTOL)
    assert max(float(d.abs().max()) for d in d_pad) > 1e-4  # the step did move


@pytest.mark.parametrize("agg", AGG_MODES)
def test_a_grpo_update_packed_equals_padded(agg):
    """One full GRPO ``policy_update`` (KL loss to a reference, entropy bonus, two
    mini-batches) with ``packing`` on and off: the same metrics (but the number of
    micro-batches) and the same parameters after the step."""
    model, ref = make_model("llama", 0), make_model("llama", 3)
    batch = skewed_batch()
    common = dict(loss_agg_mode=agg, max_tokens_per_microbatch=128, num_mini_batches=2,
                  entropy_coeff=0.01, use_kl_loss=True, kl_coef=0.1)
    runs = [_one_step(model, batch, LearnerConfig(packing=p, **common), ref_model=ref)
            for p in (False, True)]
    _assert_same_update(*runs)
    assert 0 < runs[0][0]["actor/pg_clipfrac"] < 1  # ratios on both sides of the clip


def test_a_gae_update_with_a_critic_packed_equals_padded():
    """PPO with a value model and proximal logprobs recomputed (TIS): the critic's values
    and the proximal logprobs before the update, and the critic's loss and gradient inside
    it, come from packed forwards too, with the padded results."""
    model, critic = make_model("qwen2", 0), make_model("qwen2", 1, critic=True)
    batch = skewed_batch()
    common = dict(adv_estimator="gae", lam=0.95, max_tokens_per_microbatch=128,
                  use_kl_loss=False, loss_agg_mode="seq-mean-token-mean",
                  old_logprob_source="recompute", tis_cap=2.0)
    runs = [_one_step(model, batch, LearnerConfig(packing=p, **common), value_model=critic)
            for p in (False, True)]
    _assert_same_update(*runs)
    assert runs[1][0]["learner/num_micro_batches"] < runs[0][0]["learner/num_micro_batches"]
    assert runs[0][0]["critic/vf_loss"] > 0


def test_a_bounded_context_update_packed_equals_padded(played):  # noqa: F811 (fixture)
    """A batch played with ``context_window`` (one sample per reply): the samples pack like
    trajectories and the update is the padded one."""
    batch, model = played
    packed = pack(batch.trajectories).with_rewards(np.arange(len(batch), dtype=np.float32))
    assert packed.has_steps
    common = dict(max_tokens_per_microbatch=512, use_kl_loss=False)
    runs = [_one_step(model, packed, LearnerConfig(packing=p, **common)) for p in (False, True)]
    _assert_same_update(*runs)
    assert runs[0][0]["learner/num_samples"] > len(packed)
