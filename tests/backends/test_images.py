"""Images through the backends (``generate(..., images=frames)``) with tiny-vl: the
transformers backend against a forward pass of the model, the rejected requests
(InvalidRequestError), the scripted backend, the OpenAI client's wire format against a
fake token endpoint, and (marked ``vllm``) the in-process vLLM engine and the vLLM server,
cross-checked against transformers."""

from __future__ import annotations

import asyncio
import base64
import io

import numpy as np
import pytest
import pytest_asyncio

from agentgym.backends import BackendError, InvalidRequestError, SamplingParams, make_backend
from agentgym.models.vision import VisionSpec
from tests.backends.helpers import MODULE_LOOP, VLLM_WARNINGS, _import_vllm

GREEDY = SamplingParams(max_new_tokens=6, temperature=0)


def _frame(h: int, w: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


F1, F2, F3 = _frame(28, 28, 0), _frame(56, 84, 1), _frame(56, 56, 2)


@pytest.fixture(scope="module")
def spec(tiny_vl_dir) -> VisionSpec:
    return VisionSpec.from_model(tiny_vl_dir)


@pytest.fixture(scope="module")
def requests(spec):
    """(prompt, frames) pairs: two images, one image, no image (a text-only request to the
    vision-language model); prompts with the markup already expanded."""
    m = spec.markup_ids(28, 28)  # tiny-vl's markup is the same for every frame size
    return [
        ([1, 826, 201] + m + [813] + m + [2, 201, 1, 400, 201], [F1, F2]),
        ([1, 300, 201, 45] + m + [2, 201, 1, 400, 201], [F3]),
        ([1, 5, 6, 7, 201], None),
    ]


@pytest.fixture(scope="module")
def hf_vl(tiny_vl_dir):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoModelForImageTextToText.from_pretrained(tiny_vl_dir).eval()


def vl_ref_logprobs(model, spec, prompt, frames, tokens) -> list[float]:
    """Raw logprobs of ``tokens`` after ``prompt`` with ``frames``: one forward pass."""
    import torch

    pixels = spec.pixel_inputs(frames) if frames else {}
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + tokens]), **pixels).logits[0]
    lp = logits.float().log_softmax(-1)
    return [float(lp[len(prompt) - 1 + j, t]) for j, t in enumerate(tokens)]


def assert_matches_reference(model, spec, prompt, frames, res, tol):
    assert len(res.logprobs) == len(res.token_ids) >= 1
    ref = vl_ref_logprobs(model, spec, prompt, frames, res.token_ids)
    err = max(abs(a - b) for a, b in zip(ref, res.logprobs, strict=True))
    assert err < tol, err
    return err


async def _check_rejected(backend, spec, requests):
    """Every way to get images wrong raises InvalidRequestError before generating."""
    (p2, _), (p1, _), (text, _) = requests
    cases = [
        (p2, [F1], "2 image placeholder spans but 1 images"),
        (p1, [F1, F2], "1 image placeholder spans but 2 images"),
        (p1, None, "1 image placeholder spans but 0 images"),
        (text, [F1], "0 image placeholder spans but 1 images"),
        (p1, [F1.astype(np.float32)], "dtype"),
        (p1, [F1[:, :, :2]], "shape"),
        (p1, F1, "not one array"),
        (text[:2] + [spec.image_token_id] + text[2:], None, "outside any image markup"),
        (p1[:6], [F1], "not whole"),
    ]
    for prompt, frames, match in cases:
        with pytest.raises(InvalidRequestError, match=match):
            await backend.generate(prompt, GREEDY, images=frames)


# ---------------------------------------------------------------- transformers
@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def tf_vl(tiny_vl_dir):
    pytest.importorskip("transformers")
    backend = make_backend("transformers", tiny_vl_dir, max_batch_size=8)
    yield backend
    await backend.close()


