"""``TickBatcher``: gather what many episode coroutines submit during one event-loop
iteration and process it in one call (one FFI crossing per tick, not per episode)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class TickBatcher(Generic[T, R]):
    """``await batcher.submit(item)`` resolves with ``process(items)[i]`` for its item.

    The first submit of an iteration schedules a flush with ``call_soon``; every coroutine
    that becomes runnable in the same iteration submits before the flush runs, so batches
    form naturally without a timer. ``process`` may be sync (runs inline: right for
    microsecond-scale native work) or async (runs as a task).

    Per-item failures: a result that is an exception instance (``BaseException``) is raised
    in that item's waiter only; the other waiters get their results. A ``process`` that
    raises (a fault of the batch as a whole) fails every future of its batch. A cancelled
    waiter's result is dropped.

    The event loop is looked up once and cached while it runs on the same thread:
    ``asyncio.get_running_loop()`` makes a ``getpid()`` system call on every call (CPython's
    fork check), which costs microseconds in sandboxed kernels, on every submit. A batcher
    that lives inside one coroutine's run can be given its ``loop`` and skips even that
    check.
    """

    def __init__(
        self,
        process: Callable[[list[T]], list[R]] | Callable[[list[T]], Awaitable[list[R]]],
        *,
        is_async: bool = False,
        loop: asyncio.AbstractEventLoop | None = None,
    ):
        self._process = process
        self._is_async = is_async
        self._items: list[T] = []
        self._futures: list[asyncio.Future] = []
        self._scheduled = False
        self._tasks: set[asyncio.Task] = set()
        self._bound = loop  # fixed for the batcher's life when given
        self._loop: asyncio.AbstractEventLoop | None = None  # else the cached running loop
        self._thread = 0
        self.batches = 0
        self.items = 0

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is None or not loop.is_running() or self._thread != threading.get_ident():
            loop = self._loop = asyncio.get_running_loop()
            self._thread = threading.get_ident()
        return loop

    def submit(self, item: T) -> asyncio.Future:
        loop = self._bound or self._running_loop()
        fut = loop.create_future()
        self._items.append(item)
        self._futures.append(fut)
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._flush)
        return fut

    def _take(self) -> tuple[list[T], list[asyncio.Future]]:
        items, futures = self._items, self._futures
        self._items, self._futures = [], []
        self._scheduled = False
        self.batches += 1
        self.items += len(items)
        return items, futures

    @staticmethod
    def _deliver(futures, results=None, error: BaseException | None = None) -> None:
        if error is None and len(results) != len(futures):
            error = RuntimeError(f"batch produced {len(results)} results for {len(futures)} items")
        if error is not None:
            for fut in futures:
                if not fut.done():
                    fut.set_exception(error)
            return
        for fut, result in zip(futures, results):
            if fut.done():  # a cancelled waiter's result is dropped
                continue
            if isinstance(result, BaseException):  # this item's own failure
                fut.set_exception(result)
            else:
                fut.set_result(result)

    def _flush(self) -> None:
        items, futures = self._take()
        if not items:
            return
        if self._is_async:
            task = asyncio.ensure_future(self._run_async(items, futures))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return
        try:
            results = self._process(items)
        except Exception as e:  # delivered to each waiter, never lost
            self._deliver(futures, error=e)
        else:
            self._deliver(futures, results)

    async def cancel_running(self) -> None:
        """Cancel the async batches still running and wait until they have unwound."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _run_async(self, items, futures) -> None:
        try:
            results = await self._process(items)
        except Exception as e:
            self._deliver(futures, error=e)
        else:
            self._deliver(futures, results)
