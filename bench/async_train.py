"""Synchronous, one-step overlap and fully asynchronous training on the same config, same
machine, same run: steps per hour, wall time to a held-out success, final held-out success
over seeds, the share of each core busy, and the learner's view (tokens by policy-version
lag, the share of tokens over the behaviour-weight cap).

    python bench/async_train.py --config main_job --seeds 0 1 2 \\
        --out bench/results/async_train.json

Arms: ``sync`` (rollout, update, weight sync, in turn), ``overlap`` (``async_rollouts``:
the next rollout during the update), ``async1``/``async2``/``async4`` (``fully_async`` at
``learner.max_staleness`` 1, 2, 4; the proximal logprobs recomputed, truncated importance
sampling: the mode's defaults), ``async1_behaviour`` (staleness 1 clipped against the
behaviour logprobs: no proximal pass), ``async4_decoupled`` (staleness 4 with
``learner.off_policy: decoupled``), and ``sync_ray``/``async1_ray`` (generation on one Ray
rollout worker, its own process, on a local cluster). Each seed runs every arm, the arm
order rotated per seed (a slow stretch of the machine falls on every arm alike); each run is
its own process (``agentgym-rl train``), and ``/proc/stat`` is read before and after it.
``--backend-cpus 0`` puts the in-process vLLM engine on core 0 and the learner on the rest
(``backend_kwargs.cpus``).
Per arm: the median and range over seeds of each figure; per fully asynchronous arm, the
median of its per-seed ratios to ``sync`` (steps per hour). The wall time is the sum of
the steps' and evaluations' times (no checkpoint writes, no model load). A config with a
warm-up runs it once per seed (``--work/warm_seed{S}``) and every arm of that seed starts
from that warm model (``--model DIR --no-warmup``): the arms differ only in the loop.
Prints one JSON object and writes it to ``--out`` (fsync and rename); finished runs are kept in
``--work`` and not run again, so an interrupted bench resumes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import ratio_stats, spread, write_json_atomic  # noqa: E402

ARMS = {
    "sync": [],
    "overlap": ["--async-rollouts"],
    "async1": ["--fully-async", "--max-staleness", "1"],
    "async2": ["--fully-async", "--max-staleness", "2"],
    "async4": ["--fully-async", "--max-staleness", "4"],
    # staleness 1 clipped against the behaviour logprobs (no proximal forward pass)
    "async1_behaviour": ["--fully-async", "--max-staleness", "1",
                         "--set", 'learner.old_logprob_source="behaviour"'],
    # generation in its own process: one Ray rollout worker (a local cluster) owns the backend
    "sync_ray": ["--ray", "--num-workers", "1", "--worker-cpus", "1"],
    "async1_ray": ["--fully-async", "--max-staleness", "1", "--ray", "--num-workers", "1",
                   "--worker-cpus", "1"],
    # the decoupled objective (tokens over the behaviour-weight cap dropped, not truncated)
    "async4_decoupled": ["--fully-async", "--max-staleness", "4",
                         "--set", 'learner.off_policy="decoupled"'],
}


def _cpu_times() -> list[tuple[int, int]]:
    """(busy, total) jiffies of each core."""
    out = []
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("cpu") and line[3].isdigit():
            v = [int(x) for x in line.split()[1:]]
            idle = v[3] + v[4]
            out.append((sum(v) - idle, sum(v)))
    return out


def _busy_share(before, after) -> list[float]:
    return [round((b1 - b0) / max(t1 - t0, 1), 3)
            for (b0, t0), (b1, t1) in zip(before, after)]


def warm_model(seed: int, args, work: Path) -> Path | None:
    """The config's warm-up for ``seed``, run once (a zero-step run); None without one."""
    from agentgym.learner.train_config import load_config

    cfg = load_config(args.config)
    if cfg.warmup is None or cfg.model not in ("tiny", "tiny-vl"):
        return None
    out = work / f"warm_seed{seed}"
    model = out / "warm_model"
    if (out / "bench_warm.json").exists():
        return model
    cmd = [sys.executable, "-m", "agentgym.cli", "train", "--config", args.config,
           "--seed", str(seed), "--output", str(out), "--overwrite", "--max-steps", "0"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or not (model / "config.json").exists():
        raise SystemExit(f"warm-up seed {seed} failed:\n{proc.stderr[-3000:]}")
    write_json_atomic(out / "bench_warm.json", {"seed": seed, "model": str(model)})
    return model


def summarize_run(arm: str, seed: int, out: Path, target: float) -> dict:
    """One finished run's figures, read from its ``metrics.jsonl``."""
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x]
    train = [r for r in rows if r["type"] == "train"]
    evals = [r for r in rows if r["type"] == "eval"]
    at_step, t = {}, 0.0
    for r in rows:  # the run's clock: its steps and evaluations, in order
        t += r.get("timing_s/step", 0.0) if r["type"] == "train" else r.get("timing_s/eval", 0.0)
        if r["type"] == "eval":
            at_step[int(r["step"])] = t
    train_s = sum(r["timing_s/step"] for r in train)
    reached = next((at_step[int(e["step"])] for e in evals
                    if e["success_rate"] >= target), None)
    lags: dict[str, float] = {}
    for r in train:
        for k, v in r.items():
            if k.startswith("async/tokens_lag"):
                lag = k.removeprefix("async/tokens_")
                lags[lag] = lags.get(lag, 0.0) + v
    capped = [r["actor/is_capped_frac"] for r in train if "actor/is_capped_frac" in r]
    return {
        "arm": arm, "seed": seed, "steps": len(train), "wall_s": round(t, 1),
        "steps_per_hour": round(len(train) / train_s * 3600, 1),
        "time_to_target_s": None if reached is None else round(reached, 1),
        "final_success": evals[-1]["success_rate"] if evals else None,
        "eval": {int(e["step"]): e["success_rate"] for e in evals},
        "learner_wait_s_mean": round(sum(r.get("timing_s/gen", 0.0) for r in train)
                                     / len(train), 3),
        "update_s_mean": round(sum(r["timing_s/update"] for r in train) / len(train), 3),
        # the weight push's wait for replies running under the old weights
        "weight_drain_s_mean": round(sum(r.get("timing_s/weight_drain", 0.0) for r in train)
                                     / len(train), 4),
        "weight_sync_s_mean": round(sum(r.get("timing_s/weight_sync", 0.0) for r in train)
                                    / len(train), 4),
        "tokens_by_lag": lags,
        "is_capped_frac_mean": round(sum(capped) / len(capped), 4) if capped else None,
        "stale_dropped_groups": sum(r.get("async/stale_dropped_groups", 0) for r in train),
        "partial_share_mean": round(sum(r.get("async/partial_share", 0) for r in train)
                                    / len(train), 3),
    }


