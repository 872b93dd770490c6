"""The sharded learner's GPU check, one process on one GPU (torch, transformers and peft; no
vLLM), in two parts:

1. ``fsdp``: the learner's FSDP2 path (a one-rank group; per-layer ``fully_shard`` and the
   forward unit as the root) with activation checkpointing and bf16 compute
   (``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)``; float32 master
   weights, gradients and AdamW state) on a random-weight Qwen2.5-3B architecture: GRPO
   ``policy_update`` tokens/s and ``torch.cuda.max_memory_allocated``, against the planner's
   prediction for the same settings (:func:`agentgym.learner.planner.plan_memory`);
2. ``lora``: LoRA r=64 (all linear layers of the decoder) on a random-weight Qwen2.5-7B
   architecture under the same path: one GRPO step's tokens/s and peak memory, against the
   planner's prediction.

The models are built from the bundled configs (``configs/agentgym_rl/models/``) with random
weights straight on the device (a step's cost depends on the shapes, not the weights). The
batch: ``--trajectories`` multi-turn trajectories of ``--length`` tokens (a prompt, then
replies of 64 tokens between observations of 128), random token ids, rewards spread within
each group of 4, behaviour logprobs from the model itself (one no-grad pass).

    python bench/gpu_scale.py                 # on the GPU machine: both parts, JSON under $OUT
    python bench/gpu_scale.py --tiny --device cpu   # the CPU smoke run (the test runs it)

A device run (this workplace's GPU machine has torch, transformers and peft, not this
checkout's build): carry ``python/agentgym/_core.abi3.so`` (built by ``scripts/setup.sh``;
abi3, loads on CPython >= 3.9) and run ``python3 bench/gpu_scale.py`` (about 5 minutes on one
H100: two random-weight models built on the GPU and 3 updates each).

Writes ``gpu_scale.json`` (``$OUT`` when set, else ``bench/results/``) and prints it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "configs" / "agentgym_rl" / "models" / "Qwen"
if str(ROOT / "python") not in sys.path:
    sys.path.insert(0, str(ROOT / "python"))


def synthetic_batch(n: int, length: int, vocab: int, seed: int = 0):
    """``n`` multi-turn trajectories of ``length`` tokens in groups of 4 (a 256-token prompt,
    then 64-token replies between 128-token observations)."""
    import numpy as np

    from agentgym.data import pack
    from agentgym.data.trajectories import Trajectory

    rng = np.random.default_rng(seed)
    trajs = []
    for k in range(n):
        prompt = min(256, length // 4)
        mask = [0] * prompt
        while len(mask) < length:
            mask += [1] * 64 + [0] * 128
        mask = mask[:length]
        turns = sum(1 for i in range(prompt, length) if mask[i] and not mask[i - 1])
        trajs.append(Trajectory(
            token_ids=rng.integers(10, vocab - 10, length).tolist(), loss_mask=mask,
            logprobs=[0.0] * length, task_id=k // 4, env_id="synthetic", group_id=k // 4,
            sample_index=k % 4, prompt_len=prompt, turn_rewards=[], reward=(k % 4) / 3.0,
            num_turns=turns, stop_reason="done", policy_version=0))
    return pack(trajs)


def _memory(device) -> dict:
    import torch

    if device.type == "cuda":
        return {"peak_mib": torch.cuda.max_memory_allocated(device) / 2**20,
                "memory": "torch.cuda.max_memory_allocated"}
    from bench.peer_trl_learner import _rss_mib

    return {"peak_mib": _rss_mib()[1], "memory": "VmHWM"}


def run_part(name: str, arch: str, args, device, lora: dict | None) -> dict:
    """Build ``arch`` with random weights on ``device``, shard it (one rank), run one
    untimed and ``args.steps`` timed GRPO updates; tokens/s, peak memory, the plan."""
    import numpy as np
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from agentgym.distributed.fsdp import ShardedDataParallel, make_mesh, shard_module
    from agentgym.distributed.parallel import ParallelConfig
    from agentgym.learner.forward import AdapterOff, ForwardUnit
    from agentgym.learner.microbatch import make_micro_batches, scatter_to_packed
    from agentgym.learner.update import (
        LearnerConfig,
        compute_logprobs,
        make_optimizer,
        policy_update,
    )

    parallel = ParallelConfig(strategy="fsdp", activation_checkpointing=True,
                              param_dtype="bfloat16" if device.type == "cuda" else None)
    config = AutoConfig.from_pretrained(arch)
    torch.manual_seed(0)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if lora is not None:
        from agentgym.learner.lora import apply_lora

        model = apply_lora(model, lora)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    unit = shard_module(ForwardUnit(model), parallel, make_mesh(parallel, device.type),
                        device.type)
    build_s = time.perf_counter() - t0
    cfg = LearnerConfig(lr=1e-6, use_kl_loss=True, kl_coef=1e-3, entropy_coeff=1e-3,
                        clip_ratio_low=0.2, clip_ratio_high=0.2, kl_estimator="low_var_kl",
                        max_tokens_per_microbatch=args.microbatch_tokens, seed=0)
    optimizer = make_optimizer(model, cfg)
    dp = ShardedDataParallel(unit)
    ref = AdapterOff(unit) if lora is not None else None  # full fine-tuning: no KL copy here
    if ref is None:
        cfg.use_kl_loss = False
    pb = synthetic_batch(args.trajectories, args.length, int(config.vocab_size))
    lp = np.zeros(pb.num_tokens, np.float32)
    with torch.no_grad():
        for mb in make_micro_batches(pb, max_tokens_per_microbatch=args.microbatch_tokens):
            scatter_to_packed(pb, mb, compute_logprobs(unit, mb, with_entropy=False)[0], lp)
    pb.logprobs = lp * pb.loss_mask
    policy_update(model, optimizer, pb, cfg, ref, data_parallel=dp)  # warm-up
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    tokens, t0 = 0.0, time.perf_counter()
    for _ in range(args.steps):
        m = policy_update(model, optimizer, pb, cfg, ref, data_parallel=dp)
        tokens += m["learner/num_tokens"]
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    wall = time.perf_counter() - t0
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    out = {"part": name, "arch": Path(arch).name, "lora": lora, "parallel": parallel.to_dict(),
           "params": total, "trainable_params": trainable, "build_s": build_s,
           "batch": {"trajectories": len(pb), "tokens": int(pb.num_tokens),
                     "model_tokens": int(pb.loss_mask.sum())},
           "microbatch_tokens": args.microbatch_tokens, "steps_timed": args.steps,
           "update_tokens_per_s": tokens / wall, "wall_s": wall,
           "grad_norm": m["actor/grad_norm"], **_memory(device)}
    out["planned"] = _planned(arch, args, lora, device, parallel, ref is not None)
    if out["planned"] is not None:
        out["planned_vs_measured"] = out["planned"]["total_mib"] / out["peak_mib"]
    del model, unit, optimizer, dp, ref
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def _planned(arch: str, args, lora, device, parallel, kl: bool) -> dict | None:
    """The planner's per-rank figures for the same run (one GPU), or None where the
    planner is not importable."""
    try:
        from agentgym.learner.planner import plan_memory
    except ImportError:
        return None
    cfg = {"model": arch, "backend": "transformers", "use_ref_model": kl, "lora": lora,
           "parallel": parallel.to_dict(),
           "learner": {"max_tokens_per_microbatch": args.microbatch_tokens,
                       "use_kl_loss": kl, "kl_coef": 1e-3 if kl else 0.0}}
    mem = float(os.environ.get("GPU_MEMORY_GIB", "80"))
    plan = plan_memory(cfg, world_size=1, gpu_memory_gib=mem)
    return {"total_mib": plan.total / 2**20, "fits": plan.fits,
            "lines": {ln.name: ln.bytes / 2**20 for ln in plan.lines}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true",
                   help="the CPU smoke run: the tiny model for both parts, a small batch")
    p.add_argument("--parts", nargs="+", default=["fsdp", "lora"], choices=["fsdp", "lora"])
    p.add_argument("--trajectories", type=int, default=16)
    p.add_argument("--length", type=int, default=2048)
    p.add_argument("--microbatch-tokens", type=int, default=16384)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--out")
    args = p.parse_args()
    sys.path.insert(0, str(ROOT))
    import torch

    from agentgym.distributed.fsdp import init_single_process

    device = torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.set_device(device.index or 0)
    init_single_process()
    archs = {"fsdp": str(MODELS / "Qwen2.5-3B-Instruct"),
             "lora": str(MODELS / "Qwen2.5-7B-Instruct")}
    if args.tiny:
        from agentgym.models import cached_tiny_model

        tiny = str(cached_tiny_model())
        archs = {"fsdp": tiny, "lora": tiny}
        args.trajectories, args.length, args.microbatch_tokens, args.steps = 8, 384, 2048, 1
    report = {"bench": "gpu_scale", "device": str(device), "tiny": args.tiny,
              "machine": {"platform": platform.platform(), "torch": torch.__version__,
                          "gpu": torch.cuda.get_device_name(device)
                          if device.type == "cuda" else None},
              "parts": {}}
    for part in args.parts:
        lora = {"r": 64, "alpha": 128} if part == "lora" else None
        report["parts"][part] = run_part(part, archs[part], args, device, lora)
    text = json.dumps(report, indent=2)
    print(text)
    out = args.out or (os.path.join(os.environ["OUT"], "gpu_scale.json") if os.environ.get("OUT")
                       else str(ROOT / "bench" / "results" / "gpu_scale.json"))
    Path(out).write_text(text + "\n")
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
