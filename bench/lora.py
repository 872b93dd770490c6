"""LoRA (peft, ``agentgym.learner.lora``) against full fine-tuning on SmolLM2-135M, CPU.

    python bench/lora.py [--repeats 3] [--steps 1] [--groups 2] [--samples 2]
        [--threads 2] [--no-vllm] [--out bench/results/lora.json]

Prints one JSON object (and writes it to ``--out``). Three parts:

1. **Learner** (``train``). One GRPO ``policy_update`` (the step ``agentgym-rl train``
   takes: the KL reference pass, advantages, micro-batched forward/backward, clipping,
   AdamW) per timed step, each arm in a fresh interpreter (``--arm``), interleaved
   (full, lora, lora, full, ...) ``--repeats`` times. ``full``: every weight trains and the
   KL reference is a frozen copy of the model (what the trainer does today). ``lora``:
   :func:`~agentgym.learner.lora.apply_lora` with the default settings (r 16, alpha 32,
   all linear layers of the decoder) and the reference is the same weights with the
   adapter disabled (:func:`~agentgym.learner.lora.reference_model`). The batch: ``--groups``
   x ``--samples`` synthetic three-turn trajectories of 256 tokens (a 96-token prompt, then
   three 32-token replies with a 32-token observation between each two; random ids; the
   group's rewards differ, so GRPO's advantages are not 0) whose behaviour logprobs are the
   model's own. Each process runs one untimed warm-up step (the optimizer state is made
   there), then ``--steps`` timed ones. The machine's 1-minute load average at each
   process's start and end is kept (other work on a shared machine slows both arms; the
   per-repeat ratio compares two processes that ran back to back). Reported per arm:
   trainable / total parameters, the optimizer state's size, update tokens/s (all tokens
   of the batch / step wall time; median and range over every timed step), and memory: the
   resident set once the model, reference and optimizer are built (``built_rss_mib``;
   AdamW makes its state at the first step), after the warm-up step (``setup_rss_mib``;
   freed activations may stay in the allocator's heap) and the process's resident
   high-water mark over the whole run (``VmHWM``, from ``/proc/self/status``;
   ``peak_rss_mib``).
2. **Weight sync to the transformers backend** (``sync_transformers``, this process):
   full fine-tuning sends a CPU copy of the state dict (the trainer's ``_weights``), LoRA
   the merged weights (:func:`~agentgym.learner.lora.merged_weights`); both through
   ``update_weights``; interleaved, median and range.
3. **vLLM** (``vllm``, one child process; ``--no-vllm`` skips it). Two in-process engines
   (``make_backend("vllm", ...)``, float32) live side by side and take turns: ``merged``,
   the backend as it is (LoRA off), and ``lora``, the same with ``enable_lora`` (vLLM's CPU
   punica kernels; ``max_lora_rank`` 16). Sync: ``merged`` = merge + ``update_weights``
   (safetensors written to a temp folder, ``reload_weights``); ``lora`` =
   ``save_adapter`` + ``engine.add_lora(LoRARequest)`` under a fresh adapter id +
   ``remove_lora`` of the previous one. Generation: ``--gen-requests`` concurrent requests
   of a 128-token prompt, ``--gen-tokens`` new tokens each (``ignore_eos``), generated
   tokens/s, interleaved between the engines; the ``lora`` engine is measured with the
   adapter (``lora``) and without it (``lora_engine_base``: the cost of LoRA being on).
   Agreement: the greedy logprobs of the merged engine and of the LoRA engine with the
   adapter, for the same adapter, and their largest difference.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python bench/lora.py`: the bench package
    sys.path.insert(0, str(ROOT))

from bench.peer_trl_learner import _rss_mib  # noqa: E402

MODEL = "smollm2-135m"
PROMPT, REPLY, OBS, TURNS = 96, 32, 32, 3


def _spread(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs),
            "n": len(xs), "all": xs}


def _load_model():
    import torch
    import transformers

    from agentgym.models import resolve_model

    path = resolve_model(MODEL)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return path, model


def _random_adapter(pm, seed: int) -> None:
    """Give every ``lora_B`` of ``pm`` random values (a trained adapter's stand-in)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if ".lora_B." in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)


# ------------------------------------------------------------------ 1. the learner arms
def _batch(model, groups: int, samples: int, vocab: int, seed: int = 0):
    """The synthetic GRPO batch (module docstring) with the model's own behaviour
    logprobs."""
    import numpy as np
    import torch

    from agentgym.data import pack
    from agentgym.data.trajectories import Trajectory
    from agentgym.learner.microbatch import make_micro_batches, scatter_to_packed
    from agentgym.learner.update import compute_logprobs

    rng = np.random.default_rng(seed)
    trajs = []
    for g in range(groups):
        for i in range(samples):
            ids = list(rng.integers(3, vocab, PROMPT))
            mask = [0] * PROMPT
            for turn in range(TURNS):
                if turn:
                    ids += list(rng.integers(3, vocab, OBS))
                    mask += [0] * OBS
                ids += list(rng.integers(3, vocab, REPLY))
                mask += [1] * REPLY
            r = float(i % 2)
            trajs.append(Trajectory(
                token_ids=[int(t) for t in ids], loss_mask=mask, task_id=g, env_id="bench",
                group_id=g, sample_index=i, logprobs=[0.0] * len(ids), prompt_len=PROMPT,
                turn_rewards=[0.0] * (TURNS - 1) + [r], reward=r, num_turns=TURNS,
                stop_reason="done", policy_version=0))
    pb = pack(trajs)
    lp = np.zeros(pb.num_tokens, np.float32)
    with torch.no_grad():
        for mb in make_micro_batches(pb, max_tokens_per_microbatch=4096):
            scatter_to_packed(pb, mb, compute_logprobs(model, mb, with_entropy=False)[0], lp)
    pb.logprobs = (lp * pb.loss_mask).astype(np.float32)
    return pb


def run_arm(args) -> dict:
    """One learner arm in this process (``--arm full|lora``)."""
    import torch

    from agentgym.learner.lora import LoraSettings, apply_lora, reference_model
    from agentgym.learner.update import LearnerConfig, make_optimizer, policy_update

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    load0 = os.getloadavg()[0]
    _, model = _load_model()
    cfg = LearnerConfig(adv_estimator="grpo", use_kl_loss=True, kl_coef=1e-3,
                        lr=1e-5 if args.arm == "lora" else 1e-6, pad_token_id=2, seed=0)
    batch = _batch(model, args.groups, args.samples, model.config.vocab_size)
    if args.arm == "full":
        policy = model
        ref = copy.deepcopy(model).eval().requires_grad_(False)
    else:
        policy = apply_lora(model, LoraSettings())
        ref = reference_model(policy)
    opt = make_optimizer(policy, cfg)
    trainable = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    total = sum(p.numel() for p in policy.parameters())
    built_rss = _rss_mib()[0]
    policy_update(policy, opt, batch, cfg, ref_model=ref)  # warm-up; optimizer state made
    setup_rss = _rss_mib()[0]
    opt_numel = sum(t.numel() for s in opt.state.values() for t in s.values()
                    if torch.is_tensor(t) and t.dim() > 0)
    steps = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        m = policy_update(policy, opt, batch, cfg, ref_model=ref)
        dt = time.perf_counter() - t0
        steps.append({"seconds": dt, "tokens": m["learner/num_tokens"],
                      "tokens_per_s": m["learner/num_tokens"] / dt,
                      "kl": m.get("actor/kl", float("nan"))})
    return {"arm": args.arm, "load_avg_start_end": [load0, os.getloadavg()[0]],
            "trainable_params": trainable, "total_params": total,
            "optimizer_state_mib": opt_numel * 4 / 2**20,
            "built_rss_mib": built_rss, "setup_rss_mib": setup_rss,
            "peak_rss_mib": _rss_mib()[1], "steps": steps,
            "threads": torch.get_num_threads()}


def _spawn(extra: list[str], args, timeout: float = 900) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), *extra, "--threads",
           str(args.threads), "--steps", str(args.steps), "--groups", str(args.groups),
           "--samples", str(args.samples), "--gen-requests", str(args.gen_requests),
           "--gen-tokens", str(args.gen_tokens), "--sync-repeats", str(args.sync_repeats)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "python"), str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": str(args.threads)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{extra} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure_train(args) -> dict:
    order = []
    for i in range(args.repeats):
        order += ["full", "lora"] if i % 2 == 0 else ["lora", "full"]
    runs: dict[str, list[dict]] = {"full": [], "lora": []}
    for arm in order:
        runs[arm].append(_spawn(["--arm", arm], args))
        print(f"[lora bench] {arm}: {runs[arm][-1]['steps']}", file=sys.stderr, flush=True)
    out = {}
    for arm, rs in runs.items():
        tps = [s["tokens_per_s"] for r in rs for s in r["steps"]]
        out[arm] = {
            "trainable_params": rs[0]["trainable_params"], "total_params": rs[0]["total_params"],
            "trainable_fraction": rs[0]["trainable_params"] / rs[0]["total_params"],
            "optimizer_state_mib": rs[0]["optimizer_state_mib"],
            "update_tokens_per_s": _spread(tps),
            "step_seconds": _spread([s["seconds"] for r in rs for s in r["steps"]]),
            "tokens_per_step": rs[0]["steps"][0]["tokens"],
            "built_rss_mib": _spread([r["built_rss_mib"] for r in rs]),
            "setup_rss_mib": _spread([r["setup_rss_mib"] for r in rs]),
            "peak_rss_mib": _spread([r["peak_rss_mib"] for r in rs]),
        }
    f, lo = out["full"], out["lora"]
    # each repeat's two processes ran back to back, under about the same machine load
    pairs = [statistics.median(s["tokens_per_s"] for s in runs["lora"][i]["steps"])
             / statistics.median(s["tokens_per_s"] for s in runs["full"][i]["steps"])
             for i in range(args.repeats)]
    out["lora_vs_full"] = {
        "update_speedup": lo["update_tokens_per_s"]["median"] / f["update_tokens_per_s"]["median"],
        "update_speedup_per_repeat": _spread(pairs),
        "peak_rss_saved_mib": f["peak_rss_mib"]["median"] - lo["peak_rss_mib"]["median"],
        "trainable_ratio": lo["trainable_params"] / f["trainable_params"],
    }
    out["order"] = order
    out["load_avg_start_end"] = {arm: [r["load_avg_start_end"] for r in rs]
                                 for arm, rs in runs.items()}
    return out


