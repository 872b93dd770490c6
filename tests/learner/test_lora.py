"""LoRA through peft (agentgym.learner.lora): only the adapter trains, the merged weights are
the adapter model's, the disabled adapter is the base (the KL reference), the adapter and
the merged folder round-trip, and a GRPO step moves only the adapter.

Models: the local tiny Qwen2 folder (untied head) and a tiny in-memory Llama with tied
embeddings (SmolLM2's layout). Tolerances: the merged model's logits match the adapter
model's within atol 1e-5 / rtol 1e-4 (float32; the merge reorders one matmul into
``x @ (W + s B A)^T`` from ``x @ W^T + s (x @ A^T) @ B^T``); the disabled adapter and the
adapter round trip are exact (bit-equal)."""

import asyncio
import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from agentgym.data import pack  # noqa: E402
from agentgym.learner.lora import (  # noqa: E402
    ADAPTER_FILE,
    LoraSettings,
    adapter_disabled,
    apply_lora,
    load_adapter_into,
    merged_state_dict,
    merged_weights,
    reference_model,
    save_adapter,
    save_merged,
    sync_merged,
    trainable_parameters,
    unshared,
)
from agentgym.learner.microbatch import collate  # noqa: E402
from agentgym.learner.update import (  # noqa: E402
    LearnerConfig,
    compute_logprobs,
    make_optimizer,
    policy_update,
)
from tests.learner.test_update import behaviour_logprobs, two_turn_trajs  # noqa: E402

ATOL, RTOL = 1e-5, 1e-4
SMALL = LoraSettings(r=4, alpha=8)


def tiny_tied_llama(seed=0):
    """A 2-layer Llama with tied input/output embeddings (SmolLM2's layout), vocab 32."""
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(
        vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16,
        max_position_embeddings=64, tie_word_embeddings=True)
    return transformers.LlamaForCausalLM(cfg).float().eval()


@pytest.fixture(params=["qwen2_folder", "tied_llama"])
def base(request, tiny_model_dir):
    """``(base model, its config source for save_merged, vocab)``."""
    if request.param == "qwen2_folder":
        model = transformers.AutoModelForCausalLM.from_pretrained(
            tiny_model_dir, dtype=torch.float32).eval()
        return model, tiny_model_dir, model.config.vocab_size
    model = tiny_tied_llama()
    return model, model.config, 32


def ids_for(vocab, n=3, length=12, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (n, length), generator=g)


def logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits


