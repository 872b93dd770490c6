"""TrainerConfig: every shipped config file loads, unknown keys and bad values are refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentgym.engine.config import RolloutConfig
from agentgym.learner.train_config import TrainerConfig, load_config_file

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.*"))


def test_configs_folder_is_not_empty():
    assert len(CONFIGS) >= 5


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_config_loads_with_valid_rollout_settings(path):
    cfg = TrainerConfig.from_dict(load_config_file(path))
    RolloutConfig(**cfg.rollout)  # its rollout overrides are RolloutConfig fields
    assert cfg.max_steps > 0 and cfg.eval_tasks > 0


def test_unknown_keys_and_bad_values_are_refused():
    with pytest.raises(ValueError, match="unknown TrainerConfig keys"):
        TrainerConfig.from_dict({"modle": "tiny"})
    with pytest.raises(ValueError, match="filter_groups"):
        TrainerConfig(filter_groups={"draws": 2})
    with pytest.raises(ValueError, match="truncated_turn"):
        RolloutConfig(truncated_turn="cut")