# ------------------------------------------------------------------ 2. transformers sync
def measure_sync_transformers(args) -> dict:
    import torch

    from agentgym.backends import make_backend
    from agentgym.learner.lora import LoraSettings, apply_lora, merged_weights

    torch.set_num_threads(args.threads)
    path, model = _load_model()
    full_model = copy.deepcopy(model)
    pm = apply_lora(model, LoraSettings())
    _random_adapter(pm, 0)
    backend = make_backend("transformers", path, device="cpu")

    def full_weights():
        return {k: v.detach().to("cpu", copy=True) for k, v in full_model.state_dict().items()}

    async def go():
        times = {"full": [], "lora": [], "lora_merge_only": []}
        try:
            for i in range(args.sync_repeats):
                for arm in (("full", "lora") if i % 2 == 0 else ("lora", "full")):
                    t0 = time.perf_counter()
                    if arm == "full":
                        sd = full_weights()
                    else:
                        sd = merged_weights(pm)
                        times["lora_merge_only"].append(time.perf_counter() - t0)
                    await backend.update_weights(sd)
                    times[arm].append(time.perf_counter() - t0)
            await backend.update_weights(merged_weights(pm))
            want = merged_weights(pm)
            served = backend.model.state_dict()
            ok = set(served) == set(want) and all(torch.equal(served[k], want[k])
                                                  for k in want)
        finally:
            await backend.close()
        return times, ok

    times, ok = asyncio.run(go())
    return {"backend": "transformers (cpu, float32)",
            "full_state_dict_seconds": _spread(times["full"]),
            "lora_merged_seconds": _spread(times["lora"]),
            "lora_merge_only_seconds": _spread(times["lora_merge_only"]),
            "served_weights_equal_merged": ok}


