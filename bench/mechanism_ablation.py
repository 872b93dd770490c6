"""Agent mechanisms against plain GRPO: the tiny model trained on sparse-reward mazes with
dead ends, with and without each mechanism, at the same step budget.

    python bench/mechanism_ablation.py [--seeds 0,1,2] [--arms plain,branched,undo,reflection]
    python bench/mechanism_ablation.py --warm-cache DIR   # each seed's warm-up once, shared
    python bench/mechanism_ablation.py --plot-only

The recipe is ``configs/horizon_effect_maze.yaml`` (4x4 mazes with walls, so paths have dead
ends; reward 1 only at the goal, no shaping; the staged horizon 4 -> 6 -> 8, 75 steps of 8
tasks x 8 samples after the tiny model's format warm-up; held-out success at horizon 8 on 64
test mazes). Every arm is that recipe with one change:

* ``plain``: as it is (GRPO over groups of 8 independent samples);
* ``branched``: each group played as two trees of 4 that fork after turn 2
  (``branch_at=2, branch_width=4``): step-group advantages at the fork, the prefix trained
  once;
* ``undo``: the model may reply ``Action: undo`` (``undo=True``, at most 3 an episode), and
  the system prompt says so (one sentence more);
* ``reflection``: one reflection retry from the start after an unsolved attempt
  (``reflection=1``, discount 0.9).

The arms differ in how many tokens they generate for the same number of trained samples
(a retry doubles an episode, a tree shares its prefix), so each run also reports
``model_tokens``: the model tokens it generated. Held-out evaluation plays each arm as it
trains (the reflection arm with its retry): ``final_first_attempt`` is each run's final
held-out success on the first attempt alone, the like-for-like figure. The runner and the
summary statistics are
``bench/horizon_ablation.py``'s (final and best held-out success per arm, mean and spread
over seeds, first step at 0.5, collapses). Writes ``bench/results/mechanism_ablation.json``
and ``.png``; prints the markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import horizon_ablation as ha  # noqa: E402

CONFIG = "configs/horizon_effect_maze.yaml"

#: Arm -> (what it changes, the rollout settings it adds).
ARMS: dict[str, tuple[str, dict]] = {
    "plain": ("GRPO, 8 independent samples", {}),
    "branched": ("2 trees of 4, fork after turn 2", {"branch_at": 2, "branch_width": 4}),
    "undo": ("undo allowed (3 an episode)", {"undo": True, "max_undos": 3}),
    "reflection": ("1 retry, discount 0.9", {"reflection": 1, "reflection_discount": 0.9}),
}
UNDO_SENTENCE = " Action: undo takes back your last move."


def mechanism_arm(cfg: dict, arm: str) -> None:
    """Apply ``arm``'s one change to the recipe ``cfg``."""
    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}; expected one of {tuple(ARMS)}")
    rollout = dict(cfg.get("rollout") or {})
    rollout.update(ARMS[arm][1])
    if arm == "undo":
        rollout["system_prompt"] += UNDO_SENTENCE
    cfg["rollout"] = rollout


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--out", default=str(ha.RESULTS / "mechanism_ablation.json"))
    ap.add_argument("--warm-cache", metavar="DIR",
                    help="build each seed's warm model once in DIR and start every arm of "
                         "the seed from it (the horizon_effect ablation's cache fits)")
    ap.add_argument("--plot-only", action="store_true")
    args = ap.parse_args(argv)
    base = ha.base_config(str(ROOT / CONFIG))
    out = Path(args.out)
    report = json.loads(out.read_text()) if out.exists() else {"runs": []}
    if report["runs"] and report.get("base") != base:
        raise SystemExit(f"{out} holds runs of another recipe; pass another --out")
    report.update({
        "bench": "mechanism_ablation", "config": CONFIG, "base": base, "env": base["env"],
        "env_kwargs": base["env_kwargs"], "model": base["model"],
        "max_steps": base["max_steps"], "eval_max_turns": list(base["horizon"])[-1],
        "eval_tasks": base["eval_tasks"], "arms": {a: what for a, (what, _) in ARMS.items()},
        "machine": f"{platform.machine()}, {os.cpu_count()} cores"})
    warm_cache = Path(args.warm_cache) if args.warm_cache else None
    if not args.plot_only:
        ha.run_arms(report, out, "mechanism_ablation", base, args.seeds, args.arms,
                    warm_cache, mechanism_arm, tuple(ARMS))
    report["summary"] = ha.summarize(report["runs"], tuple(ARMS))
    for arm, row in report["summary"].items():
        runs = [r for r in report["runs"] if r["arm"] == arm]
        row["model_tokens"] = [r.get("model_tokens") for r in runs]
        # held-out success on the first attempt (the reflection arm evaluates with its
        # retry; the other arms' first attempt is their only one)
        row["final_first_attempt"] = [r["eval_first_attempt"][-1][1] if
                                      r.get("eval_first_attempt") else None for r in runs]
    ha.save(report, out)
    if report["runs"]:
        ha.plot(report, out.with_suffix(".png"), tuple(ARMS), "Agent mechanisms")
    print(ha.markdown(report, "mechanism | settings"), end="")
    return report


if __name__ == "__main__":
    main()
