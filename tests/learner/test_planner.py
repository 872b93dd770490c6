"""The memory planner: the bundled Qwen2.5 configs, AgentGym-RL's recipes on 8 x 80 GiB, and
how each setting moves the plan (sharding, checkpointing, micro-batch tokens, LoRA, the
colocated backend, the suggestions)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from agentgym.learner.planner import (  # noqa: E402
    BUNDLED_MODELS_DIR,
    GIB,
    PlanError,
    check_fits,
    model_shape,
    plan_memory,
)
from agentgym.learner.train_config import TrainerConfig, load_config_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted((ROOT / "configs" / "agentgym_rl").glob("*.yaml"))
Q7, Q3 = "Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-3B-Instruct"

#: AgentGym-RL's five recipes (examples/train/ScalingInter-RL/*_train.sh): env here, turn
#: stages, steps a stage, tasks x samples, mini-batch (prompts), PPO epochs, trajectory and
#: turn tokens.
AGENTGYM_RL = {
    "babyai": ("babyai", [6, 13, 20], 100, 32, 4, 8, 2, 8192, 512),
    "sciworld": ("sciworld", [10, 20, 30], 100, 16, 8, 8, 1, 8192, 200),
    "search": ("search", [5, 8, 10], 100, 32, 4, 8, 2, 8192, 512),
    "textcraft": ("textcraft", [10, 20, 30], 100, 32, 8, 8, 2, 10240, 512),
    "webarena": ("webshop", [8, 12, 15], 80, 32, 4, 4, 2, 14098, 512),
}


def recipe(path: Path) -> TrainerConfig:
    return TrainerConfig.from_dict(load_config_file(path))


def small(**over) -> dict:
    """A SmolLM-sized config on the 3B model's shapes: fsdp, checkpointing, no backend."""
    base = {"model": Q3, "env": "maze", "backend": "openai", "max_total_tokens": 4096,
            "tasks_per_step": 8, "n_samples": 1,
            "learner": {"max_tokens_per_microbatch": 4096},
            "parallel": {"strategy": "fsdp", "activation_checkpointing": True}}
    return {**base, **over}


# ------------------------------------------------------------------------ bundled models
def test_bundled_qwen_configs_build_on_the_meta_device_with_the_published_sizes():
    s7, s3 = model_shape(Q7), model_shape(Q3)
    assert s7.params == 7_615_616_512
    assert round(s3.params / 1e9, 2) == 3.09  # Qwen2.5-3B: 3.09B parameters
    for shape, hub in ((s7, Q7), (s3, Q3)):
        cfg = json.loads((BUNDLED_MODELS_DIR / hub / "config.json").read_text())
        assert (shape.hidden, shape.intermediate, shape.layers, shape.heads,
                shape.kv_heads, shape.vocab, shape.tied) == (
            cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"],
            cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["vocab_size"],
            cfg["tie_word_embeddings"])
        # the parts add up: the layers and the root (embeddings, final norm, LM head)
        assert shape.layers * shape.layer_params + shape.root_params == shape.params
    assert not s7.tied and s3.tied
    assert s7.root_params == 2 * s7.vocab * s7.hidden + s7.hidden  # untied head
    assert s3.root_params == s3.vocab * s3.hidden + s3.hidden


def test_model_found_as_folder_tiny_or_named_and_unknown_hub_id_refused(tmp_path):
    folder = tmp_path / "my-qwen"
    folder.mkdir()
    shutil.copy(BUNDLED_MODELS_DIR / Q3 / "config.json", folder / "config.json")
    assert model_shape(str(folder)).params == model_shape(Q3).params
    tiny = model_shape("tiny", {"hidden_size": 64, "num_hidden_layers": 3})
    assert (tiny.hidden, tiny.layers) == (64, 3)
    with pytest.raises(ValueError, match="model 'Org/Unknown-7B'.*local model folder"):
        model_shape("Org/Unknown-7B")


