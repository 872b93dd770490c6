"""The memory planner (``agentgym.learner.planner``) against the measured memory of a real
learner step on this CPU.

Each case runs in a fresh process: it builds the model (the tiny model from
``agentgym.models.build_tiny_model``, or SmolLM2-135M from
``agentgym.models.resolve_model("smollm2-135m")``) in float32, its frozen reference copy and
AdamW (``make_optimizer``), runs one ``agentgym.learner.policy_update`` on one trajectory
(it makes AdamW's moments and warms the kernels at these shapes), then the measured one:
two trajectories in one mini-batch, one micro-batch each, so the second backward runs with
the first one's gradients and AdamW's moments alive. The trajectories are synthetic
multi-turn ones of known length (a prompt, then replies of 64 tokens, loss mask 1, and
observations of 96); a KL loss to the reference and an entropy bonus are on.

Measured (resident memory, ``/proc/self/status``): what building the model and its
reference added, against the plan's parameters + reference model; what the first update
left (AdamW's moments), against its optimizer line; and the peak during the measured
update (``VmHWM``, reset through ``/proc/self/clear_refs`` just before it) above the
memory before it, against the plan's gradients, gradients in flight, activations, logits,
backward working set and after-the-backward lines for the same micro-batch
(``plan_memory`` on one CPU rank: float32, unsharded). The relative error is (predicted -
measured) / measured: positive is a planner that over-counts.

Allocators: "mmap" fixes glibc's mmap threshold at 128 KiB, so every tensor above it is a
mapping of its own, returned when freed, and the resident memory follows the live tensors
(what the planner counts); "default" is glibc's dynamic threshold, which keeps freed
tensors in the heap for reuse: that is what a plain CPU run's resident memory shows, and
the gap between the two is the allocator's, not the model's. Prints one JSON object.

    python bench/planner_check.py > bench/results/planner_check.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

#: name -> (model, row length, micro-batch token budget, activation checkpointing,
#: learner.logprob_chunk_mib)
CASES = {
    "tiny": ("tiny", 4096, 4096, False, 256.0),
    "tiny_ckpt": ("tiny", 4096, 4096, True, 256.0),
    "smollm2-135m": ("smollm2-135m", 512, 512, False, 16.0),
    "smollm2-135m_ckpt": ("smollm2-135m", 512, 512, True, 16.0),
}
#: How large allocations are served: "mmap" fixes glibc's mmap threshold at 128 KiB
#: (every tensor above it is its own mapping, unmapped when freed, so the resident memory
#: follows the live tensors, as the planner counts them); "default" is glibc's own dynamic
#: threshold, which keeps freed tensors in the heap (what a plain CPU run's RSS shows).
ALLOCATORS = {"mmap": {"MALLOC_MMAP_THRESHOLD_": "131072"}, "default": {}}


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def _reset_peak() -> None:
    """Reset the process's peak resident memory (VmHWM) to its current one (Linux)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _batch(vocab: int, rows: int, length: int, seed: int = 0):
    """``rows`` multi-turn trajectories of ``length`` tokens each: a prompt (1/8), then
    replies of 64 tokens (loss mask 1) and observations of 96 (mask 0), in groups of 4
    with different rewards (GRPO advantages are not zero)."""
    import numpy as np

    from agentgym.data import pack
    from agentgym.data.trajectories import Trajectory

    rng = np.random.default_rng(seed)
    trajs = []
    for k in range(rows):
        prompt = length // 8
        mask = [0] * prompt
        while len(mask) < length:
            mask += [1] * 64 + [0] * 96
        mask = mask[:length]
        trajs.append(Trajectory(
            task_id=k // 4, env_id="bench", group_id=k // 4, sample_index=k % 4,
            token_ids=rng.integers(3, vocab, length).tolist(), loss_mask=mask,
            logprobs=[-1.5 * m for m in mask], prompt_len=prompt, turn_rewards=[0.0],
            reward=float(k % 4), num_turns=sum(mask) // 64, stop_reason="done",
            policy_version=0))
    return pack(trajs)


def _model_dir(name: str, tmp: str) -> str:
    if name == "tiny":
        from agentgym.models import build_tiny_model

        return str(build_tiny_model(os.path.join(tmp, "tiny"), seed=0))
    from agentgym.models import resolve_model

    return resolve_model(name)


