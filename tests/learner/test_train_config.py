"""TrainerConfig: one typed tree. Every shipped config file loads; an unknown key or a wrong
type is refused at load, by its full path; the old flat spellings land in their sections;
the resolved config round-trips through YAML; shipped configs are found by name."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import pytest
import yaml

from agentgym.engine.config import DEFAULT_RECORD_TOKENS, RolloutConfig
from agentgym.errors import ConfigError
from agentgym.learner.train_config import (
    CONFIGS_DIR,
    DEPRECATED_ALIASES,
    MAIN_JOB_FILE,
    TrainerConfig,
    find_config,
    has_field,
    load_config,
    load_config_file,
)

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted(p for p in CONFIGS_DIR.rglob("*.*") if p.suffix in (".yaml", ".toml"))


def test_configs_folder_is_the_package_data_and_not_empty():
    assert len(CONFIGS) >= 5
    # the repository's configs/ is the package's (what the wheel ships)
    assert (ROOT / "configs").resolve() == CONFIGS_DIR.resolve()
    assert CONFIGS_DIR.parent.name == "agentgym"


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_config_loads_in_the_tree_spelling(path):
    raw = load_config_file(path)
    cfg = TrainerConfig.from_dict(raw)
    assert isinstance(cfg.rollout, RolloutConfig)
    assert cfg.max_steps > 0 and cfg.eval_tasks > 0
    # shipped configs use the tree, not the deprecated flat spellings
    assert not set(raw) & set(DEPRECATED_ALIASES), sorted(set(raw) & set(DEPRECATED_ALIASES))


def test_main_job_file_is_what_a_bare_train_runs():
    from agentgym.cli import train

    assert train.MAIN_JOB_FILE.resolve() == MAIN_JOB_FILE.resolve()
    assert train.MAIN_JOB == load_config_file(MAIN_JOB_FILE)
    cfg = TrainerConfig.from_dict(train.MAIN_JOB)
    # the measured main job (docs/training.md): open 4x4 mazes, horizon 2 -> 4 -> 8
    assert cfg.env_kwargs == {"size": 4, "loops": 60, "goal_hint": True,
                              "show_position": False, "shaping": 0.1}
    assert (cfg.horizon, cfg.steps_per_stage, cfg.max_steps, cfg.eval_max_turns) == (
        [2, 4, 8], 50, 150, 8)
    assert (cfg.rollout.max_new_tokens, cfg.rollout.max_total_tokens,
            cfg.rollout.truncated_turn) == (12, 1024, "end")
    assert cfg.warmup.steps == 400 and cfg.warmup.max_turns == 8
    assert cfg.learner["lr"] == 5e-4 and cfg.format_penalty == 0.5


@pytest.mark.parametrize("data, message", [
    ({"rollout": {"max_turnz": 3}},
     "unknown key rollout.max_turnz (did you mean rollout.max_turns?)"),
    ({"modle": "tiny"}, "unknown key modle (did you mean model?)"),
    ({"lr": 1e-4}, "unknown key lr (did you mean learner.lr?)"),
    ({"learner": {"klcoef": 0.1}}, "unknown key learner.klcoef (did you mean learner.kl_coef?)"),
    ({"warmup": {"step": 3}}, "unknown key warmup.step (did you mean warmup.steps?)"),
    ({"parallel": {"stratgy": "fsdp"}}, "parallel.stratgy (did you mean parallel.strategy?)"),
    ({"filter_groups": {"draws": 2}}, "filter_groups.draws"),
    ({"max_steps": "three"}, "max_steps: expected an integer, got a string 'three'"),
    ({"rollout": {"max_new_tokens": [3]}}, "rollout.max_new_tokens: expected an integer"),
    ({"horizon": [2, "x"]}, "horizon[1]: expected an integer"),
    ({"learner": {"lr": "fast"}}, "learner.lr: expected a number"),
    ({"warmup": 3}, "warmup: expected a mapping or null, got an integer 3"),
    ({"rollout": {"truncated_turn": "cut"}}, "truncated_turn must be one of"),
    ({"learner": {"adv_estimator": "ppo"}}, "learner: LearnerConfig: adv_estimator"),
    ({"lora": {"r": 0}}, "lora.r must be a positive integer"),
    ({"filter_groups": {"max_draws": 0}}, "filter_groups.max_draws must be >= 1"),
    ({"rollout": {"n_samples": 4}}, "rollout.n_samples is the trainer's"),
    ({"max_new_tokens": 6, "rollout": {"max_new_tokens": 3}},
     "max_new_tokens (the old spelling of rollout.max_new_tokens) and "
     "rollout.max_new_tokens are both set"),
])
def test_a_refused_key_or_value_is_one_line_naming_its_path(data, message):
    with pytest.raises(ConfigError) as e:
        TrainerConfig.from_dict(data)
    assert message in str(e.value)
    assert "\n" not in str(e.value)
    assert isinstance(e.value, ValueError)  # callers that catch ValueError still do


def test_keyword_construction_is_checked_the_same_way():
    with pytest.raises(ConfigError, match=r"rollout\.max_turnz"):
        TrainerConfig(rollout={"max_turnz": 3})
    with pytest.raises(ConfigError, match="unknown method"):
        TrainerConfig(method="DQN")


def test_old_flat_spellings_land_in_their_sections():
    old = {"max_turns": 3, "temperature": 0.7, "max_new_tokens": 12, "max_total_tokens": 900,
           "max_concurrency": 16, "system_prompt": "Hi.", "bf16": True, "max_staleness": 2,
           "staleness_mode": "downweight", "rollout": {"reply_prefix": "Action:"}}
    cfg = TrainerConfig.from_dict(old)
    r = cfg.rollout
    assert (r.max_turns, r.temperature, r.max_new_tokens, r.max_total_tokens,
            r.max_concurrency, r.system_prompt, r.reply_prefix) == (
        3, 0.7, 12, 900, 16, "Hi.", "Action:")
    assert cfg.learner.to_dict() == {"bf16": True, "max_staleness": 2,
                                     "staleness_mode": "downweight"}
    # read back through the old names
    assert (cfg.max_turns, cfg.max_new_tokens, cfg.bf16, cfg.max_staleness) == (3, 12, True, 2)
    game = TrainerConfig(env="tictactoe", self_play=True, opponents="solver")
    assert game.rollout.opponent == "solver" == game.opponents
    # the same field twice with one value is fine
    assert TrainerConfig.from_dict({"max_turns": 4, "rollout": {"max_turns": 4}}).max_turns == 4
    for alias, path in DEPRECATED_ALIASES.items():
        assert has_field(path), (alias, path)
        assert not has_field(alias), alias


def test_a_checkpoints_old_flat_config_still_loads():
    """What ``trainer_state.pt`` held before the tree: every flat field, dict sections."""
    old = {"model": "tiny", "env": "maze", "env_kwargs": {}, "eval_env_kwargs": None,
           "method": "GRPO", "horizon": None, "steps_per_stage": None,
           "adaptive_horizon": False, "max_turns": 2, "eval_max_turns": None,
           "max_steps": 3, "tasks_per_step": 2, "n_samples": 2, "num_train_tasks": None,
           "temperature": 1.0, "max_new_tokens": 8, "max_total_tokens": 2048,
           "max_concurrency": 256, "system_prompt": None, "rollout": {}, "learner": {},
           "use_ref_model": True, "format_penalty": 0.0, "abort_after_failed_steps": 3,
           "abort_failure_rate": 1.0, "filter_groups": False, "async_rollouts": False,
           "max_staleness": 1, "staleness_mode": "drop", "backend": "transformers",
           "backend_kwargs": {}, "device": None, "bf16": False, "parallel": {}, "lora": None,
           "num_rollout_workers": 0, "ray_address": None, "rollout_worker": {},
           "torch_threads": None, "eval_every": 10, "eval_tasks": 64,
           "eval_temperature": 0.0, "eval_at_start": True, "tiny_model": {}, "warmup": {},
           "output_dir": "runs/x", "save_every": 50, "keep_checkpoints": 2,
           "tensorboard": True, "wandb": False, "plot": True, "progress": None, "seed": 0,
           "resume": None, "self_play": False, "opponents": "self", "role_baseline": True,
           "role_baseline_decay": 0.95, "opponent_pool_size": 4, "opponent_pool_every": 10,
           "eval_opponents": ["random", "solver"]}
    cfg = TrainerConfig.from_dict(old)
    assert cfg.rollout.max_turns == 2 and cfg.rollout.max_new_tokens == 8
    assert cfg.learner_config().max_staleness == 1  # staleness 1 was the default anyway


def test_the_resolved_config_round_trips_through_yaml():
    cfg = load_config("smollm2_maze_cpu", seed=3, lora={"r": 8},
                      learner={"betas": [0.9, 0.95]})
    text = cfg.to_yaml()
    assert text.startswith("#") and "rollout:\n  max_turns: 10\n" in text
    back = TrainerConfig.from_dict(yaml.safe_load(text))
    assert back == cfg
    assert back.lora.r == 8 and back.learner["betas"] == (0.9, 0.95)
    assert back.rollout.reply_prefix == "Action: move" and back.seed == 3


def test_replace_merges_a_section_and_takes_old_spellings():
    cfg = TrainerConfig(rollout={"reply_prefix": "Action:", "max_new_tokens": 6},
                        learner={"lr": 1e-4})
    new = cfg.replace(rollout={"undo": True}, max_new_tokens=9, learner={"kl_coef": 0.0})
    assert (new.rollout.reply_prefix, new.rollout.undo, new.rollout.max_new_tokens) == (
        "Action:", True, 9)
    assert new.learner.to_dict() == {"lr": 1e-4, "kl_coef": 0.0}
    assert cfg.replace(warmup=None).warmup is None
    assert cfg.replace(lora={}).lora.r == 16
    assert new.to_dict()["rollout"].keys() >= {"max_turns", "undo"}
    assert "seed" not in new.to_dict()["rollout"]  # the trainer's own


def test_learner_section_overrides_the_trainers_values():
    assert TrainerConfig(method="PPO").learner_config().adv_estimator == "gae"
    lc = TrainerConfig(seed=5, async_rollouts=True,
                       learner={"lr": 2e-5, "max_staleness": 3}).learner_config(7)
    assert (lc.lr, lc.seed, lc.max_staleness, lc.pad_token_id, lc.temperature) == (
        2e-5, 5, 3, 7, 1.0)
    assert TrainerConfig(async_rollouts=True).learner_config().max_staleness == 1
    assert TrainerConfig().learner_config().max_staleness is None


def test_shipped_configs_are_found_by_name_outside_the_checkout(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no configs/ here
    assert find_config("smollm2_maze_cpu") == CONFIGS_DIR / "smollm2_maze_cpu.yaml"
    assert find_config("configs/smollm2_maze_cpu.yaml") == \
        CONFIGS_DIR / "smollm2_maze_cpu.yaml"
    assert find_config("maze_ppo") == CONFIGS_DIR / "maze_ppo.toml"
    assert find_config("babyai_7b") == CONFIGS_DIR / "agentgym_rl" / "babyai_7b.yaml"
    own = tmp_path / "mine.yaml"
    own.write_text("max_steps: 2\n")
    assert find_config(str(own)) == own and load_config(own).max_steps == 2
    with pytest.raises(ConfigError, match="no shipped config of that name") as e:
        find_config("smollm3_maze")
    assert "smollm2_maze_cpu" in str(e.value)
    bad = tmp_path / "bad.yaml"
    bad.write_text("rollout: {max_turns: [\n")
    with pytest.raises(ConfigError, match="not valid YAML") as e:
        load_config_file(bad)
    assert "\n" not in str(e.value)
    assert os.getcwd() == str(tmp_path)


def test_rollout_record_cap_follows_the_context_cap_unless_set():
    """``collect --max-total-tokens 2000000`` used to fail on the record cap's default."""
    assert RolloutConfig().max_record_tokens is None
    assert RolloutConfig(max_total_tokens=2_000_000).max_total_tokens == 2_000_000
    assert RolloutConfig(context_window=2).max_record_tokens == DEFAULT_RECORD_TOKENS
    assert RolloutConfig(context_window=2,
                         max_total_tokens=2_000_000).max_record_tokens == 2_000_000
    # the engine's per-call override of a config made earlier
    windowed = RolloutConfig(context_window=2)
    assert msgspec.structs.replace(windowed, max_total_tokens=3_000_000
                                   ).max_record_tokens == 3_000_000
    assert msgspec.structs.replace(RolloutConfig(), max_total_tokens=2_000_000
                                   ).max_total_tokens == 2_000_000
    # what the user set stays, and a contradiction names both fields
    assert RolloutConfig(context_window=2, max_record_tokens=5000).max_record_tokens == 5000
    for kw in ({"context_window": 2}, {}):
        with pytest.raises(ValueError, match=r"max_record_tokens \(1024\) must be at least "
                                             r"max_total_tokens \(4096\)"):
            RolloutConfig(max_total_tokens=4096, max_record_tokens=1024, **kw)


def test_rollout_config_refuses_unknown_fields_where_loaded():
    with pytest.raises(ValueError, match="truncated_turn"):
        RolloutConfig(truncated_turn="cut")
    with pytest.raises(ConfigError, match=r"unknown key rollout\.undo_dept "
                                          r"\(did you mean rollout\.undo_depth\?\)"):
        RolloutConfig.from_dict({"undo_dept": 2})
