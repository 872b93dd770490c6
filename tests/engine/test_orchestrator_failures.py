"""One bad task never sinks a batch: a reset or step that fails (a refused task, an env that
raises or panics, an env that cannot be built) ends only its own episode with ``env_error``,
whichever driver runs the env (the Rust pool, Python envs on threads, worker processes, an
env server), and the other episodes of the same batch play normally."""

from __future__ import annotations

import pytest

import agentgym
from agentgym.backends.base import GenerateResult
from agentgym.backends.scripted import ScriptedBackend
from agentgym.engine import RolloutEngine
from agentgym.envs import BaseEnv
from agentgym.errors import InvalidTaskError
from agentgym.serving.server import ServerThread
from tests.helpers import BAD_TEXTCRAFT

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def engine(tokenizer, backend=None, **kw):
    backend = backend or ScriptedBackend(tokenizer, policy="oracle")
    kw.setdefault("max_turns", 40)
    kw.setdefault("max_total_tokens", 8192)
    return RolloutEngine(backend, tokenizer, **kw)


def assert_healthy(traj):
    assert traj.stop_reason in ("done", "horizon"), (traj.task_id, traj.stop_reason, traj.error)
    assert traj.num_turns > 0 and traj.error is None
    assert any(traj.loss_mask)


def assert_env_error(traj, *needles, turns=None):
    assert traj.stop_reason == "env_error", (traj.task_id, traj.stop_reason)
    assert traj.error is not None and all(n in traj.error for n in needles), traj.error
    assert not any(traj.loss_mask)
    if turns is not None:
        assert traj.num_turns == turns and traj.turn_rewards == []


# ---------------------------------------------------------------- the engine, native envs
@pytest.mark.parametrize("max_concurrency", [256, 2])
def test_native_invalid_task_fails_only_its_episode(tokenizer, max_concurrency):
    tasks = [0, 1, BAD_TEXTCRAFT, 2, 3, 4]
    batch = engine(tokenizer, max_concurrency=max_concurrency).collect_sync(tasks, "textcraft")
    assert [t.task_id for t in batch] == tasks
    for i, traj in enumerate(batch):
        if i == 2:
            assert_env_error(traj, "InvalidTaskError", "textcraft", turns=0)
            assert traj.token_ids == []
        else:
            assert_healthy(traj)
            assert traj.stop_reason == "done" and traj.success


class NoopOrPanic(ScriptedBackend):
    """Scripted replies for ``_test_panic``: ``Action: panic`` at turn ``turn`` of the
    episodes with keys in ``keys`` (a panicking step on demand), else ``Action: noop``."""

    def __init__(self, tokenizer, keys, turn=1):
        super().__init__(tokenizer, policy="random", template="Action: noop")
        self.keys, self.turn = set(keys), turn

    async def generate(self, prompt_ids, sampling, request_id=None, context=None):
        key, turn = map(int, request_id.split("-")[1:3])
        if key in self.keys and turn == self.turn:
            ids = self._encode("Action: panic") + [self.end_of_turn_id]
            return GenerateResult(token_ids=ids, logprobs=[0.0] * len(ids), finish_reason="stop")
        return await super().generate(prompt_ids, sampling, request_id, context)


@pytest.mark.parametrize("max_concurrency", [256, 2])
def test_native_panics_in_reset_and_step_fail_only_their_episodes(tokenizer, max_concurrency):
    # Episode keys count from 0 per engine: key 3 is the fourth task, it panics at turn 1.
    eng = engine(tokenizer, backend=NoopOrPanic(tokenizer, keys={3}), max_turns=3,
                 max_concurrency=max_concurrency)
    batch = eng.collect_sync([0, "panic", 2, 3, "reject", 5], "_test_panic")
    reasons = [t.stop_reason for t in batch]
    assert reasons == ["horizon", "env_error", "horizon", "env_error", "env_error", "horizon"]
    assert_env_error(batch.trajectories[1], "panic on reset", turns=0)
    assert_env_error(batch.trajectories[3], "test env asked to panic")
    assert batch.trajectories[3].num_turns == 2  # the noop turn, then the panicking one
    assert_env_error(batch.trajectories[4], "InvalidTaskError", "reject", turns=0)
    for i in (0, 2, 5):
        assert_healthy(batch.trajectories[i])
        assert batch.trajectories[i].num_turns == 3


