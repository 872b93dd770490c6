"""The env drivers (``agentgym.engine.drivers``): slots that are no longer running, resets that
fail per episode."""

import agentgym
from agentgym.engine.drivers import NativeDriver, PythonDriver
from agentgym.errors import EnvError, InvalidTaskError
from tests.helpers import ThreadProbeEnv


async def test_drivers_answer_aborted_for_slots_no_longer_running():
    native = NativeDriver("maze", 3)
    await native.reset_many([(0, 0, 1, None), (1, 1, 2, None)])
    native.finish([(1, "timeout")])  # ended from outside (a timeout)
    action = await native.oracle_action(0)
    outs = await native.step_many([(2, "go north"), (0, action), (1, "go north")])
    assert [o.stop_reason for o in (outs[0], outs[2])] == ["aborted", "aborted"]
    assert outs[1].stop_reason != "aborted" and outs[1].observation
    assert native.pool.turns.tolist() == [1, 0, 0]  # only the running slot stepped
    assert native.pool.stop_reasons([1]) == ["timeout"]

    agentgym.register("test/thread_probe", ThreadProbeEnv, override=True)
    ThreadProbeEnv.step_threads = []
    py = PythonDriver("test/thread_probe", 3, max_workers=2)
    try:
        assert await py.reset_many([(0, 0, 1, None), (1, 1, 2, None)]) == ["start", "start"]
        py.finish([(1, "timeout")])
        outs = await py.step_many([(2, "go"), (0, "go"), (1, "go")])
        assert [o.stop_reason for o in outs] == ["aborted", None, "aborted"]
        assert outs[1].observation == "turn 1" and outs[0].error == "episode no longer running"
        for _ in range(2):  # slot 0's episode ends after its third step ...
            (last,) = await py.step_many([(0, "go")])
        assert last.stop_reason == "done"
        (after,) = await py.step_many([(0, "go")])
        assert after.stop_reason == "aborted"  # ... and then is aborted
        assert len(ThreadProbeEnv.step_threads) == 3  # no aborted slot reached its env
    finally:
        py.close()


async def test_native_driver_resets_fail_per_episode():
    driver = NativeDriver("_test_panic", 4)
    out = await driver.reset_many([(0, 0, 1, None), (1, "reject", 1, None),
                                   (2, "panic", 1, None), (3, 3, 1, None)])
    assert out[0] == "reset task=Index(0) seed=1" and out[3] == "reset task=Index(3) seed=1"
    assert isinstance(out[1], InvalidTaskError) and "reject" in str(out[1])
    assert isinstance(out[2], EnvError) and "panic on reset" in str(out[2])
    steps = await driver.step_many([(0, "noop"), (3, "stop"), (1, "noop")])
    assert [s.stop_reason for s in steps] == [None, "done", "aborted"]