@MODULE_LOOP
async def test_transformers_images_batched_match_a_forward_pass(tf_vl, hf_vl, spec, requests):
    """Image and text requests batched together: each one's logprobs are a forward pass's
    over its own prompt and frames, and the batch changes nothing (greedy and seeded)."""
    assert tf_vl.vision == spec
    for sampling in (GREEDY, SamplingParams(max_new_tokens=8, seed=5)):
        batched = await asyncio.gather(
            *[tf_vl.generate(p, sampling, images=f) for p, f in requests])
        for (p, f), res in zip(requests, batched, strict=True):
            assert_matches_reference(hf_vl, spec, p, f, res, 1e-4)
            alone = await tf_vl.generate(p, sampling, images=f)
            assert alone.token_ids == res.token_ids
    # The frames matter: another picture, other logprobs.
    p, _ = requests[1]
    a = await tf_vl.generate(p, GREEDY, images=[F3])
    b = await tf_vl.generate(p, GREEDY, images=[F1])
    assert a.logprobs != b.logprobs


@MODULE_LOOP
async def test_transformers_rejects_bad_image_requests(tf_vl, spec, requests):
    await _check_rejected(tf_vl, spec, requests)
    res = await tf_vl.generate(requests[0][0], GREEDY, images=requests[0][1])
    assert len(res.token_ids) >= 1  # still serving


async def _sampled_ids(backend, requests) -> list[int]:
    """Every token of 12 long seeded samples (EOS ignored) of the image requests."""
    sampling = [SamplingParams(max_new_tokens=256, seed=k, ignore_eos=True) for k in range(12)]
    outs = await asyncio.gather(*[backend.generate(requests[k % len(requests)][0], s,
                                                   images=requests[k % len(requests)][1])
                                  for k, s in enumerate(sampling)])
    return [t for o in outs for t in o.token_ids]


def _image_markup_mass(model, spec, requests) -> float:
    """The untrained model's mean probability of the image markup ids as the next token."""
    import torch

    prompt, frames = requests[0]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt]),
                       **spec.pixel_inputs(frames)).logits[0].float()
    return float(torch.softmax(logits, -1)[:, spec.input_only_ids].sum(-1).mean())


@MODULE_LOOP
async def test_transformers_never_samples_image_markup(tf_vl, hf_vl, spec, requests):
    """3,072 sampled tokens hold none of the markup ids, which the untrained model would
    otherwise sample about 3 times per 1,000 tokens."""
    assert _image_markup_mass(hf_vl, spec, requests) > 1e-3
    assert not set(await _sampled_ids(tf_vl, requests)) & set(spec.input_only_ids)


@MODULE_LOOP
async def test_text_only_model_cannot_see_images(tiny_model_dir, requests):
    backend = make_backend("transformers", tiny_model_dir)
    try:
        assert backend.vision is None
        with pytest.raises(InvalidRequestError, match="text-only"):
            await backend.generate([1, 5, 6], GREEDY, images=[F1])
        assert len((await backend.generate([1, 5, 6], GREEDY, images=[])).token_ids) >= 1
    finally:
        await backend.close()


# ---------------------------------------------------------------- scripted
@MODULE_LOOP
async def test_scripted_backend_ignores_images(tiny_model_dir):
    from transformers import AutoTokenizer

    class Driver:
        async def oracle_action(self, slot):
            return "move north"

    backend = make_backend("scripted", tokenizer=AutoTokenizer.from_pretrained(tiny_model_dir))
    ctx = (Driver(), 0, 0, 0)
    with_images = await backend.generate([1, 2], GREEDY, context=ctx, images=[F1])
    assert with_images.token_ids == (await backend.generate([1, 2], GREEDY, context=ctx)).token_ids