# ------------------------------------------------------------------ 3. vLLM
def run_vllm(args) -> dict:
    """The vLLM part in this process (``--vllm-child``)."""
    import numpy as np
    import torch
    from vllm.inputs import TokensPrompt
    from vllm.lora.request import LoRARequest

    from agentgym.backends import make_backend
    from agentgym.backends.base import SamplingParams
    from agentgym.learner.lora import (
        LoraSettings,
        apply_lora,
        merged_weights,
        save_adapter,
        unshared,
    )

    torch.set_num_threads(args.threads)
    path, model = _load_model()
    pm = apply_lora(model, LoraSettings())
    tmp = Path(tempfile.mkdtemp(prefix="lora-bench-"))
    rng = np.random.default_rng(0)
    prompts = [[int(t) for t in rng.integers(3, 49152, 128)] for _ in range(args.gen_requests)]
    kw = dict(max_model_len=1024, max_num_seqs=max(64, args.gen_requests), seed=0)
    t0 = time.perf_counter()
    merged_be = make_backend("vllm", path, **kw)
    start_merged = time.perf_counter() - t0
    t0 = time.perf_counter()
    lora_be = make_backend("vllm", path, **kw, engine_kwargs={
        "enable_lora": True, "max_lora_rank": LoraSettings().r, "max_loras": 1})
    start_lora = time.perf_counter() - t0
    state = {"id": 0, "req": None}

    async def sync_merged() -> dict:
        t0 = time.perf_counter()
        sd = unshared(merged_weights(pm))  # tied embeddings: safetensors wants copies
        t1 = time.perf_counter()
        await merged_be.update_weights(sd)
        t2 = time.perf_counter()
        return {"seconds": t2 - t0, "merge": t1 - t0, "update_weights": t2 - t1}

    async def sync_lora() -> dict:
        t0 = time.perf_counter()
        state["id"] += 1
        folder = save_adapter(pm, tmp / f"v{state['id']}")
        t1 = time.perf_counter()
        req = LoRARequest(f"policy-v{state['id']}", state["id"], str(folder))
        if not await lora_be.engine.add_lora(req):
            raise RuntimeError("add_lora refused the adapter")
        if state["req"] is not None:
            await lora_be.engine.remove_lora(state["req"].lora_int_id)
        state["req"] = req
        t2 = time.perf_counter()
        return {"seconds": t2 - t0, "save_adapter": t1 - t0, "add_lora": t2 - t1}

    async def one(be, prompt, sp, rid, lora_req):
        final = None
        async for out in be.engine.generate(TokensPrompt(prompt_token_ids=prompt),
                                            be._params(sp), rid, lora_request=lora_req):
            final = out
        c = final.outputs[0]
        return list(c.token_ids), [float(lp[t].logprob) for t, lp in
                                   zip(c.token_ids, c.logprobs, strict=True)]

    async def generate(be, lora_req, tag) -> float:
        sp = SamplingParams(max_new_tokens=args.gen_tokens, temperature=1.0, ignore_eos=True,
                            seed=None)
        t0 = time.perf_counter()
        outs = await asyncio.gather(*[one(be, p, sp, f"{tag}-{i}", lora_req)
                                      for i, p in enumerate(prompts)])
        dt = time.perf_counter() - t0
        return sum(len(t) for t, _ in outs) / dt

    async def go() -> dict:
        res: dict = {"start_seconds": {"merged": start_merged, "lora": start_lora}}
        syncs = {"merged": [], "lora": []}
        gen = {"merged": [], "lora": [], "lora_engine_base": []}
        try:
            # warm-up: one short batch on each engine
            await asyncio.gather(generate(merged_be, None, "wm"), generate(lora_be, None, "wl"))
            for i in range(args.sync_repeats):
                _random_adapter(pm, 100 + i)  # a new adapter each round
                for arm in (("merged", "lora") if i % 2 == 0 else ("lora", "merged")):
                    syncs[arm].append(await (sync_merged() if arm == "merged" else sync_lora()))
            for i in range(args.gen_repeats):
                arms = ["merged", "lora", "lora_engine_base"]
                for arm in arms if i % 2 == 0 else arms[::-1]:
                    be = merged_be if arm == "merged" else lora_be
                    req = state["req"] if arm == "lora" else None
                    gen[arm].append(await generate(be, req, f"{arm}{i}"))
            # agreement: both engines now serve the last adapter
            sp = SamplingParams(max_new_tokens=16, temperature=0.0)
            a = await one(merged_be, prompts[0], sp, "agree-m", None)
            b = await one(lora_be, prompts[0], sp, "agree-l", state["req"])
            n = min(len(a[0]), len(b[0]))
            same = 0
            while same < n and a[0][same] == b[0][same]:
                same += 1
            res["agreement"] = {
                "greedy_tokens_equal": a[0] == b[0], "common_prefix": same,
                "max_abs_logprob_diff": max(abs(x - y) for x, y in
                                            zip(a[1][:same], b[1][:same], strict=True))}
        finally:
            await merged_be.close()
            await lora_be.close()
        res["sync_seconds"] = {k: _spread([s["seconds"] for s in v]) for k, v in syncs.items()}
        res["sync_parts_seconds"] = {
            "merged": {p: statistics.median(s[p] for s in syncs["merged"])
                       for p in ("merge", "update_weights")},
            "lora": {p: statistics.median(s[p] for s in syncs["lora"])
                     for p in ("save_adapter", "add_lora")}}
        res["generated_tokens_per_s"] = {k: _spread(v) for k, v in gen.items()}
        return res

    res = asyncio.run(go())
    adapter_bytes = sum(f.stat().st_size for f in (tmp / "v1").iterdir())
    res["adapter_file_mib"] = adapter_bytes / 2**20
    res["merged_safetensors_mib"] = sum(
        v.numel() * v.element_size() for v in merged_weights(pm).values()) / 2**20
    res["workload"] = {"requests": args.gen_requests, "prompt_tokens": 128,
                       "new_tokens": args.gen_tokens, "engines": "float32, prefix caching on"}
    g, s = res["generated_tokens_per_s"], res["sync_seconds"]
    per_tok = 1 / g["lora"]["median"] - 1 / g["merged"]["median"]
    saved = s["merged"]["median"] - s["lora"]["median"]
    res["break_even_generated_tokens_per_sync"] = (saved / per_tok if per_tok > 0
                                                   else float("inf"))
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)
    return res


