"""agentgym inside SkyRL: every agentgym env as a skyrl-gym ``BaseTextEnv``, and an agentgym
implementation of SkyRL's generator interface.

::

    import skyrl_gym
    from agentgym.integrations.skyrl import AgentGymGenerator, register_envs

    register_envs()                                   # "agentgym-maze", "agentgym-office", ...
    env = skyrl_gym.make("agentgym-maze", env_config=None, extras={"task": 3})
    chat, _ = env.init([])                            # instructions + first observation
    out = env.step("Action: move north")              # BaseTextEnvStepOutput

    generator = AgentGymGenerator(backend, tokenizer, max_turns=8)
    output = await generator.generate(input_batch)    # SkyRL's GeneratorOutput

SkyRL's ``GeneratorInterface`` / ``GeneratorOutput`` live in the ``skyrl`` package
(``skyrl.train.generators.base``); ``AgentGymGenerator`` subclasses the interface when that
package imports, and returns a plain dict of the ``GeneratorOutput`` keys either way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput
from skyrl_gym.envs.registration import register, registry

import agentgym
from agentgym.backends.base import Backend
from agentgym.data.exports import to_skyrl
from agentgym.engine.metrics import batch_metrics
from agentgym.engine.runner import open_runner
from agentgym.integrations._episodes import EpisodeCoalescer, TaskRefError, engine_top_k
from agentgym.parse import parse_action

try:  # SkyRL's trainer package (Python >= 3.12, its own transformers pin)
    from skyrl.train.generators.base import GeneratorInterface as _GeneratorBase
except Exception:  # not installed or not importable here: same method, plain base
    _GeneratorBase = object

__all__ = ["ENV_PREFIX", "AgentGymGenerator", "AgentGymTextEnv", "register_envs"]

#: skyrl-gym ids of agentgym envs: ``ENV_PREFIX + <agentgym env id>``.
ENV_PREFIX = "agentgym-"


class AgentGymTextEnv(BaseTextEnv):
    """One agentgym env as a skyrl-gym text env.

    ``extras`` (the dataset row's env extras) name the ``task`` (index or task text) and
    optionally the ``seed`` and ``max_turns``; ``env_config`` may hold ``max_turns`` and
    ``env_kwargs``. ``init(prompt)`` resets the env and returns the conversation the model
    starts from: the prompt's own system message (else the env's instructions) and the
    first observation as a user message. ``step(text)`` parses the action from the model's
    text the way the rollout engine does (a text without one goes to the env as is) and
    reports it as ``metadata["action"]``; ``postprocessed_action`` stays None, since SkyRL's
    generator would re-encode that text in place of the model's own tokens.
    """

    def __init__(self, env_config: Any = None, extras: Mapping[str, Any] | None = None,
                 env_id: str | None = None):
        super().__init__()
        if not env_id:
            raise TaskRefError("AgentGymTextEnv needs env_id (register_envs sets it)")
        cfg = dict(env_config or {})
        extras = dict(extras or {})
        self.env_id = env_id
        self.task = extras.get("task")
        self.seed = extras.get("seed")
        self.max_turns = int(extras.get("max_turns") or cfg.get("max_turns") or 10)
        self.env = agentgym.make(env_id, max_turns=self.max_turns, **cfg.get("env_kwargs", {}))
        self.total_reward = 0.0
        self.info: dict[str, Any] = {}

    def init(self, prompt):
        options = {} if self.task is None else {"task": self.task}
        obs, info = self.env.reset(seed=self.seed, options=options)
        self.info = dict(info)
        system = [m for m in (prompt or []) if m.get("role") == "system"]
        if not system:
            system = [{"role": "system", "content": self.env.unwrapped.instructions}]
        return [*system, {"role": "user", "content": obs}], {"task": info.get("task")}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        self.turns += 1
        parsed = parse_action(action)
        cmd = action if parsed is None else parsed
        obs, reward, terminated, truncated, info = self.env.step(cmd)
        self.total_reward += float(reward)
        done = bool(terminated or truncated)
        self.info = dict(info)
        return BaseTextEnvStepOutput(
            observations=[] if done else [{"role": "user", "content": obs}],
            reward=float(reward), done=done, metadata={**info, "action": cmd},
            postprocessed_action=None)

    def get_metrics(self) -> dict[str, Any]:
        return {"turns": self.turns, "reward": self.total_reward}

    def close(self):
        self.env.close()


def register_envs(env_ids=None) -> list[str]:
    """Register agentgym envs (all registered ids by default) with skyrl-gym as
    ``agentgym-<id>``; returns the skyrl-gym ids. Registering again is a no-op.

    The entry point is the class :class:`AgentGymTextEnv` with ``env_id`` in the spec's
    kwargs: SkyRL's generator aggregates an env's metrics through its registered class
    (``skyrl_gym.metrics.aggregate_for_environment`` calls ``entry_point.aggregate_metrics``).
    """
    ids = []
    for env_id in env_ids or agentgym.list_envs(kind=("native", "python")):
        name = ENV_PREFIX + env_id
        if name not in registry:
            register(id=name, entry_point=AgentGymTextEnv, kwargs={"env_id": env_id})
        ids.append(name)
    return ids


class AgentGymGenerator(_GeneratorBase):
    """SkyRL's ``GeneratorInterface`` on the agentgym rollout engine.

    ``generate(input_batch)`` plays one episode per row, in input order: the env is the
    row's ``env_classes`` entry (``agentgym-<id>`` or a plain agentgym id), the task its
    ``env_extras["task"]``; rows naming the same env and task are samples of one group
    (same seed). ``sampling_params`` (``temperature``, ``top_p``, ``top_k``,
    ``max_generate_length`` / ``max_tokens`` per turn) override the engine's for that call.
    The output has SkyRL's ``GeneratorOutput`` keys (``agentgym.data.exports.to_skyrl``
    plus the trajectory ids, metrics and per-trajectory times; unused keys are None).
    """

    def __init__(self, backend: Backend, tokenizer, **overrides):
        self.engine_overrides = {"progress": False, **overrides}
        self._coalescer = EpisodeCoalescer(
            lambda _key: open_runner(backend, tokenizer=tokenizer,
                                     **self.engine_overrides).runner)

    async def generate(self, input_batch: Mapping[str, Any]) -> dict[str, Any]:
        import asyncio

        classes = list(input_batch["env_classes"])
        extras = input_batch.get("env_extras") or [{}] * len(classes)
        if len(extras) != len(classes):
            raise ValueError(f"{len(classes)} env_classes but {len(extras)} env_extras")
        overrides = _sampling_overrides(input_batch.get("sampling_params") or {})
        futures = []
        for cls, extra in zip(classes, extras):
            extra = dict(extra or {})
            if "task" not in extra:
                raise TaskRefError(f"env_extras {extra!r} name no task")
            env_id = cls.removeprefix(ENV_PREFIX)
            row = dict(overrides)
            if extra.get("max_turns"):
                row["max_turns"] = int(extra["max_turns"])
            futures.append(self._coalescer.play(env_id, extra["task"],
                                                env_kwargs=extra.get("env_kwargs"), **row))
        trajs = list(await asyncio.gather(*futures))
        out = to_skyrl(trajs)
        out["rollout_metrics"] = batch_metrics(
            trajs, max((t.timings.get("total_s", 0.0) for t in trajs), default=0.0))
        out["trajectory_ids"] = input_batch.get("trajectory_ids")
        out["trajectory_generation_times"] = [t.timings.get("total_s", 0.0) for t in trajs]
        out["env_metrics"] = [{"env_id": t.env_id, "task": t.task_id, "turns": t.num_turns}
                              for t in trajs]
        for key in ("rollout_expert_indices", "is_last_step", "pixel_values", "image_grid_thw"):
            out[key] = None
        return out

    def close(self) -> None:
        self._coalescer.close()


def _sampling_overrides(sp: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in ("temperature", "top_p"):
        if sp.get(name) is not None:
            out[name] = float(sp[name])
    if sp.get("top_k") is not None:
        out["top_k"] = engine_top_k(sp["top_k"])
    for name in ("max_generate_length", "max_tokens", "max_new_tokens"):
        if sp.get(name) is not None:
            out["max_new_tokens"] = int(sp[name])
            break
    return out
