"""The learner against TRL's: one GRPO update of our learner (``policy_update``, the step
``agentgym-rl train`` takes) against one optimizer step of TRL's own ``GRPOTrainer``, on the
same batch of multi-turn trajectories, the same model and start weights, the same micro-batch
size and optimizer, float32.

The batch: real multi-turn episodes played by the rollout engine (``RolloutEngine``) with the
``ScriptedBackend``'s random policy on maze (4x4, step shaping 0.1, so the rewards of a group
differ and GRPO's advantages are not all 0) with the model's own tokenizer and chat template.
The scripted policy reports logprob 0, so the batch's behaviour logprobs are then set to the
start model's own logprobs of its tokens (our ``compute_logprobs``): the batch is what an
on-policy rollout of this model would have handed the learner, and at the first step the
importance ratio is 1 in both arms. The packed batch is saved once and both arms read it.

The arms, each in a fresh interpreter (``--arm``), ``--repeats`` times, interleaved (ours,
trl, trl_ckpt, then the reverse order, ...), each process running ``--steps`` updates on the
batch:

- ``ours``: ``make_optimizer`` and ``policy_update(model, optimizer, packed_batch, config)``:
  advantages (GRPO), micro-batches (``max_seqs_per_microbatch`` = ``--micro-batch``
  sequences, no token cap), loss, backward, gradient clipping, AdamW step.
- ``trl``: ``GRPOTrainer.train()`` for ``--steps`` optimizer steps with a ``rollout_func``
  that returns the same trajectories (prompt = the first prompt, completion = every later
  token, ``env_mask`` = our loss mask, what ``agentgym.integrations.trl.AgentGymRollout``
  hands TRL), ``per_device_train_batch_size`` = ``--micro-batch`` and
  ``gradient_accumulation_steps`` = batch / micro-batch, so one optimizer step covers the
  batch. TRL's own code runs: ``_generate_and_score_completions`` builds its inputs dict
  (``prompt_ids``, ``prompt_mask``, ``completion_ids``, ``completion_mask``, ``tool_mask``
  from ``env_mask``, ``advantages``, ``num_items_in_batch``), ``_compute_loss`` its loss, the
  Trainer's loop the backward, clipping and optimizer step. One thing is changed, in a
  subclass: after ``_generate_and_score_completions`` the ``advantages`` are replaced by ours
  (the same sequences' GRPO advantages; TRL's own, which divide by ``std + 1e-4`` where ours
  divide by ``std + 1e-6``, are reported beside them), and ``old_per_token_logps`` is set to
  the batch's behaviour logprobs, which our loss's ratio is taken against (TRL, without vLLM
  and with one optimizer step per generation, leaves it out and takes the ratio against the
  current logprobs, detached: the same at the first step, not at later ones; reading a given
  tensor instead costs it nothing). A step is timed from the Trainer's ``on_step_begin`` to
  its ``on_step_end`` callback. ``trl`` runs without gradient checkpointing, as ours does;
- ``trl_ckpt``: the same with TRL's own default, ``gradient_checkpointing=True`` (GRPOConfig
  turns it on; the Trainer's ``False``): less activation memory, the forward recomputed in
  the backward pass.

Settings both arms share: AdamW (lr ``--lr``, betas 0.9/0.999, eps 1e-8, no weight decay:
the Trainer exempts biases and norms from decay, our optimizer does not, so decay is off),
gradient clipping at 1.0, constant learning rate, KL off (TRL ``beta=0``, our
``use_kl_loss=False``), no entropy bonus, clip range 0.2 / 0.28, temperature 1, torch threads
``--threads`` in both. Loss definitions: TRL's default ``loss_type="dapo"`` is the sum of the
per-token clipped losses over the model tokens of the whole accumulated batch divided by their
number, our ``loss_agg_mode="token-mean"`` with the global token count; the per-token PPO-clip
loss is the same; our dual clip is turned off (``clip_ratio_c=None``; TRL has no dual clip).
So at the first step (same start weights) the losses and the gradients must agree to float
error, and so must every later step's loss while the two arms' weights stay together; the
report gives each step's loss and gradient norm and every parameter's gradient norm at step 1
in both arms, and their differences. (At the first step the ratio is 1, so the loss is minus
the token-mean advantage, which is 0 when every sequence of a group has as many model
tokens; the gradient is not.)

What is measured per arm and process: each step's wall time, update tokens/s (every token of
the batch / wall time, and model tokens / wall time), and the peak memory: on CPU the
process's resident high-water mark (``VmHWM``, the same figure as ``ru_maxrss``) and its
resident size just before the first update, on CUDA ``torch.cuda.max_memory_allocated``
(reset before the first update). A process's figure is the median of its steps after the
first (which pays one-time costs); after one untimed process of each arm, ``--repeats``
rounds (default 5) rotate the arms' order (``bench/harness.py``), and each comparison
block's ratio is the median of the per-round ratios ours / TRL (tokens/s; above 1: ours is
faster) with its range, every round listed. Each arm process is pinned to the client cores
(default: the last ``--threads`` allowed cores).

Usage: ``python bench/peer_trl_learner.py [--models tiny smollm2-135m] [--tasks 8]
[--samples 4] [--max-turns 8] [--micro-batch 4] [--steps 3] [--repeats 3] [--threads 1]
[--device cpu] [--profile] [--out bench/results/peer_trl_learner.json]``; a model may carry
its own row settings, ``--models tiny smollm2-135m:tasks=4,steps=2``. Prints one JSON
object. TRL absent: the report says so and has no rows.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import fields
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # bench.harness when run as a script
    sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "bench" / "results" / "peer_trl_learner.json"
ARMS = ("ours", "trl", "trl_ckpt")
#: maze as the main job plays it: 4x4, the goal's offset shown, step shaping (rewards differ).
ENV_KWARGS = {"size": 4, "loops": 60, "goal_hint": True, "show_position": False,
              "shaping": 0.1}


# ------------------------------------------------------------------ the batch

def model_dir(name: str, tmp: str) -> str:
    """The model folder of a row: ``tiny`` is the cached tiny model (seed 0), a named model
    (``smollm2-135m``) is resolved, anything else is a folder."""
    from agentgym.models import cached_tiny_model, resolve_model

    if name == "tiny":
        return str(cached_tiny_model())
    return str(resolve_model(name))


def build_batch(model: str, out_path: str, *, env: str = "maze", tasks: int = 8,
                samples: int = 4, max_turns: int = 8, env_kwargs: dict | None = None,
                device: str = "cpu", seed: int = 0) -> dict:
    """Play ``tasks`` x ``samples`` episodes with the scripted random policy through the
    rollout engine, set the behaviour logprobs to ``model``'s own (module docs), save the
    packed batch to ``out_path`` (``.npz``) and return its shape."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentgym.backends.scripted import ScriptedBackend
    from agentgym.data.trajectories import PackedBatch
    from agentgym.engine import RolloutEngine
    from agentgym.learner.microbatch import make_micro_batches, scatter_to_packed
    from agentgym.learner.update import compute_logprobs

    kwargs = (ENV_KWARGS if env == "maze" else {}) if env_kwargs is None else env_kwargs
    tok = AutoTokenizer.from_pretrained(model)
    engine = RolloutEngine(ScriptedBackend(tok, "random", seed=seed), tok,
                           max_turns=max_turns, seed=seed, progress=False)
    try:
        batch = engine.collect_sync(list(range(tasks)), env,
                                    env_kwargs=kwargs,
                                    n_samples=samples)
    finally:
        engine.close()
    pb = batch.packed()
    lm = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).to(device).eval()
    logprobs = np.zeros(pb.num_tokens, dtype=np.float32)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    with torch.no_grad():
        for mb in make_micro_batches(pb, max_tokens_per_microbatch=8192, pad_token_id=pad):
            lp, _ = compute_logprobs(lm, mb, with_entropy=False)
            scatter_to_packed(pb, mb, lp, logprobs)
    logprobs *= pb.loss_mask
    arrays = {f.name: getattr(pb, f.name) for f in fields(pb)}
    arrays["logprobs"] = logprobs
    np.savez(out_path, **arrays)
    pb = PackedBatch.from_dict(arrays)
    groups = pb.group_id
    if not np.all(groups[:-1] <= groups[1:]) or len(pb) % samples:
        raise RuntimeError("the batch's rows are not whole groups in order")
    return {"env": env, "env_kwargs": kwargs,
            "tasks": tasks, "samples": samples, "max_turns": max_turns,
            "trajectories": len(pb), "tokens": int(pb.num_tokens),
            "model_tokens": int(pb.loss_mask.sum()),
            "length_mean": float(pb.lengths.mean()), "length_max": int(pb.lengths.max()),
            "prompt_len_mean": float(pb.prompt_len.mean()),
            "num_turns_mean": float(pb.num_turns.mean()),
            "reward_mean": float(pb.rewards.mean()), "reward_std": float(pb.rewards.std()),
            "policy": "ScriptedBackend random; behaviour logprobs = the start model's"}


