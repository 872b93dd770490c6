"""The inference-backend protocol shared by the rollout engine and every backend.

A backend turns prompt token ids into generated token ids plus the log-probability of each
generated token (the behaviour policy's logprobs), never re-tokenizing text. Logprobs are
those of the model's raw next-token distribution (log-softmax of the logits before
temperature, top-k or top-p), which is vLLM's default ``logprobs_mode="raw_logprobs"``;
at temperature 1 without truncation this is exactly the sampling distribution.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import zlib
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

import msgspec
import numpy as np

from agentgym.errors import AgentGymError

if TYPE_CHECKING:
    from agentgym.models.vision import VisionSpec

FinishReason = Literal["stop", "length", "abort"]


class BackendError(AgentGymError):
    """An inference backend failed (engine died, server unreachable, bad response, request
    rejected). Every failure of a backend's ``generate`` is one (or a subclass)."""


class InvalidRequestError(BackendError, ValueError):
    """The backend rejected a request before generating: bad prompt ids, a prompt that
    leaves no room in the model's context, a request id already in flight. Also a
    ``ValueError``."""


#: The error of a backend that cannot send pictures (``generate(..., images=)``).
NO_IMAGES = ("{backend} takes text only: image observations (an env built with obs='image' or "
             "'both') need a backend that sends pictures: transformers, vllm or openai")


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True):
    """How to sample one completion.

    ``temperature`` 0 means greedy; ``top_k`` 0 or -1 disables top-k; ``seed`` makes one
    request's sampling reproducible; generation stops at the model's EOS tokens (unless
    ``ignore_eos``) or any of ``stop_token_ids`` (the stop token is included in the
    output), or after ``max_new_tokens``.
    """

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    stop_token_ids: list[int] = msgspec.field(default_factory=list)
    ignore_eos: bool = False
    logprobs: bool = True

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1, 0 or positive, got {self.top_k}")


class GenerateResult(msgspec.Struct, kw_only=True):
    """One completion: generated ``token_ids``, the logprob of each (empty when logprobs
    were not requested), and why generation ended: ``stop`` (EOS or a stop token, which is
    the last element of ``token_ids``), ``length`` (``max_new_tokens`` or the model's
    context) or ``abort`` (``abort(request_id)`` or cancellation; tokens so far)."""

    token_ids: list[int]
    logprobs: list[float] = msgspec.field(default_factory=list)
    finish_reason: FinishReason = "stop"
    policy_version: int = 0


@runtime_checkable
class Backend(Protocol):
    """What the rollout engine needs from an inference engine.

    ``generate`` may be called concurrently from many coroutines (the backend batches them);
    cancelling the awaiting task aborts the request. ``abort(request_id)`` ends a running
    request early: its ``generate`` returns with ``finish_reason="abort"``; an unknown or
    finished id is ignored. ``update_weights`` takes a ``{name: tensor}`` state dict (Hugging
    Face parameter names) or a path to a safetensors file or model folder, and increments
    ``policy_version`` once the new weights serve requests. ``needs_context``: the engine
    passes ``context=(driver, slot, episode_seed, sample_index)`` to ``generate`` (a policy
    that reads the env, such as :class:`~agentgym.backends.scripted.ScriptedBackend`); False
    for models. A backend whose sampling can be seeded anew may also define
    ``reseed(seed: int)``; the runner's ``reseed`` calls it (a resumed run then replays).

    ``choices`` (a backend with ``scores_choices`` True): valid-action decoding. The reply is
    one of the given token lists, chosen by the probability the model gives each after the
    prompt (:func:`choose`), with the logprobs of its tokens from that same forward pass;
    the engine's ``valid_action_decoding`` mechanism passes the env's listed actions.

    ``images``: the frames of the images in ``prompt_ids``, in order, as ``(h, w, 3)`` uint8
    arrays. The prompt holds each image's markup already expanded (the model's image tokens,
    :meth:`agentgym.models.vision.VisionSpec.markup_ids`), so the tokens the engine stores
    are the tokens the model sees. A backend whose model cannot see images, or a prompt
    whose image markup does not match the frames (count or sizes), raises
    :class:`InvalidRequestError` (:func:`check_images`).
    """

    policy_version: int
    needs_context: bool

    async def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        request_id: str | None = None,
        *,
        images: Sequence[np.ndarray] | None = None,
    ) -> GenerateResult: ...

    async def abort(self, request_id: str) -> None: ...

    async def update_weights(self, state_dict_or_path) -> None: ...

    async def close(self) -> None: ...


