"""RolloutEngine end to end on real vLLM with the tiny model: (a) the in-process AsyncLLM
backend and (b) ``vllm serve`` through the OpenAI-compatible backend. Every trajectory of
TextCraft and maze rollouts is checked for token/mask/logprob invariants, the stored logprobs
are the backend's own (and agree with a transformers forward pass), group samples share
their prompt, and cancelling a ``collect`` leaves no request running in vLLM."""

from __future__ import annotations

import asyncio
import math

import msgspec
import pytest
import pytest_asyncio

from agentgym.backends import make_backend
from agentgym.engine import RolloutEngine
from tests.backends.helpers import MODULE_LOOP, VLLM_WARNINGS, _import_vllm, _wait_until
from tests.helpers import mask_runs, vllm_request_log

pytestmark = [pytest.mark.vllm, pytest.mark.slow, *VLLM_WARNINGS, pytest.mark.timeout(900)]

ENGINE_KW = dict(max_model_len=2048, max_num_seqs=128, kv_cache_space_gib=1, enforce_eager=True)
ROLLOUT_KW = dict(max_turns=3, max_new_tokens=24, max_total_tokens=2048, progress=False)
ALLOWED = {"done", "horizon", "length"}  # no error reasons on a healthy engine
TASKS = 16  # x n_samples=2 -> 32 episodes per env


class Recording:
    """Backend proxy that records every (prompt, result) the engine received.

    With ``complete_turns`` set, a turn cut at ``max_new_tokens`` is reported as finished
    (the engine then appends the end-of-turn token as a prompt token and the episode goes
    on): a random tiny model rarely emits end-of-turn itself, and this makes its episodes
    multi-turn. With ``long_turns`` set, requests go out with no stop tokens and EOS
    ignored, so each one runs to its whole token budget unless it is aborted."""

    def __init__(self, inner):
        self.inner = inner
        self.results: dict[tuple, list[float]] = {}
        self.complete_turns = False
        self.long_turns = False
        self.returned: set[str] = set()  # request ids whose generate call returned

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def generate(self, prompt_ids, sampling, request_id=None):
        if self.long_turns:
            sampling = msgspec.structs.replace(sampling, stop_token_ids=[], ignore_eos=True)
        res = await self.inner.generate(prompt_ids, sampling, request_id=request_id)
        self.returned.add(request_id)
        self.results[(tuple(prompt_ids), tuple(res.token_ids))] = list(res.logprobs)
        if self.complete_turns and res.finish_reason == "length":
            res.finish_reason = "stop"
        return res


def check_trajectory(traj, recorded: dict, max_turns: int) -> None:
    n = len(traj.token_ids)
    assert len(traj.loss_mask) == n == len(traj.logprobs)
    assert traj.prompt_len > 0 and not any(traj.loss_mask[: traj.prompt_len])
    assert traj.stop_reason in ALLOWED, (traj.stop_reason, traj.error)
    assert len(traj.turn_rewards) == traj.num_turns <= max_turns
    assert traj.reward == pytest.approx(sum(traj.turn_rewards), abs=1e-5)
    model = [(a, b) for m, a, b in mask_runs(traj.loss_mask) if m == 1]
    extra = 1 if traj.stop_reason == "length" else 0  # a turn cut at max_new_tokens
    assert traj.num_turns <= len(model) <= traj.num_turns + extra
    assert len(model) >= 1
    for a, b in model:
        lps = traj.logprobs[a:b]
        assert all(math.isfinite(x) and x < 0 for x in lps)  # a random model: never certain
        # Exactly what the backend returned for this prompt.
        key = (tuple(traj.token_ids[:a]), tuple(traj.token_ids[a:b]))
        assert key in recorded, "model segment is not a backend completion of its prompt"
        assert recorded[key] == pytest.approx(lps, abs=1e-6)
    for m, a, b in mask_runs(traj.loss_mask):
        if m == 0:
            assert all(x == 0.0 for x in traj.logprobs[a:b])