def run_arm(arm: str, seed: int, args, work: Path, warm: Path | None = None) -> dict:
    out = work / f"{arm}_seed{seed}"
    done = out / "bench_run.json"
    if done.exists():  # the process's own figures; the rest is read from its metrics again
        kept = json.loads(done.read_text())
        return {**summarize_run(arm, seed, out, args.target), **{
            k: kept[k] for k in ("process_wall_s", "core_busy") if k in kept}}
    cmd = [sys.executable, "-m", "agentgym.cli", "train", "--config", args.config,
           "--seed", str(seed), "--output", str(out), "--overwrite", *ARMS[arm]]
    if warm is not None:
        cmd += ["--model", str(warm), "--no-warmup"]
    if args.steps:
        cmd += ["--max-steps", str(args.steps)]
    if args.backend:
        cmd += ["--backend", args.backend]
    if args.backend_cpus:  # the in-process vLLM engine on these cores, the learner on the rest
        cmd += ["--set", f"backend_kwargs.cpus=[{args.backend_cpus}]"]
    t0 = time.perf_counter()
    start = _cpu_times()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall_process = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{arm} seed {seed} failed:\n{proc.stderr[-3000:]}")
    res = {**summarize_run(arm, seed, out, args.target),
           "process_wall_s": round(wall_process, 1),
           "core_busy": _busy_share(start, _cpu_times())}
    write_json_atomic(done, res)
    return res


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="main_job")
    ap.add_argument("--arms", default="sync,overlap,async1,async2,async4")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=None, help="max_steps (default: the config's)")
    ap.add_argument("--target", type=float, default=0.7, help="held-out success to reach")
    ap.add_argument("--backend", default=None, help="the runs' backend (default: the config's)")
    ap.add_argument("--backend-cpus", default=None,
                    help="cores of the in-process vLLM engine, e.g. 0 (backend_kwargs.cpus; "
                         "the learner runs on the others); default: unpinned")
    ap.add_argument("--work", default="runs/bench_async_train")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    arms = args.arms.split(",")
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        raise SystemExit(f"--arms: unknown {unknown}; expected some of {list(ARMS)}")
    work = Path(args.work)
    runs: dict[str, list[dict]] = {a: [] for a in arms}
    load_before = os.getloadavg()
    for i, seed in enumerate(args.seeds):
        order = arms[i % len(arms):] + arms[:i % len(arms)]
        warm = warm_model(seed, args, work)
        for arm in order:
            runs[arm].append(run_arm(arm, seed, args, work, warm))
    summary = {}
    for arm, rs in runs.items():
        summary[arm] = {k: spread([r[k] for r in rs if r[k] is not None])
                        for k in ("steps_per_hour", "wall_s", "final_success")
                        if any(r[k] is not None for r in rs)}
        reached = [r["time_to_target_s"] for r in rs]
        summary[arm]["time_to_target_s"] = reached
        summary[arm]["core_busy"] = [r["core_busy"] for r in rs]
        if arm != "sync" and "sync" in runs:
            summary[arm]["steps_per_hour_vs_sync"] = ratio_stats(
                [r["steps_per_hour"] for r in rs], [r["steps_per_hour"] for r in runs["sync"]])
    report = {"bench": "async_train", "config": args.config, "backend": args.backend,
              "backend_cpus": args.backend_cpus,
              "seeds": args.seeds,
              "target": args.target, "cpu_count": os.cpu_count(),
              "load_before": load_before, "load_after": os.getloadavg(),
              "summary": summary, "runs": runs}
    print(json.dumps(report, indent=1))
    if args.out:
        write_json_atomic(args.out, report)
    return report


if __name__ == "__main__":
    main()
