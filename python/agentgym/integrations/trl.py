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

Generation: ``backend`` when given (any agentgym ``Backend``); else, when the trainer has a
vLLM (``GRPOConfig(use_vllm=True)``), that vLLM through :class:`TRLVLLMBackend` (the in-process
``vllm.LLM`` of ``vllm_mode="colocate"``, or TRL's ``VLLMClient`` of ``vllm_mode="server"``),
whose weights TRL itself syncs before it calls the rollout function; else a
``TransformersBackend`` on the trainer's model folder that receives the trainer's current
weights before the first rollout of each optimizer step.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentgym.backends.base import (
    NO_IMAGES,
    Backend,
    BackendError,
    GenerateResult,
    InvalidRequestError,
    SamplingParams,
    check_prompt,
)
from agentgym.backends.batching import BatchRequest, RequestBatcher
from agentgym.backends.vllm_backend import vllm_sampling_kwargs
from agentgym.data.trajectories import Trajectory
from agentgym.engine.orchestrator import RolloutEngine
from agentgym.integrations._episodes import (
    TaskRefError,
    check_task,
    engine_top_k,
    task_label,
    task_ref,
)

__all__ = ["AgentGymRollout", "TRLVLLMBackend", "TaskRefError", "env_reward",
           "prompt_messages"]


def prompt_messages(env_id: str, task: int | str) -> list[dict]:
    """The conversational prompt of one dataset row: one user message labelled with the
    task, carrying ``env_id`` and ``task``."""
    task = check_task(task)
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
        backend = engine.backend
        if self._own_backend and self._synced_step != trainer.state.global_step:
            if isinstance(backend, TRLVLLMBackend):
                # GRPOTrainer._generate synced its vLLM to this step's weights just before
                # calling the rollout function.
                backend.policy_version += 1
            else:
                model = trainer.accelerator.unwrap_model(trainer.model)
                await backend.update_weights(
                    {k: v.detach() for k, v in model.state_dict().items()})
            self._synced_step = trainer.state.global_step
        if (isinstance(backend, TRLVLLMBackend) and backend.client is not None
                and trainer.accelerator.num_processes > 1):
            # Only the main process pushes weights to the server: the others wait until it
            # has, so that no rank generates with half-updated weights.
            trainer.accelerator.wait_for_everyone()
        args = trainer.args
        sampling = {"temperature": float(trainer.temperature),
                    "top_p": float(getattr(args, "top_p", 1.0) or 1.0),
                    "top_k": engine_top_k(getattr(args, "top_k", None))}
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
        """The engine (:func:`~agentgym.engine.runner.open_runner`) over the given backend,
        else the trainer's colocated vLLM, else a transformers backend of its model (the
        last two owned here: closed with the engine)."""
        if self._engine is None:
            from agentgym.engine.runner import open_runner

            tok = trainer.processing_class
            if self.backend is None and getattr(trainer, "use_vllm", False):
                self.backend = TRLVLLMBackend.from_trainer(trainer)
            if self.backend is not None:
                self._engine = open_runner(self.backend, tokenizer=tok).runner
                self._engine.own_backend = self._own_backend
            else:
                model = trainer.accelerator.unwrap_model(trainer.model)
                self._engine = open_runner(
                    "transformers", model.name_or_path, tokenizer=tok,
                    backend_kwargs={"device": str(trainer.accelerator.device),
                                    "logprobs_mode": "processed",
                                    "seed": int(trainer.args.seed)}).runner
                self.backend = self._engine.backend
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
            if self._loop is not None:
                self._loop.run_until_complete(self._engine.aclose())
            else:
                self._engine.close()
        if self._loop is not None:
            self._loop.close()
            self._loop = None
        self._engine = None


#: Sampling keys the engine sets per request: the trainer's ``generation_kwargs`` never
#: override them.
_ENGINE_KEYS = frozenset({"n", "max_tokens", "temperature", "top_p", "top_k", "seed",
                          "stop_token_ids", "ignore_eos", "logprobs", "detokenize",
                          "output_kind"})


@dataclass(eq=False)
class _Request(BatchRequest):
    budget: int = 0


class TRLVLLMBackend:
    """An agentgym :class:`~agentgym.backends.base.Backend` over the vLLM of a
    ``trl.GRPOTrainer``: token ids in, token ids and their logprobs out.

    Exactly one of ``llm`` (``vllm_mode="colocate"``: the trainer's in-process ``vllm.LLM``)
    or ``client`` (``vllm_mode="server"``: TRL's ``VLLMClient`` of a vLLM server);
    :meth:`from_trainer` takes them from the trainer's ``vllm_generation``. A prompt that
    fills ``max_model_len`` (default: the LLM's, or the server's ``/v1/models`` entry) is
    refused with ``InvalidRequestError``, and replies are capped to the room left.

    The ``generate`` calls made while no vLLM call runs (the engine makes one per episode, all
    the episodes of one event-loop iteration together) go to vLLM as one call: one
    ``llm.generate`` with one sampling-params object per request, or one ``client.generate``
    per distinct set of sampling params (the client takes one set for all its prompts). Calls
    that arrive while vLLM works form the next batch. vLLM is called from one worker thread,
    so the event loop keeps stepping envs meanwhile.

    ``extra_sampling`` (the trainer's ``repetition_penalty``, ``min_p`` and
    ``generation_kwargs``) goes with every request, without the keys the engine sets per turn.
    The logprobs are the vLLM's own: TRL starts its colocated vLLM with
    ``logprobs_mode="processed_logprobs"`` (the distribution sampled from), which its
    importance-sampling correction reads. A server reply has no finish reason: one that ends
    with a stop token, or with one of ``eos_token_ids`` (unless ``ignore_eos``), is ``stop``,
    any other ``length``.

    ``abort`` ends a request still waiting at once (no tokens); one already inside a vLLM call
    returns with that call, marked ``abort``. TRL owns the weights: ``update_weights`` refuses,
    and :class:`AgentGymRollout` bumps ``policy_version`` each time TRL has synced them.
    ``close`` stops this object only; the vLLM stays the trainer's.
    """

    needs_context = False

    def __init__(self, *, llm=None, client=None, eos_token_ids: Iterable[int] = (),
                 extra_sampling: Mapping[str, Any] | None = None,
                 max_model_len: int | None = None, vocab_size: int | None = None):
        if (llm is None) == (client is None):
            raise ValueError("TRLVLLMBackend takes exactly one of llm (colocate mode) or "
                             "client (server mode)")
        if llm is not None:
            cfg = llm.llm_engine.model_config
            max_model_len = max_model_len or cfg.max_model_len
            vocab_size = vocab_size or cfg.get_vocab_size()
        elif max_model_len is None:
            max_model_len = _served_model_len(client)
        self.llm, self.client = llm, client
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self.extra_sampling = {k: v for k, v in (extra_sampling or {}).items()
                               if k not in _ENGINE_KEYS}
        self.policy_version = 0
        #: vLLM calls made so far (``llm.generate`` or ``client.generate``).
        self.calls = 0
        self._batcher: RequestBatcher[_Request] = RequestBatcher(
            self._run, self._result, lambda: self.policy_version,
            thread_name="agentgym-trl-vllm", error="vLLM generation failed",
            aborts_survive_failure=False)

    @classmethod
    def from_trainer(cls, trainer) -> TRLVLLMBackend:
        """The backend over ``trainer.vllm_generation`` (TRL 1.16's ``VLLMGeneration``).
        A process without TRL's client (in server mode only the main process has one) opens
        its own for generation. Colocated tensor parallelism (every rank of a group must
        send the same prompts), sleep mode and structured outputs are refused."""
        vg = trainer.vllm_generation
        if getattr(vg, "structured_outputs_regex", None) is not None:
            raise ValueError("AgentGymRollout does not support vllm_structured_outputs_regex")
        extra = {"repetition_penalty": float(getattr(vg, "repetition_penalty", 1.0) or 1.0),
                 "min_p": float(getattr(vg, "min_p", 0.0) or 0.0),
                 **(getattr(vg, "generation_kwargs", None) or {})}
        eos = getattr(trainer, "eos_token_ids", None)
        if eos is None:
            tok = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)
            eos = [] if tok.eos_token_id is None else [tok.eos_token_id]
        if vg.mode == "colocate":
            if vg.tensor_parallel_size > 1:
                raise ValueError("AgentGymRollout does not support vllm_tensor_parallel_size > 1 "
                                 "in colocate mode")
            if vg.enable_sleep_mode:
                raise ValueError("AgentGymRollout does not support vllm_enable_sleep_mode")
            return cls(llm=vg.llm, eos_token_ids=eos, extra_sampling=extra)
        if vg.mode == "server":
            client = getattr(vg, "vllm_client", None)
            if client is None:
                from trl.generation.vllm_client import VLLMClient

                base = vg.server_base_url or f"http://{vg.server_host}:{vg.server_port}"
                client = VLLMClient(base_url=base, group_port=vg.group_port,
                                    connection_timeout=vg.server_timeout)
            return cls(client=client, eos_token_ids=eos, extra_sampling=extra)
        raise ValueError(f"unknown vllm_mode {vg.mode!r}")

    # ------------------------------------------------------------------ public API
    async def generate(self, prompt_ids: list[int], sampling: SamplingParams,
                       request_id: str | None = None, *, images=None) -> GenerateResult:
        """One completion, batched with the calls made alongside it; cancelling the caller
        aborts the request. Text only: ``images`` raise :class:`InvalidRequestError`."""
        if images is not None and len(images):
            raise InvalidRequestError(NO_IMAGES.format(backend="TRL's vLLM"))
        if self._batcher.closed:
            raise BackendError("backend is closed")
        prompt = check_prompt(prompt_ids, self.vocab_size)
        budget = sampling.max_new_tokens
        if self.max_model_len is not None:
            if len(prompt) >= self.max_model_len:
                raise InvalidRequestError(
                    f"prompt of {len(prompt)} tokens leaves no room in the model's context "
                    f"{self.max_model_len}")
            budget = min(budget, self.max_model_len - len(prompt))
        rid = request_id or uuid.uuid4().hex
        return await self._batcher.submit(rid, _Request(prompt, sampling, budget=budget))

    async def abort(self, request_id: str) -> None:
        """Abort ``request_id`` (class docs); unknown ids are ignored."""
        self._batcher.abort(request_id)

    async def update_weights(self, state_dict_or_path) -> None:
        raise BackendError("TRL syncs its vLLM's weights itself, before each rollout")

    async def close(self) -> None:
        """Abort what is waiting, stop the batcher and the worker thread (not the vLLM)."""
        await self._batcher.close()

    # ------------------------------------------------------------------ batching
    @staticmethod
    def _result(req: _Request, out, version: int) -> GenerateResult | BaseException:
        """The result of one output of :meth:`_run`: ``(tokens, logprobs, reason)``, or this
        request's own error."""
        if isinstance(out, BaseException):
            return out
        tokens, logprobs, reason = out
        return GenerateResult(token_ids=tokens, logprobs=logprobs,
                              finish_reason="abort" if req.aborted else reason,
                              policy_version=version)

    # ------------------------------------------------------------------ worker thread
    def _run(self, reqs: list[_Request]) -> list:
        if self.llm is not None:
            return self._run_llm(reqs)
        return self._run_client(reqs)

    def _run_llm(self, reqs: list[_Request]) -> list:
        from vllm import SamplingParams as VLLMSamplingParams

        params = [VLLMSamplingParams(**{**self.extra_sampling,
                                        **vllm_sampling_kwargs(r.sampling, r.budget)})
                  for r in reqs]
        self.calls += 1
        outs = self.llm.generate([{"prompt_token_ids": r.prompt} for r in reqs],
                                 sampling_params=params, use_tqdm=False)
        results = []
        for r, out in zip(reqs, outs, strict=True):
            c = out.outputs[0]
            tokens = list(c.token_ids)
            logprobs = []
            if r.sampling.logprobs:
                if c.logprobs is None or len(c.logprobs) != len(tokens):
                    results.append(BackendError("vLLM returned no logprob for some tokens"))
                    continue
                logprobs = [float(lp[t].logprob) for t, lp in zip(tokens, c.logprobs)]
            reason = c.finish_reason if c.finish_reason in ("stop", "length", "abort") else (
                self._reason(r, tokens))
            results.append((tokens, logprobs, reason))
        return results

    def _run_client(self, reqs: list[_Request]) -> list:
        groups: dict[tuple, list[int]] = {}
        for i, r in enumerate(reqs):
            s = r.sampling
            key = (r.budget, s.temperature, s.top_p, s.top_k, s.seed, tuple(s.stop_token_ids),
                   s.ignore_eos, s.logprobs)
            groups.setdefault(key, []).append(i)
        results: list = [None] * len(reqs)
        for idx in groups.values():
            first = reqs[idx[0]]
            s = first.sampling
            kwargs = {**self.extra_sampling, "stop_token_ids": list(s.stop_token_ids),
                      "ignore_eos": s.ignore_eos}
            if s.seed is not None:
                kwargs["seed"] = s.seed
            self.calls += 1
            out = self.client.generate(
                prompts=[reqs[i].prompt for i in idx], n=1, temperature=s.temperature,
                top_p=s.top_p, top_k=s.top_k if s.top_k > 0 else 0, max_tokens=first.budget,
                logprobs=0 if s.logprobs else None, generation_kwargs=kwargs)
            all_lps = out.get("logprobs") if s.logprobs else None
            for j, i in enumerate(idx):
                tokens = list(out["completion_ids"][j])
                logprobs = []
                if s.logprobs:
                    row = all_lps[j] if all_lps is not None else None
                    if row is None or len(row) != len(tokens):
                        results[i] = BackendError("vLLM server returned no logprob for some "
                                                  "tokens")
                        continue
                    logprobs = [float("nan") if x[0] is None else float(x[0]) for x in row]
                results[i] = (tokens, logprobs, self._reason(reqs[i], tokens))
        return results

    def _reason(self, req: _Request, tokens: list[int]) -> str:
        s = req.sampling
        if tokens and (tokens[-1] in s.stop_token_ids
                       or (not s.ignore_eos and tokens[-1] in self.eos_token_ids)):
            return "stop"
        return "length"


def _served_model_len(client) -> int | None:
    """The served context length from the server's ``/v1/models`` (None if unreadable)."""
    try:
        resp = client.session.get(f"{client.base_url}/v1/models", timeout=30)
        return int(resp.json()["data"][0]["max_model_len"])
    except Exception:  # an older server or another OpenAI-compatible one: no check
        return None


def _prompt_ref(prompt) -> tuple[str, int | str]:
    if isinstance(prompt, list) and prompt and isinstance(prompt[-1], Mapping):
        return task_ref(prompt[-1])
    raise TaskRefError(f"prompt {prompt!r} names no agentgym task: build the dataset with "
                       "AgentGymRollout.dataset(env_id, tasks)")
