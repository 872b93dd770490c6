"""agentgym inside verl (``verl`` 0.9): an agent loop that plays agentgym episodes, and the
Parquet rows that feed it.

``AgentGymAgentLoop`` is registered with verl as ``agentgym``. Its ``run`` reads the env id
and task from the dataset row (``extra_info.env_id`` / ``extra_info.task``, as written by
:func:`write_dataset`), plays one multi-turn episode with :class:`RolloutEngine` and returns
verl's ``AgentLoopOutput``. Generation goes through verl's own ``server_manager.generate``
token in, token out (:class:`VerlServerBackend`); native envs step in the Rust pool. The
``run`` calls a verl worker makes for one batch arrive in one event-loop iteration and are
played as one engine batch (:class:`~agentgym.integrations._episodes.EpisodeCoalescer`):
the rollouts of one prompt become one group of samples of one task.

verl config (``actor_rollout_ref.rollout``)::

    mode: async
    agent:
      agent_loop_config_path: agentgym_agent_loop.yaml
    multi_turn:
      max_assistant_turns: 10        # the episode horizon (else the row's or the env's)
    prompt_length: 1024              # the env's first prompt must fit
    response_length: 2048            # every later token of the episode

with ``agentgym_agent_loop.yaml``::

    - name: agentgym
      _target_: agentgym.integrations.verl.AgentGymAgentLoop
      max_new_tokens: 128            # tokens per turn

and ``data.train_files`` written by :func:`write_dataset` (its rows name ``agent_name:
agentgym``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    register,
)

from agentgym.backends.base import (
    NO_IMAGES,
    BackendError,
    GenerateResult,
    InvalidRequestError,
    SamplingParams,
)
from agentgym.data.exports import to_verl
from agentgym.data.trajectories import Trajectory
from agentgym.engine.orchestrator import RolloutEngine, episode_of_request
from agentgym.engine.runner import open_runner
from agentgym.integrations._episodes import (
    EpisodeCoalescer,
    TaskRefError,
    check_task,
    engine_top_k,
    task_label,
    task_ref,
)

__all__ = ["AGENT_NAME", "AgentGymAgentLoop", "TaskRefError", "VerlServerBackend", "dataset_rows",
           "write_dataset"]

log = logging.getLogger(__name__)

#: The name the agent loop is registered under (the rows' ``agent_name``).
AGENT_NAME = "agentgym"

#: verl sampling keys the engine sets itself per turn (from ``RolloutConfig``).
_ENGINE_KEYS = ("temperature", "top_p", "top_k", "max_tokens", "max_new_tokens",
                "stop_token_ids", "logprobs")


class VerlServerBackend:
    """An agentgym :class:`~agentgym.backends.base.Backend` over verl's LLM server client
    (``server_manager.generate(request_id, prompt_ids=..., sampling_params=...)`` returning
    a ``TokenOutput``).

    ``extra_sampling`` (e.g. ``repetition_penalty``) is sent with every request next to the
    engine's own temperature / top-p / top-k / ``max_tokens`` / stop tokens. One request id
    per episode (the turn suffix of the engine's id dropped) keeps an episode's turns on
    one server for prefix caching. verl reports ``completed`` for both a stop and the token
    cap, so a reply that ends without a stop token after ``max_new_tokens`` tokens is
    ``length``. Weights are verl's to update: ``update_weights`` refuses.
    """

    needs_context = False

    def __init__(self, server_manager, extra_sampling: Mapping[str, Any] | None = None,
                 logprobs: bool = True):
        self.server_manager = server_manager
        self.extra_sampling = dict(extra_sampling or {})
        self.logprobs = logprobs
        self.policy_version = 0
        self.preempted = 0

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams,
                       request_id: str | None = None, *, images=None) -> GenerateResult:
        """One completion from verl's server manager. Text only: ``images`` raise
        :class:`InvalidRequestError`."""
        if images is not None and len(images):
            raise InvalidRequestError(NO_IMAGES.format(backend="verl's server manager"))
        params = {
            **self.extra_sampling,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k,
            "max_tokens": sampling.max_new_tokens,
            "logprobs": self.logprobs and sampling.logprobs,
        }
        if sampling.stop_token_ids:
            params["stop_token_ids"] = list(sampling.stop_token_ids)
        if sampling.seed is not None:
            params["seed"] = sampling.seed
        rid = _episode_request_id(request_id)
        try:
            out = await self.server_manager.generate(rid, prompt_ids=list(prompt_ids),
                                                     sampling_params=params)
        except Exception as e:  # any server failure ends only this episode
            raise BackendError(f"verl server_manager.generate failed: {e!r}") from e
        tokens = list(out.token_ids)
        logprobs = list(out.log_probs) if out.log_probs else []
        if logprobs and len(logprobs) != len(tokens):
            raise BackendError(f"verl returned {len(logprobs)} logprobs for {len(tokens)} tokens")
        if out.num_preempted:
            self.preempted += out.num_preempted
        if out.stop_reason == "aborted":
            reason = "abort"
        elif tokens and tokens[-1] in sampling.stop_token_ids:
            reason = "stop"
        elif len(tokens) >= sampling.max_new_tokens:
            reason = "length"
        else:
            reason = "stop"  # EOS or the server's context limit
        version = out.extra_fields.get("global_steps") if out.extra_fields else None
        if isinstance(version, int):
            self.policy_version = version
        return GenerateResult(token_ids=tokens, logprobs=logprobs, finish_reason=reason,
                              policy_version=self.policy_version)

    async def abort(self, request_id: str) -> None:
        """verl's client has no per-request abort; the engine's cancellation ends the
        waiting coroutine."""

    async def update_weights(self, state_dict_or_path) -> None:
        raise BackendError("verl updates the rollout weights itself")

    async def close(self) -> None:
        pass


def _episode_request_id(request_id: str | None) -> str:
    """The episode part of the engine's request id (a fresh id when there is none)."""
    if request_id is None:
        import uuid

        return uuid.uuid4().hex
    return episode_of_request(request_id)


#: One coalescer per (server manager, tokenizer, engine defaults), i.e. per verl agent-loop
#: worker and agent-loop configuration.
_COALESCERS: dict[tuple, tuple[object, object, EpisodeCoalescer]] = {}


def _coalescer(server_manager, tokenizer, rollout_defaults: dict) -> EpisodeCoalescer:
    key = (id(server_manager), id(tokenizer), repr(sorted(rollout_defaults.items())))
    hit = _COALESCERS.get(key)
    if hit is not None and hit[0] is server_manager and hit[1] is tokenizer:
        return hit[2]

    def make_engine(engine_key) -> RolloutEngine:
        extra, logprobs = engine_key
        backend = VerlServerBackend(server_manager, dict(extra), logprobs=logprobs)
        return open_runner(backend, tokenizer=tokenizer, **rollout_defaults).runner

    coalescer = EpisodeCoalescer(make_engine)
    _COALESCERS[key] = (server_manager, tokenizer, coalescer)
    return coalescer


@register(AGENT_NAME)
class AgentGymAgentLoop(AgentLoopBase):
    """A verl agent loop that plays one agentgym episode per dataset row (module docs).

    Keyword arguments (from the agent-loop YAML entry): ``max_new_tokens`` per turn,
    ``max_turns`` (else ``rollout.multi_turn.max_assistant_turns``, else the row's
    ``extra_info.max_turns``, else the engine default), ``system_prompt``, ``env_kwargs``.
    """

    def __init__(self, *args, max_new_tokens: int | None = None, max_turns: int | None = None,
                 system_prompt: str | None = None, env_kwargs: Mapping[str, Any] | None = None,
                 **kwargs):
        kwargs.pop("tools", None)  # verl passes its tool list; agentgym envs are the tools
        super().__init__(*args, **kwargs)
        rollout = self.rollout_config
        self.prompt_length = int(rollout.prompt_length)
        self.response_length = int(rollout.response_length)
        multi_turn = rollout.get("multi_turn", None) or {}
        self.max_turns = max_turns or multi_turn.get("max_assistant_turns", None)
        self.env_kwargs = dict(env_kwargs or {})
        defaults: dict[str, Any] = {"max_total_tokens": self.prompt_length + self.response_length,
                                    "progress": False}
        if max_new_tokens is not None:
            defaults["max_new_tokens"] = int(max_new_tokens)
        if system_prompt is not None:
            defaults["system_prompt"] = system_prompt
        self._defaults = defaults

    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        extra = kwargs.get("extra_info") or {}
        env_id, task = task_ref(extra)
        overrides: dict[str, Any] = {}
        for name in ("temperature", "top_p", "top_k"):
            if sampling_params.get(name) is not None:
                overrides[name] = sampling_params[name]
        if "top_k" in overrides:
            overrides["top_k"] = engine_top_k(overrides["top_k"])
        max_turns = self.max_turns or extra.get("max_turns")
        if max_turns:
            overrides["max_turns"] = int(max_turns)
        passthrough = tuple(sorted((k, v) for k, v in sampling_params.items()
                                   if k not in _ENGINE_KEYS and v is not None))
        logprobs = bool(sampling_params.get("logprobs", True))
        coalescer = _coalescer(self.server_manager, self.tokenizer, self._defaults)
        env_kwargs = {**self.env_kwargs, **(extra.get("env_kwargs") or {})}
        traj = await coalescer.play(env_id, task, engine_key=(passthrough, logprobs),
                                    env_kwargs=env_kwargs, **overrides)
        return self.output(traj, logprobs=logprobs)

    def output(self, traj: Trajectory, logprobs: bool = True) -> AgentLoopOutput:
        """verl's ``AgentLoopOutput`` of a trajectory (``agentgym.data.exports.to_verl``),
        the response cut at ``rollout.response_length``. A first prompt longer than
        ``rollout.prompt_length`` is left-truncated and the episode masked out (reward 0),
        so the batch goes on. ``extra_fields`` carries the stop reason, the per-turn rewards
        (``turn_scores``) and whether either cut happened."""
        f = to_verl(traj)
        n = self.response_length
        response_ids = f["response_ids"]
        prompt_ids = f["prompt_ids"]
        mask, reward = f["response_mask"][:n], f["reward_score"]
        too_long = len(prompt_ids) > self.prompt_length
        if too_long:
            # verl pads every prompt to prompt_length: keep the batch, train on nothing.
            log.warning("the first prompt of %s task %s has %d tokens > rollout.prompt_length "
                        "%d: left-truncated, masked out", traj.env_id, traj.task_id,
                        len(prompt_ids), self.prompt_length)
            prompt_ids = prompt_ids[-self.prompt_length:]
            mask, reward = [0] * len(mask), 0.0
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=response_ids[:n],
            response_mask=mask,
            response_logprobs=f["response_logprobs"][:n] if logprobs else None,
            reward_score=reward,
            num_turns=2 * f["num_turns"] + 1,  # user, then assistant + env per turn
            metrics=AgentLoopMetrics(generate_sequences=traj.timings.get("gen_s", 0.0)),
            extra_fields={
                "turn_scores": list(traj.turn_rewards),
                "tool_rewards": [],
                "agentgym_stop_reason": traj.stop_reason,
                "agentgym_truncated": len(response_ids) > n,
                "agentgym_prompt_too_long": too_long,
            },
        )


