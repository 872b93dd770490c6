"""``TransformersBackend``: a local Hugging Face causal LM as an inference backend.

The reference backend: exact, dependency-light (torch + transformers), runs on CPU or one
GPU. Requests that arrive within ``batch_wait_s`` of each other (up to ``max_batch_size``)
are generated together in one left-padded batch with a KV cache, in a hand-written decode
loop that applies each request's own temperature / top-k / top-p / seed / stop tokens.
All model work (generation and weight updates) runs in one worker thread, so the event
loop never blocks and a weight update never lands in the middle of a batch.

Logprobs are ``raw`` by default: log-softmax of the model's logits before temperature and
truncation, the same definition as vLLM's default ``logprobs_mode="raw_logprobs"``; pass
``logprobs_mode="processed"`` for the log-probability under the distribution actually
sampled from (temperature-scaled and truncated; 0 for greedy choices).

A vision-language model folder (one :meth:`agentgym.models.vision.VisionSpec.from_model`
reads, such as ``tiny-vl``) loads as ``AutoModelForImageTextToText`` and takes images:
``generate(..., images=frames)`` with the frames' markup already expanded in the prompt.
The frames of a whole batch go through the model's image processor together, in batch and
prompt order, and into the batch's first forward pass (``pixel_values``,
``pixel_attention_mask``): the model scatters the image features over the image tokens in
the same row-major order; decode steps see tokens only.
"""

from __future__ import annotations

import asyncio
import inspect
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from agentgym.backends.base import (
    BackendError,
    GenerateResult,
    InvalidRequestError,
    SamplingParams,
    check_choices,
    check_images,
    check_prompt,
    choose,
    request_seed,
)
from agentgym.backends.batching import BatchRequest, RequestBatcher


@dataclass(eq=False, kw_only=True)
class _Request(BatchRequest):
    request_id: str
    named: bool = False  # the caller chose request_id (its sampling stream derives from it)
    images: list = field(default_factory=list)  # (h, w, 3) uint8 frames, in prompt order


