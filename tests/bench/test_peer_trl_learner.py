"""``bench/peer_trl_learner.py`` on a tiny configuration: our ``policy_update`` and TRL's own
``GRPOTrainer`` steps (with and without its gradient checkpointing) on the same batch of
multi-turn maze trajectories (tiny model, 8 trajectories, two micro-batches, one process per
arm). The report carries every arm's figures, the arms train the same model tokens, and their
losses and gradients agree step for step. ``bench/gpu_check.sh`` parses, and its CPU smoke
mode runs both of its parts. Wall-clock times are reported, never asserted."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import peer_trl_learner as peer

# Found, not imported: importing trl sets VLLM_LOGGING_LEVEL=ERROR in this process, which
# every vLLM server the later tests start would inherit (their request logs go silent).
if importlib.util.find_spec("trl") is None:
    pytest.skip("TRL (the trl extra) is not installed", allow_module_level=True)

# Each arm is a fresh interpreter (imports, model load): a loaded CI machine needs the room.
pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("peer_trl") / "peer_trl_learner.json"
    return peer.main(["--models", "tiny", "--tasks", "2", "--samples", "4", "--max-turns",
                      "3", "--micro-batch", "4", "--steps", "2", "--repeats", "1",
                      "--out", str(out)]), out


def test_report_structure_and_json(report):
    rep, out = report
    assert json.loads(out.read_text()) == json.loads(json.dumps(rep))
    assert rep["trl"].startswith("1.16") and rep["device"] == "cpu" and rep["threads"] == 1
    (row,) = rep["rows"]
    assert row["model"] == "tiny"
    batch = row["batch"]
    assert batch["trajectories"] == 8 and batch["num_turns_mean"] > 1  # multi-turn
    assert 0 < batch["model_tokens"] < batch["tokens"]  # observations are not trained
    for arm in peer.ARMS:
        a = row[arm]
        assert len(a["step_s_all"]) == 1 and len(a["step_s_all"][0]) == 2
        assert a["tokens_per_s"] > 0 and a["model_tokens_per_s"] > 0
        assert a["micro_batches"] == 2  # 8 trajectories, 4 a micro-batch, in both arms
        assert a["peak_mib"] > 0 and a["memory"].startswith("VmHWM")
        assert a["peak_above_start_mib"] >= 0
    # one round: each ratio is that round's pair, the arms' medians their one process
    assert row["ratio_tokens_per_s_ours_over_trl"] == pytest.approx(
        row["ours"]["tokens_per_s"] / row["trl"]["tokens_per_s"])
    assert row["ratio_peak_memory_trl_over_ours"] == pytest.approx(
        row["trl"]["peak_mib"] / row["ours"]["peak_mib"])
    blocks = rep["comparisons"]
    assert [(b["numerator"], b["denominator"]) for b in blocks] == [("ours", "trl"),
                                                                     ("ours", "trl_ckpt")]
    for b in blocks:
        assert b["ratio"]["median"] == row[f"ratio_tokens_per_s_ours_over_{b['denominator']}"]
        assert set(b) >= {"arms", "tie", "load_before", "load_after", "cores", "pinning"}
        assert b["pinning"]["pinned"] and len(b["cores"]["client"]) == 1  # --threads 1


def test_both_arms_train_the_same_tokens(report):
    rep, _ = report
    (row,) = rep["rows"]
    assert row["agreement_step1"]["trained_tokens_equal"]
    assert row["ours"]["trained_tokens"] == row["trl"]["trained_tokens"] == \
        row["batch"]["model_tokens"]


def test_losses_and_gradients_agree(report):
    # Same start weights, same tokens, masks, advantages and old logprobs: TRL's dapo loss
    # and our token-mean loss are one definition, so they agree to float error at every step,
    # and so do the gradients (the total norm and every parameter's at step 1).
    rep, _ = report
    (row,) = rep["rows"]
    steps, first = row["agreement_steps"], row["agreement_step1"]
    assert first["same_parameters"]
    assert steps["loss_max_abs_diff"] < 1e-5
    assert steps["grad_norm_max_rel_diff"] < 1e-4
    assert first["param_grad_norm_max_rel_diff"] < 1e-4
    assert first["grad_norm_ours"] > 0  # a real gradient, not an all-zero batch
    # TRL's own advantages differ from ours only by its std epsilon (1e-4 against 1e-6).
    assert row["trl"]["trl_own_advantages_max_abs_diff"] < 1e-2
    # With TRL's default gradient checkpointing the forward is recomputed, not changed.
    ckpt = row["agreement_trl_ckpt_steps"]
    assert ckpt["loss_max_abs_diff"] < 1e-5 and ckpt["grad_norm_max_rel_diff"] < 1e-4


def test_row_settings_override_the_defaults():
    import argparse

    args = argparse.Namespace(tasks=8, samples=4, max_turns=8, micro_batch=4, steps=3,
                              repeats=3)
    name, row = peer.row_args("smollm2-135m:tasks=4,max-turns=2", args)
    assert name == "smollm2-135m" and row.tasks == 4 and row.max_turns == 2 and row.steps == 3
    assert args.tasks == 8
    with pytest.raises(ValueError, match="lr"):
        peer.row_args("tiny:lr=1", args)


ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_script_parses():
    subprocess.run(["bash", "-n", str(ROOT / "bench" / "gpu_check.sh")], check=True)


def test_gpu_check_smoke_mode_runs_both_parts_on_the_cpu(tmp_path):
    out = tmp_path / "gpu_check.json"
    env = {**os.environ, "PYTHON": sys.executable}
    env.pop("OUT", None)
    proc = subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh"), "--device", "cpu",
                           "--tiny", "--out", str(out)], env=env, capture_output=True,
                          text=True, timeout=550)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rep = json.loads(out.read_text())
    assert rep["device"] == "cpu" and rep["tiny"]
    (row,) = rep["learner"]["rows"]
    assert row["model"] == "tiny" and row["agreement_step1"]["trained_tokens_equal"]
    assert row["agreement_steps"]["grad_norm_max_rel_diff"] < 1e-4
    (roll,) = rep["rollout"]
    assert roll["episodes"] == 4
    for path in ("trl_loop", "agentgym"):
        assert roll["trajectories_per_s"][path] > 0
        assert all(r["episodes"] == 4 for r in roll["runs"][path])
