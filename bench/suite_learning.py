"""Learning on a community suite's env: one training config over several seeds, each run's
held-out success before and after, and the random legal player's figure on the same tasks
and horizon.

    python bench/suite_learning.py [--config suite_catch] [--seeds 0 1 2]
        [--work runs/suite_learning] [--out bench/results/suite_learning.json]
        [--plot bench/results/suite_learning.png]

Each seed is ``agentgym-rl train --config CONFIG --seed S --output WORK/seedS``; a finished
run (its ``summary.json``) is not run again and an interrupted one resumes from its latest
checkpoint. The random player is ``agentgym-rl eval --backend scripted --policy random`` on
the config's eval env, split and horizon, over the same ``eval_tasks`` tasks. The per-step
table (mean, min, max over seeds) reads each run's evaluation rows as :mod:`seed_spread`
does. Prints one JSON object and writes it to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import write_json_atomic  # noqa: E402
from seed_spread import eval_rows, plot_runs  # noqa: E402


def train(config: str, seed: int, out: Path) -> None:
    """Run (or finish) seed ``seed``'s training into ``out``."""
    done = out / "summary.json"
    if done.exists() and not json.loads(done.read_text()).get("interrupted"):
        return
    if (out / "checkpoints").is_dir() and any((out / "checkpoints").iterdir()):
        cmd = [sys.executable, "-m", "agentgym.cli", "train", "--resume", str(out)]
    else:
        cmd = [sys.executable, "-m", "agentgym.cli", "train", "--config", config,
               "--seed", str(seed), "--output", str(out), "--overwrite"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"seed {seed} failed:\n{proc.stderr[-3000:]}")


def random_player(cfg, work: Path) -> dict:
    """The scripted random legal player's held-out success on the config's eval tasks."""
    kw = {**cfg.env_kwargs, **cfg.eval_env_kwargs}
    cmd = [sys.executable, "-m", "agentgym.cli", "eval", "--env", cfg.env,
           "--backend", "scripted", "--policy", "random", "--tasks", str(cfg.eval_tasks),
           "--max-turns", str(cfg.eval_max_turns or cfg.max_turns), "--json",
           "-o", str(work / "random")]
    for k, v in kw.items():
        cmd += ["--env-kwarg", f"{k}={json.dumps(v)}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"random player failed:\n{proc.stderr[-3000:]}")
    res = json.loads(proc.stdout.strip().splitlines()[-1])["results"][0]
    return {"success_rate": res["success_rate"], "reward_mean": res["reward/mean"]}


def main(argv=None) -> dict:
    from agentgym.learner.train_config import load_config

    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="suite_catch")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--work", default="runs/suite_learning")
    ap.add_argument("--out", default=None)
    ap.add_argument("--plot", default=None)
    args = ap.parse_args(argv)
    cfg = load_config(args.config)
    work = Path(args.work)
    runs = {}
    for s in args.seeds:
        out = work / f"seed{s}"
        train(args.config, s, out)
        runs[f"seed{s}"] = eval_rows(out)
    steps = sorted(set.intersection(*(set(r) for r in runs.values())))
    table = [{"step": s, "mean": statistics.fmean(v := [r[s] for r in runs.values()]),
              "min": min(v), "max": max(v)} for s in steps]
    first, last = table[0], table[-1]
    report = {"bench": "suite_learning", "config": args.config, "env": cfg.env,
              "eval_env_kwargs": cfg.eval_env_kwargs, "eval_tasks": cfg.eval_tasks,
              "seeds": args.seeds, "before": first, "after": last,
              "random_player": random_player(cfg, work),
              "table": table,
              "eval_rows": {k: {str(s): v for s, v in sorted(r.items())}
                            for k, r in runs.items()}}
    if args.plot:
        plot_runs(runs, args.plot, ylabel=f"held-out success on {cfg.env} (greedy)",
                  baseline=("random legal player", report["random_player"]["success_rate"]))
    print(json.dumps(report, indent=1))
    if args.out:
        write_json_atomic(args.out, report)
    return report


if __name__ == "__main__":
    main()
