"""``bench/gpu_scale.py``, the sharded learner's GPU check: its CPU smoke mode runs both parts
(FSDP2 with checkpointing; LoRA) through the learner and reports the planner's figures."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_gpu_scale_smoke_mode_runs_both_parts_on_the_cpu(tmp_path):
    out = tmp_path / "gpu_scale.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_scale.py"), "--tiny",
                           "--device", "cpu", "--out", str(out)], capture_output=True,
                          text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["tiny"] and set(report["parts"]) == {"fsdp", "lora"}
    fsdp, lora = report["parts"]["fsdp"], report["parts"]["lora"]
    assert fsdp["parallel"]["strategy"] == "fsdp" and fsdp["parallel"]["activation_checkpointing"]
    assert fsdp["trainable_params"] == fsdp["params"]
    assert 0 < lora["trainable_params"] < lora["params"] and lora["lora"]["r"] == 64
    for part in (fsdp, lora):
        assert part["update_tokens_per_s"] > 0 and part["peak_mib"] > 0
        assert part["grad_norm"] > 0  # the update trained something
        assert part["planned"]["total_mib"] > 0 and "parameters" in " ".join(
            part["planned"]["lines"]).lower()