def check_prompt(prompt_ids, vocab_size: int | None = None) -> list[int]:
    """Validate a prompt: a non-empty sequence of ints in ``[0, vocab_size)`` (numpy ints
    accepted); an :class:`InvalidRequestError` otherwise. One vectorised pass (prompts grow
    every turn)."""
    if isinstance(prompt_ids, (str, bytes)):
        raise InvalidRequestError("prompt_ids must be a sequence of ints, not text")
    try:
        arr = np.asarray(prompt_ids)
    except (TypeError, ValueError) as e:
        raise InvalidRequestError(f"prompt_ids must be a sequence of ints: {e}") from e
    if arr.ndim != 1 or arr.size == 0:
        raise InvalidRequestError("prompt_ids must be a non-empty one-dimensional sequence")
    if arr.dtype.kind not in "iu":
        raise InvalidRequestError(f"prompt_ids must be ints, got {arr.dtype}")
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0:
        raise InvalidRequestError(f"prompt_ids must be non-negative, got {lo}")
    if vocab_size is not None and hi >= vocab_size:
        raise InvalidRequestError(f"token id {hi} out of range (vocab {vocab_size})")
    return prompt_ids if type(prompt_ids) is list else arr.tolist()


def check_choices(choices, vocab_size: int | None, room: int) -> list[list[int]]:
    """Validate the candidate replies of valid-action decoding (``generate(...,
    choices=)``): at least one, each a non-empty sequence of ints in ``[0, vocab_size)`` and
    at most ``room`` tokens (what the context leaves after the prompt); an
    :class:`InvalidRequestError` naming the choice otherwise."""
    if isinstance(choices, (str, bytes)) or not choices:
        raise InvalidRequestError("choices must be a non-empty list of token id lists")
    out = []
    for k, c in enumerate(choices):
        try:
            ids = check_prompt(c, vocab_size)
        except InvalidRequestError as e:
            raise InvalidRequestError(f"choice {k}: {e}") from None
        if len(ids) > room:
            raise InvalidRequestError(f"choice {k} of {len(ids)} tokens does not fit the "
                                      f"{room} tokens the context leaves after the prompt")
        out.append(list(ids))
    return out


def request_seed(base: int, request_id: str) -> int:
    """The sampling seed of a request with an id and no seed of its own: the backend's seed
    mixed with the id (what it draws then depends on neither batch nor order)."""
    return ((base & ((1 << 62) - 1)) * 1_000_003 + zlib.crc32(request_id.encode())) \
        & ((1 << 63) - 1)


def choose(choices: list[list[int]], logprobs: list[list[float]], sampling: SamplingParams,
           seed: int, version: int) -> GenerateResult:
    """Valid-action decoding's reply: choice ``k`` with probability ``softmax(score /
    T)[k]``, ``score`` each choice's summed token logprobs under the model (what it gives
    that reply's text) and ``T`` the sampling temperature (0: the best score, the first of a
    tie), drawn with a generator seeded by ``seed``; top-k and top-p do not apply. The reply
    is the chosen choice's tokens and its token logprobs (``logprobs``: one list per choice,
    from the same forward pass), cut to ``max_new_tokens`` (then ``finish_reason``
    ``length``)."""
    scores = np.array([sum(lp) for lp in logprobs], np.float64)
    if sampling.temperature == 0:
        k = int(np.argmax(scores))
    else:
        z = scores / sampling.temperature
        p = np.exp(z - z.max())
        k = int(np.random.default_rng(seed).choice(len(p), p=p / p.sum()))
    ids, lps, reason = list(choices[k]), [float(x) for x in logprobs[k]], "stop"
    if len(ids) > sampling.max_new_tokens:
        n = sampling.max_new_tokens
        ids, lps, reason = ids[:n], lps[:n], "length"
    return GenerateResult(token_ids=ids, logprobs=lps if sampling.logprobs else [],
                          finish_reason=reason, policy_version=version)


