"""Horizon ablation: staged ScalingInter-RL against fixed short, fixed long and adaptive
horizons, on the main job's task, model and step budget.

    python bench/horizon_ablation.py [--seeds 0,1,2] [--arms staged,short,long,adaptive]
    python bench/horizon_ablation.py --plot-only     # table and plot of the JSON so far
    python bench/horizon_ablation.py --config FILE   # fields of FILE over the main job
    python bench/horizon_ablation.py --config configs/horizon_effect_maze.yaml \
        --name horizon_effect                          # another task's ablation, own files
    python bench/horizon_ablation.py --warm-cache DIR  # each seed's warm-up once, shared

Every arm is ``agentgym-rl train``'s main job (:data:`agentgym.cli.train.MAIN_JOB`) with one
change, so task, model, warm-up, step budget, batch, learning rate and evaluation are the
same:

* ``staged``: the main job as it is (its ``horizon`` stages, ``steps_per_stage`` each);
* ``short``: one stage, the first stage's horizon, for all the steps;
* ``long``: one stage, the last stage's horizon, for all the steps;
* ``adaptive``: the same stages, advanced when the training success plateaus
  (``adaptive_horizon=True``, :class:`~agentgym.learner.horizon.AdaptiveHorizonSchedule`).

Held-out success is always measured at the last stage's horizon (``eval_max_turns``). Runs
already in the JSON are kept and skipped, so the ablation can be run a piece at a time (one
arm or seed per call). Writes ``bench/results/<name>.json`` (``--name``, default
``horizon_ablation``; per run: the eval curve; per arm: final and best success, mean and
spread over seeds, the first step at which success reached 0.5, collapses: success falling
by more than 0.2 below the run's best) and ``bench/results/<name>.png`` (mean and min-max
band per arm); prints the README's markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
ARMS = ("staged", "short", "long", "adaptive")


def horizon_arm(cfg: dict, arm: str) -> None:
    """Apply ``arm``'s one change (module docstring) to the recipe ``cfg``."""
    stages = list(cfg["horizon"])
    if arm == "short":
        cfg["horizon"] = [stages[0]]
    elif arm == "long":
        cfg["horizon"] = [stages[-1]]
    elif arm == "adaptive":
        cfg["adaptive_horizon"] = True
    elif arm != "staged":
        raise ValueError(f"unknown arm {arm!r}; expected one of {ARMS}")
COLLAPSE_DROP = 0.2
CROSS = 0.5


def base_config(config_file: str | None = None) -> dict:
    """The recipe every arm starts from: the main job, or a config file's fields over it."""
    from agentgym.cli.train import MAIN_JOB
    from agentgym.learner.train_config import load_config_file

    cfg = json.loads(json.dumps(MAIN_JOB))
    if config_file:
        cfg.update(load_config_file(config_file))
    return cfg


def arm_config(arm: str, seed: int, output_dir: str, base: dict | None = None,
               change=horizon_arm) -> dict:
    """The base recipe with the one change of ``arm`` (``change(cfg, arm)``; default: the
    horizon arms of the module docstring)."""
    cfg = json.loads(json.dumps(base if base is not None else base_config()))
    stages = list(cfg["horizon"])
    cfg.update(seed=seed, output_dir=output_dir, progress=False, save_every=0,
               tensorboard=False, plot=False, eval_max_turns=stages[-1])
    if isinstance(cfg.get("warmup"), dict):  # the same warm-up in every arm (its default
        cfg["warmup"].setdefault("max_turns", stages[-1])  # follows the schedule's last stage)
    change(cfg, arm)
    return cfg


def warm_model(seed: int, base: dict, cache: Path) -> str:
    """The seed's warm model (the tiny model after the recipe's warm-up) in ``cache``, built
    there once by the trainer's own setup and then shared by every arm of the seed: the
    warm-up is the same in every arm (same seed, task, transcripts, steps and horizon)."""
    import shutil

    from agentgym.engine.loop import run
    from agentgym.learner.trainer import Trainer

    path = cache / f"seed-{seed}"
    if (path / "config.json").exists():
        return str(path)
    with tempfile.TemporaryDirectory(prefix=f"ablation-warm-{seed}-") as out:
        trainer = Trainer(arm_config("staged", seed, out, base))

        async def build():
            try:
                await trainer.setup()
            finally:
                await trainer.aclose()

        run(build())
        tmp = cache / f"seed-{seed}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(Path(out) / "warm_model", tmp)
        tmp.rename(path)
    return str(path)


