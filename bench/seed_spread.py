"""Held-out success of the same training config over several seeds: each run's evaluation
rows (``{"type": "eval", "step": ..., "success_rate": ...}`` in its ``metrics.jsonl``), their
mean, minimum and maximum at every evaluated step, and one plot with a line per seed.

    python bench/seed_spread.py RUN_OR_METRICS [...] --labels seed0,seed1 \\
        --out bench/results/smollm2_rl/seeds.json --plot bench/results/smollm2_rl/seeds.png

Each argument is a run folder or a ``metrics.jsonl``. Prints one JSON object (and writes it
to ``--out`` with fsync and rename).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def eval_rows(path: Path) -> dict[int, float]:
    """``{step: success_rate}`` of a run's evaluation rows (the last row of a step wins)."""
    f = path / "metrics.jsonl" if path.is_dir() else path
    out = {}
    for line in f.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            if row.get("type") == "eval":
                out[int(row["step"])] = float(row["success_rate"])
    return out


def plot_runs(runs: dict[str, dict[int, float]], path: str,
              ylabel: str = "held-out success (greedy)",
              baseline: tuple[str, float] | None = None) -> None:
    """One line per run (``{label: {step: success}}``), and ``baseline`` (label, value) as a
    dashed line, written to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    for lab, r in runs.items():
        xs = sorted(r)
        ax.plot(xs, [r[x] for x in xs], marker="o", label=lab)
    if baseline is not None:
        ax.axhline(baseline[1], color="grey", ls="--", label=baseline[0])
    ax.set_xlabel("training step")
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--labels", default=None, help="one label per run, comma-separated")
    ap.add_argument("--out", default=None)
    ap.add_argument("--plot", default=None)
    args = ap.parse_args(argv)
    labels = args.labels.split(",") if args.labels else [str(r) for r in args.runs]
    if len(labels) != len(args.runs):
        raise SystemExit("--labels: one label per run")
    runs = {lab: eval_rows(Path(r)) for lab, r in zip(labels, args.runs)}
    steps = sorted(set.intersection(*(set(r) for r in runs.values())))
    table = []
    for s in steps:
        vals = [runs[lab][s] for lab in labels]
        table.append({"step": s, "mean": statistics.fmean(vals), "min": min(vals),
                      "max": max(vals), "by_run": dict(zip(labels, vals))})
    report = {"bench": "seed_spread", "runs": dict(zip(labels, map(str, args.runs))),
              "steps_in_every_run": steps, "table": table,
              "final": table[-1] if table else None,
              "eval_rows": {lab: {str(k): v for k, v in sorted(r.items())}
                            for lab, r in runs.items()}}
    if args.plot:
        plot_runs(runs, args.plot)
    text = json.dumps(report, indent=2) + "\n"
    if args.out:
        from agentgym.runtime.files import write_text_atomic

        write_text_atomic(args.out, text)
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