def test_native_env_that_cannot_be_built_is_a_clear_error(tokenizer):
    with pytest.raises(ValueError, match="construction failed"):
        engine(tokenizer).collect_sync(2, "_test_panic", env_kwargs={"fail_make": True})


# ---------------------------------------------------------------- the engine, Python envs
class FragileEnv(BaseEnv):
    """Test-only env for fault injection: task 1 raises in ``reset`` and leaves the instance
    broken (any later step raises: a driver must not reuse it), task 3 raises in its second
    step, tasks outside ``[0, 10)`` are refused (``InvalidTaskError``); every other episode
    ends after two turns of ``go``."""

    instructions = "Say go."
    num_tasks = 10

    def reset(self, task=None, seed=None):
        if not isinstance(task, int) or not 0 <= task < self.num_tasks:
            raise InvalidTaskError(f"task must be in [0, {self.num_tasks}), got {task!r}")
        if task == 1:
            self.broken = True
            raise RuntimeError("reset exploded")
        self.task, self.t = task, 0
        return f"task {task}"

    def step(self, action):
        if getattr(self, "broken", False):
            raise RuntimeError("env reused after its reset crashed")
        self.t += 1
        if self.task == 3 and self.t == 2:
            raise RuntimeError("step exploded")
        return f"turn {self.t}", 1.0, self.t >= 2, {}

    def valid_actions(self):
        return ["go"]

    def oracle_action(self):
        return "go"


FRAGILE = "test/fragile"
agentgym.register(FRAGILE, FragileEnv, override=True)
FRAGILE_TASKS = [0, 1, 2, 3, 4, 99]


def check_fragile_batch(batch, reset_error: str, invalid_error: str, step_error: str):
    assert [t.task_id for t in batch] == FRAGILE_TASKS
    t0, t1, t2, t3, t4, t99 = batch.trajectories
    assert_env_error(t1, reset_error, turns=0)
    assert_env_error(t99, invalid_error, turns=0)
    assert_env_error(t3, step_error)
    for t in (t0, t2, t4):
        assert_healthy(t)
        assert t.stop_reason == "done" and t.num_turns == 2 and t.reward == 2.0


@pytest.mark.parametrize("max_concurrency", [256, 2])
def test_python_env_reset_and_step_failures_end_only_their_episodes(tokenizer, max_concurrency):
    eng = engine(tokenizer, max_concurrency=max_concurrency)
    batch = eng.collect_sync(FRAGILE_TASKS, FRAGILE)
    check_fragile_batch(batch, "RuntimeError: reset exploded", "InvalidTaskError: task must be",
                        "RuntimeError: step exploded")
    eng.close()


def test_process_pool_reset_and_step_failures_end_only_their_episodes(tokenizer):
    # One slot per episode: a worker keeps an env whose reset raised (it resets it again).
    eng = engine(tokenizer, env_workers=2)
    try:
        batch = eng.collect_sync(FRAGILE_TASKS, FRAGILE)
        check_fragile_batch(batch, "reset exploded", "InvalidTaskError: task must be",
                            "RuntimeError: step exploded")
    finally:
        eng.close()


@pytest.mark.parametrize("max_concurrency", [256, 2])
def test_remote_env_reset_and_step_failures_end_only_their_episodes(tokenizer, max_concurrency):
    with ServerThread(FRAGILE, max_envs=64) as server:
        eng = engine(tokenizer, max_concurrency=max_concurrency)
        try:
            batch = eng.collect_sync(FRAGILE_TASKS, f"remote:{FRAGILE}",
                                     env_kwargs={"url": server.url})
            check_fragile_batch(batch, "reset exploded", "InvalidTaskError", "step exploded")
        finally:
            eng.close()
        # Every server-side env was freed, the ones dropped after raising included.
        assert server.service.listing()["live"] == 0


def test_python_scenario_env_invalid_task_fails_only_its_episode(tokenizer):
    tasks = [0, 1, 10**6, 2]
    batch = engine(tokenizer).collect_sync(tasks, "ecommerce_service")
    assert [t.task_id for t in batch] == tasks
    assert_env_error(batch.trajectories[2], "InvalidTaskError", "not in", turns=0)
    for i in (0, 1, 3):
        assert_healthy(batch.trajectories[i])
        assert batch.trajectories[i].stop_reason == "done"
