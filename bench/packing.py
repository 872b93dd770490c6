"""Packed against padded micro-batches (``LearnerConfig.packing``) in one learner update, on
a length-skewed multi-turn batch (many short trajectories, a few long ones) at SmolLM2-135M's
shape: its real weights (``resolve_model("smollm2-135m")``) cut to its first ``--layers``
decoder layers (hidden 576, 9 heads, 3 KV heads, vocabulary 49,152), float32, CPU, SDPA.

Both arms take the same ``max_tokens_per_microbatch``: padded, it counts ``n * max_len``
(today's meaning); packed, the samples' real tokens. Each (arm, repeat) runs in its own
process, the arms interleaved (padded, packed, packed, padded, ...), and reports:

* ``tokens_per_s``: the batch's real tokens over the wall time of one ``policy_update``
  (GRPO, proximal logprobs recomputed, AdamW, one optimizer step; after a small untimed
  warm-up forward), and ``tokens_per_cpu_s`` over the process's CPU time (all its
  threads), which other processes on a shared machine disturb less than the wall time;
* ``peak_rss_mib_above_start``: the process's peak resident memory during the update above
  its resident memory just before it (it follows the largest micro-batch: the budget lets
  a packed one hold more real, and model, tokens than a padded one);
* the micro-batch count, the positions the forwards ran (``forward_tokens``: padding, or
  the packed rows' filler, included), and the update's loss and gradient norm, which must
  agree between the arms.

Packed micro-batches go into rows per :func:`agentgym.learner.microbatch.row_width` (SDPA
here: a few rows, so attention does not span the whole micro-batch).

Prints one JSON object: per arm the median and range over repeats, and packed / padded.

    python bench/packing.py [--layers 4] [--budget 2048] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

import numpy as np


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def skewed_batch(n_short: int, n_long: int, vocab: int, seed: int = 0):
    """A GRPO batch shaped like multi-turn agent episodes: a prompt, then turns of a reply
    (model tokens) and an observation; ``n_short`` episodes of 1-2 turns and ``n_long`` of
    12-16, in groups of 4 with rewards that differ inside each group."""
    from agentgym.data import Trajectory, pack

    rng = np.random.default_rng(seed)
    trajs = []
    kinds = [False] * n_short + [True] * n_long
    rng.shuffle(kinds)
    for i, long in enumerate(kinds):
        ids = list(rng.integers(100, vocab - 100, size=int(rng.integers(40, 60))))
        mask = [0] * len(ids)
        turns = int(rng.integers(12, 17)) if long else int(rng.integers(1, 3))
        for _ in range(turns):
            reply, obs = int(rng.integers(8, 30)), int(rng.integers(20, 60))
            ids += list(rng.integers(100, vocab - 100, size=reply + obs))
            mask += [1] * reply + [0] * obs
        lp = np.where(np.asarray(mask) == 1, rng.uniform(-3.0, -0.5, len(mask)), 0.0)
        trajs.append(Trajectory(
            token_ids=[int(t) for t in ids], loss_mask=mask, logprobs=lp.tolist(), task_id=0,
            env_id="bench", group_id=i // 4, sample_index=i % 4, prompt_len=mask.index(1),
            turn_rewards=[], reward=float(rng.random()), num_turns=turns, stop_reason="done",
            policy_version=0))
    return pack(trajs)


def one(args, packing: bool) -> dict:
    import torch
    import transformers

    from agentgym.learner.microbatch import make_micro_batches
    from agentgym.learner.update import LearnerConfig, compute_logprobs, policy_update
    from agentgym.models import resolve_model

    torch.manual_seed(0)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    transformers.logging.set_verbosity_error()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        resolve_model(args.model), num_hidden_layers=args.layers, dtype=torch.float32,
        attn_implementation="sdpa")
    batch = skewed_batch(args.short, args.long, model.config.vocab_size)
    # recomputed proximal logprobs (a no-grad pass before the update) without truncated IS
    # weights: PPO ratios of 1 (the batch's behaviour logprobs are made up)
    cfg = LearnerConfig(packing=packing, max_tokens_per_microbatch=args.budget, lr=1e-6,
                        use_kl_loss=False, shuffle=False, old_logprob_source="recompute",
                        tis_cap=None)
    mbs = make_micro_batches(batch, max_tokens_per_microbatch=args.budget, packing=packing)
    # the positions the forwards run: padded rows, or the packed rows (filler included)
    ran = [int((mb.layout(model).input_ids if packing else mb.input_ids).numel())
           for mb in mbs]
    with torch.no_grad():  # warm-up: threads, allocator, kernels
        compute_logprobs(model, make_micro_batches(batch.select([0, 1]), packing=packing)[0])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    start = _rss_mib()
    t0, c0 = time.perf_counter(), time.process_time()
    m = policy_update(model, opt, batch, cfg)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    real = int(batch.lengths.sum())
    return {"packing": packing, "seconds": seconds, "tokens_per_s": real / seconds,
            "cpu_seconds": cpu, "tokens_per_cpu_s": real / cpu,
            "peak_rss_mib_above_start": _peak_mib() - start, "peak_rss_mib": _peak_mib(),
            "micro_batches": int(m["learner/num_micro_batches"]), "real_tokens": real,
            "forward_tokens": sum(ran), "max_forward_tokens_per_micro_batch": max(ran),
            "max_real_tokens_per_micro_batch": max(int(mb.lengths.sum()) for mb in mbs),
            "max_model_tokens_per_micro_batch": max(mb.num_model_tokens for mb in mbs),
            "pg_loss": m["actor/pg_loss"],
            "grad_norm": m["actor/grad_norm"], "entropy": m["actor/entropy"]}


def _summary(rows: list[dict], key: str) -> dict:
    vals = [r[key] for r in rows]
    return {"median": round(statistics.median(vals), 3), "min": round(min(vals), 3),
            "max": round(max(vals), 3)}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--layers", type=int, default=4, help="decoder layers kept")
    ap.add_argument("--budget", type=int, default=2048, help="max_tokens_per_microbatch")
    ap.add_argument("--short", type=int, default=24, help="short episodes (1-2 turns)")
    ap.add_argument("--long", type=int, default=3, help="long episodes (12-16 turns)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--one", choices=["padded", "packed"], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(one(args, args.one == "packed")))
        return {}
    passthrough = [f"--{k}={getattr(args, k)}" for k in
                   ("model", "layers", "budget", "short", "long")]
    load_start = os.getloadavg()[0]
    runs: dict[str, list[dict]] = {"padded": [], "packed": []}
    for r in range(args.repeats):
        for arm in (("padded", "packed") if r % 2 == 0 else ("packed", "padded")):
            out = subprocess.run([sys.executable, __file__, *passthrough, "--one", arm],
                                 check=True, capture_output=True, text=True).stdout
            runs[arm].append(json.loads(out.strip().splitlines()[-1]))
    arms = {}
    for arm, rows in runs.items():
        first = rows[0]
        arms[arm] = {k: first[k] for k in (
            "micro_batches", "real_tokens", "forward_tokens",
            "max_forward_tokens_per_micro_batch", "max_real_tokens_per_micro_batch",
            "max_model_tokens_per_micro_batch", "pg_loss", "grad_norm")}
        for key in ("tokens_per_s", "tokens_per_cpu_s", "seconds", "peak_rss_mib_above_start",
                    "peak_rss_mib"):
            arms[arm][key] = _summary(rows, key)
    pad, pk = arms["padded"], arms["packed"]

    def ratio(key: str) -> float:
        return round(pk[key]["median"] / pad[key]["median"], 3)

    report = {
        "bench": "packing", "model": f"{args.model}, first {args.layers} layers", "dtype":
        "float32", "attention": "sdpa", "max_tokens_per_microbatch": args.budget,
        "episodes": {"short": args.short, "long": args.long}, "repeats": args.repeats,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "load_avg_1m": {"start": round(load_start, 2), "end": round(os.getloadavg()[0], 2)},
        "arms": arms,
        "packed_vs_padded": {
            "tokens_per_s": ratio("tokens_per_s"),
            "tokens_per_cpu_s": ratio("tokens_per_cpu_s"),
            "peak_rss_mib_above_start": ratio("peak_rss_mib_above_start"),
            "forward_tokens": round(pk["forward_tokens"] / pad["forward_tokens"], 3),
            "pg_loss_abs_diff": abs(pk["pg_loss"] - pad["pg_loss"]),
            "grad_norm_rel_diff": abs(pk["grad_norm"] - pad["grad_norm"]) / pad["grad_norm"],
        },
        "runs": runs,
    }
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
