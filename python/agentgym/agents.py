"""The announcement's agent API: ``LLMAgent(base_model=..., backend=...)``, ``.train``, ``.infer``.

```python
from agentgym.envs import TextCraftEnv
from agentgym.agents import LLMAgent

env = TextCraftEnv()
agent = LLMAgent(base_model="path/or/hub-id", backend="vllm")  # or "transformers", "openai"
agent.train(env, method="ScalingInter-RL", max_steps=10000)
result = agent.infer(env)  # trajectories + success rate of the trained policy
```

``env`` is an env id (``"maze"``), a native env instance (``TextCraftEnv()``, anything with
``env_id``), a Gymnasium env made by ``agentgym.make`` or a user ``BaseEnv`` instance (it is
registered under a fresh id; each rollout slot plays a deep copy). ``base_model="tiny"``
builds the local tiny model (and, for training, gives it the random-policy format warm-up);
``base_model="smollm2-135m"`` is SmolLM2-135M-Instruct, built once into the cache from the
``smollm2`` extra (:mod:`agentgym.models.smollm2`).
Keyword arguments of ``LLMAgent`` and ``train`` override
:class:`~agentgym.learner.train_config.TrainerConfig` fields (a section as a mapping:
``rollout={"max_turns": 4}``, merged into it; the old flat spellings such as
``max_new_tokens=24`` set their section's field); a YAML/TOML file works too, by path or by
the name of a shipped config: ``LLMAgent.from_config("main_job")``.

Ctrl-C during ``train`` saves a checkpoint of the last finished step (``agent.model_dir``
then points at it) and raises ``KeyboardInterrupt``.
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentgym.models.vision import copy_processor_files

__all__ = ["InferenceResult", "LLMAgent", "mechanism_settings", "resolve_env"]

_user_envs = itertools.count()


def resolve_env(env: Any) -> tuple[str, dict[str, Any]]:
    """``(env_id, env_kwargs)`` for an id, an env instance or a ``BaseEnv``.

    An instance of a registered env class (``ECommerceServiceEnv(split="train")``) maps to
    its registered id and constructor arguments; any other ``BaseEnv`` is registered under
    a fresh id whose every env is a deep copy of it."""
    from agentgym.envs import BaseEnv
    from agentgym.envs.registry import registered_id

    if isinstance(env, str):
        return env, {}
    if isinstance(env, BaseEnv):
        import agentgym

        env_id = registered_id(type(env))
        if env_id is not None:
            return env_id, dict(env.init_kwargs)

        env_id = f"user:{type(env).__name__}:{next(_user_envs)}"
        proto = copy.deepcopy(env)
        agentgym.register(env_id, lambda: copy.deepcopy(proto), override=True)
        return env_id, {}
    for obj in (env, getattr(env, "unwrapped", None)):
        env_id = getattr(obj, "env_id", None)
        if isinstance(env_id, str):
            kwargs = getattr(obj, "env_kwargs", None) or getattr(obj, "_env_kwargs", None) or {}
            return env_id, dict(kwargs)
    spec = getattr(env, "spec", None)
    if spec is not None and getattr(spec, "id", None):
        return spec.id, dict(getattr(spec, "kwargs", {}) or {})
    raise TypeError(f"cannot tell which environment {env!r} is: pass an env id string, a "
                    "native env (with .env_id) or an agentgym.envs.BaseEnv instance")


def mechanism_settings(mechanisms: Any) -> dict[str, Any]:
    """:class:`~agentgym.engine.RolloutConfig` fields of ``mechanisms``: names
    (``["undo", "reflection"]``) or names with a count (``{"undo": 2, "reflection": 1}``);
    :func:`agentgym.engine.mechanisms.settings`. A ``ValueError`` names an unknown
    mechanism."""
    from agentgym.engine.mechanisms import settings

    return settings(mechanisms)


@dataclass
class InferenceResult:
    """Episodes played by :meth:`LLMAgent.infer`."""

    trajectories: list
    success_rate: float
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def rewards(self) -> list[float]:
        return [t.reward for t in self.trajectories]

    def __repr__(self) -> str:
        return (f"InferenceResult(episodes={len(self.trajectories)}, "
                f"success_rate={self.success_rate:.3f}, "
                f"reward/mean={self.metrics.get('reward/mean', 0.0):.3f})")


class LLMAgent:
    """An LLM policy that trains with multi-turn RL and plays episodes.

    ``base_model``: a Hugging Face model folder or hub id, ``"tiny"``, or a named model
    (``"smollm2-135m"``, :data:`agentgym.models.NAMED_MODELS`); ``backend``:
    ``"transformers"`` | ``"vllm"`` | ``"openai"`` (rollouts and inference). Other keyword
    arguments are :class:`~agentgym.learner.train_config.TrainerConfig` fields
    (``output_dir``, ``seed``, ``learner``, ``rollout``, ...).
    """

    def __init__(self, base_model: str = "tiny", backend: str = "transformers", **config: Any):
        self.base_model = base_model
        self.backend = backend
        self.config = dict(config)
        self.model_dir: str | None = None if base_model == "tiny" else base_model
        self.trainer = None
        self.last_summary: dict[str, Any] | None = None

    @classmethod
    def from_config(cls, path: str | Path, **overrides: Any) -> LLMAgent:
        """An agent of a config file (a path, or the name of a shipped config), with
        ``overrides``; the file's key or value errors are one-line ConfigErrors."""
        from agentgym.learner.train_config import (
            TrainerConfig,
            find_config,
            load_config_file,
        )

        raw = load_config_file(find_config(path))
        TrainerConfig.from_dict(raw)  # its mistakes now, not at train()
        cfg = {**raw, **overrides}
        model = cfg.pop("model", "tiny")
        backend = cfg.pop("backend", "transformers")
        return cls(base_model=model, backend=backend, **cfg)

    def _config(self, env_id: str, env_kwargs: dict, overrides: dict):
        """The run's TrainerConfig: the agent's settings, then ``overrides`` over them (a
        section's mapping merged into it, an old flat spelling setting its field)."""
        from agentgym.learner.train_config import DEPRECATED_ALIASES, TrainerConfig

        own = {k: v for k, v in self.config.items() if k not in DEPRECATED_ALIASES}
        flat = {k: v for k, v in self.config.items() if k in DEPRECATED_ALIASES}
        base = TrainerConfig.from_dict({"model": self.model_dir or self.base_model,
                                        "backend": self.backend, "env": env_id, **own})
        merged = {**flat, **overrides}
        given = overrides["env_kwargs"] if "env_kwargs" in overrides \
            else self.config.get("env_kwargs", {})
        merged["env_kwargs"] = {**env_kwargs, **given}
        return base.replace(**merged)

    def train(self, env: Any, method: str | None = None, max_steps: int | None = None,
              mechanisms: Any = None, **overrides: Any) -> dict[str, Any]:
        """Train on ``env`` with ``method`` (ScalingInter-RL — the default —, GRPO, PPO,
        REINFORCE++, RLOO) for ``max_steps`` steps (default: the config's, 100); returns
        the run summary (paths, eval success start/end). ``mechanisms``: agent mechanisms
        for the rollouts (``["undo", "reflection"]`` or ``{"undo": 2, "reflection": 1}``,
        :func:`mechanism_settings`).
        Training continues from the current weights when called again."""
        from agentgym.learner.trainer import Trainer

        env_id, env_kwargs = resolve_env(env)
        if method is not None:
            overrides["method"] = method
        if max_steps is not None:
            overrides["max_steps"] = max_steps
        if mechanisms:
            overrides["rollout"] = {**dict(overrides.get("rollout") or {}),
                                    **mechanism_settings(mechanisms)}
        cfg = self._config(env_id, env_kwargs, overrides)
        self.trainer = Trainer(cfg)
        summary = self.trainer.train()
        if summary.get("interrupted"):
            if summary.get("checkpoint"):
                self.model_dir = str(Path(summary["checkpoint"]) / "model")
            self.last_summary = summary
            raise KeyboardInterrupt(f"training interrupted after {summary['steps']} steps; "
                                    f"checkpoint: {summary.get('checkpoint')}")
        if summary.get("checkpoint"):
            self.model_dir = str(Path(summary["checkpoint"]) / "model")
        else:  # no checkpoint written: keep the trained weights of the run's model folder
            out = Path(summary["output_dir"]) / "final_model"
            self.trainer.model.save_pretrained(out)
            self.trainer.tokenizer.save_pretrained(out)
            copy_processor_files(self.trainer.model_dir, out)
            self.model_dir = str(out)
        self.last_summary = summary
        return summary

    async def ainfer(self, env: Any, tasks: int | list | None = None, *, n_samples: int = 1,
                     max_turns: int | None = None, temperature: float = 0.0,
                     max_new_tokens: int | None = None, backend: Any = None,
                     mechanisms: Any = None, **rollout: Any) -> InferenceResult:
        """Async :meth:`infer`. ``backend``: an open :class:`~agentgym.backends.Backend` of
        this agent's model to play with, left open (one engine serves several envs); default:
        one made for this call and closed after it. ``mechanisms`` as in :meth:`train`;
        ``rollout``: other :class:`~agentgym.engine.RolloutConfig` fields (``reflection=2``
        is the same as ``mechanisms={"reflection": 2}``)."""
        rollout = {**mechanism_settings(mechanisms), **rollout}
        import asyncio

        from agentgym.engine.runner import open_runner

        env_id, env_kwargs = resolve_env(env)
        cfg = self._config(env_id, env_kwargs, {})
        from agentgym.models import resolve_model

        model_dir = await asyncio.to_thread(resolve_model, self.model_dir)
        if model_dir is None:  # untrained tiny model
            from agentgym.models import build_tiny_model

            out = Path(cfg.output_dir or "runs/tiny_untrained") / "base_model"
            model_dir = str(build_tiny_model(out, seed=cfg.seed))
        horizon = max_turns or cfg.eval_max_turns
        if horizon is None and self.trainer is not None:
            horizon = self.trainer.schedule.stages[-1].max_turns
        horizon = horizon or cfg.rollout.max_turns
        if tasks is None or isinstance(tasks, int):  # the held-out tasks training evaluates on
            from agentgym.envs.tasks import plan_tasks

            plan = plan_tasks(env_id, cfg.env_kwargs, 32 if tasks is None else tasks,
                              cfg.eval_env_kwargs)
            kwargs, tasks = plan.eval_kwargs, plan.eval_ids
        else:
            kwargs = {**cfg.env_kwargs, **(cfg.eval_env_kwargs or {})}
        # the config's rollout settings (a reply prefix, the truncated-turn rule) as trained;
        # a backend passed in stays open, one made here closes with the engine
        settings = {**cfg.rollout_settings(), "progress": False, "seed": cfg.seed, **rollout}
        if max_new_tokens:
            settings["max_new_tokens"] = max_new_tokens
        engine = (await asyncio.to_thread(
            open_runner, self.backend if backend is None else backend, model_dir,
            backend_kwargs=cfg.backend_kwargs, **settings)).runner
        try:
            batch = await engine.collect(tasks, env_id, env_kwargs=kwargs, max_turns=horizon,
                                         n_samples=n_samples, temperature=temperature)
        finally:
            await engine.aclose()
        return InferenceResult(batch.trajectories, float(batch.metrics.get("success_rate", 0.0)),
                               dict(batch.metrics))

    def infer(self, env: Any, tasks: int | list | None = None, **kwargs: Any) -> InferenceResult:
        """Play ``tasks`` of ``env`` with the current policy (greedy by default) and return
        the trajectories and success rate. A count (default 32) plays that many held-out
        tasks, the ones training evaluates on (the env's test split where it has one, see
        :func:`agentgym.envs.tasks.plan_tasks`); a list plays exactly those task ids/texts
        under the env's own settings."""
        from agentgym.engine.loop import run

        return run(self.ainfer(env, tasks, **kwargs))