# ----------------------------------------------------------------------------- recipes
def test_there_are_five_recipes_on_two_model_sizes():
    names = {p.stem for p in RECIPES}
    assert names == {f"{n}_{s}" for n in AGENTGYM_RL for s in ("7b", "3b")}


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_recipe_is_agentgym_rls(path):
    env, rounds, steps, tasks, n, mini, epochs, traj, turn = AGENTGYM_RL[path.stem[:-3]]
    cfg = recipe(path)
    lc = cfg.learner
    assert cfg.model == (Q7 if path.stem.endswith("7b") else Q3)
    assert (cfg.env, cfg.method_key, cfg.horizon, cfg.steps_per_stage) == (
        env, "scalinginter-rl", rounds, steps)
    assert (cfg.tasks_per_step, cfg.n_samples, lc["num_mini_batches"], lc["ppo_epochs"]) == (
        tasks, n, tasks // mini, epochs)
    assert (cfg.max_total_tokens, cfg.max_new_tokens, cfg.temperature) == (traj, turn, 1.0)
    assert (lc["lr"], lc["kl_coef"], lc["kl_estimator"], lc["entropy_coeff"]) == (
        1e-6, 1e-3, "low_var_kl", 1e-3)
    assert lc["use_kl_loss"] and lc["clip_ratio_low"] == lc["clip_ratio_high"] == 0.2
    assert cfg.backend == "vllm" and cfg.parallel == {"strategy": "fsdp",
                                                      "activation_checkpointing": True}
    assert cfg.backend_kwargs["max_model_len"] >= cfg.max_total_tokens
    if env != path.stem[:-3]:  # the WebArena shape on webshop says so
        assert "runs on `webshop`" in path.read_text()


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_recipe_fits_8_gpus_of_80_gib_under_fsdp(path):
    plan = plan_memory(recipe(path), 8, 80)
    print(f"{path.stem}: {plan.total / GIB:.2f} GiB, margin {plan.margin / GIB:.2f} GiB")
    assert plan.strategy == "fsdp" and plan.shard_group == 8
    assert plan.fits and plan.margin >= 3 * GIB, plan.render()
    assert check_fits(recipe(path), 8, 80).total == plan.total
    # the colocated vLLM takes the recipe's gpu_memory_utilization of the GPU
    util = recipe(path).backend_kwargs["gpu_memory_utilization"]
    assert plan.line("backend").bytes == int(util * 80 * GIB)
    # the largest multiple of 0.05, at most AgentGym-RL's 0.7, that leaves 3 GiB
    assert abs(util * 20 - round(util * 20)) < 1e-9 and util <= 0.7
    if util < 0.7:
        assert plan.margin - int(0.05 * 80 * GIB) < 3 * GIB


@pytest.mark.parametrize("path", [p for p in RECIPES if p.stem.endswith("7b")],
                         ids=lambda p: p.stem)
def test_7b_recipe_is_refused_under_ddp_naming_the_strategy(path):
    cfg = recipe(path)
    ddp = cfg.replace(parallel={**cfg.parallel, "strategy": "ddp"})
    plan = plan_memory(ddp, 8, 80)
    assert not plan.fits and plan.margin < 0
    # a whole float32 copy of 7.6B parameters, its gradients and AdamW on every rank
    assert plan.line("optimizer").bytes == 8 * 7_615_616_512
    with pytest.raises(PlanError) as err:
        check_fits(ddp, 8, 80)
    msg = str(err.value)
    assert isinstance(err.value, ValueError) and "\n" not in msg
    assert "parallel.strategy: fsdp" in msg
    # what it suggests does fit
    assert plan_memory(cfg.replace(parallel={**ddp.parallel, "strategy": "fsdp"}), 8, 80).fits


# ------------------------------------------------------------------ what moves the plan
def test_sharding_divides_the_model_state_by_the_shard_group():
    ddp = plan_memory(small(parallel={"strategy": "ddp"}), 1, 80)
    fsdp = plan_memory(small(), 8, 80)
    for name in ("parameters", "optimizer", "reference model"):
        assert abs(fsdp.line(name).bytes - ddp.line(name).bytes / 8) <= 16
    # hsdp on 2 nodes of 4: sharded within a node
    hsdp = plan_memory(small(parallel={"strategy": "hsdp"}), 8, 80, nodes=2)
    assert hsdp.shard_group == 4
    assert abs(hsdp.line("parameters").bytes - ddp.line("parameters").bytes / 4) <= 32
    # ddp on 8 ranks: DDP's reducer buckets double the gradients
    ddp8 = plan_memory(small(parallel={"strategy": "ddp"}), 8, 80)
    assert ddp8.line("gradients").bytes == 2 * ddp.line("gradients").bytes


def test_activations_grow_with_the_tokens_and_checkpointing_keeps_layer_inputs_only():
    shape = model_shape(Q3)

    def acts(tokens, ckpt):
        p = plan_memory(small(max_total_tokens=tokens, parallel={
            "strategy": "fsdp", "activation_checkpointing": ckpt},
            learner={"max_tokens_per_microbatch": tokens}), 8, 80)
        return p.line("activations").bytes, p

    full4, _ = acts(4096, False)
    full8, p8 = acts(8192, False)
    ck8, _ = acts(8192, True)
    # the saved activations are per token (no T^2 term): doubling the tokens doubles them
    # (up to the LM head's input rows, also per token)
    assert full8 == 2 * full4
    # checkpointing keeps one bfloat16 input a layer, not the layer's activations
    per_layer_input = 8192 * shape.layers * shape.hidden * 2
    assert per_layer_input < ck8 < full8 / 10
    assert p8.activations_checkpointed < p8.activations_full
    # the micro-batch budget counts when it is above the longest trajectory, not below
    _, low = acts(8192, True)
    lower = plan_memory(small(max_total_tokens=8192, learner={
        "max_tokens_per_microbatch": 1024}), 8, 80)
    assert lower.tokens == 8192 and lower.line("activations").bytes == low.line(
        "activations").bytes


def test_activation_formula_matches_what_autograd_saves_for_the_tiny_model():
    """The planner's saved activations (float32, no checkpointing) against the bytes the
    autograd graph of a real forward holds (every saved tensor's storage, counted once)."""
    from agentgym.models import TinyModelConfig
    from agentgym.models.tiny import _hf_config

    arch = {"hidden_size": 64, "intermediate_size": 192, "num_hidden_layers": 3,
            "num_attention_heads": 4, "num_key_value_heads": 2}
    cfg = transformers.Qwen2Config(**_hf_config(TinyModelConfig(**arch), 512, 1, 2))
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).float().train()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            seen[st.data_ptr()] = max(seen.get(st.data_ptr(), 0), st.nbytes())
        return t

    n, length = 2, 512
    ids = torch.randint(3, 512, (n, length))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.model(input_ids=ids, attention_mask=torch.ones_like(ids))
    measured = sum(seen.values())
    plan = plan_memory({"model": "tiny", "tiny_model": {**arch, "vocab_size": 512},
                        "env": "maze", "max_total_tokens": length,
                        "parallel": {"strategy": "ddp"}}, 1, 80, device="cpu",
                       tokens=n * length, model_tokens=0, suggest=False)
    predicted = plan.line("activations").bytes
    assert abs(predicted - measured) / measured < 0.05, (predicted, measured)