def load_batch(path: str):
    """The :class:`PackedBatch` :func:`build_batch` saved."""
    import numpy as np

    from agentgym.data.trajectories import PackedBatch

    with np.load(path) as z:
        return PackedBatch.from_dict({k: z[k] for k in z.files})


def learner_config(args, pad: int):
    """Our :class:`LearnerConfig` with the settings both arms share (module docs)."""
    from agentgym.learner.update import LearnerConfig

    return LearnerConfig(
        adv_estimator="grpo", use_kl_loss=False, entropy_coeff=0.0, lr=args.lr,
        weight_decay=0.0, max_grad_norm=1.0, clip_ratio_low=0.2, clip_ratio_high=0.28,
        clip_ratio_c=None, loss_agg_mode="token-mean", temperature=1.0,
        max_seqs_per_microbatch=args.micro_batch, max_tokens_per_microbatch=1 << 30,
        pad_token_id=pad, seed=0)


def our_advantages(pb, cfg):
    """Our GRPO advantages of the batch: ``(per sequence float32[B], result)``."""
    from agentgym.learner.advantages import compute_advantages

    adv = compute_advantages(pb, cfg.adv_estimator, norm_by_std=cfg.norm_adv_by_std,
                             eps=cfg.adv_eps, truncated=cfg.truncated, overlong=cfg.overlong)
    return adv.seq_advantages, adv