def check_batch(batch, recorded, max_turns: int, multi_turn: bool) -> None:
    assert len(batch) == 2 * TASKS
    if multi_turn:  # every turn completes: episodes run to their horizon (or the goal)
        assert all(t.stop_reason in ("horizon", "done") for t in batch)
        assert batch.metrics["num_turns/mean"] > 1
    for traj in batch:
        check_trajectory(traj, recorded, max_turns)
    for a, b in zip(batch.trajectories[::2], batch.trajectories[1::2]):
        assert a.group_id == b.group_id and a.task_id == b.task_id and a.seed == b.seed
        assert (a.sample_index, b.sample_index) == (0, 1)
        assert a.prompt_len == b.prompt_len
        assert a.token_ids[: a.prompt_len] == b.token_ids[: b.prompt_len]
    assert len({t.group_id for t in batch}) == TASKS
    assert batch.metrics["batch/size"] == 2 * TASKS


def check_against_transformers(hf_model, trajs, tol: float = 2e-3) -> None:
    import torch

    for traj in trajs:
        with torch.no_grad():
            logits = hf_model(torch.tensor([traj.token_ids])).logits[0].float()
        lp = logits.log_softmax(-1)
        checked = 0
        for i in range(1, len(traj.token_ids)):
            if traj.loss_mask[i]:
                ref = float(lp[i - 1, traj.token_ids[i]])
                assert abs(ref - traj.logprobs[i]) < tol, (i, ref, traj.logprobs[i])
                checked += 1
        assert checked > 0


async def check_cancel(backend: Recording, engine: RolloutEngine, in_flight) -> None:
    """Cancel a collect while vLLM runs its requests: none stays running, and the engine
    (its driver lock, its env slots) works again right after. Its turns ignore EOS and
    stop tokens, so a request ends on its own only at its token budget (~1,900 tokens).
    Polls wait up to 300 s: on 2 loaded cores vLLM's API process, starved by its engine,
    can take tens of seconds to answer."""
    backend.long_turns = True
    try:
        task = asyncio.ensure_future(
            engine.collect(64, "maze", max_new_tokens=2048, max_turns=4, max_concurrency=64)
        )
        await _wait_until(lambda: in_flight(1), timeout_s=300)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await _wait_until(lambda: in_flight(0, exact=True), timeout_s=300)
    finally:
        backend.long_turns = False
    again = await engine.collect(4, "maze", max_turns=2, max_new_tokens=8)
    assert len(again) == 4 and all(t.stop_reason in ALLOWED for t in again)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir):
    """A transformers copy of the tiny model: the reference for logprob checks."""
    transformers = pytest.importorskip("transformers")
    return transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()


# ---------------------------------------------------------------- (a) in-process AsyncLLM
@pytest_asyncio.fixture(scope="class", loop_scope="module")
async def inproc(tiny_model_dir, tokenizer):
    _import_vllm()
    backend = Recording(make_backend("vllm", tiny_model_dir, **ENGINE_KW))
    yield backend, RolloutEngine(backend, tokenizer, **ROLLOUT_KW)
    await backend.inner.close()