# ------------------------------------------------------------------ main
def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arm", choices=["full", "lora"])
    ap.add_argument("--vllm-child", action="store_true")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sync-repeats", type=int, default=3)
    ap.add_argument("--gen-requests", type=int, default=32)
    ap.add_argument("--gen-tokens", type=int, default=32)
    ap.add_argument("--gen-repeats", type=int, default=2)
    ap.add_argument("--no-vllm", action="store_true")
    ap.add_argument("--skip-train", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "lora.json"))
    args = ap.parse_args(argv)
    if args.arm:
        print(json.dumps(run_arm(args)))
        return {}
    if args.vllm_child:
        print(json.dumps(run_vllm(args)))
        return {}
    t0 = time.perf_counter()
    import peft
    import torch
    import transformers

    result: dict = {
        "bench": "lora", "model": MODEL, "dtype": "float32",
        "machine": {"cpu": platform.processor() or platform.machine(),
                    "cores": os.cpu_count(), "threads": args.threads},
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "peft": peft.__version__},
        "lora": {"r": 16, "alpha": 32, "dropout": 0.0, "target_modules": "all-linear"},
        "batch": {"trajectories": args.groups * args.samples,
                  "tokens_per_trajectory": PROMPT + TURNS * REPLY + (TURNS - 1) * OBS,
                  "model_tokens_per_trajectory": TURNS * REPLY, "estimator": "grpo",
                  "kl_loss": True},
    }
    if not args.skip_train:
        result["train"] = measure_train(args)
    result["sync_transformers"] = measure_sync_transformers(args)
    if not args.no_vllm:
        try:
            import vllm

            result["versions"]["vllm"] = vllm.__version__
            result["vllm"] = _spawn(["--vllm-child"], args, timeout=1200)
        except Exception as e:  # the learner numbers still stand
            result["vllm"] = {"error": f"{type(e).__name__}: {str(e)[-2000:]}"}
    result["wall_seconds"] = time.perf_counter() - t0
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return result


if __name__ == "__main__":
    main()
