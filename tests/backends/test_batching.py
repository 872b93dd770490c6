"""The backends' request batcher (``agentgym.backends.batching.RequestBatcher``): what one
tick queued runs as one batch under the version read before it, a failed batch reaches every
request of it, aborted requests never run, a per-request error stays with its request, and
close ends running and queued requests as aborted. The worker functions are plain Python
functions that record their batches; threading events hold a batch while a test acts."""

from __future__ import annotations

import asyncio
import threading

import pytest

from agentgym.backends import BackendError, GenerateResult, InvalidRequestError, SamplingParams
from agentgym.backends.batching import BatchRequest, RequestBatcher

SP = SamplingParams(max_new_tokens=4)


def req(n: int) -> BatchRequest:
    return BatchRequest([n], SP)


class Worker:
    """Echoes each prompt as its tokens (reason "stop"); records every batch. With ``hold``,
    the first batch waits until ``release`` is set; with ``fail``, every batch raises."""

    def __init__(self, hold: bool = False, fail: bool = False):
        self.batches: list[list[int]] = []
        self.version = 0
        self.started = threading.Event()
        self.release = threading.Event()
        self.hold, self.fail = hold, fail

    def run(self, reqs: list[BatchRequest]) -> list:
        self.batches.append([r.prompt[0] for r in reqs])
        self.started.set()
        if self.hold and len(self.batches) == 1:
            assert self.release.wait(30)
        self.version += 1  # a weight update that lands while the batch runs
        if self.fail:
            raise RuntimeError("boom")
        return [ValueError(f"bad {r.prompt[0]}") if r.prompt[0] < 0 else "stop" for r in reqs]

    @staticmethod
    def result(r: BatchRequest, out, version: int):
        if isinstance(out, BaseException):
            return out
        return GenerateResult(token_ids=list(r.prompt), finish_reason=out, policy_version=version)

    def batcher(self, **kw) -> RequestBatcher:
        return RequestBatcher(self.run, self.result, lambda: self.version, thread_name="t", **kw)


async def start(b: RequestBatcher, w: Worker, reqs: dict[str, BatchRequest]) -> list:
    """Submit ``reqs`` (id: request) and wait until the worker runs their first batch."""
    tasks = [asyncio.ensure_future(b.submit(rid, r)) for rid, r in reqs.items()]
    assert await asyncio.get_running_loop().run_in_executor(None, w.started.wait, 30)
    return tasks


async def test_one_tick_is_one_batch_under_the_version_read_before_it():
    w = Worker()
    b = w.batcher(max_batch=3)
    out = await asyncio.gather(*(b.submit(f"r{i}", req(i)) for i in range(5)))
    assert w.batches == [[0, 1, 2], [3, 4]]  # queued together, split at max_batch
    assert [r.token_ids for r in out] == [[i] for i in range(5)]
    assert [r.policy_version for r in out] == [0, 0, 0, 1, 1]  # read before each run
    assert b.requests == {}
    await b.close()


@pytest.mark.parametrize("survive", [True, False])
async def test_a_failed_batch_reaches_every_request(survive):
    w = Worker(hold=True, fail=True)
    b = w.batcher(error="vLLM generation failed", aborts_survive_failure=survive)
    tasks = await start(b, w, {f"r{i}": req(i) for i in range(3)})
    b.abort("r1")  # aborted while its batch runs
    w.release.set()
    out = await asyncio.gather(*tasks, return_exceptions=True)
    assert w.batches == [[0, 1, 2]]
    for i in (0, 2):
        assert isinstance(out[i], BackendError)
        assert str(out[i]) == "vLLM generation failed: RuntimeError('boom')"
    if survive:
        assert isinstance(out[1], GenerateResult) and out[1].finish_reason == "abort"
    else:
        assert str(out[1]) == "vLLM generation failed: RuntimeError('boom')"
    await b.close()


async def test_aborted_requests_end_at_once_and_never_run():
    w = Worker(hold=True)
    b = w.batcher()
    (first,) = await start(b, w, {"first": req(0)})
    queued = [asyncio.ensure_future(b.submit(f"q{i}", req(i))) for i in (1, 2, 3)]
    await asyncio.sleep(0)  # they are queued behind the running batch
    b.abort("q2")
    b.abort("unknown")  # ignored
    w.version = 7
    w.release.set()  # the first batch ends with version 8
    res = await asyncio.gather(first, *queued)
    assert w.batches == [[0], [1, 3]]
    # no tokens, and the version when it ended
    assert res[2] == GenerateResult(token_ids=[], finish_reason="abort", policy_version=8)
    assert [r.finish_reason for r in res] == ["stop", "stop", "abort", "stop"]
    await b.close()


async def test_an_error_of_one_request_stays_with_it_and_ids_are_unique():
    w = Worker(hold=True)
    b = w.batcher()
    tasks = await start(b, w, {f"r{i}": req(i) for i in (1, -1, 2)})
    with pytest.raises(InvalidRequestError, match="'r1' is already in flight"):
        await b.submit("r1", req(9))
    w.release.set()
    with pytest.raises(ValueError, match="bad -1"):  # raised in its caller
        await tasks[1]
    assert [(await tasks[0]).token_ids, (await tasks[2]).token_ids] == [[1], [2]]
    await b.close()


async def test_cancelling_the_caller_aborts_its_request():
    w = Worker(hold=True)
    b = w.batcher()
    r = req(1)
    (task,) = await start(b, w, {"r": r})
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert r.aborted and "r" not in b.requests  # the worker can see it and stop
    w.release.set()
    await b.close()


async def test_close_ends_running_and_queued_requests_as_aborted():
    w = Worker(hold=True)
    b = w.batcher()
    r0 = req(0)
    (running,) = await start(b, w, {"run": r0})
    queued = asyncio.ensure_future(b.submit("queued", req(1)))
    await asyncio.sleep(0)
    closing = asyncio.ensure_future(b.close())
    # the running request ends at once, while the worker thread still holds its batch,
    # with the version of that moment
    ran = await asyncio.wait_for(running, 30)
    assert r0.aborted  # the worker is told to stop
    assert ran == GenerateResult(token_ids=[], finish_reason="abort", policy_version=0)
    assert not closing.done()  # close waits for the worker thread
    w.release.set()
    await asyncio.wait_for(closing, 30)
    # the queued one ends after the worker (which bumps the version) has stopped
    left = await asyncio.wait_for(queued, 30)
    assert left == GenerateResult(token_ids=[], finish_reason="abort", policy_version=1)
    assert w.batches == [[0]]  # the queued one never ran
    assert b.closed
    await b.close()  # idempotent
