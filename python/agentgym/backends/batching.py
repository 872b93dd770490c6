"""``RequestBatcher``: a backend's concurrent ``generate`` calls, batched into calls of one
worker function on one worker thread.

The backends whose engine is a blocking call over a list of prompts (``TransformersBackend``,
TRL's vLLM) share it. It owns the in-flight requests by id, the queue, the batching task and
the worker thread, and it gives every request the same abort, cancellation, failure and
``policy_version`` semantics. (The engine's ``TickBatcher`` batches the other way round:
episode work into one inline call per event-loop iteration.)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from agentgym.backends.base import (
    BackendError,
    GenerateResult,
    InvalidRequestError,
    SamplingParams,
)


@dataclass(eq=False)
class BatchRequest:
    """One queued ``generate`` call. ``aborted`` is set by ``abort``, by cancelling the
    caller and by ``close``; a worker may read it to stop early. ``tokens`` and ``logprobs``
    are what the request has generated so far: what it returns when it ends aborted.
    ``future`` is set by :meth:`RequestBatcher.submit`."""

    prompt: list[int]
    sampling: SamplingParams
    future: asyncio.Future | None = None
    aborted: bool = False
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


R = TypeVar("R", bound=BatchRequest)


class RequestBatcher(Generic[R]):
    """Run the requests ``submit`` queues as batches: ``run(requests)`` in the worker thread
    returns one output per request, and ``result(request, output, version)`` turns an
    output into the request's :class:`GenerateResult` (or an exception it raises).

    A batch is the first queued request plus those queued by the time the batcher looks
    again: after ``wait_s`` seconds (0: the rest of the event-loop iteration; None: no
    wait, only what is already queued), at most ``max_batch`` (None: no limit). A request
    aborted before its batch runs ends at once with ``finish_reason="abort"`` and the
    tokens so far. ``version()`` (the backend's ``policy_version``) is read in the worker
    thread just before ``run`` and goes into every result of the batch (a weight update run on
    ``executor`` and bumping the version there is exact: the batch after it reads the new
    version); aborted ends read it when they happen.

    A ``run`` that raises fails every request of the batch with
    ``BackendError(f"{error}: {exc!r}")``; with ``aborts_survive_failure`` a request aborted
    meanwhile ends as aborted instead. Cancelling the batcher (``close``) ends every request
    of the running batch as aborted. ``executor`` is the worker thread, for other model work
    that must not overlap a batch (weight updates).
    """

    def __init__(
        self,
        run: Callable[[list[R]], list],
        result: Callable[[R, Any, int], GenerateResult | BaseException],
        version: Callable[[], int],
        *,
        thread_name: str,
        wait_s: float | None = 0.0,
        max_batch: int | None = None,
        error: str = "generation failed",
        aborts_survive_failure: bool = True,
    ):
        self.run = run
        self.result = result
        self.version = version
        self.wait_s = wait_s
        self.max_batch = max_batch
        self.error = error
        self.aborts_survive_failure = aborts_survive_failure
        self.executor = concurrent.futures.ThreadPoolExecutor(1, thread_name)
        #: The requests in flight, by id.
        self.requests: dict[str, R] = {}
        self.closed = False
        self._queue: asyncio.Queue[R] | None = None
        self._task: asyncio.Task | None = None

    async def submit(self, request_id: str, req: R) -> GenerateResult:
        """Queue ``req`` under ``request_id`` and wait for its result; cancelling the caller
        aborts it. An id already in flight is an :class:`InvalidRequestError`."""
        if request_id in self.requests:
            raise InvalidRequestError(f"request id {request_id!r} is already in flight")
        loop = asyncio.get_running_loop()
        req.future = loop.create_future()
        self.requests[request_id] = req
        if self._task is None or self._task.done():
            if self._queue is None:
                self._queue = asyncio.Queue()
            self._task = loop.create_task(self._loop())
        self._queue.put_nowait(req)
        try:
            return await asyncio.shield(req.future)
        except asyncio.CancelledError:
            req.aborted = True
            raise
        finally:
            self.requests.pop(request_id, None)

    def abort(self, request_id: str) -> None:
        """Mark ``request_id`` aborted; unknown ids are ignored."""
        req = self.requests.get(request_id)
        if req is not None:
            req.aborted = True

    async def close(self) -> None:
        """Abort every request, stop the batching task and the worker thread, and end what
        is still queued as aborted. Idempotent."""
        if self.closed:
            return
        self.closed = True
        for req in list(self.requests.values()):
            req.aborted = True
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        await asyncio.get_running_loop().run_in_executor(None, self.executor.shutdown)
        while self._queue is not None and not self._queue.empty():
            self._finish_aborted(self._queue.get_nowait())

    def _run(self, live: list[R]) -> tuple[int, list]:
        """``run(live)`` in the worker thread, with the version it ran under: read there,
        after any weight update queued before it on the same thread."""
        return self.version(), self.run(live)

    def _finish_aborted(self, req: R) -> None:
        if not req.future.done():
            req.future.set_result(GenerateResult(
                token_ids=req.tokens, logprobs=req.logprobs, finish_reason="abort",
                policy_version=self.version()))

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        queue = self._queue
        while True:
            batch = [await queue.get()]
            if self.wait_s is not None:
                await asyncio.sleep(self.wait_s)
            limit = math.inf if self.max_batch is None else self.max_batch
            while len(batch) < limit and not queue.empty():
                batch.append(queue.get_nowait())
            live = []
            for req in batch:
                if req.aborted:
                    self._finish_aborted(req)
                else:
                    live.append(req)
            if not live:
                continue
            try:
                version, outputs = await loop.run_in_executor(self.executor, self._run, live)
            except asyncio.CancelledError:
                for req in live:
                    req.aborted = True
                    self._finish_aborted(req)
                raise
            except Exception as e:  # the whole batch failed: every request learns why
                for req in live:
                    if req.aborted and self.aborts_survive_failure:
                        self._finish_aborted(req)
                    elif not req.future.done():
                        req.future.set_exception(BackendError(f"{self.error}: {e!r}"))
                continue
            for req, out in zip(live, outputs, strict=True):
                if req.future.done():
                    continue
                res = self.result(req, out, version)
                if isinstance(res, BaseException):
                    req.future.set_exception(res)
                else:
                    req.future.set_result(res)
