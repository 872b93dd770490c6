"""The tick batcher (``agentgym.engine.batching.TickBatcher``): one failed item fails only its
own waiter; a batch function that raises fails every waiter of that batch."""

from __future__ import annotations

import asyncio

import pytest

from agentgym.engine.batching import TickBatcher


@pytest.mark.parametrize("is_async", [False, True])
async def test_tick_batcher_delivers_an_item_error_to_its_waiter_only(is_async):
    bad = ValueError("item 1 is bad")

    def results(items):
        return [bad if x == 1 else x * 10 for x in items]

    async def aresults(items):
        await asyncio.sleep(0)
        return results(items)

    batcher = TickBatcher(aresults if is_async else results, is_async=is_async)
    futs = [batcher.submit(x) for x in range(4)]
    await asyncio.wait(futs)
    assert futs[1].exception() is bad  # raised in its waiter, not handed over as a value
    assert [futs[i].result() for i in (0, 2, 3)] == [0, 20, 30]
    with pytest.raises(ValueError, match="item 1 is bad"):
        await futs[1]
    assert batcher.batches == 1  # one batch, one failed item in it


async def test_tick_batcher_process_that_raises_fails_every_waiter():
    def broken(items):
        raise RuntimeError("the batch itself is broken")

    batcher = TickBatcher(broken)
    out = await asyncio.gather(*(batcher.submit(x) for x in range(3)), return_exceptions=True)
    assert [str(e) for e in out] == ["the batch itself is broken"] * 3
    assert batcher.batches == 1
