"""bench/selfplay_learning.py's SmolLM2 recipe is a valid self-play trainer config, and
``--merge`` joins reports run side by side (one per arm or seed) into one summary."""

from __future__ import annotations

import json

from bench import selfplay_learning as bench


def test_the_smollm2_recipe_is_a_self_play_trainer_config(tmp_path):
    from agentgym.learner.trainer import TrainerConfig

    for arm, (_, fields) in bench.ARMS.items():
        cfg = TrainerConfig(**{**bench.recipe(20, "smollm2-135m"), **fields, "seed": 1,
                               "output_dir": str(tmp_path / arm)})
        assert cfg.self_play and cfg.env == "tictactoe" and cfg.backend == "vllm"
        assert cfg.rollout["reply_prefix"] == "Action:" and cfg.warmup is None
        assert cfg.role_baseline == (arm != "self_plain")


def _run(arm: str, seed: int, end: float) -> dict:
    curve = [{"step": s, "vs_random_win_draw": v, "vs_solver_draw": 0.0, "vs_solver_loss": 1.0}
             for s, v in ((0, 0.2), (20, end))]
    return {"arm": arm, "seed": seed, "steps": 20, "wall_s": 1.0, "curve": curve,
            "start": curve[0], "final": curve[-1], "best_vs_random_win_draw": end,
            "train_invalid_share_last": 0.1,
            "train_rows": [{"step": 1, "invalid_turns/share": 0.7},
                           {"step": 20, "invalid_turns/share": 0.1}]}


def test_merge_joins_reports_run_side_by_side(tmp_path):
    parts = []
    for k, runs in enumerate(([_run("self_rae", 0, 0.5), _run("self_plain", 0, 0.4)],
                              [_run("self_rae", 1, 0.7), _run("self_rae", 0, 0.9)])):
        parts.append(tmp_path / f"part{k}.json")
        parts[-1].write_text(json.dumps({"runs": runs}))
    out = tmp_path / "merged.json"
    report = bench.main(["--model", "smollm2-135m", "--merge", *map(str, parts), "--arms", "",
                         "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    # the first report's (arm, seed) wins over a later duplicate
    assert sorted((r["arm"], r["seed"], r["final"]["vs_random_win_draw"])
                  for r in report["runs"]) == [("self_plain", 0, 0.4), ("self_rae", 0, 0.5),
                                               ("self_rae", 1, 0.7)]
    rae = report["summary"]["self_rae"]
    assert rae["seeds"] == [0, 1] and rae["final/vs_random_win_draw"] == {
        "mean": 0.6, "min": 0.5, "max": 0.7}
    assert report["model"] == "smollm2-135m" and out.with_suffix(".png").exists()