def dataset_rows(env_id: str, tasks: Iterable[int | str], *, agent_name: str = AGENT_NAME,
                 max_turns: int | None = None, split: str = "train") -> list[dict]:
    """verl dataset rows, one per task: ``data_source`` ``agentgym/<env>``, a one-message
    ``prompt`` naming the task (the episode's real prompt comes from the env), the
    ``agent_name``, a ``reward_model`` entry (the env is the reward) and ``extra_info`` with
    ``index``, ``env_id``, ``task`` (and ``max_turns`` when given)."""
    rows = []
    for i, task in enumerate(tasks):
        task = check_task(task)
        info: dict[str, Any] = {"index": i, "env_id": env_id, "task": task, "split": split}
        if max_turns is not None:
            info["max_turns"] = int(max_turns)
        rows.append({
            "data_source": f"agentgym/{env_id}",
            "prompt": [{"role": "user", "content": task_label(env_id, task)}],
            "ability": "agent",
            "agent_name": agent_name,
            "reward_model": {"style": "env", "ground_truth": ""},
            "extra_info": info,
        })
    return rows


def write_dataset(path: str | Path, env_id: str, tasks: Iterable[int | str], **kw) -> Path:
    """Write :func:`dataset_rows` to the Parquet file ``path`` (verl's ``data.train_files`` /
    ``data.val_files``); returns the path."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(dataset_rows(env_id, tasks, **kw)), path)
    return path
