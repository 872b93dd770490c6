"""agentgym inside TRL (``trl`` 1.16): a ``rollout_func`` for ``trl.GRPOTrainer`` that plays
multi-turn agentgym episodes with the rollout engine.

::

    from trl import GRPOConfig, GRPOTrainer
    from agentgym.integrations.trl import AgentGymRollout, env_reward

    rollout = AgentGymRollout(max_turns=4, max_new_tokens=32)
    trainer = GRPOTrainer(model=model_dir, args=GRPOConfig(...), reward_funcs=env_reward,
                          train_dataset=rollout.dataset("maze", range(64)),
                          rollout_func=rollout)
    trainer.train()

Each dataset row names its env and task (in the prompt message's ``env_id`` and ``task``
keys; the text is only a label, the real prompt is the env's first observation rendered by
the engine). TRL hands ``rollout_func`` every prompt ``num_generations`` times in a row;
each such group becomes ``num_generations`` samples of one task (same seed, one GRPO group).
The returned ``completion_ids`` are everything after the first prompt (model turns and the
env's observations), ``env_mask`` is 1 exactly on the model's tokens (TRL trains only on
those), and ``env_reward`` is the episode's reward, passed to the reward functions
(:func:`env_reward` returns it).

Generation: ``backend`` when given (any agentgym ``Backend``); else a
``TransformersBackend`` on the trainer's model folder that receives the trainer's current
weights before the first rollout of each optimizer step.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from agentgym.backends.base import Backend
from agentgym.data.trajectories import Trajectory
from agentgym.engine.orchestrator import RolloutEngine
from agentgym.integrations._episodes import TaskRefError, task_label, task_ref

__all__ = ["AgentGymRollout", "TaskRefError", "env_reward", "prompt_messages"]


def prompt_messages(env_id: str, task: int | str) -> list[dict]:
    """The conversational prompt of one dataset row: one user message labelled with the
    task, carrying ``env_id`` and ``task``."""
    if isinstance(task, bool) or not isinstance(task, (int, str)):
        raise TaskRefError(f"task must be an int index or a task text, got {task!r}")
    return [{"role": "user", "content": task_label(env_id, task), "env_id": env_id,
             "task": task}]


def env_reward(prompts=None, completions=None, env_reward=None, **kwargs) -> list[float]:
    """A TRL reward function: the episode reward the rollout function returned."""
    if env_reward is None:
        raise ValueError("env_reward is missing: use it with AgentGymRollout as rollout_func")
    return [float(r) for r in env_reward]


class AgentGymRollout:
    """``rollout_func(prompts, trainer) -> dict`` for ``trl.GRPOTrainer`` (module docs).

    ``overrides`` are :class:`~agentgym.engine.config.RolloutConfig` fields (``max_turns``,
    ``max_new_tokens``, ``max_total_tokens``, ...); the sampling temperature, top-p and
    top-k default to the trainer's. ``env_kwargs`` go to the env constructor.
    """

    def __init__(self, *, backend: Backend | None = None,
                 env_kwargs: Mapping[str, Any] | None = None, **overrides):
        self.backend = backend
        self.env_kwargs = dict(env_kwargs or {})
        self.overrides = {"progress": False, **overrides}
        self._own_backend = backend is None
        self._engine: RolloutEngine | None = None
        self._synced_step: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        #: The trajectories of the last call, in prompt order.
        self.last_trajectories: list[Trajectory] = []

    @staticmethod
    def dataset(env_id: str, tasks: Iterable[int | str]):
        """A ``datasets.Dataset`` with one row per task (a ``prompt`` column)."""
        from datasets import Dataset

        return Dataset.from_list([{"prompt": prompt_messages(env_id, t)} for t in tasks])

    def __call__(self, prompts: Sequence, trainer) -> dict[str, list]:
        n = trainer.num_generations if trainer.model.training else trainer.num_generations_eval
        refs = [_prompt_ref(p) for p in prompts]
        if n < 1 or len(refs) % n:
            raise ValueError(f"rollout_func got {len(refs)} prompts, not a multiple of "
                             f"num_generations={n}")
        groups = [refs[i] for i in range(0, len(refs), n)]
        for g, ref in enumerate(groups):
            if any(r != ref for r in refs[g * n:(g + 1) * n]):
                raise ValueError(f"prompts {g * n}..{(g + 1) * n - 1} are not one task "
                                 f"repeated num_generations={n} times")
        if self._loop is None:
            from agentgym.engine.loop import new_event_loop

            self._loop = new_event_loop()
        trajs = self._loop.run_until_complete(self._play(groups, n, trainer))
        self.last_trajectories = trajs
        return self.outputs(trajs, trainer.processing_class)

    async def _play(self, groups: list[tuple[str, int | str]], n: int, trainer):
        engine = self._ensure_engine(trainer)
        if self._own_backend and self._synced_step != trainer.state.global_step:
            model = trainer.accelerator.unwrap_model(trainer.model)
            await engine.backend.update_weights(
                {k: v.detach() for k, v in model.state_dict().items()})
            self._synced_step = trainer.state.global_step
        args = trainer.args
        sampling = {"temperature": float(trainer.temperature),
                    "top_p": float(getattr(args, "top_p", 1.0) or 1.0),
                    "top_k": int(getattr(args, "top_k", 0) or -1)}
        overrides = {**sampling, **self.overrides}
        by_env: dict[str, list[int]] = {}
        for g, (env_id, _) in enumerate(groups):
            by_env.setdefault(env_id, []).append(g)
        batches = await asyncio.gather(*(
            engine.collect([groups[g][1] for g in idx], env_id, env_kwargs=self.env_kwargs,
                           n_samples=n, **overrides)
            for env_id, idx in by_env.items()))
        out: list[Trajectory | None] = [None] * (len(groups) * n)
        for idx, batch in zip(by_env.values(), batches):
            for j, g in enumerate(idx):
                out[g * n:(g + 1) * n] = batch.trajectories[j * n:(j + 1) * n]
        return out

    def _ensure_engine(self, trainer) -> RolloutEngine:
        if self._engine is None:
            backend = self.backend
            if backend is None:
                from agentgym.backends.transformers_backend import TransformersBackend

                model = trainer.accelerator.unwrap_model(trainer.model)
                backend = TransformersBackend(model.name_or_path,
                                              device=str(trainer.accelerator.device),
                                              logprobs_mode="processed",
                                              seed=int(trainer.args.seed))
                self.backend = backend
            self._engine = RolloutEngine(backend, trainer.processing_class)
        return self._engine

    @staticmethod
    def outputs(trajs: Sequence[Trajectory], tokenizer) -> dict[str, list]:
        """TRL's rollout dict of trajectories: ``prompt_ids``, ``completion_ids``,
        ``logprobs``, ``env_mask`` and the extra keys ``env_reward``, ``stop_reason``,
        ``num_turns``. A trajectory with no token after its prompt (an episode that failed
        at once) gets one end-of-text token with mask 0, since TRL reads every
        completion's last token."""
        out: dict[str, list] = {k: [] for k in ("prompt_ids", "completion_ids", "logprobs",
                                                "env_mask", "env_reward", "stop_reason",
                                                "num_turns")}
        for t in trajs:
            p = t.prompt_len
            ids, mask, lps = t.token_ids[p:], t.loss_mask[p:], t.logprobs[p:]
            if not ids:
                ids, mask, lps = [tokenizer.eos_token_id], [0], [0.0]
            out["prompt_ids"].append(list(t.token_ids[:p]))
            out["completion_ids"].append(list(ids))
            out["logprobs"].append(list(lps))
            out["env_mask"].append(list(mask))
            out["env_reward"].append(float(t.reward))
            out["stop_reason"].append(t.stop_reason)
            out["num_turns"].append(int(t.num_turns))
        return out

    def close(self) -> None:
        """Close the engine's env drivers (and the backend this object made)."""
        if self._engine is not None:
            self._engine.close()
        if self._loop is not None:
            if self._own_backend and self.backend is not None:
                self._loop.run_until_complete(self.backend.close())
            self._loop.close()
            self._loop = None
        self._engine = None


def _prompt_ref(prompt) -> tuple[str, int | str]:
    if isinstance(prompt, list) and prompt and isinstance(prompt[-1], Mapping):
        return task_ref(prompt[-1])
    raise TaskRefError(f"prompt {prompt!r} names no agentgym task: build the dataset with "
                       "AgentGymRollout.dataset(env_id, tasks)")
