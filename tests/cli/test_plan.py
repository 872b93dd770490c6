"""``agentgym-rl plan``: the table and its verdict, and one-line errors for bad input."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from agentgym.cli import main  # noqa: E402

RECIPE = "configs/agentgym_rl/babyai_7b.yaml"


def _gib(out: str, line: str) -> float:
    (m,) = re.findall(rf"^  {line}\s+([0-9.]+) GiB", out, flags=re.M)
    return float(m)


def test_plan_prints_the_table_and_the_margin(capsys):
    assert main(["plan", "--config", RECIPE, "--gpus", "8"]) == 0
    out = capsys.readouterr().out
    for line in ("parameters", "gradients", "optimizer", "reference model", "activations",
                 "logits", "backend", "total"):
        assert re.search(rf"^  {line}\s+[0-9.]+ GiB", out, flags=re.M), line
    assert "parallel.activation_checkpointing on" in out and "parallel.strategy fsdp" in out
    total = _gib(out, "total")
    (margin,) = re.findall(r"^fits: [0-9.]+ GiB of 80 GiB per GPU, margin ([0-9.]+) GiB", out,
                           flags=re.M)
    assert float(margin) == pytest.approx(80 - total, abs=0.011)


def test_more_gpus_and_a_bare_config_name_shrink_the_sharded_state(capsys):
    assert main(["plan", "--config", "babyai_7b", "--gpus", "8", "--nodes", "2",
                 "--gpu-memory", "141"]) == 0
    two = capsys.readouterr().out
    assert main(["plan", "--config", "babyai_7b", "--gpus", "8"]) == 0
    one = capsys.readouterr().out
    assert "16 ranks on 2 nodes" in two and "of 141 GiB per GPU" in two
    assert _gib(two, "optimizer") == pytest.approx(_gib(one, "optimizer") / 2, abs=0.011)


def test_a_plan_that_does_not_fit_exits_1_naming_the_setting(capsys):
    rc = main(["plan", "--config", RECIPE, "--gpus", "8", "--set",
               'parallel={"strategy": "ddp", "activation_checkpointing": true}'])
    out = capsys.readouterr().out
    assert rc == 1
    (verdict,) = [ln for ln in out.splitlines() if ln.startswith("does not fit")]
    assert "parallel.strategy: fsdp" in verdict


@pytest.mark.parametrize("argv, flag", [
    (["--config", RECIPE, "--gpus", "0"], "--gpus"),
    (["--config", RECIPE, "--nodes", "0"], "--nodes"),
    (["--config", RECIPE, "--gpu-memory", "-1"], "--gpu-memory"),
    (["--config", "no/such/config.yaml", "--gpus", "8"], "--config"),
    (["--config", RECIPE, "--set", "model=Org/Unknown-7B"], "model"),
    (["--config", RECIPE, "--set", "parallel={\"strategy\": \"zero3\"}"], "parallel.strategy"),
])
def test_bad_input_is_one_line_naming_the_flag_and_exit_2(capsys, argv, flag):
    assert main(["plan", *argv]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and flag in lines[0], captured.err
    assert captured.out == ""


def test_console_script_bad_gpus_has_no_traceback():
    out = subprocess.run([sys.executable, "-m", "agentgym.cli", "plan", "--config", RECIPE,
                          "--gpus", "0"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip() == "agentgym-rl plan: --gpus must be >= 1, got 0"
