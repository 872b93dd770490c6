"""The image-observation learning probe: tiny-vl trained by RL on 2x2 mazes
(``configs/tiny_vl_maze_image.yaml``), several seeds per arm, against the uniformly random
policy on the same held-out tasks.

    python bench/multimodal_learning.py --config configs/tiny_vl_maze_image.yaml \
        --arm image=runs/img0,runs/img1,runs/img2 \
        --arm both=runs/both0,runs/both1,runs/both2 --both-kwargs '{"obs": "both", ...}' \
        --out bench/results/multimodal_learning.json --plot bench/results/multimodal_learning.png

Each run folder is one seed of an arm (``agentgym-rl train --config ... --seed S -o RUN``,
the ``both`` arm with ``--set env_kwargs=...``). Prints one JSON object: per arm and run its
held-out success at the start, at the end and at best (the evaluation rows of its
``metrics.jsonl``), wall time and steps; per arm their mean and spread; and the random
policy's success on the same held-out tasks, horizon and env options
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
                        max_total_tokens=cfg["rollout"]["max_total_tokens"], progress=False)
    try:
        batch = eng.collect_sync(list(plan.eval_ids), cfg["env"], env_kwargs=plan.eval_kwargs)
    finally:
        eng.close()
    return sum(t.success for t in batch) / len(batch)


def _arm(paths: list[str]) -> dict:
    runs = {}
    for run in paths:
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

    return {"runs": runs, "start": spread("start"), "end": spread("end"),
            "best": spread("best")}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--config", required=True)
    ap.add_argument("--arm", action="append", required=True, metavar="NAME=RUN,RUN,...")
    ap.add_argument("--both-kwargs", default=None,
                    help="env kwargs (JSON) of the arm named 'both' (default: the config's)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--plot", default=None)
    args = ap.parse_args(argv)
    from agentgym.learner.train_config import load_config_file

    cfg = load_config_file(args.config)
    arms = {}
    for spec in args.arm:
        name, _, paths = spec.partition("=")
        arm = _arm(paths.split(","))
        kwargs = json.loads(args.both_kwargs) if name == "both" and args.both_kwargs \
            else cfg.get("env_kwargs", {})
        arm["env_kwargs"] = kwargs
        arm["random_policy"] = random_policy({**cfg, "env_kwargs": kwargs})
        arms[name] = arm
    out = {"bench": "multimodal_learning", "config": args.config, "arms": arms}
    text = json.dumps(out, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, len(arms), figsize=(5 * len(arms), 3.5), sharey=True,
                                 squeeze=False)
        for ax, arm in zip(axes[0], arms.values()):
            for run, r in arm["runs"].items():
                xs = sorted(r["curve"])
                ax.plot(xs, [r["curve"][x] for x in xs], marker="o", ms=3, label=run)
            ax.axhline(arm["random_policy"], color="grey", ls="--", label="random policy")
            ax.set_title(f"tiny-vl, obs={arm['env_kwargs'].get('obs')}")
            ax.set_xlabel("step")
            ax.set_ylim(-0.02, 1.02)
            ax.legend(fontsize=7)
        axes[0][0].set_ylabel("held-out success (greedy)")
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
    return out


if __name__ == "__main__":
    main()