def run_one(arm: str, seed: int, base: dict | None = None,
            warm_cache: Path | None = None, change=horizon_arm) -> dict:
    """Train one arm with one seed; its eval curve and the horizon per step. With
    ``warm_cache`` the arm starts from the seed's cached warm model (:func:`warm_model`)
    instead of repeating the warm-up."""
    from agentgym.learner.trainer import Trainer

    base = base if base is not None else base_config()
    warm = None
    if warm_cache is not None and base.get("model") == "tiny" and base.get("warmup"):
        warm = warm_model(seed, base, warm_cache)
    with tempfile.TemporaryDirectory(prefix=f"ablation-{arm}-{seed}-") as out:
        cfg = arm_config(arm, seed, out, base, change)
        if warm:
            cfg.update(model=warm, warmup=None)
        t0 = time.time()
        summary = Trainer(cfg).train()
        rows = [json.loads(x) for x in (Path(out) / "metrics.jsonl").read_text().splitlines()
                if x.strip()]
    evals = [[r["step"], r["success_rate"]] for r in rows if r.get("type") == "eval"]
    horizons = [[r["step"], r["horizon/max_turns"]] for r in rows if r.get("type") == "train"]
    first = [[r["step"], r["success_rate/first_attempt"]] for r in rows
             if r.get("type") == "eval" and "success_rate/first_attempt" in r]
    return {"arm": arm, "seed": seed, "eval": evals, "eval_first_attempt": first,
            "horizon": horizons,
            "train_success": [[r["step"], r.get("success_rate", 0.0)] for r in rows
                              if r.get("type") == "train"],
            # model tokens the run generated (and trained on): its token budget
            "model_tokens": round(sum(r.get("response_length/mean", 0.0)
                                      * r.get("batch/size", 0.0) for r in rows
                                      if r.get("type") == "train")),
            "steps": summary["steps"], "wall_s": round(time.time() - t0, 1),
            "warm_model": "cached" if warm else "built in the run",
            "load_avg": round(os.getloadavg()[0], 2)}


def run_stats(run: dict) -> dict:
    """Final and best success, first step at >= 0.5, and whether it collapsed."""
    succ = [s for _, s in run["eval"]]
    steps = [t for t, _ in run["eval"]]
    best_so_far = np.maximum.accumulate(succ)
    drop = float(np.max(best_so_far - succ))
    cross = next((t for t, s in zip(steps, succ) if s >= CROSS), None)
    return {"final": succ[-1], "best": float(max(succ)), "start": succ[0],
            "step_reached_0.5": cross, "max_drop_from_best": round(drop, 4),
            "collapsed": drop > COLLAPSE_DROP}


def summarize(runs: list[dict], arms=ARMS) -> dict:
    """Per arm: mean, min and max over seeds of final and best success, the crossing
    steps and the collapses."""
    out = {}
    for arm in arms:
        rs = [r for r in runs if r["arm"] == arm]
        if not rs:
            continue
        st = [run_stats(r) for r in rs]
        row = {"seeds": [r["seed"] for r in rs]}
        for key in ("final", "best"):
            v = np.array([s[key] for s in st])
            row[key] = {"mean": round(float(v.mean()), 4), "std": round(float(v.std()), 4),
                        "min": float(v.min()), "max": float(v.max())}
        row["step_reached_0.5"] = [s["step_reached_0.5"] for s in st]
        row["collapsed"] = sum(s["collapsed"] for s in st)
        row["max_drop_from_best"] = [s["max_drop_from_best"] for s in st]
        out[arm] = row
    return out


def markdown(report: dict, first: str = "schedule | horizon") -> str:
    """The README table: one row per arm."""
    lines = [f"| {first} | final success (mean ± std) | best (mean ± std) | "
             "step reaching 0.5 (per seed) | collapses (> 0.2 below best) |",
             "| --- | --- | ---: | ---: | --- | ---: |"]
    for arm, row in report["summary"].items():
        hz = report["arms"][arm]
        cross = ", ".join("-" if c is None else str(c) for c in row["step_reached_0.5"])
        lines.append(f"| {arm} | {hz} | {row['final']['mean']:.2f} ± {row['final']['std']:.2f} "
                     f"| {row['best']['mean']:.2f} ± {row['best']['std']:.2f} | {cross} | "
                     f"{row['collapsed']} of {len(row['seeds'])} |")
    return "\n".join(lines) + "\n"


