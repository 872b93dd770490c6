"""Training metrics sinks: a JSONL log, a CSV log, TensorBoard (when installed), Weights &
Biases (optional) and a PNG plot.

:class:`MetricsLogger` writes one JSON object per row to ``metrics.jsonl``: training rows
``{"type": "train", "step": ..., "reward/mean": ..., ...}`` and evaluation rows
``{"type": "eval", "step": ..., "success_rate": ..., "horizon/max_turns": ...}``. The same
scalars go to ``metrics.csv`` (train rows; the header is fixed by the first row) and to a
``torch.utils.tensorboard.SummaryWriter`` when TensorBoard is installed (eval scalars under
``eval/``), and, with ``wandb``, to a Weights & Biases run (the ``wandb`` extra): offline
unless ``WANDB_MODE`` or the options say otherwise, its folder under the run folder
(``<out_dir>/wandb/offline-run-*``; ``wandb sync`` uploads it later).
:func:`plot_learning_curve` draws eval success rate and the training horizon
against step into a PNG, with matplotlib (Agg) when installed and with Pillow otherwise.
"""

from __future__ import annotations

import csv
import json
import math
import os
import warnings
from pathlib import Path
from typing import Any

__all__ = ["MetricsLogger", "plot_learning_curve", "read_jsonl"]


def _scalar(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _drop_rows_after(jsonl: Path, csv_path: Path, step: int) -> None:
    """Rewrite ``metrics.jsonl`` and ``metrics.csv`` without the rows of steps after
    ``step`` (a resumed run's checkpoint: the stopped run went on past it)."""
    if jsonl.exists():
        kept = []
        for line in jsonl.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
            except ValueError:  # a line cut by a crash
                continue
            if int(row.get("step", 0)) <= step:
                kept.append(line)
        jsonl.write_text("".join(x + "\n" for x in kept), encoding="utf-8")
    if csv_path.exists():
        with open(csv_path, encoding="utf-8", newline="") as f:
            rows = list(csv.reader(f))
        if rows:
            head, body = rows[0], rows[1:]
            at = head.index("step") if "step" in head else None
            body = [r for r in body if at is None or (len(r) > at and _scalar(r[at]) is not None
                                                      and float(r[at]) <= step)]
            with open(csv_path, "w", encoding="utf-8", newline="") as f:
                csv.writer(f).writerows([head, *body])


class MetricsLogger:
    """Append-only metrics sink rooted at ``out_dir`` (``metrics.jsonl``, ``metrics.csv``,
    ``tensorboard/``, ``wandb/``). ``resume=True`` appends to existing files instead of
    truncating; with ``resume_step`` (the checkpoint's step) the rows written after that
    step by the run that stopped are dropped first (JSONL, CSV; TensorBoard purges them), so
    the resumed curve goes on from the checkpoint without a break or a repeat. ``wandb``:
    False, True, or keyword arguments of ``wandb.init`` (``project``, ``name``, ``tags``,
    ``mode``, ``settings``, ...); ``run_config`` is the run's config."""

    def __init__(self, out_dir: str | Path, *, tensorboard: bool = True, resume: bool = False,
                 wandb: bool | dict[str, Any] = False,
                 run_config: dict[str, Any] | None = None, resume_step: int | None = None):
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl_path = self.out_dir / "metrics.jsonl"
        self.csv_path = self.out_dir / "metrics.csv"
        if resume and resume_step is not None:
            _drop_rows_after(self.jsonl_path, self.csv_path, resume_step)
        mode = "a" if resume else "w"
        self._jsonl = open(self.jsonl_path, mode, encoding="utf-8")  # noqa: SIM115
        self._csv_fields: list[str] | None = None
        if resume and self.csv_path.exists():
            with open(self.csv_path, encoding="utf-8") as f:
                header = f.readline().strip()
            self._csv_fields = header.split(",") if header else None
        self._csv = open(self.csv_path, mode, encoding="utf-8", newline="")  # noqa: SIM115
        self._csv_writer = None
        if self._csv_fields:
            self._csv_writer = csv.DictWriter(self._csv, self._csv_fields, extrasaction="ignore")
        self._tb = None
        if tensorboard:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    from torch.utils.tensorboard import SummaryWriter
                self._tb = SummaryWriter(
                    str(self.out_dir / "tensorboard"),
                    purge_step=resume_step + 1 if resume and resume_step is not None else None)
            except Exception:  # tensorboard not installed: JSONL/CSV only
                self._tb = None
        self._wandb = _wandb_run(self.out_dir, wandb, run_config) if wandb else None

    @property
    def has_tensorboard(self) -> bool:
        return self._tb is not None

    @property
    def wandb_dir(self) -> Path | None:
        """The Weights & Biases run's folder (``<out_dir>/wandb/<mode>-run-<time>-<id>``)."""
        return None if self._wandb is None else Path(self._wandb.dir).parent

    def log(self, row: dict[str, Any]) -> None:
        """Write one row (``type`` defaults to ``"train"``; ``step`` is required)."""
        row = {"type": row.get("type", "train"), **row}
        step = int(row["step"])
        self._jsonl.write(json.dumps(row, default=float) + "\n")
        self._jsonl.flush()
        scalars = {k: s for k, v in row.items()
                   if k not in ("type", "step") and (s := _scalar(v)) is not None}
        if row["type"] == "train":
            if self._csv_writer is None:
                self._csv_fields = ["step", *sorted(scalars)]
                self._csv_writer = csv.DictWriter(self._csv, self._csv_fields,
                                                  extrasaction="ignore")
                self._csv_writer.writeheader()
            self._csv_writer.writerow({"step": step, **scalars})
            self._csv.flush()
        if self._tb is not None:
            prefix = "" if row["type"] == "train" else f"{row['type']}/"
            for k, v in scalars.items():
                self._tb.add_scalar(prefix + k, v, step)
            self._tb.flush()
        if self._wandb is not None:
            prefix = "" if row["type"] == "train" else f"{row['type']}/"
            self._wandb.log({prefix + k: v for k, v in scalars.items()}, step=step)

    def close(self) -> None:
        self._jsonl.close()
        self._csv.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _wandb_run(out_dir: Path, options: bool | dict[str, Any],
               run_config: dict[str, Any] | None):
    """A started ``wandb`` run writing under ``out_dir``: offline unless ``WANDB_MODE`` or
    ``options["mode"]`` says otherwise; project ``agentgym-rl`` and the run folder's name
    unless given; console capture off (the scheduler's log has the output) unless
    ``options["settings"]`` turns it on."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import wandb
    except ImportError as e:
        raise ImportError("report_to wandb needs the wandb package: "
                          "pip install 'agentgym-rl[wandb]'") from e
    opts = dict(options) if isinstance(options, dict) else {}
    opts.setdefault("mode", os.environ.get("WANDB_MODE", "offline"))
    opts.setdefault("project", os.environ.get("WANDB_PROJECT", "agentgym-rl"))
    opts.setdefault("name", out_dir.name)
    opts.setdefault("dir", str(out_dir))
    opts["settings"] = {"console": "off", **dict(opts.get("settings") or {})}
    if run_config is not None:
        opts.setdefault("config", run_config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return wandb.init(**opts)


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """All rows of a JSONL metrics file."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def plot_learning_curve(jsonl_path: str | Path, png_path: str | Path, title: str = "") -> Path:
    """Plot eval ``success_rate`` (and train ``success_rate``) plus ``horizon/max_turns``
    against step from a metrics JSONL into ``png_path``."""
    rows = read_jsonl(jsonl_path)
    ev = [(r["step"], r["success_rate"]) for r in rows
          if r.get("type") == "eval" and "success_rate" in r]
    tr = [(r["step"], r["success_rate"]) for r in rows
          if r.get("type") == "train" and "success_rate" in r]
    hz = [(r["step"], r["horizon/max_turns"]) for r in rows
          if r.get("type") == "train" and "horizon/max_turns" in r]
    png_path = Path(png_path)
    try:
        import matplotlib
    except ImportError:
        _plot_pillow(ev, tr, hz, png_path, title)
        return png_path
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    if tr:
        ax.plot(*zip(*tr), color="tab:blue", alpha=0.3, label="train success")
    if ev:
        ax.plot(*zip(*ev), "o-", color="tab:blue", label="eval success (held-out)")
    ax.set_xlabel("step")
    ax.set_ylabel("success rate")
    ax.set_ylim(-0.02, 1.02)
    ax2 = ax.twinx()
    if hz:
        ax2.step(*zip(*hz), where="post", color="tab:orange", label="horizon (max turns)")
    ax2.set_ylabel("max turns")
    ax2.set_ylim(bottom=0)
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="upper left", fontsize=8)
    ax.set_title(title or "ScalingInter-RL training")
    fig.tight_layout()
    fig.savefig(png_path)
    plt.close(fig)
    return png_path


