"""Inference backends: protocol types, TransformersBackend (exact reference), OpenAIBackend's
retries against a fault-injecting server, and (marked ``vllm``) the in-process vLLM engine
and the vLLM OpenAI-compatible server, each cross-checked against a transformers forward
pass; ``LLMAgent`` with the ``openai`` backend against that server."""

from __future__ import annotations

import asyncio

import pytest
import pytest_asyncio

from agentgym.backends import (
    BackendError,
    GenerateResult,
    InvalidRequestError,
    SamplingParams,
    make_backend,
)
from agentgym.errors import AgentGymError

MODULE_LOOP = pytest.mark.asyncio(loop_scope="module")
# Deprecation noise that vLLM's lazy imports trigger inside torch (not ours to fix).
VLLM_WARNINGS = [
    pytest.mark.filterwarnings("ignore:.*torch.jit.script_method.*:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:.*torch.distributed.reduce_op.*:FutureWarning"),
]

PROMPT = [1, 803, 201, 302, 287, 16, 2, 201, 1, 798, 201, 43, 291, 28, 2, 201, 1, 802, 201]
LONG = SamplingParams(max_new_tokens=900, ignore_eos=True)


def prompts(n: int) -> list[list[int]]:
    """``n`` distinct prompts of different lengths (batched with left padding)."""
    return [PROMPT[: 5 + i % 11] + [3 + (7 * i) % 500] * (1 + i % 4) for i in range(n)]


def ref_logprobs(model, prompt: list[int], tokens: list[int]) -> list[float]:
    """Raw logprobs of ``tokens`` after ``prompt`` from one transformers forward pass."""
    import torch

    with torch.no_grad():
        lp = model(torch.tensor([prompt + tokens])).logits[0].float().log_softmax(-1)
    return [float(lp[len(prompt) - 1 + j, t]) for j, t in enumerate(tokens)]


def _mask_runs(mask) -> list[tuple[int, int, int]]:
    """Maximal runs of equal loss-mask value: [(mask, start, end), ...]."""
    out: list[list[int]] = []
    for i, m in enumerate(mask):
        if out and out[-1][0] == m:
            out[-1][2] = i + 1
        else:
            out.append([m, i, i + 1])
    return [tuple(r) for r in out]


def assert_consistent(model, prompt, res: GenerateResult, tol: float):
    assert len(res.logprobs) == len(res.token_ids)
    ref = ref_logprobs(model, prompt, res.token_ids)
    assert max(abs(a - b) for a, b in zip(ref, res.logprobs, strict=True)) < tol


# ---------------------------------------------------------------- protocol types
def test_sampling_params_validation():
    with pytest.raises(ValueError, match="max_new_tokens"):
        SamplingParams(max_new_tokens=0)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)
    assert issubclass(BackendError, AgentGymError)


def test_make_backend_unknown():
    with pytest.raises(ValueError, match="unknown backend"):
        make_backend("nope", "/x")


# ---------------------------------------------------------------- transformers
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


# ---------------------------------------------------------------- OpenAI client, no vLLM
@MODULE_LOOP
async def test_openai_backend_server_down_is_clear_error():
    from agentgym.backends.openai_backend import OpenAIBackend, free_port

    backend = OpenAIBackend(f"http://127.0.0.1:{free_port()}", "m", max_retries=2, backoff_s=0.01)
    with pytest.raises(BackendError, match="unreachable"):
        await backend.generate(PROMPT, SamplingParams(max_new_tokens=4))
    await backend.close()


