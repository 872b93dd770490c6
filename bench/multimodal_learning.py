"""The image-observation learning probe: tiny-vl trained by RL on image-only maze
(``configs/tiny_vl_maze_image.yaml``), several seeds, against the uniformly random policy
on the same held-out tasks.

    python bench/multimodal_learning.py RUN [RUN ...] --config configs/tiny_vl_maze_image.yaml \\
        --out bench/results/multimodal_learning.json --plot bench/results/multimodal_learning.png

Each RUN is a run folder of that config (``agentgym-rl train --config ... --seed S -o RUN``).
Prints one JSON object: per run its held-out success at the start, at the end and at best
(the evaluation rows of its ``metrics.jsonl``), wall time and steps; their mean and spread;
and the random policy's success on the same held-out tasks, horizon and env options
(``ScriptedBackend(policy="random")`` through the same engine, 3 samples a task).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from seed_spread import eval_rows  # noqa: E402


def random_policy(cfg: dict, samples: int = 3) -> float:
    """Success of the uniformly random policy on the config's held-out tasks."""
    from transformers import AutoTokenizer

    from agentgym.backends.scripted import ScriptedBackend
    from agentgym.engine import RolloutEngine
    from agentgym.envs.tasks import plan_tasks
    from agentgym.models import resolve_model
    from agentgym.models.vision import VisionSpec

    model_dir = resolve_model(cfg["model"])
    tok = AutoTokenizer.from_pretrained(model_dir)
    plan = plan_tasks(cfg["env"], cfg.get("env_kwargs", {}), cfg["eval_tasks"],
                      cfg.get("eval_env_kwargs"))
    eng = RolloutEngine(ScriptedBackend(tok, policy="random", seed=0), tok,
                        vision=VisionSpec.from_model(model_dir),
                        max_turns=cfg["eval_max_turns"], n_samples=samples,
                        max_total_tokens=cfg["max_total_tokens"], progress=False)
    try:
        batch = eng.collect_sync(list(plan.eval_ids), cfg["env"], env_kwargs=plan.eval_kwargs)
    finally:
        eng.close()
    return sum(t.success for t in batch) / len(batch)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--config", required=True)
    ap.add_argument("--out", default=None)
    ap.add_argument("--plot", default=None)
    args = ap.parse_args(argv)
    from agentgym.learner.train_config import load_config_file

    cfg = load_config_file(args.config)
    runs = {}
    for run in args.runs:
        path = Path(run)
        curve = eval_rows(path)
        summary = json.loads((path / "summary.json").read_text())
        steps = sorted(curve)
        runs[path.name] = {"start": curve[steps[0]], "end": curve[steps[-1]],
                           "best": max(curve.values()), "curve": curve,
                           "steps": summary["steps"], "wall_s": summary["wall_s"]}

    def spread(key: str) -> dict:
        vals = [r[key] for r in runs.values()]
        return {"mean": statistics.fmean(vals), "min": min(vals), "max": max(vals)}

    out = {"bench": "multimodal_learning", "config": args.config, "runs": runs,
           "start": spread("start"), "end": spread("end"), "best": spread("best"),
           "random_policy": random_policy(cfg)}
    text = json.dumps(out, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.5))
        for name, r in runs.items():
            xs = sorted(r["curve"])
            ax.plot(xs, [r["curve"][x] for x in xs], marker="o", label=name)
        ax.axhline(out["random_policy"], color="grey", ls="--", label="random policy")
        ax.set_xlabel("step")
        ax.set_ylabel("held-out success")
        ax.set_title("tiny-vl on image-only maze")
        ax.set_ylim(-0.02, 1.02)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
    return out


if __name__ == "__main__":
    main()