def test_lora_trains_r_times_in_plus_out_per_targeted_linear_and_needs_no_reference():
    full = plan_memory(small(), 8, 80)
    lora = plan_memory(small(lora={"r": 8, "target_modules": ["q_proj", "v_proj"]}), 8, 80)
    with torch.device("meta"):
        m = transformers.AutoModelForCausalLM.from_config(
            transformers.AutoConfig.from_pretrained(BUNDLED_MODELS_DIR / Q3))
    expected = sum(8 * (mod.in_features + mod.out_features)
                   for name, mod in m.named_modules()
                   if isinstance(mod, torch.nn.Linear) and name.endswith(("q_proj", "v_proj")))
    assert lora.trainable == expected
    assert lora.line("optimizer").bytes == 8 * math.ceil(expected / 8)
    assert lora.line("reference model").bytes == 0 < full.line("reference model").bytes
    assert lora.total < full.total
    all_linear = plan_memory(small(lora={"r": 8}), 8, 80)
    assert all_linear.trainable > lora.trainable
    with pytest.raises(ValueError, match="lora.target_modules"):
        plan_memory(small(lora={"target_modules": ["no_such_proj"]}), 8, 80)


def test_reference_model_only_with_a_kl_and_the_backend_share_only_when_colocated():
    no_kl = plan_memory(small(learner={"use_kl_loss": False}), 8, 80)
    assert no_kl.line("reference model").bytes == 0
    assert plan_memory(small(use_ref_model=False), 8, 80).line("reference model").bytes == 0
    vllm = plan_memory(small(backend="vllm"), 8, 80)
    assert vllm.line("backend").bytes == int(0.9 * 80 * GIB)  # vLLM's default
    own = plan_memory(small(backend="vllm", backend_kwargs={
        "gpu_memory_utilization": 0.5, "engine_kwargs": {"gpu_memory_utilization": 0.4}}), 8, 80)
    assert own.line("backend").bytes == int(0.4 * 80 * GIB)  # engine_kwargs win
    ray = plan_memory(small(backend="vllm", num_rollout_workers=2), 8, 80)
    assert ray.line("backend").bytes == 0
    assert vllm.total - own.total == vllm.line("backend").bytes - own.line("backend").bytes