def trained(model, settings=SMALL, steps=3, vocab=32, lr=1e-2):
    """A peft model of ``model`` after ``steps`` AdamW steps of next-token loss on random
    ids, so every ``lora_B`` is non-zero."""
    pm = apply_lora(model, settings)
    opt = make_optimizer(pm, LearnerConfig(lr=lr))
    ids = ids_for(vocab, seed=7)
    pm.train()
    for _ in range(steps):
        out = pm(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad()
    pm.eval()
    for n, p in pm.named_parameters():
        if ".lora_B." in n:
            assert p.abs().max() > 0, n
    return pm


# --------------------------------------------------------------------------- settings
def test_settings_defaults_round_trip():
    s = LoraSettings()
    assert (s.r, s.alpha, s.dropout, s.target_modules) == (16, 32.0, 0.0, "all-linear")
    assert s.scaling == 2.0
    assert LoraSettings.from_dict(s.to_dict()) == s
    assert LoraSettings.from_dict(None) == s
    t = LoraSettings.from_dict({"r": 8, "target_modules": ("q_proj", "v_proj")})
    assert t.target_modules == ["q_proj", "v_proj"]
    cfg = t.peft_config()
    assert (cfg.r, cfg.lora_alpha, cfg.bias) == (8, 32.0, "none")


@pytest.mark.parametrize("d, key", [
    ({"rank": 4}, "lora.rank"),
    ({"r": 0}, "lora.r"),
    ({"r": 2.5}, "lora.r"),
    ({"r": True}, "lora.r"),
    ({"alpha": -1}, "lora.alpha"),
    ({"alpha": float("nan")}, "lora.alpha"),
    ({"dropout": 1.0}, "lora.dropout"),
    ({"target_modules": "linear"}, "lora.target_modules"),
    ({"target_modules": []}, "lora.target_modules"),
    ({"target_modules": ["q_proj", ""]}, "lora.target_modules"),
])
def test_bad_settings_name_the_key(d, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")) as e:
        LoraSettings.from_dict(d)
    assert "\n" not in str(e.value)


def test_targets_that_match_nothing_or_a_tied_head_are_refused():
    with pytest.raises(ValueError, match=r"lora\.target_modules"):
        apply_lora(tiny_tied_llama(), {"target_modules": ["no_such_proj"]})
    with pytest.raises(ValueError, match=r"lora\.target_modules.*tied"):
        apply_lora(tiny_tied_llama(), {"target_modules": ["q_proj", "lm_head"]})
    model = tiny_tied_llama()
    pm = apply_lora(model, SMALL)
    for again in (pm, model):  # the peft model, or its base changed in place
        with pytest.raises(ValueError, match="already"):
            apply_lora(again, SMALL)


# --------------------------------------------------------------------------- the model
def test_only_the_adapter_is_trainable_and_in_the_optimizer(base):
    model, _, _ = base
    linears = {n: m for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and ".layers." in n}
    head = model.get_output_embeddings()
    n_total = sum(p.numel() for p in model.parameters())
    pm = apply_lora(model, SMALL)
    trainable = {n for n, p in pm.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A.default." in n or ".lora_B.default." in n
                             for n in trainable)
    # every Linear of the decoder layers carries an adapter; the LM head does not
    adapted = {n.split(".lora_")[0].removeprefix("base_model.model.") for n in trainable}
    assert adapted == set(linears)
    assert not hasattr(pm.get_output_embeddings(), "lora_A") and head is not None
    expected = sum(SMALL.r * (m.in_features + m.out_features) for m in linears.values())
    assert trainable_parameters(pm) == (expected, n_total + expected)
    opt = make_optimizer(pm, LearnerConfig())
    in_opt = {id(p) for g in opt.param_groups for p in g["params"]}
    assert in_opt == {id(p) for p in pm.parameters() if p.requires_grad}


def test_a_fresh_adapter_and_the_disabled_adapter_are_the_base_model(base):
    model, _, vocab = base
    ref = copy.deepcopy(model)
    ids = ids_for(vocab)
    pm = apply_lora(model, SMALL)
    assert torch.equal(logits(pm, ids), logits(ref, ids))  # B = 0
    opt = make_optimizer(pm, LearnerConfig(lr=1e-2))
    pm.train()
    for _ in range(2):
        pm(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    pm.eval()
    assert not torch.allclose(logits(pm, ids), logits(ref, ids))
    with adapter_disabled(pm):
        assert torch.equal(logits(pm, ids), logits(ref, ids))
    assert not torch.allclose(logits(pm, ids), logits(ref, ids))  # enabled again after
    with adapter_disabled(ref):  # a plain model: a no-op
        assert torch.equal(logits(ref, ids), logits(copy.deepcopy(ref), ids))


@pytest.mark.parametrize("only_model_tokens", [True, False])
def test_reference_view_logprobs_equal_the_base_models(only_model_tokens):
    """``reference_model`` through ``compute_logprobs`` (both its paths: the decoder + head
    on model tokens, and the whole forward) gives the base model's logprobs, and leaves the
    adapter enabled."""
    model = tiny_tied_llama()
    base_copy = copy.deepcopy(model)
    pm = trained(model)
    mb = collate(pack(two_turn_trajs(2, 4)), np.arange(8))
    view = reference_model(pm).eval().requires_grad_(False)  # a frozen copy's habits
    with torch.no_grad():
        got, _ = compute_logprobs(view, mb, only_model_tokens=only_model_tokens)
        want, _ = compute_logprobs(base_copy, mb, only_model_tokens=only_model_tokens)
        policy, _ = compute_logprobs(pm, mb, only_model_tokens=only_model_tokens)
    assert torch.equal(got, want)
    assert not torch.allclose(policy, want)
    assert list(view.parameters()) and next(view.parameters()).device == torch.device("cpu")
    lora_numel = sum(p.numel() for n, p in pm.named_parameters() if ".lora_" in n)
    assert trainable_parameters(pm)[0] == lora_numel > 0  # the adapter is still trainable


# --------------------------------------------------------------------------- merging
def test_merged_state_dict_is_the_base_layout_and_the_adapter_models_logits(base):
    model, _, vocab = base
    base_sd = {k: (v.shape, v.dtype) for k, v in model.state_dict().items()}
    fresh = copy.deepcopy(model)
    pm = trained(model, vocab=vocab)
    state = {k: v.detach().clone() for k, v in pm.state_dict().items()}
    before = {k: v.clone() for k, v in state.items()}
    merged = merged_state_dict(state, SMALL)
    assert list(merged) == list(base_sd)
    assert {k: (v.shape, v.dtype) for k, v in merged.items()} == base_sd
    assert all(torch.equal(state[k], before[k]) for k in state)  # pure
    fresh.load_state_dict(merged)
    ids = ids_for(vocab)
    torch.testing.assert_close(logits(fresh, ids), logits(pm, ids), atol=ATOL, rtol=RTOL)
    # the one-process shortcut and the peft config give the same dict
    again = merged_weights(pm)
    also = merged_state_dict(state, pm.peft_config["default"])
    for k in merged:
        assert torch.equal(again[k], merged[k]) and torch.equal(also[k], merged[k])
    # an adapted weight is W + (alpha / r) B A (float32 rounding apart); the rest untouched
    key = "model.layers.0.self_attn.q_proj"
    w = state[f"base_model.model.{key}.base_layer.weight"]
    a = state[f"base_model.model.{key}.lora_A.default.weight"]
    b = state[f"base_model.model.{key}.lora_B.default.weight"]
    torch.testing.assert_close(merged[f"{key}.weight"], w + SMALL.scaling * (b @ a),
                               atol=1e-7, rtol=1e-6)
    assert not torch.equal(merged[f"{key}.weight"], w)
    norm = "model.layers.0.input_layernorm.weight"
    assert merged[norm].data_ptr() == state[f"base_model.model.{norm}"].data_ptr()


def test_merge_runs_in_float32_and_keeps_the_weights_dtype():
    pm = trained(tiny_tied_llama())
    state = {k: v.detach().to(torch.bfloat16) for k, v in pm.state_dict().items()}
    merged = merged_state_dict(state, SMALL)
    assert {v.dtype for v in merged.values()} == {torch.bfloat16}
    key = "model.layers.1.mlp.down_proj"
    w, a, b = (state[f"base_model.model.{key}.{p}.weight"]
               for p in ("base_layer", "lora_A.default", "lora_B.default"))
    want = (w.float() + SMALL.scaling * (b.float() @ a.float())).to(torch.bfloat16)
    # rounded once, from float32: at most one bfloat16 step from the float32 sum's rounding
    torch.testing.assert_close(merged[f"{key}.weight"], want, atol=0, rtol=2**-7)
    in_bf16 = w + SMALL.scaling * (b @ a)  # bfloat16 throughout: rounded at every op
    exact = w.double() + SMALL.scaling * (b.double() @ a.double())
    err = (merged[f"{key}.weight"].double() - exact).abs().sum()
    assert err <= (in_bf16.double() - exact).abs().sum()


def test_merge_refuses_what_it_cannot_merge():
    pm = trained(tiny_tied_llama())
    state = dict(pm.state_dict())
    lone = {k: v for k, v in state.items() if ".lora_B." not in k}
    with pytest.raises(ValueError, match="lora_A only"):
        merged_state_dict(lone, SMALL)
    with pytest.raises(ValueError, match="cannot merge"):
        merged_state_dict(state, SMALL, adapter_name="other")
    with pytest.raises(ValueError, match=r"lora\.use_dora"):
        merged_state_dict(state, {"lora_alpha": 8, "use_dora": True})


# --------------------------------------------------------------------------- files
def test_adapter_save_and_load_round_trip_exactly(tmp_path, base):
    model, _, vocab = base
    fresh_base, other_base = copy.deepcopy(model), copy.deepcopy(model)
    pm = trained(model, vocab=vocab)
    folder = save_adapter(pm, tmp_path / "adapter")
    assert (folder / ADAPTER_FILE).is_file() and (folder / "adapter_config.json").is_file()
    resumed = apply_lora(fresh_base, SMALL)
    params_before = {n: p for n, p in resumed.named_parameters()}
    load_adapter_into(resumed, folder)
    for (n, p), (n2, q) in zip(pm.named_parameters(), resumed.named_parameters(), strict=True):
        assert n == n2 and torch.equal(p, q), n
        assert q is params_before[n2]  # in place: an optimizer built before still holds them
    ids = ids_for(vocab)
    assert torch.equal(logits(resumed, ids), logits(pm, ids))
    other = apply_lora(other_base, LoraSettings(r=2, alpha=8))
    with pytest.raises(ValueError, match=r"lora\.r"):
        load_adapter_into(other, folder)


def test_merged_folder_loads_with_transformers_and_matches(tmp_path, base, tiny_model_dir):
    model, config_src, vocab = base
    pm = trained(model, vocab=vocab)
    tok = transformers.AutoTokenizer.from_pretrained(tiny_model_dir)
    out = save_merged(pm, config_src, tok, tmp_path / "merged")
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()
    assert not (out / "adapter_config.json").exists()
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert type(loaded).__name__ == type(model).__name__
    assert set(loaded.state_dict()) == set(merged_weights(pm))
    ids = ids_for(vocab)
    torch.testing.assert_close(logits(loaded, ids), logits(pm, ids), atol=ATOL, rtol=RTOL)
    assert transformers.AutoTokenizer.from_pretrained(out).get_vocab() == tok.get_vocab()
    # the same folder from a (gathered) peft state dict and the LoRA config
    out2 = save_merged(dict(pm.state_dict()), config_src, None, tmp_path / "from_state",
                       lora=SMALL)
    again = transformers.AutoModelForCausalLM.from_pretrained(out2, dtype=torch.float32)
    assert torch.equal(logits(again.eval(), ids), logits(loaded, ids))
    with pytest.raises(ValueError, match="LoRA config"):
        save_merged(dict(pm.state_dict()), config_src, None, tmp_path / "x")


def test_sync_merged_loads_the_merged_weights_into_the_transformers_backend(tiny_model_dir):
    from agentgym.backends import make_backend

    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir,
                                                              dtype=torch.float32)
    pm = trained(model, vocab=model.config.vocab_size)
    backend = make_backend("transformers", tiny_model_dir, device="cpu")

    async def go():
        try:
            await sync_merged(backend, pm)
            return backend.policy_version, {k: v.clone()
                                            for k, v in backend.model.state_dict().items()}
        finally:
            await backend.close()

    version, served = asyncio.run(go())
    assert version == 1
    want = merged_weights(pm)
    assert set(served) == set(want)
    assert all(torch.equal(served[k], want[k]) for k in want)


def test_unshared_copies_tied_weights_so_safetensors_can_write_them(tmp_path):
    """A tied model's merged dict shares the embedding between two keys (as its own state
    dict does), which safetensors refuses (the vLLM backend writes the dict to a file);
    ``unshared`` copies the second one and keeps every other tensor as it is."""
    from safetensors.torch import load_file, save_file

    pm = trained(tiny_tied_llama())
    merged = merged_weights(pm)
    emb, head = merged["model.embed_tokens.weight"], merged["lm_head.weight"]
    assert emb.data_ptr() == head.data_ptr()
    with pytest.raises(RuntimeError, match="share memory"):
        save_file(merged, str(tmp_path / "shared.safetensors"))
    flat = unshared(merged)
    assert flat["model.embed_tokens.weight"] is emb
    assert flat["lm_head.weight"].data_ptr() != emb.data_ptr()
    assert torch.equal(flat["lm_head.weight"], emb)
    assert all(flat[k] is merged[k] for k in merged if k != "lm_head.weight")
    save_file(flat, str(tmp_path / "flat.safetensors"))
    back = load_file(str(tmp_path / "flat.safetensors"))
    assert all(torch.equal(back[k], merged[k]) for k in merged)


# --------------------------------------------------------------------------- the learner
def _grpo_batch(model):
    batch = pack(two_turn_trajs(2, 4))
    return behaviour_logprobs(model, batch, jitter=0.1)


def test_a_grpo_policy_update_moves_only_the_adapter():
    """One GRPO ``policy_update`` with the KL to the disabled adapter: the base weights are
    bit-equal after it, every ``lora_B`` moved (B starts at 0, so ``lora_A`` has no gradient
    on the first step and moves by weight decay alone), and the KL of the first step is 0
    (the policy is still the base); the second step's KL is positive."""
    pm = apply_lora(tiny_tied_llama(), SMALL)
    before = {n: p.detach().clone() for n, p in pm.named_parameters()}
    cfg = LearnerConfig(adv_estimator="grpo", lr=1e-2, use_kl_loss=True, kl_coef=0.1)
    opt = make_optimizer(pm, cfg)
    batch = _grpo_batch(pm)
    m = policy_update(pm, opt, batch, cfg, ref_model=reference_model(pm))
    assert m["learner/num_trained"] == 8
    assert m["actor/kl"] == pytest.approx(0.0, abs=1e-7)
    changed = {n for n, p in pm.named_parameters() if not torch.equal(p, before[n])}
    lora_b = {n for n in before if ".lora_B." in n}
    assert lora_b <= changed
    assert all(".lora_A." in n or ".lora_B." in n for n in changed)
    m2 = policy_update(pm, opt, batch, cfg, ref_model=reference_model(pm))
    assert m2["actor/kl"] > 0
    for n, p in pm.named_parameters():
        if ".lora_" not in n:
            assert torch.equal(p, before[n]), n


def test_the_reference_view_trains_like_a_frozen_copy_of_the_base():
    """Two steps with ``reference_model(pm)`` as the KL reference give the same adapter as
    two steps with a separate frozen copy of the base model."""
    model = tiny_tied_llama()
    frozen = copy.deepcopy(model).requires_grad_(False)
    cfg = LearnerConfig(adv_estimator="grpo", lr=1e-2, use_kl_loss=True, kl_coef=0.5,
                        shuffle=False)
    pm_a = apply_lora(model, SMALL)
    pm_b = copy.deepcopy(pm_a)
    batch = _grpo_batch(pm_a)
    opt_a, opt_b = make_optimizer(pm_a, cfg), make_optimizer(pm_b, cfg)
    for _ in range(2):
        ma = policy_update(pm_a, opt_a, batch, cfg, ref_model=reference_model(pm_a))
        mb = policy_update(pm_b, opt_b, batch, cfg, ref_model=frozen)
    assert ma["actor/kl"] == pytest.approx(mb["actor/kl"], rel=1e-5, abs=1e-9)
    assert ma["actor/kl"] > 0
    for (n, p), (_, q) in zip(pm_a.named_parameters(), pm_b.named_parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-5, msg=n)
