"""TransformersBackend, the exact reference: batched logprobs match a transformers forward
pass, greedy and seeded sampling reproduce, named requests sample independently of their
batch, stop tokens, abort and cancel, bad input and weight updates."""

from __future__ import annotations

import asyncio

import pytest
import pytest_asyncio

from agentgym.backends import BackendError, InvalidRequestError, SamplingParams, make_backend
from tests.backends.helpers import LONG, MODULE_LOOP, PROMPT, assert_consistent, prompts


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def tf_backend(tiny_model_dir):
    pytest.importorskip("transformers")
    backend = make_backend("transformers", tiny_model_dir, max_batch_size=16)
    yield backend
    await backend.close()


@MODULE_LOOP
async def test_transformers_batched_logprobs_match_forward(tf_backend):
    ps = prompts(12)
    results = await asyncio.gather(
        *[
            tf_backend.generate(p, SamplingParams(max_new_tokens=12, seed=i))
            for i, p in enumerate(ps)
        ]
    )
    for p, r in zip(ps, results, strict=True):
        assert r.finish_reason in ("stop", "length")
        assert 1 <= len(r.token_ids) <= 12
        assert_consistent(tf_backend.model, p, r, 1e-4)


@MODULE_LOOP
async def test_transformers_greedy_and_seeded_are_reproducible(tf_backend):
    greedy = SamplingParams(max_new_tokens=8, temperature=0)
    alone = await tf_backend.generate(PROMPT, greedy)
    batched = await asyncio.gather(*[tf_backend.generate(p, greedy) for p in [PROMPT, *prompts(5)]])
    assert batched[0].token_ids == alone.token_ids  # batching and padding do not change it
    seeded = SamplingParams(max_new_tokens=8, seed=42, top_k=50, top_p=0.9, temperature=0.7)
    a, b = await asyncio.gather(
        tf_backend.generate(PROMPT, seeded), tf_backend.generate(PROMPT, seeded)
    )
    assert a.token_ids == b.token_ids


@MODULE_LOOP
async def test_transformers_named_requests_sample_independently_of_their_batch(tf_backend):
    """Without their own seed, requests with a caller-given id draw from (backend seed, id):
    the same tokens whatever requests share the batch and in whatever order they came."""
    sp = SamplingParams(max_new_tokens=10, temperature=1.0)
    ps = prompts(4)
    ids = [f"req-{i}" for i in range(4)]

    async def run(order):
        tf_backend._generator.manual_seed(5)
        out = await asyncio.gather(*[tf_backend.generate(ps[i], sp, request_id=ids[i])
                                     for i in order])
        return {i: r.token_ids for i, r in zip(order, out, strict=True)}

    forward, backward = await run([0, 1, 2, 3]), await run([3, 2, 1, 0])
    tf_backend._generator.manual_seed(5)
    alone = (await tf_backend.generate(ps[2], sp, request_id=ids[2])).token_ids
    assert forward == backward and alone == forward[2]
    assert len({tuple(t) for t in forward.values()}) == 4
    tf_backend._generator.manual_seed(6)  # another backend seed: other samples
    assert (await tf_backend.generate(ps[2], sp, request_id=ids[2])).token_ids != alone


@MODULE_LOOP
async def test_transformers_stop_tokens(tf_backend):
    greedy = SamplingParams(max_new_tokens=8, temperature=0, ignore_eos=True)
    full = await tf_backend.generate(PROMPT, greedy)
    stop = full.token_ids[2]
    cut = await tf_backend.generate(
        PROMPT, SamplingParams(max_new_tokens=8, temperature=0, stop_token_ids=[stop])
    )
    first = full.token_ids.index(stop)
    assert cut.token_ids == full.token_ids[: first + 1]
    assert cut.finish_reason == "stop"


@MODULE_LOOP
async def test_transformers_abort_and_cancel(tf_backend):
    task = asyncio.create_task(tf_backend.generate(PROMPT, LONG, request_id="long-1"))
    await asyncio.sleep(0.3)
    await tf_backend.abort("long-1")
    res = await asyncio.wait_for(task, 60)
    assert res.finish_reason == "abort" and len(res.token_ids) < LONG.max_new_tokens
    task = asyncio.create_task(tf_backend.generate(PROMPT, LONG, request_id="long-2"))
    await asyncio.sleep(0.3)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await tf_backend.abort("unknown-id")  # ignored
    res = await asyncio.wait_for(tf_backend.generate(PROMPT, SamplingParams(max_new_tokens=3)), 60)
    assert len(res.token_ids) <= 3


@MODULE_LOOP
async def test_transformers_bad_input(tf_backend, tmp_path):
    """Rejected requests and failed weight updates raise BackendError (the protocol's one
    failure type, which the engine records as ``backend_error``)."""
    with pytest.raises(InvalidRequestError, match="empty"):
        await tf_backend.generate([], SamplingParams())
    with pytest.raises(InvalidRequestError, match="out of range"):
        await tf_backend.generate([10**6], SamplingParams())
    with pytest.raises(InvalidRequestError, match="no room"):
        await tf_backend.generate(PROMPT * (tf_backend.max_model_len // len(PROMPT) + 1),
                                  SamplingParams())
    with pytest.raises(BackendError):
        await tf_backend.update_weights(tmp_path / "missing")
    with pytest.raises(BackendError, match="unknown parameter"):
        await tf_backend.update_weights({"not.a.weight": None})
    corrupt = tmp_path / "corrupt.safetensors"
    corrupt.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not a header")
    with pytest.raises(BackendError, match="weight update failed"):
        await tf_backend.update_weights(corrupt)
    assert issubclass(InvalidRequestError, BackendError) and issubclass(
        InvalidRequestError, ValueError)


@MODULE_LOOP
async def test_transformers_update_weights(tf_backend, tiny_model_dir):
    import torch

    greedy = SamplingParams(max_new_tokens=8, temperature=0)
    before = await tf_backend.generate(PROMPT, greedy)
    v0 = tf_backend.policy_version
    g = torch.Generator().manual_seed(1)
    sd = {
        k: v + 0.05 * torch.randn(v.shape, generator=g)
        for k, v in tf_backend.model.state_dict().items()
    }
    await tf_backend.update_weights(sd)
    after = await tf_backend.generate(PROMPT, greedy)
    assert tf_backend.policy_version == v0 + 1 and after.policy_version == v0 + 1
    assert after.logprobs != before.logprobs
    assert_consistent(tf_backend.model, PROMPT, after, 1e-4)
    await tf_backend.update_weights(tiny_model_dir)  # a model folder restores the original
    again = await tf_backend.generate(PROMPT, greedy)
    assert again.token_ids == before.token_ids and again.logprobs == before.logprobs
