"""MetricsLogger: JSONL and CSV rows, and the optional Weights & Biases run (offline)."""

import pytest

from agentgym.learner.tracking import MetricsLogger, read_jsonl
from tests.helpers import read_wandb_history


def test_rows_go_to_jsonl_and_csv(tmp_path):
    with MetricsLogger(tmp_path, tensorboard=False) as log:
        log.log({"step": 1, "reward/mean": 0.5, "note": "x"})
        log.log({"type": "eval", "step": 1, "success_rate": 0.25})
        assert log.wandb_dir is None
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert rows[0] == {"type": "train", "step": 1, "reward/mean": 0.5, "note": "x"}
    assert rows[1]["type"] == "eval"
    assert (tmp_path / "metrics.csv").read_text().splitlines() == ["step,reward/mean",
                                                                   "1,0.5"]


def test_wandb_run_is_offline_under_the_run_folder(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    log = MetricsLogger(tmp_path / "run", tensorboard=False, wandb={"tags": ["test"]},
                        run_config={"env": "maze", "lr": 0.1})
    run_dir = log.wandb_dir
    log.log({"type": "eval", "step": 0, "success_rate": 0.25})
    log.log({"step": 1, "reward/mean": 0.5, "learner/loss": -1.0})
    log.log({"step": 2, "reward/mean": 0.75, "learner/loss": -2.0})
    log.close()
    assert run_dir.parent == tmp_path / "run" / "wandb"
    assert run_dir.name.startswith("offline-run-")
    rows = read_wandb_history(run_dir, at_least=3)
    assert [r["_step"] for r in rows] == [0, 1, 2]
    assert rows[0]["eval/success_rate"] == 0.25
    assert [r["reward/mean"] for r in rows[1:]] == [0.5, 0.75]
    assert rows[2]["learner/loss"] == -2.0
