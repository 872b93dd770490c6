"""ProcessEnvPool: parallel == sequential, fault isolation (hang, crash, raise), shutdown."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time

import pytest

import agentgym
from agentgym.errors import EpisodeFinishedError, EpisodeNotStartedError, UnknownEnvError
from agentgym.runtime.workers import ProcessEnvPool
from tests.helpers import TaskEnv, process_gone

pytestmark = pytest.mark.timeout(120)


class FaultyEnv(TaskEnv):
    """Test-only env for fault injection: counts steps; some actions hang, crash or raise."""

    instructions = "say anything"

    def step(self, action):
        if action == "hang":
            time.sleep(3600)
        if action == "crash":
            os._exit(3)
        if action == "raise":
            raise RuntimeError("boom")
        if action == "spawn":  # a grandchild standing in for a simulator JVM
            proc = subprocess.Popen(["sleep", "600"])
            return str(proc.pid), 0.0, False, {}
        self.n += 1
        return f"{self.task}:{self.n}:{action}", 1.0, action == "finish", {"n": self.n}


agentgym.register("test-faulty", FaultyEnv, override=True)


@pytest.mark.slow  # spawns and restarts worker processes
async def test_parallel_matches_sequential_babyai():
    pytest.importorskip("minigrid")
    from agentgym.envs.simulators import register_all

    register_all()
    tasks, seeds = [0, 3, 7, 11], [5, 6, 7, 8]
    expected = []
    for task, seed in zip(tasks, seeds, strict=True):  # sequential, in this process
        env = agentgym.make("babyai", level="GoToLocal", max_turns=12)
        obs, _ = env.reset(seed=seed, options={"task": task})
        trace, actions = [obs], []
        for _ in range(12):
            action = env.unwrapped.oracle_action() or "turn left"
            obs, reward, term, trunc, _ = env.step(action)
            trace.append((obs, reward, term, trunc))
            actions.append(action)
            if term or trunc:
                break
        expected.append((trace, actions))
    async with ProcessEnvPool(
        "babyai", num_workers=2, envs_per_worker=2, level="GoToLocal", max_turns=12
    ) as pool:
        results = await pool.reset_many([0, 1, 2, 3], tasks, seeds)
        traces = [[obs] for obs, _ in results]
        for k in range(12):
            ids = [i for i in range(4) if pool.is_live(i)]
            if not ids:
                break
            out = await pool.step_many(ids, [expected[i][1][k] for i in ids])
            for i, (obs, reward, term, trunc, _) in zip(ids, out, strict=True):
                traces[i].append((obs, reward, term, trunc))
    assert traces == [t for t, _ in expected]


@pytest.mark.slow  # spawns and restarts worker processes
async def test_hang_times_out_and_other_episodes_survive():
    async with ProcessEnvPool("test-faulty", 1, 3, timeout_s=2.0) as pool:
        await pool.reset_many([0, 1, 2], [10, 11, 12], [0, 0, 0])
        first = await pool.step_many([0, 1, 2], ["a", "b", "c"])
        assert [o for o, *_ in first] == ["10:1:a", "11:1:b", "12:1:c"]
        out = await pool.step_many([0, 1, 2], ["x", "hang", "y"])
        assert out[0][0] == "10:2:x"
        assert out[1][3] is True and out[1][4]["stop_reason"] == "timeout"
        assert out[2][0] == "12:2:y"  # queued behind the hang, replayed and run
        assert pool.stop_reason(1) == "timeout" and pool.restarts == 1
        # the restarted worker rebuilt episodes 0 and 2 by replaying their actions
        again = await pool.step_many([0, 2], ["z", "z"])
        assert [o for o, *_ in again] == ["10:3:z", "12:3:z"]
        with pytest.raises(EpisodeFinishedError):
            await pool.step(1, "a")
        obs, _ = await pool.reset(1, task=42)
        assert obs == "task 42"


@pytest.mark.slow  # spawns and restarts worker processes
async def test_crash_ends_only_that_episode():
    async with ProcessEnvPool("test-faulty", 2, 2, timeout_s=30.0) as pool:
        await pool.reset_many([0, 1, 2, 3], [0, 1, 2, 3], [0] * 4)
        out = await pool.step_many([0, 1, 2, 3], ["a", "crash", "b", "c"])
        assert out[1][4]["stop_reason"] == "env_error"
        assert "died" in out[1][4]["error"]
        assert [out[i][0] for i in (0, 2, 3)] == ["0:1:a", "2:1:b", "3:1:c"]
        more = await pool.step_many([0, 2, 3], ["d", "e", "f"])
        assert [o for o, *_ in more] == ["0:2:d", "2:2:e", "3:2:f"]
        assert pool.stop_reasons() == [None, "env_error", None, None]


async def test_env_exception_is_recorded_without_restart():
    async with ProcessEnvPool("test-faulty", 1, 2) as pool:
        await pool.reset_many([0, 1], [0, 1], [0, 0])
        bad, good = await pool.step_many([0, 1], ["raise", "ok"])
        assert bad[4]["stop_reason"] == "env_error" and "boom" in bad[4]["error"]
        assert good[:4] == ("1:1:ok", 1.0, False, False)
        assert pool.restarts == 0
        assert await pool.valid_actions(1) == []
        assert await pool.instructions() == "say anything"
        _, _, term, trunc, _ = await pool.step(1, "finish")
        assert term and not trunc and pool.stop_reason(1) == "done"


async def test_misuse_raises_named_errors():
    with pytest.raises(UnknownEnvError):
        ProcessEnvPool("no-such-env")
    async with ProcessEnvPool("test-faulty", 1, 2, max_turns=2) as pool:
        with pytest.raises(EpisodeNotStartedError):
            await pool.step(0, "a")
        with pytest.raises(IndexError):
            await pool.step(5, "a")
        await pool.reset(0)
        with pytest.raises(TypeError):
            await pool.step(0, 3)
        await pool.step(0, "a")
        *_, trunc, info = await pool.step(0, "b")
        assert trunc and pool.stop_reason(0) == "horizon"
        with pytest.raises(EpisodeFinishedError):
            await pool.step(0, "c")


@pytest.mark.slow  # spawns and restarts worker processes
async def test_shutdown_leaves_no_processes():
    pool = ProcessEnvPool("test-faulty", 2, 1, timeout_s=2.0)
    await pool.reset_many([0, 1], [0, 1], [0, 0])
    (child,) = [int(o) for o, *_ in await pool.step_many([0], ["spawn"])]
    # a hang kills the worker's whole process group, grandchildren included
    out = await pool.step_many([0], ["hang"])
    assert out[0][4]["stop_reason"] == "timeout"
    assert process_gone(child)
    (child2,) = [int(o) for o, *_ in await pool.step_many([1], ["spawn"])]
    workers = [info["pid"] for info in await pool.worker_info()]
    await pool.aclose()
    for pid in [*workers, child2]:  # the shutdown also clears each worker's process group
        assert process_gone(pid)


def test_sync_close_without_loop():
    pool = ProcessEnvPool("test-faulty", 1, 1)

    async def run():
        await pool.reset(0, task=1)
        return [info["pid"] for info in await pool.worker_info()]

    pids = asyncio.run(run())
    pool.close()
    assert all(process_gone(pid) for pid in pids)


class GatedEnv(TaskEnv):
    """Test-only env: ``wait:<dir>`` writes ``<dir>/started`` and returns once ``<dir>/go``
    exists (a step the test holds in flight); any other action counts."""

    instructions = "say anything"

    def step(self, action):
        if action.startswith("wait:"):
            gate = action[5:]
            open(os.path.join(gate, "started"), "w").close()
            deadline = time.monotonic() + 60
            while not os.path.exists(os.path.join(gate, "go")) and time.monotonic() < deadline:
                time.sleep(0.01)
        if action == "crash":
            os._exit(3)
        self.n += 1
        return f"{self.task}:{self.n}:{action}", 0.0, False, {}


agentgym.register("test-gated", GatedEnv, override=True)


@pytest.mark.slow  # spawns and restarts worker processes
async def test_cancelled_step_frees_its_slot_and_is_not_replayed(tmp_path):
    async with ProcessEnvPool("test-gated", 1, 2, timeout_s=60.0) as pool:
        await pool.reset_many([0, 1], [0, 1], [0, 0])
        held = asyncio.ensure_future(pool.step(0, f"wait:{tmp_path}"))
        for _ in range(6000):  # until the worker is inside the step
            if (tmp_path / "started").exists():
                break
            await asyncio.sleep(0.01)
        held.cancel()
        with pytest.raises(asyncio.CancelledError):
            await held
        # The slot is free at once: a new episode starts there (queued behind the held step).
        reset = asyncio.ensure_future(pool.reset(0, task=5))
        await asyncio.sleep(0.1)
        (tmp_path / "go").touch()
        obs, _ = await asyncio.wait_for(reset, 60)
        assert obs == "task 5"
        assert (await pool.step(0, "a"))[0] == "5:1:a"
        # A worker restart replays episode 0 from its own actions only: the cancelled step
        # belonged to the previous episode.
        crash = await pool.step(1, "crash")
        assert crash[4]["stop_reason"] == "env_error" and pool.restarts == 1
        assert (await pool.step(0, "b"))[0] == "5:2:b"