class TestEngineInProcessVLLM:
    @MODULE_LOOP
    @pytest.mark.parametrize("multi_turn", [False, True], ids=["plain", "multi_turn"])
    @pytest.mark.parametrize("env_id", ["textcraft", "maze"])
    async def test_rollout_invariants(self, inproc, hf_model, env_id, multi_turn):
        backend, engine = inproc
        backend.complete_turns = multi_turn
        batch = await engine.collect(TASKS, env_id, n_samples=2)
        check_batch(batch, backend.results, ROLLOUT_KW["max_turns"], multi_turn)
        check_against_transformers(hf_model, batch.trajectories[-2:])

    @MODULE_LOOP
    async def test_rejected_request_is_a_backend_error(self, inproc, tokenizer):
        """A request vLLM cannot serve ends its episode with ``backend_error`` (not
        ``env_error``) and the reason: a prompt longer than max_model_len (the context
        cap set above it) and sampling parameters vLLM rejects (temperature above 2)."""
        _, engine = inproc
        system = "north south east west " * ENGINE_KW["max_model_len"]
        assert len(tokenizer(system)["input_ids"]) > ENGINE_KW["max_model_len"]
        batch = await engine.collect(4, "maze", system_prompt=system, max_total_tokens=65536)
        assert [t.stop_reason for t in batch] == ["backend_error"] * 4
        assert all("max_model_len" in t.error for t in batch)
        batch = await engine.collect(4, "maze", temperature=2.5, max_new_tokens=4)
        assert [t.stop_reason for t in batch] == ["backend_error"] * 4
        assert all("temperature" in t.error for t in batch)
        again = await engine.collect(4, "maze", max_turns=2, max_new_tokens=8)
        assert all(t.stop_reason in ALLOWED for t in again)

    @MODULE_LOOP
    async def test_cancel_leaves_no_request_running(self, inproc):
        backend, engine = inproc

        async def in_flight(n, exact=False):
            k = await backend.inner.num_unfinished_requests()
            return k == n if exact else k >= n

        await check_cancel(backend, engine, in_flight)


# ---------------------------------------------------------------- (b) vllm serve + HTTP
@pytest.fixture(scope="class")
def server(tiny_model_dir):
    _import_vllm()
    from agentgym.backends.openai_backend import launch_vllm_server

    # The server logs each request it adds and aborts: the cancel test reads them.
    with launch_vllm_server(
        tiny_model_dir, **ENGINE_KW, extra_args=["--enable-log-requests"],
        # INFO whatever an earlier import (trl sets ERROR) left in this process's env
        env={"VLLM_LOGGING_LEVEL": "INFO"},
    ) as srv:
        yield srv
    assert srv.process.poll() is not None


class TestEngineVLLMServer:
    @pytest_asyncio.fixture(loop_scope="module")
    async def http(self, server, tokenizer):
        backend = Recording(make_backend("openai", server.model, base_url=server.base_url))
        yield backend, RolloutEngine(backend, tokenizer, **ROLLOUT_KW)
        await backend.inner.close()

    @MODULE_LOOP
    @pytest.mark.parametrize("multi_turn", [False, True], ids=["plain", "multi_turn"])
    @pytest.mark.parametrize("env_id", ["textcraft", "maze"])
    async def test_rollout_invariants(self, http, hf_model, env_id, multi_turn):
        backend, engine = http
        backend.complete_turns = multi_turn
        batch = await engine.collect(TASKS, env_id, n_samples=2)
        check_batch(batch, backend.results, ROLLOUT_KW["max_turns"], multi_turn)
        check_against_transformers(hf_model, batch.trajectories[-2:])

    @MODULE_LOOP
    async def test_cancel_leaves_no_request_running(self, http, server):
        """The cancelled collect's requests that reached the server are aborted there (the
        server logs each request it adds and aborts), and its running and waiting gauges
        fall to 0. On 2 loaded cores the API process can handle a disconnect so late that
        the engine has run that request to its budget by then, so the check is that the
        server aborted some of them, not all."""
        import httpx

        backend, engine = http

        async def in_flight(n, exact=False):
            try:
                async with httpx.AsyncClient(timeout=60.0) as client:
                    text = (await client.get(server.base_url[:-3] + "/metrics")).text
            except httpx.TimeoutException:
                return False  # the API process is starved; ask again
            k = sum(
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith(("vllm:num_requests_running{", "vllm:num_requests_waiting{"))
            )
            return k == n if exact else k >= n

        await check_cancel(backend, engine, in_flight)
        added, aborted = vllm_request_log(server)
        cancelled = added - backend.returned
        assert cancelled, "no request of the cancelled collect reached the server"
        assert cancelled & aborted, "no cancelled request was aborted on the server"