# ---------------------------------------------------------------- OpenAI client, no vLLM
async def _token_server(handler):
    """An aiohttp server on 127.0.0.1 answering vLLM's token endpoint with ``handler``
    (and an OpenAPI schema that lists it); its runner and base URL."""
    from aiohttp import web

    from agentgym.backends.openai_backend import TOKENS_PATH

    async def openapi(request):
        return web.json_response({"paths": {TOKENS_PATH: {}}})

    app = web.Application()
    app.router.add_get("/openapi.json", openapi)
    app.router.add_post(TOKENS_PATH, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"


@MODULE_LOOP
async def test_openai_images_go_to_the_token_endpoint_as_png(tiny_vl_dir, spec, requests):
    """The body carries the collapsed prompt (one ``<image>`` per image), each frame as a
    lossless PNG data URL, and asks for the server's expanded prompt, which must equal the
    one the engine sent: a server that expands differently is a BackendError."""
    from aiohttp import web
    from PIL import Image

    from agentgym.backends.openai_backend import OpenAIBackend

    seen: list[dict] = []
    expand = {"right": True}

    async def handler(request):
        body = await request.json()
        seen.append(body)
        prompt = requests[0][0] if expand["right"] else requests[0][0][:-1]
        return web.json_response({
            "prompt_token_ids": prompt,
            "choices": [{"token_ids": [7, 2], "finish_reason": "stop",
                         "logprobs": {"content": [{"logprob": -1.0}, {"logprob": -2.0}]}}]})

    runner, url = await _token_server(handler)
    backend = OpenAIBackend(url, "served-name", model_dir=tiny_vl_dir, max_retries=0)
    try:
        prompt, frames = requests[0]
        res = await backend.generate(prompt, SamplingParams(max_new_tokens=4), images=frames)
        assert res.token_ids == [7, 2] and res.logprobs == [-1.0, -2.0]
        body = seen[-1]
        assert body["token_ids"] == spec.collapse(prompt)
        assert body["token_ids"].count(spec.image_token_id) == 2 and body["return_token_ids"]
        assert body["model"] == "served-name"
        for part, frame in zip(body["content_parts"], frames, strict=True):
            assert part["type"] == "image_url"
            head, data = part["url"].split(",", 1)
            assert head == "data:image/png;base64"
            img = np.asarray(Image.open(io.BytesIO(base64.b64decode(data))))
            assert np.array_equal(img, frame)
        text = await backend.generate(requests[2][0], SamplingParams(max_new_tokens=4))
        assert text.token_ids == [7, 2] and "content_parts" not in seen[-1]
        expand["right"] = False
        with pytest.raises(BackendError, match="expanded the image placeholders"):
            await backend.generate(prompt, SamplingParams(max_new_tokens=4), images=frames)
    finally:
        await backend.close()
        await runner.cleanup()


@MODULE_LOOP
async def test_openai_rejects_images_it_cannot_send(tiny_vl_dir, tiny_model_dir, spec, requests):
    """Over /v1/completions (no multimodal field), to a text-only model, to a model whose
    folder the client cannot read, and every malformed request: InvalidRequestError, with
    no server involved."""
    from agentgym.backends.openai_backend import OpenAIBackend, free_port

    url = f"http://127.0.0.1:{free_port()}"
    prompt, frames = requests[1]
    completions = OpenAIBackend(url, tiny_vl_dir, api="completions")
    with pytest.raises(InvalidRequestError, match="cannot send images with token ids over"):
        await completions.generate(prompt, GREEDY, images=frames)
    await _check_rejected(completions, spec, requests)
    for model, kw, match in ((tiny_model_dir, {}, "text-only model"),
                             ("served-name", {}, "pass model_dir")):
        backend = OpenAIBackend(url, model, **kw)
        with pytest.raises(InvalidRequestError, match=match):
            await backend.generate(prompt, GREEDY, images=frames)
        await backend.close()
    await completions.close()


# ---------------------------------------------------------------- vLLM in process
@pytest_asyncio.fixture(scope="class", loop_scope="module")
async def vllm_vl(tiny_vl_dir):
    _import_vllm()
    backend = make_backend("vllm", tiny_vl_dir, max_model_len=1024, max_num_seqs=16,
                           kv_cache_space_gib=1, enforce_eager=True, max_images_per_prompt=4)
    yield backend
    await backend.close()


@pytest.mark.vllm
@pytest.mark.slow
class TestVLLMImages:
    pytestmark = VLLM_WARNINGS

    @MODULE_LOOP
    async def test_never_samples_image_markup(self, vllm_vl, hf_vl, spec, requests):
        assert _image_markup_mass(hf_vl, spec, requests) > 1e-3
        assert not set(await _sampled_ids(vllm_vl, requests)) & set(spec.input_only_ids)

    @MODULE_LOOP
    async def test_logprobs_match_transformers(self, vllm_vl, tf_vl, hf_vl, spec, requests):
        """Greedy: the same tokens as the transformers backend, logprobs within 2e-3 (as the
        text cross-checks); seeded: logprobs within 2e-3 of a forward pass."""
        assert vllm_vl.vision == spec
        ours = await asyncio.gather(*[vllm_vl.generate(p, GREEDY, images=f) for p, f in requests])
        ref = await asyncio.gather(*[tf_vl.generate(p, GREEDY, images=f) for p, f in requests])
        for a, b in zip(ours, ref, strict=True):
            assert a.token_ids == b.token_ids
            assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 2e-3
        sampled = await asyncio.gather(*[
            vllm_vl.generate(p, SamplingParams(max_new_tokens=12, seed=i), images=f)
            for i, (p, f) in enumerate(requests)])
        for (p, f), res in zip(requests, sampled, strict=True):
            assert_matches_reference(hf_vl, spec, p, f, res, 2e-3)

    @MODULE_LOOP
    async def test_expanded_prompts_are_collapsed_for_vllm(self, vllm_vl, spec, requests):
        """Why the backend collapses: sent as is, vLLM expands the expanded markup again
        (each ``<image>`` token of the first image takes one image); collapsed, vLLM's own
        expansion is exactly the prompt the engine stores."""
        from vllm import SamplingParams as VSP
        from vllm.inputs import TokensPrompt

        prompt, frames = requests[0]

        async def prompt_seen(ids):
            final = None
            async for out in vllm_vl.engine.generate(
                    TokensPrompt(prompt_token_ids=ids, multi_modal_data={"image": frames}),
                    VSP(max_tokens=1, detokenize=False), f"raw-{len(ids)}"):
                final = out
            return list(final.prompt_token_ids)

        assert await prompt_seen(spec.collapse(prompt)) == prompt
        again = await prompt_seen(prompt)
        assert again != prompt and len(again) > len(prompt)

    @MODULE_LOOP
    async def test_rejects_bad_image_requests(self, vllm_vl, spec, requests):
        await _check_rejected(vllm_vl, spec, requests)
        m = spec.markup_ids(28, 28)
        assert vllm_vl.max_images_per_prompt == 4
        with pytest.raises(InvalidRequestError, match="5 images exceed the engine's 4"):
            await vllm_vl.generate([1] + m * 5 + [2], GREEDY, images=[F1] * 5)
        assert await vllm_vl.num_unfinished_requests() == 0
        res = await vllm_vl.generate(requests[0][0], GREEDY, images=requests[0][1])
        assert len(res.token_ids) >= 1


# ---------------------------------------------------------------- vLLM server
@pytest.fixture(scope="class")
def vl_server(tiny_vl_dir):
    _import_vllm()
    from agentgym.backends.openai_backend import launch_vllm_server

    with launch_vllm_server(tiny_vl_dir, max_model_len=1024, max_num_seqs=16, kv_cache_space_gib=1,
                            enforce_eager=True) as server:
        yield server


@pytest.mark.vllm
@pytest.mark.slow
class TestVLLMServerImages:
    pytestmark = VLLM_WARNINGS

    @MODULE_LOOP
    async def test_token_endpoint_images_match_transformers(self, vl_server, tf_vl, requests):
        client = make_backend("openai", vl_server.model, base_url=vl_server.base_url)
        try:
            ours = await asyncio.gather(
                *[client.generate(p, GREEDY, images=f) for p, f in requests])
            assert client.api == "tokens"
            ref = await asyncio.gather(
                *[tf_vl.generate(p, GREEDY, images=f) for p, f in requests])
            for a, b in zip(ours, ref, strict=True):
                assert a.token_ids == b.token_ids
                assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 2e-3
        finally:
            await client.close()
