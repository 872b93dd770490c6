"""Reflection retries (``RolloutConfig.reflection``): an unsolved attempt is followed by a
note and a new attempt from the episode's start, in the same token-exact trajectory."""

import pytest

import agentgym
from agentgym.backends.base import GenerateResult
from agentgym.backends.scripted import ScriptedBackend
from agentgym.engine import RolloutConfig, RolloutEngine
from agentgym.engine.drivers import NativeDriver, make_driver
from agentgym.engine.mechanisms.reflection import REFLECTION_PROMPT, final_reward, note, retries
from agentgym.envs import BaseEnv
from agentgym.errors import SnapshotUnsupportedError
from tests.helpers import TaskEnv, mask_runs


class Line(BaseEnv):
    """A line of cells: ``right`` moves on (0.25 a step), ``give up`` ends the episode
    unsolved (reward 0, done), ``crash`` raises; cell 3 is the goal (reward 1, done)."""

    instructions = "Walk right. Reply with Action: right."
    num_tasks = 4
    snapshot_safe = True

    def reset(self, task=None, seed=None):
        self.pos = 0
        return "at 0"

    def step(self, action):
        if action == "crash":
            raise RuntimeError("boom")
        if action == "give up":
            return "gave up", 0.0, True, {}
        if action == "right":
            self.pos += 1
            if self.pos == 3:
                return "goal", 1.0, True, {}
            return f"at {self.pos}", 0.25, False, {}
        return f"invalid; at {self.pos}", 0.0, False, {"invalid": True}

    def oracle_action(self):
        return "right"

    def valid_actions(self):
        return ["right"]


class NoSnapshots(TaskEnv):
    def step(self, action):
        return "ok", 0.0, False, {}


agentgym.register("test/line", Line, override=True)
agentgym.register("test/no_snapshots_r", NoSnapshots, override=True)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


class Script(ScriptedBackend):
    """The oracle, except the replies ``script[turn]`` (the episode's turn counter, over
    all attempts) where given."""

    def __init__(self, tokenizer, script: dict[int, str] | None = None, default=None):
        super().__init__(tokenizer)
        self.script = script or {}
        self.default = default

    async def generate(self, prompt_ids, sampling, request_id=None, context=None):
        turn = int(request_id.rsplit("-", 2)[1])
        text = self.script.get(turn, self.default)
        if text is None:
            return await super().generate(prompt_ids, sampling, request_id, context)
        self.requests += 1
        ids = self._encode(text) + [self.end_of_turn_id]
        return GenerateResult(token_ids=ids, logprobs=[0.0] * len(ids), finish_reason="stop",
                              policy_version=self.policy_version)


def _engine(tokenizer, backend=None, **kw):
    kw.setdefault("max_total_tokens", 8192)
    return RolloutEngine(backend or ScriptedBackend(tokenizer), tokenizer, **kw)


def _model_runs(traj):
    return [(s, e) for m, s, e in mask_runs(traj.loss_mask) if m]


def test_the_texts_and_the_rules():
    text = note(None, 1, 1, "horizon", 0.0, "at 0")
    assert text == REFLECTION_PROMPT.format(attempt=1, attempts_left=1,
                                            outcome="the turn limit was reached",
                                            observation="at 0")
    assert "(the episode ended with return 0.25)" in note(None, 2, 0, "done", 0.25, "x")
    assert note("{attempt}/{attempts_left}: {outcome}", 1, 2, "horizon", 0, "x") \
        == "1/2: the turn limit was reached"
    assert retries("horizon", 0.5) and retries("done", 0.0)
    assert not retries("done", 1.0) and not retries("env_error", 0.0)
    assert not retries("length", 0.0) and not retries("backend_error", 0.0)
    assert final_reward(1.0, 3, 0.5) == 0.25 and final_reward(0.7, 1, 0.5) == 0.7
    with pytest.raises(ValueError):
        RolloutConfig(reflection=-1)
    with pytest.raises(ValueError):
        RolloutConfig(reflection_discount=1.5)
    with pytest.raises(ValueError):
        RolloutConfig(reflection_prompt="{nope}")


