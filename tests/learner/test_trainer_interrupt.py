"""Trainer and Ctrl-C: a rollout in flight is abandoned (its step played again on resume,
the task sampler and RNGs put back), a checkpoint of the last finished step is written,
and resuming it in the same folder continues exactly as an uninterrupted run, the metrics
curve without a break; the run folder holds the resolved config as YAML."""

from __future__ import annotations

import signal

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from agentgym.learner.checkpoint import checkpoint_config  # noqa: E402
from agentgym.learner.tracking import read_jsonl  # noqa: E402
from agentgym.learner.trainer import Trainer, TrainerConfig  # noqa: E402
from tests.learner.test_trainer import _cfg, _metrics_equal, _params  # noqa: E402

pytestmark = pytest.mark.timeout(240)

KW = dict(method="GRPO", max_steps=4, save_every=0, format_penalty=1.0,
          learner={"lr": 1e-3, "use_kl_loss": False})


def _run(trainer: Trainer, interrupt_at: int | None = None):
    """Train; with ``interrupt_at`` Ctrl-C arrives while that step's rollout is in flight.
    Returns the summary and the token ids each update trained on."""
    tokens = []
    update, rollout = trainer.update, trainer.rollout

    def watch(batch, step):
        tokens.append(batch.packed().token_ids.copy())
        return update(batch, step)

    async def rollout_then_ctrl_c(step):
        if step == interrupt_at:
            trainer._on_sigint(signal.SIGINT, None)  # what the handler does on Ctrl-C
        return await rollout(step)

    trainer.update = watch
    trainer.rollout = rollout_then_ctrl_c
    return trainer.train(), tokens


def test_ctrl_c_abandons_the_rollout_and_resume_continues_exactly(tmp_path, tiny_model_dir):
    full = Trainer(_cfg(tmp_path / "a", tiny_model_dir, **KW))
    _, full_tokens = _run(full)

    cut = Trainer(_cfg(tmp_path / "b", tiny_model_dir, **KW))
    summary, cut_tokens = _run(cut, interrupt_at=2)
    run = tmp_path / "b" / "run"
    assert summary["interrupted"] is True and summary["steps"] == 2 == cut.step
    assert summary["checkpoint"] == str(run / "checkpoints" / "step_2")  # save_every 0
    assert len(cut_tokens) == 2  # the third step's rollout never reached an update
    # the resolved config, readable, beside the run and in the checkpoint
    assert TrainerConfig.from_dict(checkpoint_config(run)) == cut.cfg
    assert (run / "config.yaml").read_text() == cut.cfg.to_yaml()

    # resume: only the checkpoint is named; the run goes on in its own folder
    resumed = Trainer(_cfg(tmp_path / "b", tiny_model_dir, **KW, output_dir=None,
                           resume=str(run / "checkpoints" / "step_2")))
    summary, resumed_tokens = _run(resumed)
    assert summary["output_dir"] == str(run) and not summary["interrupted"]
    assert resumed.step == 4 and len(resumed.history) == 2
    for a, b in zip(full_tokens[2:], resumed_tokens, strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(full.history[2:], resumed.history, strict=True):
        _metrics_equal(a, b)
    pa, pb = _params(full.model), _params(resumed.model)
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    assert full.task_rng.bit_generator.state == resumed.task_rng.bit_generator.state
    steps = [r["step"] for r in read_jsonl(run / "metrics.jsonl") if r["type"] == "train"]
    assert steps == [1, 2, 3, 4]


def test_resume_drops_the_rows_written_after_its_checkpoint(tmp_path, tiny_model_dir):
    """A run killed (not interrupted) after its checkpoint wrote rows the resumed run
    plays again: they are dropped, so every step is in metrics.jsonl/.csv once."""
    cfg = _cfg(tmp_path, tiny_model_dir, **{**KW, "save_every": 2, "max_steps": 3})
    Trainer(cfg).train()
    run = tmp_path / "run"
    resumed = Trainer(cfg.replace(resume=str(run / "checkpoints" / "step_2"), max_steps=4))
    resumed.train()
    steps = [r["step"] for r in read_jsonl(run / "metrics.jsonl") if r["type"] == "train"]
    assert steps == [1, 2, 3, 4]
    csv_steps = [int(line.split(",")[0]) for line in
                 (run / "metrics.csv").read_text().splitlines()[1:]]
    assert csv_steps == [1, 2, 3, 4]
