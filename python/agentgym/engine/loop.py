"""The one asyncio bridge: run a coroutine on uvloop when it is installed."""

from __future__ import annotations

import asyncio


def new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def run(coro):
    """Run ``coro`` to completion on a fresh (uv)loop; refuses to nest inside a running loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise RuntimeError("collect_sync() called from a running event loop; await collect()")
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(coro)