@MODULE_LOOP
async def test_openai_backend_retries_5xx_with_fresh_request_ids():
    web = pytest.importorskip("aiohttp.web")
    from agentgym.backends.openai_backend import OpenAIBackend

    seen: list[dict] = []

    async def completions(request):
        body = await request.json()
        seen.append(body)
        if len(seen) < 3:  # fault injection: two server errors, then a real answer
            return web.Response(status=503, text="overloaded")
        n = body["max_tokens"]
        return web.json_response(
            {
                "choices": [
                    {
                        "token_ids": list(range(5, 5 + n)),
                        "finish_reason": "length",
                        "logprobs": {"token_logprobs": [-1.5] * n},
                    }
                ]
            }
        )

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    backend = OpenAIBackend(f"http://127.0.0.1:{port}", "m", max_retries=3, backoff_s=0.01)
    try:
        res = await backend.generate(PROMPT, SamplingParams(max_new_tokens=4), request_id="r")
        assert res.token_ids == [5, 6, 7, 8] and res.logprobs == [-1.5] * 4
        assert len(seen) == 3
        ids = [b["request_id"] for b in seen]
        assert len(set(ids)) == 3 and all(i.startswith("r-") for i in ids)
        assert seen[0]["prompt"] == PROMPT and seen[0]["return_token_ids"] is True
        assert seen[0]["logprobs"] == 1
    finally:
        await backend.close()
        await runner.cleanup()


@MODULE_LOOP
async def test_openai_backend_bad_responses_are_backend_errors():
    """A 200 whose body is not JSON, a malformed completion, a 4xx and a call after close
    each raise BackendError (not the JSON decoder's, httpx's or a RuntimeError)."""
    web = pytest.importorskip("aiohttp.web")
    from agentgym.backends.openai_backend import OpenAIBackend

    answers = {
        "not-json": lambda: web.Response(status=200, text="<html>oops</html>"),
        "list-choice": lambda: web.json_response({"choices": [[1, 2]]}),
        "bad-request": lambda: web.Response(status=400, text="prompt too long"),
    }

    async def completions(request):
        body = await request.json()
        return answers[body["request_id"].split("/")[0]]()

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    backend = OpenAIBackend(f"http://127.0.0.1:{port}", "m", max_retries=0)
    try:
        for rid, match in [("not-json", "not JSON"), ("list-choice", "malformed"),
                           ("bad-request", "400")]:
            with pytest.raises(BackendError, match=match):
                await backend.generate(PROMPT, SamplingParams(max_new_tokens=4),
                                       request_id=f"{rid}/1")
    finally:
        await backend.close()
        await runner.cleanup()
    with pytest.raises(BackendError, match="closed"):
        await backend.generate(PROMPT, SamplingParams(max_new_tokens=4))