# ------------------------------------------------------------------ one arm, one process

def _rss_mib() -> tuple[float, float]:
    """(resident size, resident high-water mark) of this process in MiB (``/proc``)."""
    cur = hwm = 0.0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                cur = int(line.split()[1]) / 1024
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) / 1024
    return cur, hwm


class _GradProbe:
    """Every parameter's gradient norm, read once in an optimizer step pre-hook (after
    clipping, before the step): the first step's, to compare the arms."""

    def __init__(self, model, optimizer):
        self.model = model
        self.norms: dict[str, float] | None = None
        self.handle = optimizer.register_step_pre_hook(self)

    def __call__(self, optimizer, args, kwargs):
        import torch

        names, grads = zip(*[(n, p.grad) for n, p in self.model.named_parameters()
                             if p.grad is not None])
        norms = torch.stack([g.detach().float().norm() for g in grads]).cpu().tolist()
        self.norms = dict(zip(names, norms))
        self.handle.remove()


def _memory_start(device) -> float:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        return torch.cuda.memory_allocated(device) / 2**20
    return _rss_mib()[0]


def _memory_peak(device) -> dict:
    import torch

    if device.type == "cuda":
        return {"memory": "torch.cuda.max_memory_allocated",
                "peak_mib": torch.cuda.max_memory_allocated(device) / 2**20}
    return {"memory": "VmHWM (ru_maxrss)", "peak_mib": _rss_mib()[1]}


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_ours(args) -> dict:
    """``--steps`` of ``policy_update`` on the saved batch (this process's report)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentgym.learner.update import make_optimizer, policy_update

    device = torch.device(args.device)
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).to(device)
    pb = load_batch(args.batch)
    cfg = learner_config(args, tok.pad_token_id if tok.pad_token_id is not None else 0)
    opt = make_optimizer(model, cfg)
    probe = _GradProbe(model, opt)
    start = _memory_start(device)
    steps, losses, grad_norms, micro = [], [], [], []
    prof = _profiler(args)
    for _ in range(args.steps):
        _sync(device)
        t0 = time.perf_counter()
        m = policy_update(model, opt, pb, cfg)
        _sync(device)
        steps.append(time.perf_counter() - t0)
        losses.append(m["actor/pg_loss"])
        grad_norms.append(m["actor/grad_norm"])
        micro.append(int(m["learner/num_micro_batches"]))
        if prof is not None:
            prof.step()
    out = {"step_s": steps, "loss": losses, "grad_norm": grad_norms,
           "micro_batches": micro[0], "trained_tokens": int(m["learner/num_model_tokens"]),
           "param_grad_norms": probe.norms, "memory_before_update_mib": start,
           **_memory_peak(device)}
    if prof is not None:
        out["profile"] = _profile_table(prof)
    return out


def run_trl(args) -> dict:
    """``--steps`` optimizer steps of TRL's ``GRPOTrainer`` on the saved batch (this
    process's report)."""
    import warnings

    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from trl import GRPOConfig, GRPOTrainer

    from agentgym.integrations.trl import AgentGymRollout, env_reward

    device = torch.device(args.device)
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).to(device)
    pb = load_batch(args.batch)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    ours_seq, _ = our_advantages(pb, learner_config(args, pad))
    rows = _rollout_rows(pb)
    n_seq = len(pb)
    if n_seq % args.micro_batch:
        raise ValueError(f"{n_seq} trajectories are not a whole number of micro-batches of "
                         f"{args.micro_batch}")
    samples = int(np.bincount(np.unique(pb.group_id, return_inverse=True)[1]).max())

    def rollout_func(prompts, trainer):
        if len(prompts) != n_seq:
            raise RuntimeError(f"TRL asked for {len(prompts)} rollouts, the batch has {n_seq}")
        return {k: list(v) for k, v in rows.items()}

    class SameAdvantages(GRPOTrainer):
        """TRL's trainer with our advantages put into the inputs it builds itself; it
        records its own advantages, the time of building the inputs, each micro-batch's
        loss and each step's gradient norm."""

        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.trl_advantages: list = []
            self.prepare_s: list[float] = []
            self.micro_losses: list = []
            self.grad_norms: list[float] = []

        def _generate_and_score_completions(self, inputs):
            t0 = time.perf_counter()
            out = super()._generate_and_score_completions(inputs)
            self.trl_advantages.append(out["advantages"].detach().cpu().numpy().copy())
            dev = out["advantages"].device
            out["advantages"] = torch.as_tensor(ours_seq, dtype=torch.float32, device=dev)
            width = out["completion_ids"].shape[1]
            out["old_per_token_logps"] = torch.tensor(
                [lp + [0.0] * (width - len(lp)) for lp in rows["logprobs"]],
                dtype=torch.float32, device=dev)
            _sync(device)
            self.prepare_s.append(time.perf_counter() - t0)
            return out

        def training_step(self, model, inputs, num_items_in_batch=None):
            loss = super().training_step(model, inputs, num_items_in_batch)
            self.micro_losses.append(loss.detach())
            return loss

        def _clip_grad_norm(self, model):
            norm = super()._clip_grad_norm(model)
            self.grad_norms.append(float(norm))
            return norm

    class StepTimer(TrainerCallback):
        """Each optimizer step's wall time, ``on_step_begin`` to ``on_step_end``."""

        def __init__(self):
            self.t0 = 0.0
            self.step_s: list[float] = []
            self.start_mem: float | None = None
            self.prof = None

        def on_step_begin(self, args_, state, control, **kw):
            if self.start_mem is None:
                self.start_mem = _memory_start(device)
            _sync(device)
            self.t0 = time.perf_counter()

        def on_step_end(self, args_, state, control, **kw):
            _sync(device)
            self.step_s.append(time.perf_counter() - self.t0)
            if self.prof is not None:
                self.prof.step()

    with tempfile.TemporaryDirectory() as tmp:
        cfg = GRPOConfig(
            output_dir=tmp, per_device_train_batch_size=args.micro_batch,
            gradient_accumulation_steps=n_seq // args.micro_batch, num_generations=samples,
            max_steps=args.steps, learning_rate=args.lr, weight_decay=0.0,
            adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, max_grad_norm=1.0,
            lr_scheduler_type="constant", optim="adamw_torch", beta=0.0, loss_type="dapo",
            epsilon=0.2, epsilon_high=0.28, temperature=1.0,
            max_completion_length=int((pb.lengths - pb.prompt_len).max()),
            gradient_checkpointing=args.arm == "trl_ckpt",
            use_cpu=device.type == "cpu", bf16=False, fp16=False, report_to="none",
            save_strategy="no", logging_steps=1, disable_tqdm=True, seed=0,
            log_completions=False, dataloader_num_workers=0)
        timer = StepTimer()
        trainer = SameAdvantages(
            model=model, args=cfg, reward_funcs=env_reward, processing_class=tok,
            train_dataset=AgentGymRollout.dataset(args.env, range(max(n_seq // samples, 1))),
            rollout_func=rollout_func, callbacks=[timer])
        trainer.create_optimizer()
        probe = _GradProbe(trainer.model, trainer.optimizer)
        timer.prof = _profiler(args)
        trainer.train()
    ga = n_seq // args.micro_batch
    losses = [float(sum(x.item() for x in trainer.micro_losses[i * ga:(i + 1) * ga]))
              for i in range(args.steps)]
    trl_adv = trainer.trl_advantages[0]
    out = {"step_s": timer.step_s, "loss": losses, "grad_norm": trainer.grad_norms,
           "prepare_s": trainer.prepare_s, "micro_batches": ga,
           "trained_tokens": int(sum(sum(m) for m in rows["env_mask"])),
           "param_grad_norms": probe.norms, "memory_before_update_mib": timer.start_mem,
           "trl_advantages_max_abs_diff": float(np.abs(trl_adv - ours_seq).max()),
           **_memory_peak(device)}
    if timer.prof is not None:
        out["profile"] = _profile_table(timer.prof)
    return out


def _rollout_rows(pb) -> dict[str, list]:
    """The batch as TRL's rollout dict (``AgentGymRollout.outputs``' layout): the first
    prompt, everything after it, its logprobs, ``env_mask`` (our loss mask) and the reward."""
    rows: dict[str, list] = {k: [] for k in ("prompt_ids", "completion_ids", "logprobs",
                                             "env_mask", "env_reward")}
    for b in range(len(pb)):
        s, e = int(pb.offsets[b]), int(pb.offsets[b + 1])
        p = s + int(pb.prompt_len[b])
        rows["prompt_ids"].append(pb.token_ids[s:p].astype(int).tolist())
        rows["completion_ids"].append(pb.token_ids[p:e].astype(int).tolist())
        rows["logprobs"].append(pb.logprobs[p:e].astype(float).tolist())
        rows["env_mask"].append(pb.loss_mask[p:e].astype(int).tolist())
        rows["env_reward"].append(float(pb.rewards[b]))
    if sum(int(pb.loss_mask[int(pb.offsets[b]):int(pb.offsets[b]) + int(pb.prompt_len[b])]
               .sum()) for b in range(len(pb))):
        raise RuntimeError("model tokens inside a first prompt")
    return rows


def _profiler(args):
    """A torch profiler over the arm's steps (``--profile``), else None."""
    if not args.profile:
        return None
    import torch

    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]
                                  + ([torch.profiler.ProfilerActivity.CUDA]
                                     if args.device.startswith("cuda") else []))
    prof.start()
    return prof


def _profile_table(prof, rows: int = 25) -> list[dict]:
    """The profile's most expensive operators (self time), as rows."""
    prof.stop()
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    return [{"op": e.key, "calls": e.count, "self_cpu_ms": e.self_cpu_time_total / 1e3,
             "cpu_total_ms": e.cpu_time_total / 1e3} for e in events[:rows]]


def run_arm(args) -> dict:
    """One arm in this process (``--arm``), with ``--threads`` torch threads."""
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    fn = run_ours if args.arm == "ours" else run_trl  # trl, trl_ckpt
    return fn(args)


# ------------------------------------------------------------------ the comparison

def _spawn(arm: str, model: str, batch: str, args, cores: list[int] | None = None,
           steps: int | None = None) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--arm", arm, "--model", model,
           "--batch", batch, "--steps", str(steps or args.steps), "--micro-batch",
           str(args.micro_batch), "--lr", repr(args.lr), "--threads", str(args.threads),
           "--device", args.device] + (["--profile"] if args.profile else [])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "python"), str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": str(args.threads)}
    pin = (lambda: os.sched_setaffinity(0, cores)) if cores else None
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, preexec_fn=pin)
    if proc.returncode != 0:
        raise RuntimeError(f"arm {arm} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(a), abs(b), 1e-30)


#: what ``--models NAME:key=value,...`` may set for one row
ROW_KEYS = {"tasks": int, "samples": int, "max_turns": int, "micro_batch": int, "steps": int,
            "repeats": int}


def row_args(spec: str, args) -> tuple[str, argparse.Namespace]:
    """``NAME`` or ``NAME:key=value,...`` (``ROW_KEYS``): the model and its row's settings."""
    name, _, opts = spec.partition(":")
    row = argparse.Namespace(**vars(args))
    for item in filter(None, opts.split(",")):
        key, _, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if key not in ROW_KEYS:
            raise ValueError(f"{spec!r}: {key!r} is not one of {sorted(ROW_KEYS)}")
        setattr(row, key, ROW_KEYS[key](value))
    return name, row


def arm_harness(args):
    """The harness of the arm processes: no server; the client cores are ``--client-cores``
    or the last ``--threads`` allowed cores."""
    from bench.harness import Harness, plan_cores

    client = args.client_cores
    if client is None:
        allowed = sorted(os.sched_getaffinity(0))
        client = ",".join(map(str, allowed[-max(1, min(args.threads, len(allowed))):]))
    return Harness(plan_cores(None, client, with_server=False, pin=not args.no_pin),
                   repeats=args.repeats)


def measure_model(spec: str, args) -> dict:
    """One model row: build the batch, run the arms interleaved, compare."""
    from bench.harness import schedule

    name, args = row_args(spec, args)
    hs = arm_harness(args)
    cores = hs.plan.client if hs.plan.pin else None
    with tempfile.TemporaryDirectory() as tmp:
        model = model_dir(name, tmp)
        batch_path = os.path.join(tmp, "batch.npz")
        t0 = time.perf_counter()
        shape = build_batch(model, batch_path, env=args.env, tasks=args.tasks,
                            samples=args.samples, max_turns=args.max_turns,
                            device=args.device)
        shape["build_s"] = time.perf_counter() - t0
        arms = tuple(args.arms)
        runs: dict[str, list[dict]] = {a: [] for a in arms}
        order: list[list[str]] = []
        load0 = os.getloadavg()
        # one untimed process of each arm (imports, page cache), then the rounds
        plan = schedule(arms, args.repeats) if len(arms) > 1 else \
            [("warmup", -1, arms[0])] + [("run", r, arms[0]) for r in range(args.repeats)]
        for kind, r, arm in plan:
            if kind == "warmup":  # one step: imports, model load, page cache
                _spawn(arm, model, batch_path, args, cores, steps=1)
                continue
            out = _spawn(arm, model, batch_path, args, cores)
            if len(order) <= r:
                order.append([])
            order[r].append(arm)
            runs[arm].append(out)
        load1 = os.getloadavg()
    return summarize(name, model, shape, runs, args, hs, order, load0, load1)


def _median(xs):
    import statistics

    return statistics.median(xs)


def summarize(name: str, model: str, shape: dict, runs: dict[str, list[dict]], args,
              hs=None, order=None, load0=None, load1=None) -> dict:
    """The row of one model: each arm's median tokens/s over its processes (a process's
    figure: the median of its steps after the first), peak memory, the comparison blocks
    ours over each TRL arm, and the step-1 agreement of loss and gradients."""
    tokens, model_tokens = shape["tokens"], shape["model_tokens"]
    row = {"model": name, "model_dir": model, "batch": shape,
           "settings": {k: getattr(args, k) for k in ROW_KEYS}, "comparisons": []}
    per_run: dict[str, list[dict]] = {}
    for arm, rs in runs.items():
        # the first step of a process pays one-time costs (lazy optimizer state, allocator)
        steady = [_median(r["step_s"][1:] or r["step_s"]) for r in rs]
        per_run[arm] = [{"tokens_per_s": tokens / s, "model_tokens_per_s": model_tokens / s,
                         "step_s": s, "peak_mib": r["peak_mib"]} for s, r in zip(steady, rs)]
        med = _median(steady)
        row[arm] = {
            "median_step_s": med, "step_s_per_process": steady,
            "first_step_s": [r["step_s"][0] for r in rs],
            "step_s_all": [r["step_s"] for r in rs],
            "tokens_per_s": tokens / med, "model_tokens_per_s": model_tokens / med,
            "trained_tokens": rs[0]["trained_tokens"], "micro_batches": rs[0]["micro_batches"],
            "peak_mib": _median([r["peak_mib"] for r in rs]),
            "peak_mib_all": [r["peak_mib"] for r in rs],
            "memory": rs[0]["memory"],
            "memory_before_update_mib": [r["memory_before_update_mib"] for r in rs],
            "step1_loss": [r["loss"][0] for r in rs], "step1_grad_norm": [r["grad_norm"][0]
                                                                         for r in rs],
        }
        if arm != "ours":
            row[arm]["prepare_s_all"] = [r["prepare_s"] for r in rs]
            row[arm]["trl_own_advantages_max_abs_diff"] = rs[0]["trl_advantages_max_abs_diff"]
        if args.profile:
            row[arm]["profile"] = rs[0].get("profile")
    if hs is None:
        hs = arm_harness(args)
    order = order or [list(runs) for _ in range(len(runs["ours"]))]
    load0 = load0 if load0 is not None else os.getloadavg()
    load1 = load1 if load1 is not None else os.getloadavg()
    for peer in (a for a in runs if a != "ours"):
        block = hs.block_from_runs(
            f"{name}: ours / {peer}", {"ours": per_run["ours"], peer: per_run[peer]},
            metric="tokens_per_s", numerator="ours", denominator=peer, order=order,
            load_before=load0, load_after=load1, other_metrics=["peak_mib"])
        block.update({"model": name, "device": args.device})
        row["comparisons"].append(block)
        row[f"ratio_tokens_per_s_ours_over_{peer}"] = block["ratio"]["median"]
        row[f"ratio_tokens_per_s_ours_over_{peer}_range"] = [block["ratio"]["min"],
                                                              block["ratio"]["max"]]
        row[f"ratio_peak_memory_{peer}_over_ours"] = _median(
            [b["peak_mib"] / a["peak_mib"] for a, b in zip(per_run["ours"], per_run[peer])])
        key = "agreement" if peer == "trl" else f"agreement_{peer}"
        row[f"{key}_steps"], row[f"{key}_step1"] = _agreement(runs["ours"][0], runs[peer][0])
    if row["ours"]["memory"].startswith("VmHWM"):
        for a, rs in runs.items():
            row[a]["peak_above_start_mib"] = max(r["peak_mib"] - r["memory_before_update_mib"]
                                                 for r in rs)
    return row


def _agreement(ours: dict, peer: dict) -> tuple[dict, dict]:
    """Each step's loss and gradient norm in both arms' first process, and step 1's
    per-parameter gradient norms, with their largest differences."""
    lo, lt, no, nt = ours["loss"], peer["loss"], ours["grad_norm"], peer["grad_norm"]
    steps = {"loss_ours": lo, "loss_trl": lt, "grad_norm_ours": no, "grad_norm_trl": nt,
             "loss_max_abs_diff": max(abs(a - b) for a, b in zip(lo, lt)),
             "grad_norm_max_rel_diff": max(_rel(a, b) for a, b in zip(no, nt))}
    g_o, g_t = ours["param_grad_norms"], peer["param_grad_norms"]
    same = g_o is not None and g_t is not None and g_o.keys() == g_t.keys()
    first = {"loss_ours": lo[0], "loss_trl": lt[0], "loss_abs_diff": abs(lo[0] - lt[0]),
             "grad_norm_ours": no[0], "grad_norm_trl": nt[0],
             "grad_norm_rel_diff": _rel(no[0], nt[0]),
             "param_grad_norm_max_rel_diff": max(_rel(g_o[k], g_t[k]) for k in g_o)
             if same else None,
             "same_parameters": same,
             "trained_tokens_equal": ours["trained_tokens"] == peer["trained_tokens"]}
    return steps, first


def measure(models: list[str], args) -> dict:
    """The report: one row per model, or no rows and the reason when TRL is absent."""
    import torch

    report = {"bench": "peer_trl_learner", "device": args.device, "threads": args.threads,
              "torch": torch.__version__, "python": platform.python_version(),
              "machine": platform.machine(), "cpus": os.cpu_count(),
              "load_average": list(os.getloadavg()),
              "settings": {"micro_batch": args.micro_batch, "steps": args.steps,
                           "repeats": args.repeats, "lr": args.lr, "dtype": "float32",
                           "kl": "off in both (TRL beta=0, ours use_kl_loss=False)",
                           "loss": "TRL loss_type=dapo vs ours loss_agg_mode=token-mean; "
                                   "clip 0.2/0.28, no dual clip",
                           "optimizer": "AdamW betas 0.9/0.999 eps 1e-8, no weight decay, "
                                        "grad clip 1.0, constant lr"},
              "rows": []}
    # Versions without importing trl here: `import trl` sets VLLM_LOGGING_LEVEL=ERROR for this
    # process and every vLLM server it starts later (the arms import it in their own).
    from importlib.metadata import PackageNotFoundError, version

    try:
        report["trl"], report["transformers"] = version("trl"), version("transformers")
    except PackageNotFoundError as e:
        report["skipped"] = f"TRL is not installed ({e}): pip install 'agentgym-rl[trl]'"
        return report
    report["method"] = ("bench/harness.py: one untimed process of each arm, then --repeats "
                        "rounds, arms rotated; ratio = median of per-round ours/TRL")
    report["comparisons"] = []
    for name in models:
        row = measure_model(name, args)
        report["rows"].append(row)
        report["comparisons"] += row["comparisons"]
    report["load_average_after"] = list(os.getloadavg())
    return report


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["tiny", "smollm2-135m"])
    ap.add_argument("--env", default="maze")
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--max-turns", type=int, default=8)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS),
                    help="ours; trl: TRL without gradient checkpointing (as ours); trl_ckpt: "
                         "TRL with its default gradient_checkpointing=True")
    ap.add_argument("--profile", action="store_true",
                    help="torch.profiler over each arm's steps (slows them; its own run)")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--no-out", action="store_true")
    # one arm in this process (the parent spawns these)
    ap.add_argument("--arm", choices=ARMS)
    ap.add_argument("--model")
    ap.add_argument("--batch")
    from bench.harness import add_arguments, write_json_atomic

    add_arguments(ap)
    args = ap.parse_args(argv)
    if args.arm:
        out = run_arm(args)
        print(json.dumps(out))
        return out
    report = measure(args.models, args)
    print(json.dumps(report, indent=1))
    if not args.no_out:
        write_json_atomic(args.out, report)
    return report


if __name__ == "__main__":
    main()
