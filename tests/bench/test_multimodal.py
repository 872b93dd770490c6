"""``bench/multimodal.py`` on a tiny configuration: the engine's image and text rows of the
same envs in one run, with the frame sizes the envs draw."""

from __future__ import annotations

import pytest

from bench import multimodal

pytest.importorskip("transformers")


def test_tiny_run_reports_image_and_text_rows_and_frame_bytes(capsys):
    report = multimodal.main(["--episodes", "16", "--concurrency", "8", "--repeats", "1",
                              "--max-turns", "30", "--json"])
    assert set(report["engine"]) == set(multimodal.ENVS)
    for env_id, row in report["engine"].items():
        for obs in ("text", "image"):
            assert row[obs]["episodes_per_s"] > 0 and row[obs]["success_rate"] == 1.0
        assert row["image_over_text_episodes_per_s"] == pytest.approx(
            row["image"]["episodes_per_s"] / row["text"]["episodes_per_s"])
        # maze medium and gridworld easy both draw 56x56 RGB frames
        assert row["image"]["bytes_per_stored_frame"] == 56 * 56 * 3, env_id
        assert row["image"]["frames_shown_per_episode"] >= 1
        assert row["image_tokens_per_frame"] == 4
    assert "vllm" not in report
    assert capsys.readouterr().out.strip().startswith("{")