def test_maze_fails_then_solves_on_the_second_attempt(tokenizer):
    """Hand-checked: attempt 1 takes the oracle's first step (a shaping reward), then
    wanders (unreadable actions) to the horizon; the note; attempt 2 is the oracle's path,
    its first reply a reflection followed by the action."""
    kwargs = {"shaping": 0.5}
    plain = _engine(tokenizer, max_turns=40)
    (ref,) = plain.collect_sync(1, "maze", env_kwargs=kwargs)
    assert ref.success and ref.turn_rewards[0] > 0
    n, horizon = ref.num_turns, ref.num_turns + 2
    # turn 0 the oracle, turns 1..horizon-1 nonsense, turn `horizon` reflection + action
    script = {t: "Action: fly" for t in range(1, horizon)}
    backend = Script(tokenizer, script)
    eng = _engine(tokenizer, backend, max_turns=horizon, reflection=2,
                  reflection_discount=0.8)
    # the reflection reply carries the oracle's first action
    first = ref.token_ids[_model_runs(ref)[0][0]:_model_runs(ref)[0][1]]
    backend.script[horizon] = ("I wandered into walls. I will follow the open paths. "
                               + tokenizer.decode(first[:-1]))
    batch = eng.collect_sync(1, "maze", env_kwargs=kwargs)
    (traj,) = batch
    assert traj.stop_reason == "done" and traj.success
    assert traj.num_turns == horizon + n  # the horizon counted attempt 1's turns only
    assert traj.timings["attempts"] == 2.0 and batch.metrics["attempts/mean"] == 2.0
    assert traj.timings["invalid_turns"] == horizon - 1  # attempt 1's, kept over the restore
    # The return is the last attempt's, discounted once; attempt 1's shaping is not in it.
    assert traj.turn_rewards[0] == pytest.approx(ref.turn_rewards[0])
    assert traj.turn_rewards[horizon:] == pytest.approx(ref.turn_rewards)
    assert traj.reward == pytest.approx(ref.reward * 0.8)
    assert sum(traj.turn_rewards) == pytest.approx(ref.reward + ref.turn_rewards[0])
    # Masks: every reply is a policy run; the note between attempts is prompt (mask 0).
    runs = _model_runs(traj)
    assert len(runs) == traj.num_turns
    gap = traj.token_ids[runs[horizon - 1][1]:runs[horizon][0]]
    assert set(traj.loss_mask[runs[horizon - 1][1]:runs[horizon][0]]) == {0}
    driver = NativeDriver("maze", 1, **kwargs)
    import asyncio

    (start,) = asyncio.run(driver.reset_many([(0, traj.task_id, traj.seed, None)]))
    text = note(None, 1, 1, "horizon", 0.0, start)
    assert gap == eng.formatter.observation_ids([text])[0]
    reflection = tokenizer.decode(traj.token_ids[runs[horizon][0]:runs[horizon][1]])
    assert reflection.startswith("I wandered into walls.")
    assert set(traj.loss_mask[runs[horizon][0]:runs[horizon][1]]) == {1}
    # Attempt 2 replays the reference episode token for token after its reflection.
    tail = ref.token_ids[_model_runs(ref)[0][1]:]
    assert traj.token_ids[-len(tail):] == tail
    eng.close()
    plain.close()


def test_reflection_credit_trains_a_retry_solve_on_its_reflection_alone(tokenizer):
    """R³'s rule: an episode solved on a retry keeps its loss mask on the reflection (the
    retry's first reply) only; an episode whose retries all fail keeps every reply."""
    kwargs = {"shaping": 0.5}
    plain = _engine(tokenizer, max_turns=40)
    (ref,) = plain.collect_sync(1, "maze", env_kwargs=kwargs)
    horizon = ref.num_turns + 2
    first = ref.token_ids[_model_runs(ref)[0][0]:_model_runs(ref)[0][1]]
    script = {t: "Action: fly" for t in range(1, horizon)}
    script[horizon] = "I will follow the open paths. " + tokenizer.decode(first[:-1])
    solved = _engine(tokenizer, Script(tokenizer, script), max_turns=horizon, reflection=1,
                     reflection_credit="reflection")
    (traj,) = solved.collect_sync(1, "maze", env_kwargs=kwargs)
    assert traj.stop_reason == "done" and traj.timings["attempts"] == 2.0
    assert traj.reward == pytest.approx(ref.reward * 0.9)  # solved on the retry
    runs = [(s, e) for m, s, e in mask_runs(traj.loss_mask) if m]
    assert len(runs) == 1
    reflection = tokenizer.decode(traj.token_ids[runs[0][0]:runs[0][1]])
    assert reflection.startswith("I will follow the open paths.")
    failing = _engine(tokenizer, Script(tokenizer, default="Action: fly"), max_turns=3,
                      reflection=1, reflection_credit="reflection")
    (lost,) = failing.collect_sync(1, "maze")
    assert lost.timings["attempts"] == 2.0 and len(_model_runs(lost)) == lost.num_turns == 6
    with pytest.raises(ValueError, match="reflection_credit"):
        RolloutConfig(reflection_credit="plan")
    for e in (plain, solved, failing):
        e.close()


