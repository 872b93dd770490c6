"""``bench/horizon_ablation.py``: each arm changes only the horizon schedule of the main job,
and the summary reads final, best, crossing step and collapses off the eval curves."""

from __future__ import annotations

import json

import pytest

from agentgym.cli.train import MAIN_JOB
from bench import horizon_ablation as ab


def test_arms_differ_from_the_main_job_only_in_the_schedule(tmp_path):
    base = json.loads(json.dumps(MAIN_JOB))
    base["horizon"] = [2, 4, 8]
    cfgs = {arm: ab.arm_config(arm, 3, str(tmp_path), base) for arm in ab.ARMS}
    assert cfgs["staged"]["horizon"] == [2, 4, 8]
    assert cfgs["short"]["horizon"] == [2]
    assert cfgs["long"]["horizon"] == [8]
    assert cfgs["adaptive"]["horizon"] == [2, 4, 8] and cfgs["adaptive"]["adaptive_horizon"]
    for cfg in cfgs.values():
        # Held-out success is always measured at the last stage's horizon, same seed.
        assert cfg["eval_max_turns"] == 8 and cfg["seed"] == 3
        assert cfg["warmup"]["max_turns"] == MAIN_JOB["warmup"]["max_turns"]
        rest = {k: v for k, v in cfg.items() if k not in ("horizon", "adaptive_horizon")}
        assert rest == {k: v for k, v in cfgs["staged"].items() if k != "horizon"}
    with pytest.raises(ValueError, match="unknown arm"):
        ab.arm_config("medium", 0, str(tmp_path), base)


def _run(arm, seed, curve):
    return {"arm": arm, "seed": seed, "eval": [[20 * i, s] for i, s in enumerate(curve)]}


def test_summary_reads_final_best_crossing_and_collapse():
    runs = [_run("staged", 0, [0.1, 0.4, 0.6, 0.7]),
            _run("staged", 1, [0.1, 0.5, 0.2, 0.3]),  # falls 0.3 below its best: collapse
            _run("short", 0, [0.1, 0.2, 0.3, 0.3])]
    st = ab.run_stats(runs[0])
    assert (st["final"], st["best"], st["step_reached_0.5"], st["collapsed"]) == (0.7, 0.7, 40,
                                                                                   False)
    st = ab.run_stats(runs[1])
    assert st["step_reached_0.5"] == 20 and st["collapsed"] and st["max_drop_from_best"] == 0.3
    assert ab.run_stats(runs[2])["step_reached_0.5"] is None
    summary = ab.summarize(runs)
    assert summary["staged"]["final"]["mean"] == pytest.approx(0.5)
    assert summary["staged"]["best"]["max"] == 0.7 and summary["staged"]["collapsed"] == 1
    assert summary["short"]["collapsed"] == 0 and set(summary) == {"staged", "short"}
    report = {"summary": summary, "arms": {"staged": "2->4->8", "short": "fixed 2"}}
    table = ab.markdown(report)
    assert "| staged | 2->4->8 | 0.50 ± 0.20 | 0.60 ± 0.10 | 40, 20 | 1 of 2 |" in table
    assert "| short | fixed 2 | 0.30 ± 0.00 | 0.30 ± 0.00 | - | 0 of 1 |" in table


def test_report_is_replaced_whole(tmp_path):
    out = tmp_path / "r.json"
    ab.save({"runs": [1]}, out)
    ab.save({"runs": [1, 2]}, out)
    assert json.loads(out.read_text()) == {"runs": [1, 2]}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]