class TransformersBackend:
    """Generate with a Hugging Face model folder ``model_dir`` (see module docstring).

    ``device`` defaults to CUDA when available, else CPU; ``dtype`` to float32.
    ``seed`` seeds sampling for requests without their own ``SamplingParams.seed``: a
    request with a caller-given ``request_id`` samples from a generator seeded by
    (``seed``, its id), so what it draws does not depend on which requests share its batch
    or their order; requests without an id share one generator seeded by ``seed``.
    """

    needs_context = False
    #: ``generate(..., choices=)`` (valid-action decoding) is served.
    scores_choices = True

    def __init__(
        self,
        model_dir: str | Path,
        *,
        device: str | None = None,
        dtype=None,
        max_batch_size: int = 64,
        batch_wait_s: float = 0.005,
        logprobs_mode: str = "raw",
        seed: int = 0,
    ):
        import torch
        from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, GenerationConfig

        from agentgym.models.vision import VisionSpec

        if logprobs_mode not in ("raw", "processed"):
            raise ValueError(f"logprobs_mode must be 'raw' or 'processed', got {logprobs_mode!r}")
        self._torch = torch
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.model_dir = str(model_dir)
        try:
            #: The model's image markup; None for a text-only model.
            self.vision = VisionSpec.from_model(self.model_dir)
            auto = AutoModelForImageTextToText if self.vision else AutoModelForCausalLM
            model = auto.from_pretrained(self.model_dir)
        except (OSError, ValueError) as e:
            raise BackendError(f"cannot load model from {self.model_dir}: {e}") from e
        self.model = model.to(self.device, dtype or torch.float32).eval()
        cfg = self.model.config
        text_cfg = cfg.get_text_config()
        eos = set()
        for src in (cfg, text_cfg, _generation_config(GenerationConfig, self.model_dir)):
            e = getattr(src, "eos_token_id", None) if src is not None else None
            eos.update([e] if isinstance(e, int) else (e or []))
        self.eos_token_ids = frozenset(eos)
        pad = cfg.pad_token_id if cfg.pad_token_id is not None else text_cfg.pad_token_id
        self.pad_token_id = pad if pad is not None else 0
        self.vocab_size = text_cfg.vocab_size
        self.max_model_len = getattr(text_cfg, "max_position_embeddings", None) or 1 << 30
        self.logprobs_mode = logprobs_mode
        # Only the last position's logits are sampled from: models that take
        # ``logits_to_keep`` skip the LM head over the rest of the prompt.
        self._last_logits_only = (
            {"logits_to_keep": 1}
            if "logits_to_keep" in inspect.signature(self.model.forward).parameters else {})
        self.policy_version = 0
        self._generator = torch.Generator(device="cpu").manual_seed(seed)
        self._choice_draws = 0  # choice requests without an id or seed, for their seeds
        self._batcher: RequestBatcher[_Request] = RequestBatcher(
            self._run_batch,
            self._result,
            lambda: self.policy_version,
            thread_name="agentgym-transformers",
            wait_s=batch_wait_s if batch_wait_s > 0 else None,
            max_batch=max_batch_size,
        )

    @property
    def max_batch_size(self) -> int:
        """The most requests one forward batch takes (set at construction)."""
        return self._batcher.max_batch

    @property
    def batch_wait_s(self) -> float:
        """How long a batch waits for more requests (set at construction)."""
        return self._batcher.wait_s or 0.0

    # ------------------------------------------------------------------ public API
    async def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        request_id: str | None = None,
        *,
        images=None,
        choices=None,
    ) -> GenerateResult:
        """Generate one completion (batched with concurrent calls); cancelling the caller
        aborts the request. ``images``: the frames of the prompt's expanded image markup,
        in order (a vision-language model only; see :class:`~agentgym.backends.Backend`).
        ``choices``: the reply is one of these token lists (valid-action decoding,
        :func:`~agentgym.backends.base.choose`), scored in one forward pass over the prompt
        and all of them on the model's thread."""
        if self._batcher.closed:
            raise BackendError("backend is closed")
        prompt = check_prompt(prompt_ids, self.vocab_size)
        if len(prompt) >= self.max_model_len:
            raise InvalidRequestError(
                f"prompt of {len(prompt)} tokens leaves no room in the model's context "
                f"{self.max_model_len}"
            )
        frames, _ = check_images(prompt, images, self.vision, self.model_dir)
        rid = request_id or uuid.uuid4().hex
        if choices is not None:
            if frames:
                raise InvalidRequestError("choices with images are not served yet")
            options = check_choices(choices, self.vocab_size, self.max_model_len - len(prompt))
            seed = (sampling.seed if sampling.seed is not None else
                    self._request_seed(rid) if request_id is not None else
                    int(self._generator.initial_seed()) + self._choice_draws)
            self._choice_draws += 1
            try:
                logprobs, version = await asyncio.get_running_loop().run_in_executor(
                    self._batcher.executor, self._score_choices, prompt, options)
            except Exception as e:
                raise BackendError(f"scoring the choices failed: {e!r}") from e
            return choose(options, logprobs, sampling, seed, version)
        req = _Request(prompt, sampling, request_id=rid, named=request_id is not None,
                       images=frames)
        return await self._batcher.submit(rid, req)

    async def abort(self, request_id: str) -> None:
        """End ``request_id`` early; its ``generate`` returns the tokens so far with
        ``finish_reason="abort"``. Unknown ids are ignored."""
        self._batcher.abort(request_id)

    async def update_weights(self, state_dict_or_path) -> None:
        """Load new weights in place: a ``{name: tensor}`` state dict (a subset is fine) or
        a path to a ``.safetensors`` file or a folder of them. Waits for the running batch
        (a batch generates under one version: every reply it returns is labelled exactly);
        ``policy_version`` increments when the new weights are live."""
        loop = asyncio.get_running_loop()
        executor = self._batcher.executor

        def load() -> None:  # on the batch thread: the next batch sees the new version
            self._load_weights(state_dict_or_path)
            self.policy_version += 1

        try:
            await loop.run_in_executor(executor, load)
        except BackendError:
            raise
        except Exception as e:  # a tensor of the wrong shape or dtype, an unreadable file
            raise BackendError(f"weight update failed: {e!r}") from e

    async def close(self) -> None:
        """Abort every request, stop the batcher and the worker thread."""
        await self._batcher.close()

    # ------------------------------------------------------------------ batching
    @staticmethod
    def _result(req: _Request, reason: str, version: int) -> GenerateResult:
        return GenerateResult(
            token_ids=req.tokens,
            logprobs=req.logprobs,
            finish_reason=reason,
            policy_version=version,
        )

    # ------------------------------------------------------------------ worker thread
    def _run_batch(self, reqs: list[_Request]) -> list[str]:
        """Generate ``reqs`` together (worker thread); fills each request's tokens and
        logprobs and returns their finish reasons."""
        torch = self._torch
        from transformers import DynamicCache

        n, dev = len(reqs), self.device
        plen = max(len(r.prompt) for r in reqs)
        ids = torch.full((n, plen), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((n, plen), dtype=torch.long)
        for i, r in enumerate(reqs):
            ids[i, plen - len(r.prompt) :] = torch.tensor(r.prompt)
            mask[i, plen - len(r.prompt) :] = 1
        ids, mask = ids.to(dev), mask.to(dev)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        budget = [min(r.sampling.max_new_tokens, self.max_model_len - len(r.prompt)) for r in reqs]
        gens = [
            torch.Generator(device="cpu").manual_seed(r.sampling.seed)
            if r.sampling.seed is not None
            else torch.Generator(device="cpu").manual_seed(self._request_seed(r.request_id))
            if r.named
            else self._generator
            for r in reqs
        ]
        reasons: list[str | None] = [None] * n
        cache = DynamicCache()
        frames = [f for r in reqs for f in r.images]
        # Images enter with the prompts (first forward pass only), in row-major order.
        pixels = (
            {k: v.to(dev) for k, v in self.vision.pixel_inputs(frames).items()}
            if frames else {})
        with torch.inference_mode():
            for _step in range(max(budget)):
                out = self.model(
                    input_ids=ids,
                    attention_mask=mask,
                    position_ids=pos,
                    past_key_values=cache,
                    use_cache=True,
                    **pixels,
                    **self._last_logits_only,
                )
                pixels = {}
                cache = out.past_key_values
                logits = out.logits[:, -1, :].float().cpu()
                raw_lp = torch.log_softmax(logits, dim=-1)
                if self.vision is not None:  # image markup is never sampled
                    logits[:, self.vision.input_only_ids] = float("-inf")
                next_ids = [self.pad_token_id] * n
                for i, r in enumerate(reqs):
                    if reasons[i] is not None:
                        continue
                    if r.aborted:
                        reasons[i] = "abort"
                        continue
                    tok, proc_lp = self._sample(logits[i], r.sampling, gens[i])
                    r.tokens.append(tok)
                    if r.sampling.logprobs:
                        r.logprobs.append(
                            float(raw_lp[i, tok]) if self.logprobs_mode == "raw" else proc_lp
                        )
                    next_ids[i] = tok
                    s = r.sampling
                    if (not s.ignore_eos and tok in self.eos_token_ids) or (
                        tok in s.stop_token_ids
                    ):
                        reasons[i] = "stop"
                    elif len(r.tokens) >= budget[i]:
                        reasons[i] = "length"
                if all(x is not None for x in reasons):
                    break
                ids = torch.tensor(next_ids, dtype=torch.long, device=dev)[:, None]
                mask = torch.cat([mask, torch.ones((n, 1), dtype=mask.dtype, device=dev)], 1)
                pos = pos[:, -1:] + 1
        return [x or "length" for x in reasons]

    def _score_choices(self, prompt: list[int], choices: list[list[int]]
                       ) -> tuple[list[list[float]], int]:
        """Each choice's token logprobs after ``prompt`` (raw: log-softmax of the logits),
        and the weights' version (worker thread): the prompt once, its KV cache repeated
        for every choice, then all choices in one right-padded forward pass."""
        torch = self._torch
        from transformers import DynamicCache

        dev, n, p = self.device, len(choices), len(prompt)
        width = max(len(c) for c in choices)
        toks = torch.full((n, width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((n, p + width), dtype=torch.long)
        mask[:, :p] = 1
        for i, c in enumerate(choices):
            toks[i, :len(c)] = torch.tensor(c)
            mask[i, p:p + len(c)] = 1
        with torch.inference_mode():
            out = self.model(input_ids=torch.tensor([prompt], device=dev),
                             past_key_values=DynamicCache(), use_cache=True,
                             **self._last_logits_only)
            first = torch.log_softmax(out.logits[0, -1].float(), -1).cpu()
            cache = out.past_key_values
            cache.batch_repeat_interleave(n)
            pos = torch.arange(p, p + width, device=dev).expand(n, width)
            out = self.model(input_ids=toks.to(dev), attention_mask=mask.to(dev),
                             position_ids=pos, past_key_values=cache, use_cache=True)
            # row j of a choice's logits predicts its token j + 1
            nxt = torch.log_softmax(out.logits[:, :-1].float(), -1).cpu()
        result = []
        for i, c in enumerate(choices):
            after = nxt[i, torch.arange(len(c) - 1), torch.tensor(c[1:], dtype=torch.long)]
            result.append([float(first[c[0]]), *after.tolist()])
        return result, self.policy_version

    def reseed(self, seed: int) -> None:
        """Seed sampling anew, as ``seed`` does at construction (requests already running
        keep their generators)."""
        self._generator.manual_seed(int(seed))

    def _request_seed(self, request_id: str) -> int:
        """Sampling seed of a named request without its own seed: the backend seed (the
        last :meth:`reseed`) mixed with the request id."""
        return request_seed(int(self._generator.initial_seed()), request_id)

    def _sample(self, logits, s: SamplingParams, gen) -> tuple[int, float]:
        """Sample one token from one row of logits; returns (token, processed logprob)."""
        torch = self._torch
        if s.temperature == 0:
            return int(torch.argmax(logits)), 0.0
        x = logits / s.temperature
        if s.top_k > 0 and s.top_k < x.numel():
            kth = torch.topk(x, s.top_k).values[-1]
            x = x.masked_fill(x < kth, float("-inf"))
        if s.top_p < 1.0:
            sorted_x, order = torch.sort(x, descending=True)
            probs = torch.softmax(sorted_x, -1)
            drop = probs.cumsum(-1) - probs > s.top_p  # keep the smallest prefix reaching p
            x = x.clone()
            x[order[drop]] = float("-inf")
        lp = torch.log_softmax(x, -1)
        tok = int(torch.multinomial(lp.exp(), 1, generator=gen))
        return tok, float(lp[tok])

    def _load_weights(self, src) -> None:
        torch = self._torch
        if isinstance(src, (str, Path)):
            from safetensors.torch import load_file

            p = Path(src)
            files = sorted(p.glob("*.safetensors")) if p.is_dir() else [p]
            if not files or not all(f.is_file() for f in files):
                raise BackendError(f"no safetensors weights at {p}")
            sd = {}
            for f in files:
                sd.update(load_file(str(f)))
        else:
            sd = dict(src)
        params = dict(self.model.state_dict())
        unknown = sorted(set(sd) - set(params))
        if unknown:
            raise BackendError(f"unknown parameter names in update: {unknown[:5]}")
        for name, t in sd.items():  # validate everything before changing anything
            if tuple(t.shape) != tuple(params[name].shape):
                raise BackendError(
                    f"shape mismatch for {name}: {tuple(t.shape)} vs {tuple(params[name].shape)}"
                )
        with torch.no_grad():
            for name, t in sd.items():
                params[name].copy_(t.detach().to(params[name].device, params[name].dtype))


def _generation_config(cls, model_dir: str):
    try:
        return cls.from_pretrained(model_dir)
    except (OSError, ValueError):
        return None