def test_the_horizon_counts_each_attempt_and_attempts_are_capped(tokenizer):
    eng = _engine(tokenizer, Script(tokenizer, default="Action: fly"), max_turns=3,
                  reflection=2)
    batch = eng.collect_sync(2, "maze")
    for traj in batch:
        assert traj.stop_reason == "horizon" and not traj.success
        assert traj.num_turns == 9 and traj.timings["attempts"] == 3.0
        assert traj.reward == 0.0 and traj.timings["invalid_turns"] == 9
        text = tokenizer.decode(traj.token_ids)
        assert text.count("ended without success") == 2
        assert "Attempt 2 ended without success" in text
        assert len(_model_runs(traj)) == 9
    assert batch.metrics["attempts/mean"] == 3.0
    eng.close()


def test_no_retry_after_success_and_identical_trajectories_without_reflection(tokenizer):
    default = _engine(tokenizer, max_turns=40)
    off = _engine(tokenizer, max_turns=40, reflection=0)
    on = _engine(tokenizer, max_turns=40, reflection=2)
    runs = [e.collect_sync(4, "maze") for e in (default, off, on)]
    for a, b, c in zip(*runs):
        assert a.success and "attempts" not in c.timings
        for t in (b, c):
            assert t.token_ids == a.token_ids and t.loss_mask == a.loss_mask
            assert t.logprobs == a.logprobs and t.turn_rewards == a.turn_rewards
            assert t.reward == a.reward and t.stop_reason == a.stop_reason
    assert runs[0].metrics["attempts/mean"] == 1.0
    for e in (default, off, on):
        e.close()


@pytest.mark.parametrize("kwargs", [{}, {"env_workers": 1}])
def test_a_python_env_retries_from_its_start(tokenizer, kwargs):
    # attempt 1: right (0.25), give up (done, unsolved); attempt 2: right x3 (goal)
    backend = Script(tokenizer, {1: "Action: give up", 2: "Try again. Action: right"})
    eng = _engine(tokenizer, backend, max_turns=10, reflection=1, reflection_discount=0.5)
    batch = eng.collect_sync(1, "test/line", **kwargs)
    (traj,) = batch
    # solved on attempt 2: judged on that attempt's return (1.5), not on the discounted
    # reward (0.75), which is what it trains on
    assert traj.stop_reason == "done" and traj.success
    assert batch.metrics["success_rate"] == 1.0
    assert batch.metrics["success_rate/first_attempt"] == 0.0
    assert traj.turn_rewards == [0.25, 0.0, 0.25, 0.25, 1.0]
    assert traj.reward == pytest.approx((0.25 + 0.25 + 1.0) * 0.5)
    assert traj.timings["attempts"] == 2.0 and traj.timings["attempt_return"] == 1.5
    # stored and read back, the row is judged the same
    from agentgym.collection.progress import shard_stats
    from agentgym.collection.schema import rows_to_trajectories, trajectories_table

    table = trajectories_table([traj], run_id="r", max_turns=10, env_kwargs={})
    assert table.column("attempt_return").to_pylist() == [1.5]
    assert rows_to_trajectories(table)[0].success
    assert shard_stats(table)["successes"] == 1
    assert shard_stats(table.drop_columns(["attempt_return"]))["successes"] == 0
    text = tokenizer.decode(traj.token_ids)
    assert "Attempt 1 ended without success (the episode ended with return 0.25)" in text
    assert "the environment is back at its start.\nat 0" in text
    assert text.count("at 1") == 2  # the restored env walks the same line again
    eng.close()


def test_a_retry_back_to_the_failing_turn_on_a_python_env(tokenizer):
    # attempt 1: right (0.25), give up (done, unsolved); back to before "give up" (at 1,
    # return 0.25); attempt 2: reflection + right (0.25), right (goal, 1.0)
    backend = Script(tokenizer, {1: "Action: give up", 2: "Not that. Action: right"})
    eng = _engine(tokenizer, backend, max_turns=10, reflection=1, reflection_discount=0.5,
                  reflection_restore="last")
    (traj,) = eng.collect_sync(1, "test/line")
    assert traj.stop_reason == "done" and traj.timings["attempts"] == 2.0
    assert traj.turn_rewards == [0.25, 0.0, 0.25, 1.0]
    # the last attempt's return counts the turn before the failing one
    assert traj.reward == pytest.approx((0.25 + 0.25 + 1.0) * 0.5)
    text = tokenizer.decode(traj.token_ids)
    assert "the environment is back where it was before your last action." in text
    assert "at 0" not in text.split("before your last action.")[1]  # not the start
    assert text.count("at 2") == 1
    # an attempt the horizon ended goes back to the start
    stuck = _engine(tokenizer, Script(tokenizer, default="Action: stay"), max_turns=2,
                    reflection=1, reflection_restore="last")
    (lost,) = stuck.collect_sync(1, "test/line")
    assert "the environment is back at its start.\nat 0" in tokenizer.decode(lost.token_ids)
    for e in (eng, stuck):
        e.close()