def _plot_pillow(ev, tr, hz, png_path: Path, title: str) -> None:
    """Minimal line plot with Pillow (no matplotlib): success in blue, horizon in orange."""
    from PIL import Image, ImageDraw

    w, h, m = 700, 400, 50
    img = Image.new("RGB", (w, h), "white")
    d = ImageDraw.Draw(img)
    steps = [s for s, _ in ev + tr + hz] or [0, 1]
    x0, x1 = min(steps), max(max(steps), min(steps) + 1)
    hmax = max([v for _, v in hz] or [1.0]) * 1.1

    def px(step, frac):
        return m + (step - x0) / (x1 - x0) * (w - 2 * m), h - m - frac * (h - 2 * m)

    d.rectangle([m, m, w - m, h - m], outline="black")
    for k in range(6):
        y = px(x0, k / 5)[1]
        d.line([m - 4, y, m, y], fill="black")
        d.text((8, y - 6), f"{k / 5:.1f}", fill="black")
        d.text((w - m + 6, y - 6), f"{hmax * k / 5:.{0 if hmax >= 10 else 1}f}",
               fill="darkorange")
    d.text((m, h - m + 8), f"step {x0}", fill="black")
    d.text((w - m - 60, h - m + 8), f"step {x1}", fill="black")
    d.text((m, 15), title or "ScalingInter-RL training", fill="black")
    d.text((m + 250, 15), "eval success (blue), train success (light), horizon (orange)",
           fill="gray")
    for pts, color, scale in ((tr, (170, 200, 235), 1.0), (ev, (31, 119, 180), 1.0),
                              (hz, (255, 127, 14), 1.0 / hmax)):
        if color == (255, 127, 14):  # the horizon is a step function
            pts = [p for a, b in zip(pts, pts[1:] + pts[-1:]) for p in (a, (b[0], a[1]))]
        xy = [px(s, v * scale) for s, v in pts]
        if len(xy) > 1:
            d.line(xy, fill=color, width=2)
        for x, y in xy if color == (31, 119, 180) else []:
            d.ellipse([x - 3, y - 3, x + 3, y + 3], fill=color)
    img.save(png_path)