@MODULE_LOOP
async def test_openai_backend_cancel_closes_the_connection():
    """Cancelling ``generate`` must close its HTTP connection at once: that is the only way
    an OpenAI-compatible server (vLLM's included) learns to abort the request. A raw TCP
    server on 127.0.0.1 reads the request, never answers, and records the client's EOF."""
    from agentgym.backends.openai_backend import OpenAIBackend

    got_request, closed = asyncio.Event(), asyncio.Event()

    async def handle(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        got_request.set()
        while await reader.read(4096):  # b"" once the client closed the connection
            pass
        closed.set()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    backend = OpenAIBackend(f"http://127.0.0.1:{port}", "m", max_retries=0)
    try:
        task = asyncio.ensure_future(backend.generate(PROMPT, SamplingParams(max_new_tokens=4)))
        await asyncio.wait_for(got_request.wait(), 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # Closed by the time the cancelled call returned (no further loop turns needed).
        await asyncio.sleep(0)
        assert closed.is_set() or await asyncio.wait_for(closed.wait(), 5) is True
    finally:
        await backend.close()
        server.close()
        await server.wait_closed()


# ---------------------------------------------------------------- vLLM (in-process, server)
def _import_vllm():
    """Import vllm (skip the test only if that fails); its import-time FutureWarnings from
    torch are not ours to fix."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            import vllm  # noqa: F401
        except ImportError as e:
            pytest.skip(f"vllm not importable: {e}")


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir):
    """A transformers copy of the tiny model, the reference for logprob checks."""
    transformers = pytest.importorskip("transformers")
    return transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()


async def _wait_until(pred, timeout_s: float = 30.0):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await pred():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def _check_concurrent(backend, hf_model, n: int):
    ps = prompts(n)
    results = await asyncio.gather(
        *[
            backend.generate(p, SamplingParams(max_new_tokens=16, seed=i), request_id=f"c{i}")
            for i, p in enumerate(ps)
        ]
    )
    for p, r in zip(ps, results, strict=True):
        assert r.finish_reason in ("stop", "length") and 1 <= len(r.token_ids) <= 16
        assert_consistent(hf_model, p, r, 2e-3)
    return results


async def _check_abort(backend):
    """Abort a long request while short ones run beside it, then cancel another; nothing
    stays in the engine. The abort is certain to come first: it is sent once the short
    requests are done and the engine reports the long one (900 tokens) as its only
    unfinished request, with no await between that reading and the abort (vLLM's client
    side ends the request at once, whatever its engine process sends after)."""
    long = asyncio.create_task(backend.generate(PROMPT, LONG, request_id="to-abort"))
    short = await asyncio.gather(
        *[backend.generate(p, SamplingParams(max_new_tokens=8)) for p in prompts(8)])
    assert all(1 <= len(r.token_ids) <= 8 for r in short)
    assert await backend.num_unfinished_requests() == 1 and not long.done()
    await backend.abort("to-abort")
    res = await asyncio.wait_for(long, 60)
    assert res.finish_reason == "abort" and len(res.token_ids) < LONG.max_new_tokens
    assert len(res.logprobs) == len(res.token_ids)
    assert await backend.num_unfinished_requests() == 0

    async def started():
        return await backend.num_unfinished_requests() == 1

    cancelled = asyncio.create_task(backend.generate(PROMPT, LONG, request_id="to-cancel"))
    await _wait_until(started, timeout_s=120)
    cancelled.cancel()  # no await since the engine reported it unfinished
    with pytest.raises(asyncio.CancelledError):
        await cancelled

    async def drained():
        return await backend.num_unfinished_requests() == 0

    # Generous: on a loaded machine the engine may take a while to drop its requests.
    await _wait_until(drained, timeout_s=180)
    res = await backend.generate(PROMPT, SamplingParams(max_new_tokens=4))
    assert 1 <= len(res.token_ids) <= 4


@pytest_asyncio.fixture(scope="class", loop_scope="module")
async def vllm_backend(tiny_model_dir):
    _import_vllm()
    backend = make_backend(
        "vllm",
        tiny_model_dir,
        max_model_len=1024,
        max_num_seqs=64,
        kv_cache_space_gib=1,
        enforce_eager=True,
    )
    yield backend
    await backend.close()


@pytest.mark.vllm
@pytest.mark.slow
class TestVLLMInProcess:
    pytestmark = VLLM_WARNINGS

    @MODULE_LOOP
    async def test_concurrent_generate_logprobs(self, vllm_backend, hf_model):
        await _check_concurrent(vllm_backend, hf_model, 48)

    @MODULE_LOOP
    async def test_abort_and_cancel(self, vllm_backend):
        await _check_abort(vllm_backend)

    @MODULE_LOOP
    async def test_rejected_requests_raise_backend_error(self, vllm_backend):
        """A prompt with no room in max_model_len, an out-of-vocabulary id (both checked
        before the engine) and sampling parameters vLLM itself rejects (temperature above
        2) raise BackendError; the engine serves the next request."""
        too_long = PROMPT * (vllm_backend.max_model_len // len(PROMPT) + 1)
        with pytest.raises(InvalidRequestError, match="no room"):
            await vllm_backend.generate(too_long, SamplingParams(max_new_tokens=4))
        with pytest.raises(InvalidRequestError, match="out of range"):
            await vllm_backend.generate([vllm_backend.vocab_size], SamplingParams())
        with pytest.raises(BackendError, match="temperature") as raised:
            await vllm_backend.generate(PROMPT, SamplingParams(max_new_tokens=4, temperature=2.5))
        assert raised.value.__cause__ is not None  # vLLM's own error, chained
        res = await vllm_backend.generate(PROMPT, SamplingParams(max_new_tokens=4))
        assert 1 <= len(res.token_ids) <= 4

    @MODULE_LOOP
    async def test_update_weights_reloads(self, vllm_backend, hf_model, tiny_model_dir):
        import torch
        from safetensors.torch import load_file

        greedy = SamplingParams(max_new_tokens=8, temperature=0)
        before = await vllm_backend.generate(PROMPT, greedy)
        original = load_file(f"{tiny_model_dir}/model.safetensors")
        g = torch.Generator().manual_seed(3)
        new = {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in original.items()}
        v0 = vllm_backend.policy_version
        await vllm_backend.update_weights(new)
        assert vllm_backend.policy_version == v0 + 1
        after = await vllm_backend.generate(PROMPT, greedy)
        assert after.logprobs != before.logprobs and after.policy_version == v0 + 1
        hf_model.load_state_dict(new)
        try:
            assert_consistent(hf_model, PROMPT, after, 2e-3)  # the new weights serve it
        finally:
            hf_model.load_state_dict(original)
        await vllm_backend.update_weights(tiny_model_dir)
        again = await vllm_backend.generate(PROMPT, greedy)
        assert again.token_ids == before.token_ids


    @MODULE_LOOP
    async def test_close_ends_cleanly(self, vllm_backend, caplog):
        """Last in the class: it closes the class's engine. A request in flight at close
        raises BackendError, later calls too, and the shutdown logs no error: vLLM's output
        handler is stopped before the engine core goes, and the engine processes get time
        to exit. A stand-in makes the race that
        vLLM's own order (engine core first, its output handler after, from a worker
        thread) leaves open certain to show: the core client's shutdown returns 0.5 s late,
        so a handler still running would read the client's EngineDeadError and log it."""
        import logging
        import time

        core = vllm_backend.engine.engine_core
        real_shutdown = core.shutdown

        def late_shutdown(*args, **kwargs):  # runs in close()'s worker thread
            real_shutdown(*args, **kwargs)
            time.sleep(0.5)

        core.shutdown = late_shutdown

        async def started():
            return await vllm_backend.num_unfinished_requests() == 1

        pending = asyncio.create_task(vllm_backend.generate(PROMPT, LONG, request_id="at-close"))
        await _wait_until(started, timeout_s=120)
        with caplog.at_level(logging.WARNING):
            await vllm_backend.close()
            await asyncio.wait([pending], timeout=60)
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert errors == []
        # The engine processes exited by themselves (a killed worker leaks shared memory).
        assert not [r for r in caplog.records if "force killing" in r.getMessage()]
        with pytest.raises(BackendError):
            pending.result()
        with pytest.raises(BackendError, match="closed"):
            await vllm_backend.generate(PROMPT, SamplingParams(max_new_tokens=4))


#: The served context: room for a request far too long to finish before it is aborted (the
#: tiny model makes ~2k tokens/s on CPU). It exceeds the tiny model's 4,096 positions, which
#: vLLM allows with VLLM_ALLOW_LONG_MAX_MODEL_LEN (rotary positions extrapolate); only the
#: abort test goes past 4,096 tokens and it checks no logprobs.
SERVER_LEN = 16384
HUGE = SamplingParams(max_new_tokens=SERVER_LEN - 64, ignore_eos=True)


@pytest.fixture(scope="class")
def vllm_server(tiny_model_dir):
    _import_vllm()
    from agentgym.backends.openai_backend import launch_vllm_server

    with pytest.MonkeyPatch.context() as env:
        env.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")  # read by the server at launch
        with launch_vllm_server(
            tiny_model_dir,
            max_model_len=SERVER_LEN,
            max_num_seqs=64,
            kv_cache_space_gib=1,
            enforce_eager=True,
        ) as server:
            env.undo()
            yield server
    assert server.process.poll() is not None  # reaped
    from agentgym.backends.openai_backend import _group_members

    assert _group_members(server.process.pid) == []  # no engine process left behind


@pytest.mark.vllm
@pytest.mark.slow
class TestVLLMServer:
    pytestmark = VLLM_WARNINGS

    @pytest_asyncio.fixture(loop_scope="module")
    async def client(self, vllm_server):
        backend = make_backend("openai", vllm_server.model, base_url=vllm_server.base_url)
        yield backend
        await backend.close()

    @MODULE_LOOP
    async def test_concurrent_generate_logprobs(self, client, hf_model):
        await _check_concurrent(client, hf_model, 40)

    @MODULE_LOOP
    async def test_abort_and_cancel(self, client, vllm_server):
        """Abort one request and cancel another, each far too long to finish first (HUGE,
        ignore_eos), while short requests run beside them. vLLM's own counters show that
        neither long request finished by itself, that generation stopped soon after, and
        that only the short requests completed."""
        import httpx

        metrics_url = vllm_server.base_url[:-3] + "/metrics"

        async def counters() -> dict[str, float]:
            async with httpx.AsyncClient(timeout=30) as http:
                text = (await http.get(metrics_url)).text
            out = {"generated": 0.0, "finished": 0.0}
            for line in text.splitlines():
                if line.startswith("vllm:generation_tokens_total{"):
                    out["generated"] += float(line.rsplit(" ", 1)[1])
                elif line.startswith("vllm:request_success_total{") and (
                        'finished_reason="abort"' not in line):
                    out["finished"] += float(line.rsplit(" ", 1)[1])  # ran to stop/length
            return out

        async def quiet() -> dict[str, float]:
            """The counters once generation has stopped (two reads 1 s apart agree)."""
            last = await counters()
            for _ in range(120):
                await asyncio.sleep(1.0)
                now = await counters()
                if now == last:
                    return now
                last = now
            pytest.fail("the server kept generating")

        async def generating(since: dict[str, float]) -> None:
            async def moved():
                return (await counters())["generated"] > since["generated"]

            await _wait_until(moved, timeout_s=120)

        base = await quiet()
        long = asyncio.create_task(client.generate(PROMPT, HUGE, request_id="to-abort"))
        await generating(base)
        short = await asyncio.gather(
            *[client.generate(p, SamplingParams(max_new_tokens=8)) for p in prompts(8)])
        assert all(1 <= len(r.token_ids) <= 8 for r in short)
        assert not long.done()  # still generating beside them
        await client.abort("to-abort")
        res = await asyncio.wait_for(long, 60)
        assert res.finish_reason == "abort" and res.token_ids == []
        aborted = await quiet()
        assert aborted["finished"] - base["finished"] == len(short)  # not the long one
        assert aborted["generated"] - base["generated"] < HUGE.max_new_tokens / 2

        cancelled = asyncio.create_task(client.generate(PROMPT, HUGE, request_id="to-cancel"))
        await generating(aborted)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        after = await quiet()
        assert after["finished"] == aborted["finished"]
        assert after["generated"] - aborted["generated"] < HUGE.max_new_tokens / 2
        # The server still serves.
        again = await client.generate(PROMPT, SamplingParams(max_new_tokens=4))
        assert 1 <= len(again.token_ids) <= 4

    def test_llm_agent_infers_through_the_server(self, vllm_server, hf_model):
        """``LLMAgent(backend="openai")`` plays its episodes with the served model: one server
        request per model turn, and the stored logprobs are the model's."""
        import httpx

        from agentgym.agents import LLMAgent

        def finished() -> float:
            text = httpx.get(vllm_server.base_url[:-3] + "/metrics", timeout=30).text
            return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                       if line.startswith("vllm:request_success_total{"))

        before = finished()
        agent = LLMAgent(base_model=vllm_server.model, backend="openai",
                         backend_kwargs={"base_url": vllm_server.base_url})
        res = agent.infer("maze", tasks=3, max_turns=2, max_new_tokens=16)
        assert len(res.trajectories) == 3
        turns = 0
        for traj in res.trajectories:
            assert traj.stop_reason in ("done", "horizon", "length"), traj.error
            assert len(traj.loss_mask) == len(traj.token_ids) == len(traj.logprobs)
            runs = _mask_runs(traj.loss_mask)
            turns += sum(1 for m, _, _ in runs if m == 1)
            assert traj.num_turns <= sum(1 for m, _, _ in runs if m == 1)
        assert turns >= 3
        assert finished() - before == turns  # every model turn is a request to the server
        traj = res.trajectories[0]
        model = [(a, b) for m, a, b in _mask_runs(traj.loss_mask) if m == 1]
        for a, b in model:
            ref = ref_logprobs(hf_model, traj.token_ids[:a], traj.token_ids[a:b])
            assert max(abs(x - y) for x, y in zip(ref, traj.logprobs[a:b], strict=True)) < 2e-3

    @MODULE_LOOP
    async def test_weights_are_server_owned(self, client):
        with pytest.raises(BackendError, match="server owns"):
            await client.update_weights({})
