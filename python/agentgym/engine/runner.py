"""The runner contract and the one way to build a runner.

A *runner* plays episode requests and streams their trajectories: the in-process
:class:`~agentgym.engine.RolloutEngine` (one backend, one event loop) or the
:class:`~agentgym.distributed.RayRolloutPool` (many engines on Ray actors). The trainer,
the collector, ``LLMAgent`` and the trainer adapters drive either through :class:`Runner`
and never ask which one they hold.

:func:`open_runner` builds one from a backend name (or an open backend), a model and the
rollout settings: the model folder, its tokenizer, the backend, the engine or the Ray pool,
and the identity a run folder records. Every place that needs a runner calls it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Protocol, runtime_checkable

from agentgym.data.trajectories import Trajectory
from agentgym.engine.orchestrator import (
    EpisodeBatch,
    EpisodeRequest,
    RolloutBatch,
    model_folder,
    open_engine,
)

__all__ = ["OpenRunner", "Runner", "backend_identity", "open_runner", "tokenizer_sha256"]


@runtime_checkable
class Runner(Protocol):
    """What drives rollouts, in process or on Ray workers.

    ``requests`` makes ``tasks`` x ``n_samples`` requests, each task a fresh group;
    ``stream_requests`` plays requests and yields each trajectory as its episode ends;
    ``stream_batches`` yields the episodes that ended together as one
    :class:`~agentgym.engine.EpisodeBatch`; ``collect`` returns them all in request order
    with their metrics. ``update_weights`` loads a state dict (or a path) into every backend
    and returns the version they now serve (``version``, else the current one + 1);
    ``policy_version`` is that version (settable: a resumed run continues its count).
    ``reseed`` restarts the group counter (hence the episode seeds), the episode keys, the
    request-id prefix and the backends' sampling seed, so a resumed run replays an
    uninterrupted one. ``aclose`` releases the envs and the backends the runner opened.
    """

    @property
    def policy_version(self) -> int: ...

    @policy_version.setter
    def policy_version(self, value: int) -> None: ...

    def requests(self, tasks: int | Sequence[int | str],
                 n_samples: int | None = None) -> list[EpisodeRequest]: ...

    def reseed(self, group_start: int, key_start: int | None = None,
               run_id: str | None = None, sampling_seed: int | None = None) -> None: ...

    def stream_requests(self, requests: Iterable[EpisodeRequest]
                        | AsyncIterable[EpisodeRequest], env_id: str, *,
                        env_kwargs: dict | None = None,
                        **overrides: Any) -> AsyncIterator[Trajectory]: ...

    def stream_batches(self, requests: Iterable[EpisodeRequest]
                       | AsyncIterable[EpisodeRequest], env_id: str, *,
                       env_kwargs: dict | None = None, trajectories: bool = True,
                       **overrides: Any) -> AsyncIterator[EpisodeBatch]: ...

    async def collect(self, tasks: int | Sequence[int | str], env_id: str, *,
                      env_kwargs: dict | None = None, **overrides: Any) -> RolloutBatch: ...

    async def update_weights(self, weights: Any, version: int | None = None) -> int: ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True, eq=False)
class OpenRunner:
    """What :func:`open_runner` returns: the runner, the tokenizer its prompts are made
    with, and (computed when first read) the identity a run folder records of the policy,
    which a resume must match."""

    runner: Runner
    tokenizer: Any
    backend_name: str
    model: str | None
    backend_kwargs: dict[str, Any]

    @cached_property
    def identity(self) -> dict[str, Any]:
        return backend_identity(self.backend_name, self.model, self.tokenizer,
                                self.backend_kwargs)


def open_runner(backend: Any = "scripted", model: str | None = None, *,
                tokenizer: Any = None, backend_kwargs: dict[str, Any] | None = None,
                num_workers: int = 0, ray_address: str | None = None,
                worker: dict[str, Any] | None = None, pool: dict[str, Any] | None = None,
                **rollout: Any) -> OpenRunner:
    """A runner for ``backend`` over ``model``, with the rollout settings ``rollout``
    (:class:`~agentgym.engine.RolloutConfig` fields).

    ``backend``: a name (``scripted`` | ``transformers`` | ``vllm`` | ``openai``, built by
    :func:`~agentgym.backends.make_backend` with ``backend_kwargs`` and closed by the
    runner's ``aclose``) or an open :class:`~agentgym.backends.Backend` (left open).
    ``model``: a model folder or a named model (``None``/``"tiny"``: the cached tiny model);
    it gives the tokenizer unless ``tokenizer`` is passed, and ``scripted`` uses only that.
    ``num_workers`` > 0: a :class:`~agentgym.distributed.RayRolloutPool` of that many
    workers on the Ray cluster at ``ray_address`` (or a local one), ``worker`` holding
    :class:`~agentgym.distributed.WorkerSpec` resources (``num_cpus``, ``num_gpus``,
    ``torch_threads``) and ``pool`` the pool's options (``chunk_size``, ``max_restarts``,
    ``max_request_retries``, ``weights_dir``); ``backend`` must then be a name.
    Blocking (it loads the tokenizer and may load a model): call it from a thread in async
    code."""
    named = isinstance(backend, str)
    if num_workers:
        if not named:
            raise TypeError("a Ray rollout pool builds its backends on the workers: pass "
                            "the backend by name, not an open backend")
        from agentgym.distributed.rollout_workers import RayRolloutPool, WorkerSpec, init_ray

        model_dir = model_folder(model)
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(model_dir)
        kw = dict(backend_kwargs or {})
        init_ray(ray_address)
        spec = WorkerSpec(model_dir, backend, kw, dict(rollout), **(worker or {}))
        runner: Runner = RayRolloutPool(spec, num_workers, **(pool or {}))
    else:
        runner = open_engine(backend, model, tokenizer=tokenizer,
                             backend_kwargs=backend_kwargs, **rollout)
        tokenizer, kw = runner.tokenizer, dict(backend_kwargs or {})
    return OpenRunner(runner, tokenizer, backend if named else type(backend).__name__, model, kw)


def tokenizer_sha256(tokenizer) -> str:
    """A digest of the tokenizer's vocabulary, merges, special tokens and chat template."""
    fast = getattr(tokenizer, "backend_tokenizer", None)
    text = fast.to_str() if fast is not None else json.dumps(tokenizer.get_vocab(),
                                                             sort_keys=True)
    text += "\n" + str(getattr(tokenizer, "chat_template", "") or "")
    return hashlib.sha256(text.encode()).hexdigest()


def backend_identity(backend: str, model: str | None, tokenizer,
                     backend_kwargs: dict[str, Any]) -> dict[str, Any]:
    """What a run folder records of its policy (and a resume must match): the backend, the
    model name, the tokenizer digest and, for ``scripted``, its policy."""
    identity = {"backend": backend, "model": str(model or "tiny"),
                "tokenizer_sha256": tokenizer_sha256(tokenizer)}
    if backend == "scripted":
        identity["policy"] = backend_kwargs.get("policy", "oracle")
    return identity