def one(case: str) -> dict:
    """Run one case in this process and return its figures (see the module docstring)."""
    import copy

    import torch
    from transformers import AutoModelForCausalLM

    from agentgym.learner.planner import GIB, plan_memory
    from agentgym.learner.update import LearnerConfig, make_optimizer, policy_update

    name, length, budget, ckpt, chunk_mib = CASES[case]
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    torch.manual_seed(0)
    lc = LearnerConfig(lr=1e-5, use_kl_loss=True, kl_coef=1e-3, entropy_coeff=1e-3,
                       max_tokens_per_microbatch=budget, logprob_chunk_mib=chunk_mib,
                       clip_ratio_low=0.2, clip_ratio_high=0.2)
    per_mb = budget // length  # rows a micro-batch (equal lengths: no padding)
    with tempfile.TemporaryDirectory() as tmp:
        path = _model_dir(name, tmp)
        # library and thread-pool start-up on a one-layer copy of the architecture, so it
        # does not count as the model's memory
        warm_cfg = AutoModelForCausalLM.from_pretrained(path).config
        warm_cfg.num_hidden_layers = 1
        warm = AutoModelForCausalLM.from_config(warm_cfg).float()
        policy_update(warm, make_optimizer(warm, lc), _batch(warm_cfg.vocab_size, 2, 160), lc,
                      ref_model=copy.deepcopy(warm).eval().requires_grad_(False))
        del warm
        gc.collect()
        rss0 = _status_kib("VmRSS")
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        ref = copy.deepcopy(model).eval().requires_grad_(False)
        if ckpt:
            model.config.use_cache = False
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False})
        vocab = model.get_output_embeddings().out_features
        opt = make_optimizer(model, lc)
        gc.collect()
        rss1 = _status_kib("VmRSS")
        # the first update (one micro-batch) makes AdamW's moments and warms the kernels
        # at these shapes; the measured one has two micro-batches in one mini-batch
        policy_update(model, opt, _batch(vocab, per_mb, length, seed=1), lc, ref_model=ref)
        gc.collect()
        rss2 = _status_kib("VmRSS")
        pb = _batch(vocab, 2 * per_mb, length)
        _reset_peak()
        t0 = time.perf_counter()
        metrics = policy_update(model, opt, pb, lc, ref_model=ref)
        wall = time.perf_counter() - t0
        peak = _status_kib("VmHWM")
        model_tokens_mb = int(pb.loss_mask[: per_mb * length].sum())
        cfg = {"model": path, "env": "maze", "max_total_tokens": length,
               "learner": lc.to_dict() | {"betas": list(lc.betas)},
               "parallel": {"strategy": "ddp", "activation_checkpointing": ckpt}}
        plan = plan_memory(cfg, 1, 1024, device="cpu", tokens=budget,
                           model_tokens=model_tokens_mb, suggest=False)
    step_lines = ("gradients", "gathered weights", "gradients in flight", "activations",
                  "logits", "backward working set", "after the backward")
    predicted = {
        "build": plan.line("parameters").bytes + plan.line("reference model").bytes,
        "optimizer": plan.line("optimizer").bytes,
        "step": sum(plan.line(n).bytes for n in step_lines)}
    predicted["total"] = sum(predicted.values())
    measured = {"build": (rss1 - rss0) * 1024, "optimizer": (rss2 - rss1) * 1024,
                "step": (peak - rss2) * 1024}
    measured["total"] = sum(measured.values())
    mib = 2**20
    out = {
        "case": case, "allocator": os.environ.get("PLANNER_CHECK_ALLOCATOR", "default"),
        "model": name, "parameters": plan.params, "activation_checkpointing": ckpt,
        "row_tokens": length, "tokens_per_microbatch": budget,
        "model_tokens_per_microbatch": model_tokens_mb,
        "logits_tokens_at_once": plan.logit_tokens,
        "micro_batches": int(metrics["learner/num_micro_batches"]),
        "predicted_step_lines_mib": {n: round(plan.line(n).bytes / mib, 1)
                                     for n in step_lines}}
    for k in ("build", "optimizer", "step", "total"):
        out[f"predicted_{k}_mib"] = round(predicted[k] / mib, 1)
        out[f"measured_{k}_mib"] = round(measured[k] / mib, 1)
        out[f"{k}_rel_error"] = round((predicted[k] - measured[k]) / measured[k], 4)
    out.update(update_wall_s=round(wall, 1), plan_total_gib=round(plan.total / GIB, 3))
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default=",".join(CASES),
                    help=f"cases under the mmap allocator, of {', '.join(CASES)}")
    ap.add_argument("--default-malloc-cases", default="tiny,tiny_ckpt,smollm2-135m",
                    help="cases also run under glibc's default allocator ('' for none)")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one is not None:
        print(json.dumps(one(args.one)))
        return {}
    runs = [("mmap", c) for c in args.cases.split(",") if c] + \
        [("default", c) for c in args.default_malloc_cases.split(",") if c]
    for _, case in runs:
        if case not in CASES:
            ap.error(f"unknown case {case!r}; known: {', '.join(CASES)}")
    rows = []
    t0 = time.perf_counter()
    for alloc, case in runs:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
        env.update(ALLOCATORS[alloc], PLANNER_CHECK_ALLOCATOR=alloc)
        out = subprocess.run([sys.executable, __file__, "--one", case], check=True,
                             capture_output=True, text=True, env=env).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
    summary = {}
    for alloc in ALLOCATORS:
        mine = [r for r in rows if r["allocator"] == alloc]
        if mine:
            summary[alloc] = {f"{k}_rel_error_{f.__name__}": f(r[f"{k}_rel_error"] for r in mine)
                              for k in ("step", "total") for f in (min, max)}
    report = {"bench": "planner_check", "device": "cpu", "dtype": "float32",
              "machine": f"{platform.machine()}, {os.cpu_count()} cores",
              "load_avg": os.getloadavg()[0], "wall_s": round(time.perf_counter() - t0, 1),
              "summary": summary, "results": rows}
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