def check_images(
    prompt: list[int], images, vision: VisionSpec | None, model: str
) -> tuple[list[np.ndarray], list[tuple[int, int]]]:
    """The frames of a request and the ``[start, end)`` span of each one's markup in
    ``prompt``, checked: ``images`` must be ``(h, w, 3)`` uint8 arrays, one per image markup
    in the prompt, each markup the exact expansion for its frame's size (``vision``: the
    model's :class:`~agentgym.models.vision.VisionSpec`, None for a text-only ``model``).
    :class:`InvalidRequestError` otherwise. ``([], [])`` for a request without images to a
    text-only model (its prompt is not searched)."""
    from agentgym.models.vision import as_frames

    try:
        frames = as_frames(images) if images is not None else []
    except ValueError as e:
        raise InvalidRequestError(f"bad images: {e}") from e
    if vision is None:
        if frames:
            raise InvalidRequestError(
                f"{model} is a text-only model: it cannot see the {len(frames)} image(s) sent")
        return [], []
    try:
        return frames, vision.check_prompt(prompt, frames)
    except ValueError as e:
        raise InvalidRequestError(f"image placeholders do not match the images: {e}") from e


class WeightGate:
    """Orders a backend's ``generate`` calls around its weight updates so that every reply
    is generated by one version of the weights and labelled with it.

    A reply runs inside :meth:`generating` (it reads the version there); an update inside
    :meth:`updating`, which stops new replies from starting, waits for the running ones to
    finish under the old weights (the drain), then loads. Replies that arrive meanwhile wait
    and start under the new weights. ``drains``, ``drain_s`` and ``waited_s``: the updates,
    the seconds they spent draining, and the seconds replies spent held at the gate.
    """

    def __init__(self) -> None:
        self.active = 0
        self.drains = 0
        self.drain_s = 0.0
        self.waited_s = 0.0
        self._updating = False
        self._changed: asyncio.Condition | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def closed(self) -> bool:
        """An update holds the gate: new replies wait."""
        return self._updating

    def _cond(self) -> asyncio.Condition:
        loop = asyncio.get_running_loop()
        if self._changed is None or self._loop is not loop:  # one per event loop
            self._changed, self._loop = asyncio.Condition(), loop
        return self._changed

    @contextlib.asynccontextmanager
    async def generating(self) -> AsyncIterator[None]:
        """One reply: waits while an update runs."""
        if self._updating:
            cond, t0 = self._cond(), time.perf_counter()
            async with cond:
                await cond.wait_for(lambda: not self._updating)
            self.waited_s += time.perf_counter() - t0
        self.active += 1
        try:
            yield
        finally:
            self.active -= 1
            if self._updating and not self.active:
                cond = self._cond()
                async with cond:
                    cond.notify_all()

    @contextlib.asynccontextmanager
    async def updating(self) -> AsyncIterator[None]:
        """One weight update: new replies wait, running ones finish first."""
        cond = self._cond()
        async with cond:
            await cond.wait_for(lambda: not self._updating)  # one update at a time
            self._updating = True
            t0 = time.perf_counter()
            await cond.wait_for(lambda: not self.active)
            self.drain_s += time.perf_counter() - t0
            self.drains += 1
        try:
            yield
        finally:
            async with cond:
                self._updating = False
                cond.notify_all()
