"""``Trainer``: the multi-turn RL loop (rollout -> advantages -> update -> weight sync).

One training step:

1. **rollout** — ``tasks_per_step`` tasks x ``n_samples`` episodes through the
   :class:`~agentgym.engine.RolloutEngine` with the horizon the schedule sets for this step
   (ScalingInter-RL moves it in stages; other methods keep it fixed);
2. **update** — :func:`~agentgym.learner.policy_update` (advantages of the method's
   estimator, micro-batched PPO-clip loss, KL to a frozen reference, a critic for PPO);
3. **sync** — the learner's state dict goes to the backend
   (``await backend.update_weights(sd)``); the backend's ``policy_version`` increments and
   every trajectory keeps the version it was generated with;
4. **log / eval / checkpoint** — JSONL + CSV + TensorBoard rows, periodic greedy evaluation
   on held-out tasks (``{"type": "eval", "success_rate": ...}`` rows), a PNG learning curve,
   and checkpoints that resume exactly (model, optimizer, step, horizon schedule, task
   sampler, RNGs).

With ``async_rollouts=True`` the rollout of step k+1 runs while step k's update runs (the
update is in a worker thread); its trajectories are then one policy version old, kept or
dropped by the learner's staleness rule (``max_staleness``), and the PPO ratio uses their
behaviour logprobs. With ``fully_async=True`` there is no rollout per step at all: one open
stream of groups runs the whole time, the learner takes a step whenever a batch of whole
groups has finished and pushes its weights while episodes are in flight, within the
staleness bound (:mod:`agentgym.learner.async_rollout`).

Scale-out (:mod:`agentgym.distributed`): with ``num_rollout_workers`` > 0 the rollouts come
from a :class:`~agentgym.distributed.RayRolloutPool` of that many Ray workers (each its own
backend and engine; ``ray_address`` picks the cluster) instead of the in-process engine, and
the weights go to every worker after each update. Under ``torchrun`` the learner is data
parallel (``parallel.strategy``: ``ddp``, or FSDP2's ``fsdp``/``hsdp``, which shard the model,
its gradients and the optimizer state; :mod:`agentgym.learner.models`): rank 0 runs the loop
(rollouts, logging, evaluation, checkpoints, weight sync) and names each piece of work every
rank takes part in (the update on each step's batch; under a sharded strategy also gathering
the weights and writing the checkpoint's shards); every rank trains on its share of each
batch. ``lora`` trains LoRA adapters instead of every weight (:mod:`agentgym.learner.lora`).

The run folder: ``config.yaml`` (the resolved config, :meth:`TrainerConfig.to_yaml`; every
checkpoint has its own copy), the metrics, the checkpoints. A resumed run (``resume``)
continues in the checkpoint's run folder unless ``output_dir`` says otherwise, dropping the
metrics rows written after that checkpoint, so the curve goes on without a break.

Ctrl-C (SIGINT) while :meth:`Trainer.train` runs in the main thread stops the run cleanly:
a step's rollout or an evaluation in flight is abandoned (the step is played again on
resume; the task sampler and RNGs are put back as they were before it), an update in
flight finishes its step, and a checkpoint of the last finished step is written; the
format warm-up (which runs off the event loop) stops at its next step. ``train()`` then
returns its summary with ``"interrupted": True``. A second Ctrl-C stops at once
(KeyboardInterrupt).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentgym.data.trajectories import STOP_CODES
from agentgym.envs.registry import horizon_preset, roles
from agentgym.learner.advantages import informative_groups
from agentgym.learner.async_rollout import AsyncRollouts
from agentgym.learner.failures import FailureGuard
from agentgym.learner.horizon import AdaptiveHorizonSchedule, HorizonSchedule
from agentgym.learner.selfplay import SelfPlay, outcomes
from agentgym.learner.tracking import MetricsLogger, plot_learning_curve
from agentgym.learner.train_config import RunConfigError, TrainerConfig
from agentgym.progress import progress_bar

__all__ = ["Trainer", "TrainerConfig", "make_schedule", "run_folder_of"]

log = logging.getLogger(__name__)


def make_schedule(cfg: TrainerConfig):
    """The horizon schedule of ``cfg``: staged for ScalingInter-RL, fixed otherwise."""
    if cfg.method_key != "scalinginter-rl":
        return HorizonSchedule.fixed(cfg.rollout.max_turns)
    stages = cfg.horizon
    steps = cfg.steps_per_stage
    if stages is None:
        preset = horizon_preset(cfg.env)  # the env family's (AgentGym-RL's rounds)
        if preset is not None:
            stages = list(preset.rounds)
            steps = steps or preset.steps_per_stage
        else:  # no preset: thirds of the final horizon
            top = cfg.rollout.max_turns
            stages = sorted({max(1, top // 3), max(1, 2 * top // 3), top})
    stages = [int(s) for s in stages]
    if cfg.adaptive_horizon:
        return AdaptiveHorizonSchedule(stages, window=5, min_steps_per_stage=5)
    if len(stages) == 1:
        return HorizonSchedule(stages)
    if steps is None:
        steps = max(1, cfg.max_steps // len(stages))
    return HorizonSchedule(stages, steps)


def run_folder_of(checkpoint: str | Path) -> Path:
    """The run folder a checkpoint belongs to (``RUN/checkpoints/step_N`` -> ``RUN``; a run
    folder itself); FileNotFoundError when there is no checkpoint there."""
    from agentgym.learner.checkpoint import find_checkpoint

    ckpt = find_checkpoint(checkpoint)
    return ckpt.parent.parent if ckpt.parent.name == "checkpoints" else ckpt.parent


class _Abandoned(Exception):
    """The rollout or evaluation in flight was cancelled by Ctrl-C."""


class Trainer:
    """Runs a :class:`TrainerConfig` (``Trainer(cfg).train()``); keyword arguments override
    the config. ``backend`` injects a ready backend (e.g. a ``ScriptedBackend`` in tests)
    instead of building ``cfg.backend`` from the model folder."""

    def __init__(self, config: TrainerConfig | dict | None = None, *, backend=None,
                 **overrides: Any):
        if config is None:
            config = TrainerConfig()
        elif isinstance(config, dict):
            config = TrainerConfig.from_dict(config)
        self.cfg = config.replace(**overrides) if overrides else config
        self._injected_backend = backend
        self.runner = None
        self.dp = None  # the data-parallel rank under torchrun
        self.last_sync_s = 0.0
        self.last_drain_s = 0.0
        self.step = 0
        self.history: list[dict[str, Any]] = []
        self.eval_history: list[dict[str, Any]] = []
        self._ready = False
        #: set on Ctrl-C (:meth:`train`): the loop stops at the next safe point, the
        #: warm-up (in its thread) at its next step
        self._stop = threading.Event()
        self._cancellable: asyncio.Future | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._saved_step: int | None = None
        #: The fully asynchronous run's producer (``fully_async``), and the checkpoint's
        #: state it resumes from.
        self.producer = None
        self._async_state: dict | None = None

    # ------------------------------------------------------------------ setup
    @property
    def output_dir(self) -> Path:
        """The run folder: ``output_dir``; else a resumed checkpoint's own run folder; else
        ``runs/<time>``."""
        if self.cfg.output_dir is None:
            if self.cfg.resume:
                self.cfg.output_dir = str(run_folder_of(self.cfg.resume))
            else:
                stamp = time.strftime("%Y%m%d-%H%M%S")
                self.cfg.output_dir = str(Path("runs") / stamp)
        return Path(self.cfg.output_dir)

    def _resolve_model(self) -> str:
        cfg = self.cfg
        if cfg.model not in ("tiny", "tiny-vl"):
            from agentgym.models import resolve_model

            return resolve_model(cfg.model)
        if cfg.model == "tiny-vl":  # built with the run's seed, like the tiny model
            from agentgym.models.tiny_vl import build_tiny_vl_model

            base = build_tiny_vl_model(self.output_dir / "base_model", seed=cfg.seed)
        else:
            from agentgym.models import build_tiny_model
            from agentgym.models.tiny import TinyModelConfig

            arch = cfg.tiny_model.to_dict()
            vocab = arch.pop("vocab_size", 1024)
            base = build_tiny_model(self.output_dir / "base_model", seed=cfg.seed,
                                    vocab_size=vocab,
                                    config=TinyModelConfig(**arch) if arch else None)
        if cfg.warmup is None:
            return str(base)
        import msgspec

        from agentgym.learner.warmup import warmup_model

        w = cfg.warmup  # the fields left None follow the run
        wcfg = msgspec.structs.replace(
            w, seed=cfg.seed if w.seed is None else w.seed,
            max_turns=self.schedule.stages[-1].max_turns if w.max_turns is None
            else w.max_turns,
            reply_prefix=cfg.rollout.reply_prefix if w.reply_prefix is None else w.reply_prefix)
        out = self.output_dir / "warm_model"
        stats = warmup_model(base, out, cfg.env, env_kwargs=self.train_env_kwargs,
                             num_tasks=self.train_task_hi, config=wcfg,
                             system_prompt=cfg.rollout.system_prompt,
                             progress=self._show_progress, stop=self._stop)
        self.warmup_stats = stats
        return str(out)

    @property
    def _show_progress(self) -> bool:
        p = self.cfg.progress
        return sys.stderr.isatty() if p is None else bool(p)

    async def setup(self) -> None:
        """Load models, backend, engine, schedule, logger; resume if asked (idempotent).

        In order: the process (torch.distributed under ``torchrun``, threads, seeds, the
        run folder), the schedule and the task split, the model folder (from the
        checkpoint, or built), the policy / reference / critic models and their optimizers,
        the checkpoint's state, and on rank 0 the runner and the logger."""
        if self._ready:
            return
        from agentgym.distributed.ddp import main_first
        from agentgym.learner.checkpoint import load_checkpoint

        cfg = self.cfg
        distributed = self._setup_process()
        self.schedule = make_schedule(cfg)
        self._split_tasks()
        self.failures = FailureGuard(cfg.env, cfg.abort_after_failed_steps,
                                     cfg.abort_failure_rate)
        ckpt = load_checkpoint(cfg.resume) if cfg.resume else None
        if ckpt:
            self.model_dir = str(ckpt["model_dir"])
        else:  # built (tiny model, warm-up) once, on rank 0, off the event loop (Ctrl-C)
            self.model_dir = await asyncio.to_thread(main_first, self._resolve_model) \
                if distributed else await asyncio.to_thread(self._resolve_model)
        st = ckpt["state"] if ckpt else {}
        # the KL anchor and a LoRA run's base weights stay the run's first model folder
        self.ref_model_dir = st.get("ref_model_dir") or self.model_dir
        self.base_model_dir = st.get("base_model_dir") or self.model_dir
        self.device = torch.device(cfg.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if distributed and self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self._check_plan()
        self._setup_models(distributed, ckpt)
        self.task_rng = np.random.default_rng(cfg.seed)
        self.version_offset = 0
        self.selfplay = None
        if cfg.self_play:
            self.selfplay = SelfPlay(
                cfg.env, list(roles(cfg.env)), cfg.opponents,
                role_baseline=cfg.role_baseline, role_baseline_decay=cfg.role_baseline_decay,
                pool_size=cfg.opponent_pool_size, pool_every=cfg.opponent_pool_every)
        if ckpt:
            self._restore(ckpt)
        self.dp = self.learner.dp
        if self.dp is not None and not self.dp.is_main:  # rank 0 alone rolls out, logs, saves
            self._ready = True
            return
        ro = {**cfg.rollout_settings(), "n_samples": cfg.n_samples, "seed": cfg.seed,
              "progress": False}
        self.runner = await asyncio.to_thread(self._open_runner, ro)
        if self.selfplay is not None and cfg.opponents == "pool":
            if not self.selfplay.pool:  # the starting weights are the first opponent
                self.selfplay.add_snapshot(f"pool:v{self.policy_version}", self._weights())
            for name, sd in self.selfplay.pool:
                await self._add_opponent(name, sd)
        if self.version_offset:
            # a resumed run's runner continues the checkpoint's version count, so its
            # trajectories, the staleness rule and the learner metrics see the run's versions
            self.runner.policy_version += self.version_offset
            self.version_offset = 0
        self.logger = MetricsLogger(self.output_dir, tensorboard=cfg.tensorboard,
                                    resume=ckpt is not None, wandb=cfg.wandb,
                                    run_config=cfg.to_dict() if cfg.wandb else None,
                                    resume_step=self.step if ckpt is not None else None)
        self._ready = True

    def _setup_process(self) -> bool:
        """torch.distributed from ``torchrun``'s environment (when there is one), torch
        threads, the Python / numpy / torch seeds and the run folder (rank 0's name on
        every rank); returns whether the run is distributed."""
        from agentgym.distributed.ddp import init_from_env, main_first

        cfg = self.cfg
        joined = torch.distributed.is_available() and torch.distributed.is_initialized()
        distributed = init_from_env()
        self._dist_owned = distributed and not joined
        self._threads_before = torch.get_num_threads()
        if cfg.torch_threads:
            torch.set_num_threads(cfg.torch_threads)
        random.seed(cfg.seed)
        np.random.seed(cfg.seed % 2**32)
        torch.manual_seed(cfg.seed)
        if distributed:  # rank 0's run folder (a default one is named by the time)
            cfg.output_dir = main_first(lambda: str(self.output_dir))
        self.output_dir.mkdir(parents=True, exist_ok=True)
        if int(os.environ.get("RANK", "0") or 0) == 0:  # the resolved config, readable
            from agentgym.runtime.files import write_text_atomic

            write_text_atomic(self.output_dir / "config.yaml", cfg.to_yaml())
        return distributed

    def _check_plan(self) -> None:
        """On a GPU, the memory plan of this run (:func:`~agentgym.learner.planner.
        check_fits`: the model's shapes on the meta device, this world size, this GPU's
        memory) before any weight is loaded; a run that cannot fit is refused with the
        setting to change (:class:`~agentgym.learner.planner.PlanError`)."""
        if self.device.type != "cuda":
            return
        from agentgym.distributed.ddp import world_from_env
        from agentgym.learner.planner import check_fits

        world = world_from_env()
        nodes = max(1, world // int(os.environ.get("LOCAL_WORLD_SIZE", world) or 1))
        gib = torch.cuda.get_device_properties(self.device).total_memory / 2**30
        plan = check_fits(self.cfg, world, gib, nodes=nodes, device="cuda",
                          model_dir=self.base_model_dir if self.cfg.lora is not None
                          else self.model_dir, suggest=True)
        log.info("memory plan: %s", plan.verdict())

    def _setup_models(self, distributed: bool, ckpt: dict | None) -> None:
        """The tokenizer, the learner config and the learner's models under the run's
        parallel strategy (:func:`~agentgym.learner.models.build_learner`: the policy,
        LoRA adapters, the frozen reference when a KL is used, the critic for ``gae`` with
        its checkpointed weights, the optimizers, the data-parallel rank)."""
        from transformers import AutoTokenizer

        from agentgym.learner.models import build_learner

        cfg = self.cfg
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.learner_config = cfg.learner_config(pad_token_id=pad)
        lcfg = self.learner_config
        wants_kl = (lcfg.use_kl_loss and lcfg.kl_coef > 0) or lcfg.use_kl_in_reward
        lora = cfg.lora is not None
        self.learner = build_learner(
            self.base_model_dir if lora else self.model_dir, lcfg, device=self.device,
            parallel=cfg.parallel_config, lora=cfg.lora,
            use_ref=cfg.use_ref_model and wants_kl, critic=lcfg.adv_estimator == "gae",
            distributed=distributed, ref_dir=self.ref_model_dir,
            critic_state=ckpt["critic"] if ckpt else None,
            adapter_dir=ckpt["dir"] / "adapter" if ckpt and lora else None)
        lm = self.learner
        self.model, self.ref_model, self.optimizer = lm.model, lm.ref, lm.optimizer
        self.critic, self.critic_optimizer = lm.critic, lm.critic_optimizer

    def _restore(self, ckpt: dict) -> None:
        """A checkpoint's optimizer states, schedule, task sampler, step, policy version,
        evaluation history, reference weights and RNG states."""
        from agentgym.learner.checkpoint import restore_rng

        st = ckpt["state"]
        if self.learner.sharded:
            if not (ckpt["dir"] / "dcp").is_dir():
                raise RunConfigError(f"{ckpt['dir']} was written by a ddp run (no dcp/ "
                                     "shards): resume it with parallel.strategy ddp")
            self.learner.load_shards(ckpt["dir"] / "dcp")
        else:
            if ckpt["optim"] is None:
                raise RunConfigError(f"{ckpt['dir']} was written by a sharded run (no "
                                     "optim.pt): resume it with parallel.strategy fsdp or hsdp")
            self.optimizer.load_state_dict(ckpt["optim"]["optimizer"])
            if self.critic_optimizer is not None and "critic_optimizer" in ckpt["optim"]:
                self.critic_optimizer.load_state_dict(ckpt["optim"]["critic_optimizer"])
        try:
            self.schedule.load_state_dict(st["schedule"])
        except ValueError as e:
            was = st["schedule"]
            turns = [s.get("max_turns") if isinstance(s, dict) else s
                     for s in was.get("stages", [])]
            raise RunConfigError(
                f"resume {ckpt['dir']}: {e} (the checkpoint's stages {turns}, steps per "
                f"stage {was.get('steps_per_stage')}; this config's: {self.schedule!r}): "
                "keep horizon, steps_per_stage and adaptive_horizon as the run had them "
                "(without steps_per_stage, max_steps sets the stages' length)") from None
        self.task_rng.bit_generator.state = st["task_rng"]
        self.step = int(st["step"])
        self.version_offset = int(st["policy_version"])
        self._async_state = st.get("async")  # where a fully asynchronous run's draws stand
        if self.selfplay is not None and "selfplay" in st:
            self.selfplay.load_state_dict(st["selfplay"])
        self.eval_history = list(st.get("eval_history", []))
        restore_rng(st["rng"])

    def _open_runner(self, rollout: dict[str, Any]):
        """The run's runner (:func:`~agentgym.engine.runner.open_runner`): an engine over
        the injected backend, or over ``cfg.backend`` built from the model folder, or a Ray
        rollout pool of ``num_rollout_workers`` workers (``max_concurrency`` is then per
        worker; ``rollout_worker`` holds WorkerSpec resources and pool options)."""
        from agentgym.engine.runner import open_runner

        cfg = self.cfg
        if self._injected_backend is not None:  # the model folder: for its vision spec
            return open_runner(self._injected_backend, self.model_dir, tokenizer=self.tokenizer,
                               **rollout).runner
        kw = dict(cfg.backend_kwargs)
        if cfg.backend == "transformers":
            if not cfg.num_rollout_workers:
                kw.setdefault("device", str(self.device))
            kw.setdefault("seed", cfg.seed)
        res = cfg.rollout_worker.to_dict()
        pool = {k: res.pop(k) for k in cfg.rollout_worker.POOL if k in res}
        res.setdefault("torch_threads", cfg.torch_threads)
        runner = open_runner(cfg.backend, self.model_dir, tokenizer=self.tokenizer,
                             backend_kwargs=kw, num_workers=cfg.num_rollout_workers,
                             ray_address=cfg.ray_address, worker=res, pool=pool,
                             **rollout).runner
        cpus = kw.get("cpus") if cfg.backend == "vllm" else None
        if cpus and (not cfg.num_rollout_workers or cfg.ray_address is None):
            from agentgym.backends.vllm_backend import check_cpus, pin_process

            # the vLLM engine (in process, or a local Ray worker's) on backend_kwargs.cpus;
            # the learner on the other cores of this machine, away from its busy-waiting
            pin_process(sorted(os.sched_getaffinity(0) - set(check_cpus(cpus))))
        return runner

    def _split_tasks(self) -> None:
        """Train tasks and held-out eval tasks (:func:`agentgym.envs.tasks.plan_tasks`)."""
        from agentgym.envs.tasks import plan_tasks

        cfg = self.cfg
        plan = plan_tasks(cfg.env, cfg.env_kwargs, cfg.eval_tasks, cfg.eval_env_kwargs,
                          cfg.num_train_tasks)
        self.task_plan = plan
        self.train_env_kwargs = plan.train_kwargs
        self.eval_env_kwargs = plan.eval_kwargs
        self.eval_task_ids = plan.eval_ids
        self.train_task_hi = plan.train_hi
        log.info("tasks of %s: %s", cfg.env, plan.note)

    # ------------------------------------------------------------------ pieces of a step
    @property
    def policy_version(self) -> int:
        return self.version_offset + self.runner.policy_version

    @property
    def backend(self):
        """The in-process backend the runner generates with (None for a Ray pool, whose
        backends live on its workers, and before :meth:`setup`)."""
        runner = getattr(self, "runner", None)
        return getattr(runner, "backend", self._injected_backend)

    def _seed_rollout(self, step: int, group_base: int, draw: int = 0) -> None:
        """Deterministic group ids (hence episode seeds), request ids and backend sampling
        per step (and per top-up ``draw`` of dynamic sampling), so a resumed run replays
        the rollouts of an uninterrupted one."""
        self.runner.reseed(group_base, group_base * 1024, run_id=f"s{self.cfg.seed}",
                           sampling_seed=self.cfg.seed * 1_000_003 + step
                           + draw * 7_919_000_003)

    async def rollout(self, step: int):
        """Collect the training batch of ``step`` at the schedule's horizon.

        With ``filter_groups`` (DAPO's dynamic sampling) the groups whose samples all
        scored alike (zero GRPO advantage) are dropped and fresh groups are drawn, at most
        ``max_draws`` draws of ``tasks_per_step`` tasks in all, until ``tasks_per_step``
        informative groups are kept; the batch then holds the kept groups (none when no
        group was informative: the step makes no update) and its metrics describe every
        episode played. The failure guard sees every episode played too."""
        from agentgym.engine.metrics import batch_metrics
        from agentgym.engine.orchestrator import RolloutBatch

        cfg = self.cfg
        horizon = self.schedule.max_turns(step)
        fg = cfg.max_draws
        draws = fg or 1
        played: list = []
        kept: list = []
        n_groups = n_dropped = 0
        t0 = time.perf_counter()
        for draw in range(draws):
            tasks = self.task_rng.integers(0, self.train_task_hi, cfg.tasks_per_step).tolist()
            # draw 0 keeps the ids of a run without dynamic sampling
            self._seed_rollout(step, draw * 10**7 + step * cfg.tasks_per_step, draw)
            batch = await self.runner.collect(tasks, cfg.env, env_kwargs=self.train_env_kwargs,
                                              max_turns=horizon, n_samples=cfg.n_samples)
            played.extend(batch.trajectories)
            if not fg:
                break
            informative = informative_groups(batch.trajectories, cfg.format_penalty)
            n_groups += len(tasks)
            n_dropped += len(tasks) - len(informative)
            kept.extend(t for g in informative for t in g)
            if len(kept) >= cfg.tasks_per_step * cfg.n_samples:
                break
        self.failures.check_step(played, step + 1)
        if fg:
            train = kept[:cfg.tasks_per_step * cfg.n_samples]
            batch = RolloutBatch(train, batch_metrics(played, time.perf_counter() - t0))
            batch.metrics.update({
                "filter_groups/dropped_share": n_dropped / max(n_groups, 1),
                "filter_groups/draws": float(draw + 1),
                "filter_groups/kept_groups": float(len(kept) // cfg.n_samples),
                "batch/trained": float(len(train)),
            })
        return self._training_rows(batch, played, horizon, time.perf_counter() - t0)

    def _training_rows(self, batch, played: list, horizon: int, wall: float):
        """The batch the learner trains on: a game's policy rows (the games rated and
        counted), the horizon in the metrics."""
        from agentgym.engine.metrics import batch_metrics
        from agentgym.engine.orchestrator import RolloutBatch

        if self.selfplay is not None:  # the policy's rows train; the games rate and count
            self.selfplay.rate(played)
            rows = SelfPlay.train_rows(played)
            metrics = {**batch.metrics, **batch_metrics(rows, wall),
                       **outcomes(played, "selfplay/")}
            batch = RolloutBatch(SelfPlay.train_rows(batch.trajectories), metrics)
        batch.metrics["horizon/max_turns"] = float(horizon)
        return batch

    async def async_batch(self, step: int):
        """The training batch of ``step`` in a fully asynchronous run: the next finished
        groups of the open stream (:class:`~agentgym.learner.async_rollout.AsyncRollouts`)."""
        from agentgym.engine.orchestrator import RolloutBatch

        trajs, metrics = await self.producer.next_batch()
        self.failures.check_step(trajs, step + 1)
        return self._training_rows(RolloutBatch(trajs, metrics), trajs,
                                   self.schedule.max_turns(step), 0.0)

    def update(self, batch, step: int) -> dict[str, float]:
        """Reward shaping of the stage, then one :func:`policy_update` (blocking); a batch
        without trajectories (dynamic sampling kept no group) changes nothing."""
        if not len(batch):
            return {"learner/num_trajectories": 0.0, "learner/num_tokens": 0.0}
        pb = batch.packed()
        stage = self.schedule.stage(step)
        if stage.shapes_rewards:
            pb = pb.with_rewards(stage.shape_rewards(pb.rewards, pb.num_turns))
        if self.cfg.format_penalty:
            cut = pb.stop_reason == STOP_CODES["length"]
            pb = pb.with_rewards(pb.rewards - np.float32(self.cfg.format_penalty) * cut)
        version = self.runner.policy_version
        baseline = self.selfplay.baselines(pb.seat) if self.selfplay is not None else None
        out = self._collective("update", pb, version, baseline)
        if self.selfplay is not None:
            self.selfplay.update_baseline(pb.seat, pb.rewards, ~pb.failed)
            out.update(self.selfplay.metrics())
        return out

    def _policy_update(self, pb, version: int, baseline=None) -> dict[str, float]:
        from agentgym.learner import policy_update

        return policy_update(
            self.model, self.optimizer, pb, self.learner_config, self.ref_model, self.critic,
            critic_optimizer=self.critic_optimizer, current_version=version,
            data_parallel=self.dp, role_baseline=baseline)

    #: the work every rank does together: rank 0 names it (:meth:`_collective`), the others
    #: run it as they receive it (:meth:`_follow`)
    _COLLECTIVE = {"update": "_policy_update", "weights": "_gather_weights",
                   "critic_weights": "_gather_critic", "shards": "_save_shards"}

    def _collective(self, op: str, *args: Any) -> Any:
        """Run ``op`` (a key of :attr:`_COLLECTIVE`) here and, under torchrun, on every rank:
        rank 0 broadcasts it first. Under ``ddp`` only the update needs the other ranks
        (each holds the whole model); under a sharded strategy the weights and checkpoint
        shards are gathered or written by every rank."""
        if self.dp is not None and (op == "update" or self.learner.sharded):
            self.dp.broadcast_object((op, args))
        return getattr(self, self._COLLECTIVE[op])(*args)

    def _follow(self) -> dict[str, Any]:
        """A data-parallel rank other than 0: run each piece of collective work rank 0
        broadcasts, until it broadcasts the end (None)."""
        steps = 0
        while (msg := self.dp.broadcast_object(None)) is not None:
            op, args = msg
            getattr(self, self._COLLECTIVE[op])(*args)
            steps += op == "update"
        return {"rank": self.dp.rank, "steps": steps, "output_dir": str(self.output_dir)}

    def _gather_weights(self, merge: bool = True) -> dict | None:
        return self.learner.full_weights(merge)

    def _gather_critic(self) -> dict | None:
        return self.learner.critic_weights()

    def _save_shards(self, path: str) -> None:
        self.learner.save_shards(path)

    def _weights(self) -> dict:
        """A CPU copy of the policy's weights as the base model's state dict (LoRA merged;
        gathered from every rank's shards under a sharded strategy)."""
        return self._collective("weights")

    async def sync_weights(self) -> None:
        """Send the learner's weights to the runner's backends (bumps its policy_version);
        under self-play with an opponent pool, a due snapshot joins the pool."""
        t0 = time.perf_counter()
        sd = await asyncio.to_thread(self._weights)
        gate = getattr(getattr(self.runner, "backend", None), "gate", None)
        drained = gate.drain_s if gate is not None else 0.0
        await self.runner.update_weights(sd)
        self.last_sync_s = time.perf_counter() - t0
        # the update's wait for the replies running under the old weights (WeightGate)
        self.last_drain_s = gate.drain_s - drained if gate is not None else 0.0
        sp = self.selfplay
        if sp is not None and sp.snapshot_due(self.step + 1):
            name = f"pool:v{self.policy_version}"
            evicted = sp.add_snapshot(name, sd)
            await self._add_opponent(name, sd)
            if evicted is not None:
                old = self.runner.opponents.pop(evicted, None)
                if old is not None:
                    await old.close()

    async def _add_opponent(self, name: str, weights: dict) -> None:
        """A backend of the run's kind serving ``weights``, as opponent ``name`` of the
        engine's game episodes (it keeps ``name``'s version)."""
        from agentgym.backends import make_backend

        cfg = self.cfg
        kw = dict(cfg.backend_kwargs)
        if cfg.backend == "transformers":
            kw.setdefault("device", str(self.device))
            kw.setdefault("seed", cfg.seed)
        backend = await asyncio.to_thread(make_backend, cfg.backend, self.model_dir, **kw)
        await backend.update_weights(weights)
        backend.policy_version = int(name.rsplit("v", 1)[1])
        self.runner.opponents[name] = backend

    async def evaluate(self, step: int | None = None, tasks: list[int] | None = None
                       ) -> dict[str, Any]:
        """Greedy (``eval_temperature``) episodes on held-out tasks at the eval horizon;
        logs and returns an ``{"type": "eval", "success_rate": ...}`` row."""
        await self.setup()
        cfg = self.cfg
        step = self.step if step is None else step
        horizon = cfg.eval_max_turns or self.schedule.stages[-1].max_turns
        self._seed_rollout(10**6 + step, 10**9)
        t0 = time.perf_counter()
        if self.selfplay is not None:
            return self._log_eval(await self._evaluate_game(step, horizon, t0))
        batch = await self.runner.collect(tasks if tasks is not None else self.eval_task_ids,
                                          cfg.env, env_kwargs=self.eval_env_kwargs,
                                          max_turns=horizon, n_samples=1,
                                          temperature=cfg.eval_temperature)
        self.failures.check_eval(batch.trajectories, step)
        m = batch.metrics
        row = {"type": "eval", "step": step, "success_rate": m.get("success_rate", 0.0),
               "success_rate/first_attempt": m.get("success_rate/first_attempt", 0.0),
               "reward/mean": m.get("reward/mean", 0.0),
               "num_turns/mean": m.get("num_turns/mean", 0.0),
               "horizon/max_turns": float(horizon), "num_tasks": len(batch),
               "policy_version": self.policy_version,
               "timing_s/eval": time.perf_counter() - t0}
        return self._log_eval(row)

    def _log_eval(self, row: dict[str, Any]) -> dict[str, Any]:
        self.eval_history.append(row)
        self.logger.log(row)
        return row

    async def _evaluate_game(self, step: int, horizon: int, t0: float) -> dict[str, Any]:
        """Greedy games against each of ``eval_opponents`` on the held-out openings or
        deals, the policy in every seat of each (one episode per task and seat): win, draw
        and loss rates overall and per seat (``vs_<opponent>/...``). ``success_rate`` is the
        win + draw rate against the first of them."""
        from agentgym.engine.orchestrator import EpisodeRequest

        cfg = self.cfg
        seats = len(self.selfplay.roles)
        base = 10**9 - 10**9 % seats  # group % seats: the policy's seat
        reqs = [EpisodeRequest(task, base + i * seats + s)
                for i, task in enumerate(self.eval_task_ids) for s in range(seats)]
        row: dict[str, Any] = {"type": "eval", "step": step}
        for opp in cfg.eval_opponents:
            trajs = [t async for t in self.runner.stream_requests(
                reqs, cfg.env, env_kwargs=self.eval_env_kwargs, max_turns=horizon,
                temperature=cfg.eval_temperature, opponent=opp)]
            self.failures.check_eval(trajs, step)
            row.update(outcomes(trajs, f"vs_{opp}/"))
        first = cfg.eval_opponents[0]
        row["success_rate"] = row.get(f"vs_{first}/win_rate", 0.0) + \
            row.get(f"vs_{first}/draw_rate", 0.0)
        row.update({"horizon/max_turns": float(horizon), "num_tasks": len(reqs),
                    "policy_version": self.policy_version,
                    "timing_s/eval": time.perf_counter() - t0})
        return row

    def save(self) -> Path:
        from agentgym.learner.checkpoint import save_checkpoint

        lm = self.learner
        state = {"step": self.step, "policy_version": self.policy_version,
                 "schedule": self.schedule.state_dict(),
                 "task_rng": self.task_rng.bit_generator.state,
                 "config": self.cfg.to_dict(), "eval_history": self.eval_history,
                 "ref_model_dir": self.ref_model_dir, "base_model_dir": self.base_model_dir,
                 "parallel": lm.parallel.to_dict()}
        if self.selfplay is not None:
            state["selfplay"] = self.selfplay.state_dict()
        if self.producer is not None:
            state["async"] = self.producer.state_dict()

        raw = self._collective("weights", False)  # LoRA: the adapter kept apart

        def extras(folder: Path) -> None:  # written into the checkpoint before it is renamed
            if lm.sharded:
                self._collective("shards", str(folder / "dcp"))
            if lm.lora is not None:
                lm.save_adapter(folder / "adapter", raw)
            (folder / "config.yaml").write_text(self.cfg.to_yaml(), encoding="utf-8")

        self._saved_step = self.step

        return save_checkpoint(
            self.output_dir / "checkpoints", self.step, model=self.model,
            tokenizer=self.tokenizer, optimizer=None if lm.sharded else self.optimizer,
            state=state, critic=self.critic, critic_optimizer=self.critic_optimizer,
            keep=self.cfg.keep_checkpoints, model_dir=self.model_dir, weights=lm.merge(raw),
            critic_weights=self._collective("critic_weights") if lm.critic is not None else None,
            extras=extras)

    # ------------------------------------------------------------------ the loop
    async def train_async(self, max_steps: int | None = None) -> dict[str, Any]:
        """Train until ``max_steps`` (default ``cfg.max_steps``) completed steps; returns a
        summary (first/last eval success, paths, wall time, ``interrupted``)."""
        from agentgym.learner.warmup import WarmupInterrupted

        self._loop = asyncio.get_running_loop()
        t_setup = time.perf_counter()
        try:
            await self.setup()
        except WarmupInterrupted:  # Ctrl-C in the warm-up: no policy to save yet
            return {"output_dir": str(self.output_dir), "interrupted": True, "steps": 0,
                    "checkpoint": None, "metrics": None, "plot": None,
                    "wall_s": time.perf_counter() - t_setup, "eval_success_start": None,
                    "eval_success_end": None, "eval_success_best": None}
        if self.dp is not None and not self.dp.is_main:
            return await asyncio.to_thread(self._follow)
        cfg = self.cfg
        end = cfg.max_steps if max_steps is None else max_steps
        t_start = time.perf_counter()
        interrupted = False
        bar = None
        pending: asyncio.Future | None = None
        pending_rng = None  # the task sampler's state before the pending rollout drew
        producer = None
        try:
            if cfg.eval_at_start and cfg.eval_every and self.step == 0 \
                    and not self.eval_history and cfg.eval_tasks and not self._stop.is_set():
                try:
                    await self._interruptible(self.evaluate(0))
                except _Abandoned:
                    interrupted = True
            if cfg.fully_async and not interrupted and self.step < end:
                producer = self.producer = AsyncRollouts(
                    self, self.learner_config.max_staleness, self._async_state)
                # fresh request ids and the run's sampling seed, once: the stream never stops
                self.runner.reseed(0, 0, run_id=f"s{cfg.seed}a{self.step}",
                                   sampling_seed=cfg.seed * 1_000_003 + self.step)
                producer.start()
            if self._show_progress:
                bar = progress_bar(end, f"{cfg.method} on {cfg.env}", "step", show=True,
                                   initial=self.step)
            while not interrupted and self.step < end:
                if self._stop.is_set():
                    interrupted = True
                    break
                step = self.step
                self.schedule.update(step)
                t0 = time.perf_counter()
                if producer is not None:
                    mark = (None, None)  # the producer keeps its own place
                    pending = asyncio.ensure_future(self.async_batch(step))
                elif pending is None:
                    mark = self._mark()
                    pending = asyncio.ensure_future(self.rollout(step))
                else:
                    mark = (pending_rng, None)
                try:
                    batch = await self._interruptible(pending)
                except _Abandoned:  # the step is played again on resume, as it would be
                    pending = None
                    self._unmark(mark)
                    interrupted = True
                    break
                pending = None
                t_gen = time.perf_counter() - t0
                if cfg.async_rollouts and step + 1 < end and not self._stop.is_set():
                    pending_rng = self.task_rng.bit_generator.state
                    pending = asyncio.ensure_future(self.rollout(step + 1))
                t1 = time.perf_counter()
                upd = await asyncio.to_thread(self.update, batch, step)
                t2 = time.perf_counter()
                await self.sync_weights()
                if producer is not None:
                    producer.synced_weights()
                t3 = time.perf_counter()
                self.step = step + 1
                self.schedule.update(self.step, batch.metrics.get("success_rate"))
                row = {"type": "train", "step": self.step, **batch.metrics, **upd,
                       "horizon/max_turns": batch.metrics["horizon/max_turns"],
                       "horizon/stage": float(self.schedule.stage_index(step)),
                       "timing_s/gen": t_gen, "timing_s/update": t2 - t1,
                       "timing_s/sync": t3 - t2, "timing_s/step": t3 - t0,
                       # gathering (and merging) the weights and loading them into the backend
                       "timing_s/weight_sync": self.last_sync_s,
                       "timing_s/weight_drain": self.last_drain_s,
                       # tokens through the learner's forward and backward passes per second
                       "perf/update_tokens_per_s": upd.get("learner/num_tokens", 0.0)
                       / max(t2 - t1, 1e-9),
                       "policy_version": self.policy_version}
                self.history.append(row)
                self.logger.log(row)
                if cfg.eval_every and cfg.eval_tasks and not self._stop.is_set() and (
                        self.step % cfg.eval_every == 0 or self.step == end):
                    try:
                        if producer is not None:  # one version of the weights throughout
                            await self._interruptible(producer.pause())
                        await self._interruptible(self.evaluate(self.step))
                        if producer is not None and self.step < end:
                            producer.resume()
                    except _Abandoned:
                        interrupted = True
                if cfg.save_every and (self.step % cfg.save_every == 0 or self.step == end):
                    self.save()
                if bar is not None:
                    post = {"H": int(row["horizon/max_turns"]),
                            "succ": f"{row.get('success_rate', 0):.2f}",
                            "R": f"{row.get('reward/mean', 0):.2f}"}
                    if self.eval_history:
                        post["eval"] = f"{self.eval_history[-1]['success_rate']:.2f}"
                    bar.set_postfix(post)
                    bar.update(1)
            if pending is not None and producer is None:  # a step that will not be trained
                pending.cancel()
                await asyncio.gather(pending, return_exceptions=True)
                pending = None
                self.task_rng.bit_generator.state = pending_rng
            interrupted = interrupted or self._stop.is_set()
            if interrupted and self._saved_step != self.step:
                self.save()  # the last finished step, so --resume continues from it
        finally:
            if pending is not None:
                pending.cancel()
                await asyncio.gather(pending, return_exceptions=True)
            if producer is not None:
                await producer.close()
            if bar is not None:
                bar.close()
            if self.dp is not None:
                self.dp.broadcast_object(None)  # the other ranks stop
        return self._finish(time.perf_counter() - t_start, interrupted)

    async def _interruptible(self, aw) -> Any:
        """Await ``aw`` as the task Ctrl-C cancels (:meth:`_on_sigint`); raises
        :class:`_Abandoned` when it did."""
        task = asyncio.ensure_future(aw)
        self._cancellable = task
        try:
            if self._stop.is_set():
                task.cancel()
            return await task
        except asyncio.CancelledError:
            if self._stop.is_set() and task.cancelled():
                raise _Abandoned from None
            raise
        finally:
            self._cancellable = None

    def _mark(self) -> tuple:
        """The task sampler's and the global RNGs' states before a rollout, to put back when
        Ctrl-C abandons it."""
        from agentgym.learner.checkpoint import capture_rng

        return self.task_rng.bit_generator.state, capture_rng()

    def _unmark(self, mark: tuple) -> None:
        from agentgym.learner.checkpoint import restore_rng

        rng_state, global_rngs = mark
        if rng_state is not None:
            self.task_rng.bit_generator.state = rng_state
        if global_rngs is not None:
            restore_rng(global_rngs)

    def _finish(self, wall: float, interrupted: bool = False) -> dict[str, Any]:
        out = self.output_dir
        plot = None
        if self.cfg.plot and self.logger.jsonl_path.exists():
            plot = plot_learning_curve(self.logger.jsonl_path, out / "learning_curve.png",
                                       title=f"{self.cfg.method} on {self.cfg.env}")
        evals = self.eval_history
        ckpts = out / "checkpoints"
        return {
            "output_dir": str(out), "metrics": str(self.logger.jsonl_path),
            "config": str(out / "config.yaml"),
            "plot": str(plot) if plot else None,
            "checkpoint": str(ckpts / (ckpts / "latest").read_text().strip())
            if (ckpts / "latest").exists() else None,
            "steps": self.step, "wall_s": wall, "interrupted": interrupted,
            "eval_success_start": evals[0]["success_rate"] if evals else None,
            "eval_success_end": evals[-1]["success_rate"] if evals else None,
            "eval_success_best": max(e["success_rate"] for e in evals) if evals else None,
        }

    def train(self, max_steps: int | None = None) -> dict[str, Any]:
        """Synchronous :meth:`train_async` (own event loop); closes the backend after. In
        the main thread, Ctrl-C stops the run cleanly (the module docstring): the summary
        then has ``"interrupted": True`` and the checkpoint of the last finished step."""
        from agentgym.engine.loop import run

        async def go():
            try:
                return await self.train_async(max_steps)
            finally:
                await self.aclose()

        with self._sigint_handler():
            return run(go())

    @contextlib.contextmanager
    def _sigint_handler(self):
        """:meth:`_on_sigint` as the SIGINT handler while training (main thread only)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = signal.getsignal(signal.SIGINT)
        signal.signal(signal.SIGINT, self._on_sigint)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous if previous is not None
                          else signal.default_int_handler)

    def _on_sigint(self, signum, frame) -> None:
        """The first Ctrl-C asks the run to stop at the next safe point (the rollout or
        evaluation in flight is cancelled; the warm-up stops at its next step); the second
        stops at once."""
        if self._stop.is_set():
            raise KeyboardInterrupt
        self._stop.set()
        os.write(2, b"\ninterrupted: stopping the run and saving a checkpoint of the last "
                    b"finished step (Ctrl-C again to quit at once)\n")
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._cancel_current)

    def _cancel_current(self) -> None:
        task = self._cancellable
        if task is not None and not task.done():
            task.cancel()

    async def aclose(self) -> None:
        """Close the runner (and the backends it opened; an injected one stays open) and
        the logger."""
        runner = getattr(self, "runner", None)
        if runner is not None:
            self.runner = None
            await runner.aclose()
        if getattr(self, "_dist_owned", False):
            torch.distributed.destroy_process_group()
            self._dist_owned = False
        if getattr(self, "logger", None) is not None:
            self.logger.close()
        if getattr(self, "_threads_before", None):
            torch.set_num_threads(self._threads_before)
        self._ready = False

