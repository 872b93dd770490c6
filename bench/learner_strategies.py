"""The learner's GRPO update under each parallel strategy, on the same batch, in one run:

* ``one``: one process (``parallel.strategy: ddp`` without torchrun: the whole model);
* ``ddp``: 2 gloo ranks under ``torchrun``, each holding the whole model, its gradients and
  AdamW's moments;
* ``fsdp``: 2 gloo ranks, FSDP2 (each rank holds half of them);
* ``fsdp_ckpt``: the same with activation checkpointing.

    python bench/learner_strategies.py [--model smollm2-135m] [--repeats 3] [--steps 2]
                                       [--arms one ddp fsdp fsdp_ckpt] [--out FILE]

Each arm runs in fresh processes (so the peak memory is its own), and the arms are
interleaved (one ddp fsdp fsdp_ckpt, one ddp ...) so that each sees the same machine.
Every process builds its models with :func:`agentgym.learner.models.build_learner` (as the
trainer does), runs one untimed update, then ``--steps`` timed updates of the batch. Per arm:
update tokens/s (all tokens through forward and backward, ``learner/num_tokens``, over the
wall time of the timed updates; the median and range over repeats), and per rank the
persistent memory (the bytes of this rank's parameters, gradients and optimizer state, from
the tensors' local storage) and the peak resident memory (``VmHWM``). The batch: maze
episodes played by the scripted random policy with the model's tokenizer, behaviour
logprobs from the model itself (``bench/peer_trl_learner.build_batch``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

ARMS = {
    "one": {"nproc": 1, "parallel": {"strategy": "ddp"}},
    "ddp": {"nproc": 2, "parallel": {"strategy": "ddp"}},
    "fsdp": {"nproc": 2, "parallel": {"strategy": "fsdp"}},
    "fsdp_ckpt": {"nproc": 2, "parallel": {"strategy": "fsdp", "activation_checkpointing": True}},
}


def _local_bytes(tensors) -> int:
    """Bytes of the tensors' storage on this rank (a DTensor's local shard)."""
    total = 0
    for t in tensors:
        if t is None:
            continue
        local = getattr(t, "_local_tensor", t)
        total += local.numel() * local.element_size()
    return total


def worker(args) -> None:
    """One process of an arm (under torchrun when the arm has 2 ranks): the updates and
    this rank's figures, written as JSON to ``args.result`` + rank."""
    import torch

    from agentgym.distributed.ddp import init_from_env
    from agentgym.distributed.parallel import ParallelConfig
    from agentgym.learner.models import build_learner
    from agentgym.learner.update import LearnerConfig, policy_update
    from bench.peer_trl_learner import _rss_mib, load_batch

    torch.set_num_threads(args.threads)
    distributed = init_from_env()
    pb = load_batch(args.batch)
    cfg = LearnerConfig(lr=1e-6, use_kl_loss=True, kl_coef=1e-3, entropy_coeff=1e-3,
                        clip_ratio_low=0.2, clip_ratio_high=0.2,
                        max_tokens_per_microbatch=args.microbatch_tokens, seed=0)
    lm = build_learner(args.model_dir, cfg, device=torch.device("cpu"),
                       parallel=ParallelConfig(**json.loads(args.parallel)), use_ref=True,
                       distributed=distributed)
    policy_update(lm.model, lm.optimizer, pb, cfg, lm.ref, data_parallel=lm.dp)  # warm-up
    params = [p for p in lm.model.parameters()]
    persistent = {
        "params_mib": _local_bytes(params) / 2**20,
        # gradients exist for the trainable parameters between backward and zero_grad
        "grads_mib": _local_bytes(p for p in params if p.requires_grad) / 2**20,
        "optimizer_mib": _local_bytes(v for st in lm.optimizer.state.values()
                                      for v in st.values() if torch.is_tensor(v)
                                      and v.dim() > 0) / 2**20,
        "reference_mib": _local_bytes(lm.ref.parameters()) / 2**20 if lm.ref is not None
        and not hasattr(lm.ref, "unit") else 0.0,
    }
    persistent["total_mib"] = sum(persistent.values())
    tokens = 0.0
    t0 = time.perf_counter()
    for _ in range(args.steps):
        m = policy_update(lm.model, lm.optimizer, pb, cfg, lm.ref, data_parallel=lm.dp)
        tokens += m["learner/num_tokens"]
    wall = time.perf_counter() - t0
    rank = lm.dp.rank if lm.dp is not None else 0
    out = {"rank": rank, "wall_s": wall, "tokens": tokens, "tokens_per_s": tokens / wall,
           "persistent": persistent, "peak_rss_mib": _rss_mib()[1],
           "grad_norm": m["actor/grad_norm"], "pg_loss": m["actor/pg_loss"]}
    Path(f"{args.result}.{rank}").write_text(json.dumps(out))
    if distributed:
        torch.distributed.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_arm(name: str, model_dir: str, batch: str, args, tmp: str, rep: int) -> dict:
    """One run of arm ``name`` in fresh processes; its ranks' figures."""
    arm = ARMS[name]
    result = os.path.join(tmp, f"{name}-{rep}")
    threads = max(1, args.threads // arm["nproc"])
    cmd = [str(Path(__file__).resolve()), "--worker", "--model-dir", model_dir, "--batch",
           batch, "--parallel", json.dumps(arm["parallel"]), "--result", result, "--steps",
           str(args.steps), "--threads", str(threads), "--microbatch-tokens",
           str(args.microbatch_tokens)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    if arm["nproc"] > 1:
        torchrun = Path(sys.executable).with_name("torchrun")
        cmd = [str(torchrun), f"--nproc-per-node={arm['nproc']}", "--master-addr=127.0.0.1",
               f"--master-port={_free_port()}", *cmd]
    else:
        cmd = [sys.executable, *cmd]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"arm {name} failed:\n{proc.stderr[-3000:]}")
    ranks = [json.loads(Path(f"{result}.{r}").read_text()) for r in range(arm["nproc"])]
    return {"tokens_per_s": ranks[0]["tokens"] / max(r["wall_s"] for r in ranks),
            "ranks": ranks}


def summarize(runs: list[dict]) -> dict:
    tps = [r["tokens_per_s"] for r in runs]
    last = runs[-1]["ranks"]
    return {
        "update_tokens_per_s": {"median": statistics.median(tps), "min": min(tps),
                                "max": max(tps), "runs": tps},
        "persistent_mib_per_rank": [r["persistent"] for r in last],
        "peak_rss_mib_per_rank": [max(run["ranks"][k]["peak_rss_mib"] for run in runs)
                                  for k in range(len(last))],
        "grad_norm": last[0]["grad_norm"], "pg_loss": last[0]["pg_loss"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--tasks", type=int, default=4)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--max-turns", type=int, default=8)
    p.add_argument("--microbatch-tokens", type=int, default=4096)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    p.add_argument("--out")
    # one process of an arm
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model-dir", help=argparse.SUPPRESS)
    p.add_argument("--batch", help=argparse.SUPPRESS)
    p.add_argument("--parallel", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    from bench.peer_trl_learner import build_batch, model_dir

    with tempfile.TemporaryDirectory() as tmp:
        folder = model_dir(args.model, tmp)
        batch = os.path.join(tmp, "batch.npz")
        shape = build_batch(folder, batch, tasks=args.tasks, samples=args.samples,
                            max_turns=args.max_turns)
        runs: dict[str, list[dict]] = {a: [] for a in args.arms}
        load_before = os.getloadavg()
        for rep in range(args.repeats):
            for arm in args.arms:
                runs[arm].append(run_arm(arm, folder, batch, args, tmp, rep))
    report = {"bench": "learner_strategies", "model": args.model, "batch": shape,
              "steps_timed": args.steps, "repeats": args.repeats,
              "microbatch_tokens": args.microbatch_tokens, "threads": args.threads,
              "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                          "loadavg_before": load_before, "loadavg_after": os.getloadavg()},
              "arms": {a: summarize(r) for a, r in runs.items()}}
    arms = report["arms"]
    if "ddp" in arms and "fsdp" in arms:
        ddp = arms["ddp"]["persistent_mib_per_rank"][0]["total_mib"]
        report["fsdp_persistent_vs_ddp"] = \
            arms["fsdp"]["persistent_mib_per_rank"][0]["total_mib"] / ddp
    if "one" in arms:
        base = arms["one"]["update_tokens_per_s"]["median"]
        report["tokens_per_s_vs_one"] = {a: v["update_tokens_per_s"]["median"] / base
                                         for a, v in arms.items()}
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