def plot(report: dict, png: Path, arms=ARMS, what: str = "Horizon schedules") -> Path:
    """Mean held-out success per arm against step, with the min-max band over seeds; the
    title names the config file when there is one, else the main job."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    for arm in arms:
        rs = [r for r in report["runs"] if r["arm"] == arm]
        if not rs:
            continue
        steps = [t for t, _ in rs[0]["eval"]]
        curves = np.array([[s for _, s in r["eval"]] for r in rs if len(r["eval"]) == len(steps)])
        mean = curves.mean(axis=0)
        line, = ax.plot(steps, mean, "o-", ms=3, label=f"{arm} ({report['arms'][arm]}), "
                                                       f"{len(curves)} seeds")
        ax.fill_between(steps, curves.min(axis=0), curves.max(axis=0), alpha=0.15,
                        color=line.get_color())
    ax.set_xlabel("training step")
    ax.set_ylabel(f"held-out success at horizon {report['eval_max_turns']}")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(loc="upper left", fontsize=8)
    task = Path(report["config"]).stem if report.get("config") else "the main job"
    ax.set_title(f"{what} on {task} (mean, min-max over seeds)")
    fig.tight_layout()
    fig.savefig(png)
    plt.close(fig)
    return png


def save(report: dict, out: Path) -> None:
    """Write the report so that a killed run leaves the previous complete file."""
    from agentgym.collection.store import atomic_write

    out.parent.mkdir(parents=True, exist_ok=True)
    data = (json.dumps(report, indent=1) + "\n").encode()
    atomic_write(out, lambda f: f.write(data))


def run_arms(report: dict, out: Path, name: str, base: dict, seeds: str, arms: str,
             warm_cache: Path | None, change=horizon_arm, all_arms=ARMS) -> None:
    """Run every (seed, arm) of the comma lists ``seeds`` x ``arms`` not in ``report`` yet,
    saving the report to ``out`` after each run."""
    if warm_cache is not None:
        warm_cache.mkdir(parents=True, exist_ok=True)
    for seed in [int(s) for s in seeds.split(",")]:
        for arm in arms.split(","):
            if any(r["arm"] == arm and r["seed"] == seed for r in report["runs"]):
                continue
            print(f"{name}: {arm} seed {seed}", file=sys.stderr)
            report["runs"].append(run_one(arm, seed, base, warm_cache, change))
            report["summary"] = summarize(report["runs"], all_arms)
            save(report, out)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--name", default="horizon_ablation",
                    help="results name: bench/results/NAME.json and NAME.png")
    ap.add_argument("--out", help="the JSON's path (default bench/results/NAME.json); the "
                                  "plot goes beside it as .png")
    ap.add_argument("--config", help="YAML/TOML fields over the main job (default: the main "
                                      "job as it is)")
    ap.add_argument("--warm-cache", metavar="DIR",
                    help="build each seed's warm model once in DIR and start every arm of "
                         "the seed from it (default: every run repeats the warm-up)")
    ap.add_argument("--plot-only", action="store_true", help="no training: table and plot")
    args = ap.parse_args(argv)
    base = base_config(args.config)

    out = Path(args.out) if args.out else RESULTS / f"{args.name}.json"
    report = json.loads(out.read_text()) if out.exists() else {"runs": []}
    if report["runs"] and report.get("base") != base:
        raise SystemExit(f"{out} holds runs of another recipe; pass another --out")
    stages = list(base["horizon"])
    report.update({
        "bench": args.name, "config": args.config, "base": base,
        "env": base["env"], "env_kwargs": base["env_kwargs"], "model": base["model"],
        "max_steps": base["max_steps"], "eval_max_turns": stages[-1],
        "eval_tasks": base["eval_tasks"],
        "arms": {"staged": f"{'->'.join(map(str, stages))}, {base['steps_per_stage']} "
                           "steps per stage",
                 "short": f"fixed {stages[0]}", "long": f"fixed {stages[-1]}",
                 "adaptive": f"{'->'.join(map(str, stages))} on plateaus"},
        "machine": f"{platform.machine()}, {os.cpu_count()} cores"})
    warm_cache = Path(args.warm_cache) if args.warm_cache else None
    if not args.plot_only:
        run_arms(report, out, args.name, base, args.seeds, args.arms, warm_cache)
    report["summary"] = summarize(report["runs"])
    save(report, out)
    if report["runs"]:
        plot(report, out.with_suffix(".png"))
    print(markdown(report), end="")
    return report


if __name__ == "__main__":
    main()