def test_sharded_gradients_do_not_grow_with_the_micro_batches_a_rank_runs():
    # every micro-batch's backward reduce-scatters (tests/distributed/test_fsdp.py checks
    # the learner does): one trajectory a rank a mini-batch or several, a rank holds its
    # float32 shard of the gradients and nothing unsharded beyond the backward's
    shape = model_shape(Q3)
    one_each = plan_memory(small(tasks_per_step=8, n_samples=1), 8, 80)
    more = plan_memory(small(tasks_per_step=8, n_samples=4), 8, 80)
    assert [(ln.name, ln.bytes) for ln in more.lines] == \
        [(ln.name, ln.bytes) for ln in one_each.lines]
    assert more.line("gradients").bytes == 4 * math.ceil(shape.params / 8)
    assert "accumulated gradients" not in {ln.name for ln in more.lines}


def test_a_plan_that_does_not_fit_names_what_makes_it_fit():
    cfg = small(max_total_tokens=16384, learner={"max_tokens_per_microbatch": 16384},
                parallel={"strategy": "fsdp", "activation_checkpointing": False})
    plan = plan_memory(cfg, 8, 40)
    assert not plan.fits
    assert any(s.startswith("parallel.activation_checkpointing: true") for s in plan.suggestions)
    fixed = plan_memory({**cfg, "parallel": {"strategy": "fsdp",
                                             "activation_checkpointing": True}}, 8, 40)
    assert fixed.fits
    with pytest.raises(PlanError, match="parallel.activation_checkpointing: true"):
        check_fits(cfg, 8, 40)
    # a micro-batch budget above the longest trajectory: the largest budget that fits
    big = small(learner={"max_tokens_per_microbatch": 400_000})
    plan = plan_memory(big, 8, 40)
    (budget,) = [s for s in plan.suggestions if s.startswith("learner.max_tokens")]
    n = int(budget.split(":")[1].split()[0])
    assert 4096 <= n < 400_000
    assert plan_memory(small(learner={"max_tokens_per_microbatch": n}), 8, 40).fits
    assert not plan_memory(small(learner={"max_tokens_per_microbatch": n + 256}), 8, 40).fits


def test_bad_inputs_are_one_line_errors_naming_the_setting():
    for kwargs, match in (({"world_size": 0}, "world_size"),
                          ({"world_size": 6, "nodes": 4}, "nodes"),
                          ({"world_size": 8, "gpu_memory_gib": 0}, "gpu memory")):
        with pytest.raises(ValueError, match=match) as err:
            plan_memory(small(), **kwargs)
        assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        plan_memory(small(backend="vllm", backend_kwargs={"gpu_memory_utilization": 1.5}),
                    8, 80)
    with pytest.raises(ValueError, match="parallel.strategy"):
        plan_memory(small(parallel={"strategy": "zero3"}), 8, 80)