def test_a_retry_back_to_the_failing_turn_on_a_native_env(tokenizer):
    # wordle with 2 guesses: an unreadable reply, two wrong guesses (out of guesses: done,
    # unsolved); back to before the second guess, the retry's guess is guess 2 of 2
    script = {0: "Action: hello there", 1: "Action: guess crane", 2: "Action: guess slate",
              3: "Wrong word. Action: guess crane"}
    kwargs = {"max_guesses": 2}
    out = {}
    for restore in ("last", "start"):
        eng = _engine(tokenizer, Script(tokenizer, script), max_turns=10, reflection=1,
                      reflection_restore=restore)
        task = next(t for t in range(50) if not _solves(tokenizer, t, kwargs))
        (traj,) = eng.collect_sync([task], "wordle", env_kwargs=kwargs)
        out[restore] = traj
        eng.close()
    last, start = out["last"], out["start"]
    # back before guess 2, the retry's guess is the last one: the env ends the episode
    assert last.num_turns == 4 and last.stop_reason == "done"
    # from the start, it is guess 1 of 2, and one more follows
    assert "Guess 1/2: crane" in tokenizer.decode(start.token_ids).split("Wrong word.")[1]
    assert start.num_turns == 5
    # the unreadable reply is counted once over the restore, either way
    assert last.timings["invalid_turns"] == start.timings["invalid_turns"] == 1.0
    assert last.timings["attempts"] == start.timings["attempts"] == 2.0


def _solves(tokenizer, task, kwargs) -> bool:
    """Whether ``crane`` or ``slate`` is the answer of wordle ``task``."""
    env = agentgym.make("wordle", **kwargs)
    env.reset(seed=0, options={"task": task})
    _, r1, *_ = env.step("guess crane")
    env.reset(seed=0, options={"task": task})
    _, r2, *_ = env.step("guess slate")
    env.close()
    return max(r1, r2) >= 1.0


def test_a_python_env_horizon_applies_per_attempt(tokenizer):
    eng = _engine(tokenizer, Script(tokenizer, default="Action: stay"), max_turns=2,
                  reflection=1)
    (traj,) = eng.collect_sync(1, "test/line")
    assert traj.stop_reason == "horizon" and traj.num_turns == 4
    assert traj.timings["attempts"] == 2.0
    eng.close()


def test_no_retry_on_env_error(tokenizer):
    eng = _engine(tokenizer, Script(tokenizer, {0: "Action: crash"}), max_turns=10,
                  reflection=2)
    (traj,) = eng.collect_sync(1, "test/line")
    assert traj.stop_reason == "env_error" and traj.num_turns == 1
    assert "attempts" not in traj.timings
    eng.close()


@pytest.mark.parametrize("env_id", ["_test_panic", "test/no_snapshots_r"])
def test_reflection_on_an_env_that_cannot_snapshot_fails_at_setup(tokenizer, env_id):
    with pytest.raises(SnapshotUnsupportedError, match="reflection"):
        make_driver(env_id, 2, restarts=True)
    backend = ScriptedBackend(tokenizer)
    eng = RolloutEngine(backend, tokenizer, reflection=1)
    with pytest.raises(SnapshotUnsupportedError):
        eng.collect_sync(2, env_id)
    assert backend.requests == 0
    if env_id == "test/no_snapshots_r":
        with pytest.raises(SnapshotUnsupportedError):
            make_driver(env_id, 2, env_workers=1, restarts=True)


def test_retries_back_to_the_failing_turn_are_refused_in_worker_processes():
    with pytest.raises(SnapshotUnsupportedError, match="failing turn"):
        make_driver("test/line", 2, env_workers=1, restarts=True, lasts=True)
    with pytest.raises(ValueError, match="reflection_restore"):
        RolloutConfig(reflection=1, reflection_restore="middle")
