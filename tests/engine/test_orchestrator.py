"""RolloutEngine with the scripted backend and fault-injecting wrappers: token-exact
trajectories, group sampling, horizon, length, and failures recorded as data."""

import asyncio
import os
import threading
import time

import pytest

import agentgym
from agentgym.backends.base import BackendError
from agentgym.backends.scripted import ScriptedBackend
from agentgym.engine import RolloutEngine
from agentgym.envs import BaseEnv
from agentgym.parse import parse_action
from tests.helpers import TaskEnv, ThreadProbeEnv


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def engine(tokenizer, policy="oracle", backend=None, **kw):
    backend = backend or ScriptedBackend(tokenizer, policy=policy)
    kw.setdefault("max_turns", 40)
    kw.setdefault("max_total_tokens", 8192)
    return RolloutEngine(backend, tokenizer, **kw)


def segments(traj):
    """Runs of equal mask value: [(mask, [ids...]), ...]."""
    runs = []
    for tok, m in zip(traj.token_ids, traj.loss_mask):
        if runs and runs[-1][0] == m:
            runs[-1][1].append(tok)
        else:
            runs.append((m, [tok]))
    return runs


@pytest.mark.parametrize("env_id", ["textcraft", "maze"])
def test_oracle_trajectories_are_token_exact(tokenizer, env_id):
    eng = engine(tokenizer)
    batch = eng.collect_sync(6, env_id)
    assert len(batch) == 6
    eot = eng.formatter.end_of_turn_id
    for traj in batch:
        assert traj.stop_reason == "done" and traj.success, traj.stop_reason
        n = len(traj.token_ids)
        assert len(traj.loss_mask) == n == len(traj.logprobs)
        assert not any(traj.loss_mask[: traj.prompt_len])
        runs = segments(traj)
        model_runs = [ids for m, ids in runs if m == 1]
        assert len(model_runs) == traj.num_turns == len(traj.turn_rewards)
        assert all(ids[-1] == eot for ids in model_runs)  # end-of-turn token is trained on
        # Replay the env with the decoded actions and rebuild the conversation: the stored
        # ids must equal the chat template applied once to the final message list.
        env = agentgym.make(env_id)
        pool = env.unwrapped._pool
        obs0 = pool.reset([0], [traj.task_id], [traj.seed], [None])[0]
        messages = [{"role": "system", "content": pool.instructions},
                    {"role": "user", "content": obs0}]
        for k, ids in enumerate(model_runs):
            text = tokenizer.decode(ids[:-1])
            messages.append({"role": "assistant", "content": text})
            action = parse_action(text)
            (obs,), rew, term, _ = pool.step([0], [action])
            assert float(rew[0]) == traj.turn_rewards[k]
            if k < len(model_runs) - 1:
                messages.append({"role": "user", "content": obs})
        rendered = tokenizer.apply_chat_template(messages, tokenize=False)
        expected = eng.formatter.encode(rendered)
        assert traj.token_ids == expected[: len(traj.token_ids)]
        assert len(expected) - len(traj.token_ids) <= 1  # the template's trailing newline
        assert traj.reward == pytest.approx(sum(traj.turn_rewards))


def test_group_sampling_shares_task_seed_and_prompt(tokenizer):
    batch = engine(tokenizer, policy="random").collect_sync([3, 11], "maze", n_samples=3,
                                                         max_turns=4)
    assert [(t.task_id, t.sample_index) for t in batch] == [
        (3, 0), (3, 1), (3, 2), (11, 0), (11, 1), (11, 2)]
    g0, g1 = batch.trajectories[:3], batch.trajectories[3:]
    assert len({t.group_id for t in g0}) == 1 and g0[0].group_id != g1[0].group_id
    assert len({t.seed for t in g0}) == 1
    assert len({tuple(t.token_ids[: t.prompt_len]) for t in g0}) == 1
    packed = batch.packed()
    assert packed.offsets[-1] == packed.num_tokens == sum(len(t.token_ids) for t in batch)


def test_stream_requests_plays_exactly_the_requests(tokenizer):
    from agentgym.engine import EpisodeRequest

    reqs = [EpisodeRequest(5, 40, 1), EpisodeRequest(5, 40, 0), EpisodeRequest(2, 7, 3),
            EpisodeRequest(9, 41, 0, seed=12345)]

    async def play(eng, requests):
        return sorted([t async for t in eng.stream_requests(requests, "maze", max_turns=6)],
                      key=lambda t: (t.group_id, t.sample_index))

    first = asyncio.run(play(engine(tokenizer), reqs))
    assert [(t.task_id, t.group_id, t.sample_index) for t in first] == [
        (2, 7, 3), (5, 40, 0), (5, 40, 1), (9, 41, 0)]
    assert first[3].seed == 12345
    assert first[1].seed == first[2].seed != first[0].seed  # a group shares its env seed
    # The same request replays the same episode on another engine, alone or in any order;
    # the seed depends on (config seed, group), not on what else is played.
    again = asyncio.run(play(engine(tokenizer), [reqs[2], reqs[0]]))
    assert [(t.seed, t.token_ids, t.reward) for t in again] == [
        (t.seed, t.token_ids, t.reward) for t in (first[0], first[2])]
    other = asyncio.run(play(engine(tokenizer, seed=1), reqs[:1]))
    assert other[0].seed != first[2].seed


def test_stream_requests_takes_requests_that_arrive_while_it_runs(tokenizer):
    """An async iterable of requests feeds one running stream: requests sent after the first
    trajectories came back join it, the stream ends once the feed is exhausted, and each
    request plays the episode the list form plays."""
    from agentgym.engine import EpisodeRequest

    reqs = [EpisodeRequest(k % 5, 100 + k, k % 2) for k in range(12)]
    eng = engine(tokenizer, max_concurrency=4)

    async def play_fed():
        sent_more = asyncio.Event()
        first_done = asyncio.Event()

        async def feed():
            for r in reqs[:3]:
                yield r
            await first_done.wait()  # the rest arrive only after a trajectory came back
            for r in reqs[3:]:
                yield r
            sent_more.set()

        out = []
        async for t in eng.stream_requests(feed(), "maze", max_turns=6):
            out.append((t, sent_more.is_set()))
            first_done.set()
        return out

    fed = asyncio.run(play_fed())
    assert not fed[0][1]  # the first came back before the rest of the feed was sent
    got = sorted((t for t, _ in fed), key=lambda t: t.group_id)
    assert [(t.task_id, t.group_id, t.sample_index) for t in got] == [tuple(r[:3]) for r in reqs]

    async def play_list():
        return sorted([t async for t in engine(tokenizer).stream_requests(
            reqs, "maze", max_turns=6)], key=lambda t: t.group_id)

    assert [(t.seed, t.token_ids) for t in got] == [(t.seed, t.token_ids)
                                                    for t in asyncio.run(play_list())]

    async def failing():
        yield reqs[0]
        raise RuntimeError("feed broke")

    async def drain():
        return [t async for t in eng.stream_requests(failing(), "maze", max_turns=6)]

    with pytest.raises(RuntimeError, match="feed broke"):
        asyncio.run(drain())


def test_stream_batches_hand_each_tick_with_its_packed_rows(tokenizer):
    """``stream_batches`` plays the same episodes as ``stream_requests``; each batch's packed
    row ``i`` holds trajectory ``i``'s tokens, mask, logprobs and turn rewards, and its row
    info the rest of it. Asked for rows only, it hands the same rows without trajectories."""
    from agentgym.data.trajectories import STOP_CODES, RowInfo
    from agentgym.engine import EpisodeRequest

    reqs = [EpisodeRequest(t % 7, t, 0) for t in range(24)]
    key = lambda t: (t.group_id, t.sample_index)  # noqa: E731

    async def play(mode: str):
        eng = engine(tokenizer, max_turns=8, max_concurrency=5, progress=False)
        eng.backend.policy_version = 3  # weights updated before this stream began
        try:
            if mode == "plain":
                return [t async for t in eng.stream_requests(reqs, "textcraft")]
            return [b async for b in eng.stream_batches(reqs, "textcraft",
                                                        trajectories=mode == "batches")]
        finally:
            eng.close()

    plain = sorted(asyncio.run(play("plain")), key=key)
    batches = asyncio.run(play("batches"))
    assert len(batches) > 2  # refilled slots end on different ticks
    trajs = [t for b in batches for t in b.trajectories]
    assert [(t.token_ids, t.loss_mask, t.logprobs, t.reward, t.stop_reason) for t in
            sorted(trajs, key=key)] == [
        (t.token_ids, t.loss_mask, t.logprobs, t.reward, t.stop_reason) for t in plain]
    for p, info, ts in batches:
        assert len(p) == len(ts)
        assert info == RowInfo.of(ts)
        for i, t in enumerate(ts):
            a, b = p.offsets[i], p.offsets[i + 1]
            assert p.token_ids[a:b].tolist() == t.token_ids
            assert p.loss_mask[a:b].tolist() == t.loss_mask
            assert p.logprobs[a:b].tolist() == t.logprobs
            ta, tb = p.turn_offsets[i], p.turn_offsets[i + 1]
            assert p.turn_rewards[ta:tb].tolist() == t.turn_rewards
            assert (p.prompt_len[i], p.num_turns[i], p.stop_reason[i]) == (
                t.prompt_len, t.num_turns, STOP_CODES[t.stop_reason])
            assert (p.group_id[i], p.sample_index[i]) == (t.group_id, t.sample_index)
            assert p.policy_version[i] == t.policy_version == 3

    def by_key(bs):
        out = {}
        for p, info, _ in bs:
            for i in range(len(p)):
                a, b = p.offsets[i], p.offsets[i + 1]
                out[int(p.group_id[i]), int(p.sample_index[i])] = (
                    p.token_ids[a:b].tolist(), p.loss_mask[a:b].tolist(), float(p.rewards[i]),
                    info.task_id[i], info.seed[i], info.env_id[i])
        return out

    rows_only = asyncio.run(play("rows"))
    assert all(b.trajectories is None for b in rows_only)
    assert sum(len(b.packed) for b in rows_only) == len(reqs)
    assert by_key(rows_only) == by_key(batches)


def test_horizon_and_length_limits(tokenizer):
    eng = engine(tokenizer, policy="random")
    horizon = eng.collect_sync(8, "maze", max_turns=2, env_kwargs={})
    assert {t.stop_reason for t in horizon} <= {"horizon", "done"}
    assert all(t.num_turns <= 2 for t in horizon)
    assert any(t.stop_reason == "horizon" for t in horizon)
    prompt_len = eng.collect_sync(1, "maze", max_turns=1).trajectories[0].prompt_len
    cap = prompt_len + 60
    short = eng.collect_sync(4, "maze", max_turns=50, max_total_tokens=cap)
    assert all(t.stop_reason in ("length", "done") for t in short)
    assert all(len(t.token_ids) <= cap for t in short)
    assert any(t.stop_reason == "length" for t in short)
    cut = eng.collect_sync(2, "maze", max_new_tokens=2, truncated_turn="end")
    assert all(t.stop_reason == "length" and t.num_turns == 0 for t in cut)


@pytest.mark.parametrize("env_id", ["maze", "office"])
def test_refused_actions_are_counted_per_episode(tokenizer, env_id):
    """A turn whose action the env refuses as unreadable is counted in the trajectory's
    ``invalid_turns`` and the batch's ``invalid_turns/*`` metrics: a native env (its pool
    counts) and a Python env (``info["invalid"]``) alike; an oracle's turns are never
    counted."""
    talk = ScriptedBackend(tokenizer, template="I am not sure what {action} would do")
    batch = engine(tokenizer, backend=talk, max_turns=3).collect_sync(4, env_id)
    for t in batch:
        assert t.num_turns >= 1 and t.timings["invalid_turns"] == t.num_turns
    assert batch.metrics["invalid_turns/share"] == 1.0
    assert batch.metrics["invalid_turns/mean"] == pytest.approx(
        sum(t.num_turns for t in batch) / len(batch))
    oracle = engine(tokenizer).collect_sync(4, env_id)
    assert all("invalid_turns" not in t.timings for t in oracle)
    assert oracle.metrics["invalid_turns/share"] == 0.0


def test_a_reply_cut_at_max_new_tokens_steps_the_env(tokenizer):
    """truncated_turn="step" (the default): a reply cut at max_new_tokens is closed with an
    end-of-turn token (mask 0), the env steps with what was written, and the episode goes
    on to its horizon; every cut is counted."""
    eng = engine(tokenizer, policy="random")
    eot = eng.formatter.end_of_turn_id
    batch = eng.collect_sync(4, "maze", max_new_tokens=2, max_turns=3)
    for t in batch:
        assert t.stop_reason in ("horizon", "done") and t.num_turns >= 1, t.stop_reason
        runs = segments(t)
        model = [i for i, (m, _) in enumerate(runs) if m == 1]
        assert len(model) == t.num_turns
        for i in model:
            assert len(runs[i][1]) == 2 and eot not in runs[i][1]  # cut, never ended
            assert runs[i + 1][1][0] == eot  # closed as a prompt token
        assert t.timings["cut_turns"] == t.num_turns
    assert batch.metrics["cut_turns/mean"] == pytest.approx(
        sum(t.num_turns for t in batch) / len(batch))
    with pytest.raises(ValueError, match="truncated_turn"):
        agentgym.engine.RolloutConfig(truncated_turn="stop")


def test_reply_prefix_opens_every_assistant_turn(tokenizer):
    """reply_prefix: each assistant turn starts with the prefix as prompt tokens (mask 0),
    the trajectory stays token-exact, and only the reply is parsed."""
    eng = engine(tokenizer, policy="oracle", max_turns=12)
    prefix = eng.formatter.encode("Action:")
    kw = {"size": 3, "loops": 4}
    batch = eng.collect_sync(3, "maze", env_kwargs=kw, reply_prefix="Action:")
    plain = eng.collect_sync(3, "maze", env_kwargs=kw)
    for t, p in zip(batch, plain, strict=True):
        assert (t.num_turns, t.reward, t.stop_reason) == (p.num_turns, p.reward, p.stop_reason)
        assert t.success
        runs = segments(t)
        model = [i for i, (m, _) in enumerate(runs) if m == 1]
        assert len(model) == t.num_turns
        for i in model:  # the prompt tokens before each reply end with the prefix
            assert runs[i - 1][1][-len(prefix):] == prefix
        assert len(t.token_ids) == len(p.token_ids) + len(prefix) * (t.num_turns)


class FlakyBackend(ScriptedBackend):
    """Fault injection: fails every request of chosen episodes, records request ids."""

    def __init__(self, tokenizer, fail_keys, delay=0.0, **kw):
        super().__init__(tokenizer, **kw)
        self.fail_keys = set(fail_keys)
        self.delay = delay
        self.request_ids = []
        self.in_flight = set()

    async def generate(self, prompt_ids, sampling, request_id=None, context=None):
        self.request_ids.append(request_id)
        key = int(request_id.split("-")[1])
        self.in_flight.add(request_id)
        try:
            if self.delay:
                await asyncio.sleep(self.delay)
            if key in self.fail_keys:
                raise BackendError(f"injected failure for {request_id}")
            return await super().generate(prompt_ids, sampling, request_id, context)
        finally:
            self.in_flight.discard(request_id)


def test_backend_errors_end_only_their_episode(tokenizer):
    # Episode keys count from 0 per engine, so key 1 is the second task.
    backend = FlakyBackend(tokenizer, fail_keys={1})
    eng = engine(tokenizer, backend=backend, backend_retries=2, retry_backoff_s=0.0)
    batch = eng.collect_sync(4, "maze")
    reasons = [t.stop_reason for t in batch]
    assert reasons[1] == "backend_error" and reasons.count("done") == 3
    failed = batch.trajectories[1]
    assert not any(failed.loss_mask) and "injected" in failed.error
    tries = [r for r in backend.request_ids if r.split("-")[1] == "1"]
    assert len(tries) == 3 and len(set(tries)) == 3  # bounded retries, fresh ids


class CrashyEnv(TaskEnv):
    instructions = "Say anything. 'boom' crashes the env."

    def step(self, action):
        if self.task == 2:
            raise RuntimeError("simulator crashed")
        return "ok", 1.0, True, {}

    def valid_actions(self):
        return ["go"]


def test_env_exceptions_and_panics_are_env_errors(tokenizer):
    agentgym.register("test/crashy", CrashyEnv, override=True)
    batch = engine(tokenizer).collect_sync(4, "test/crashy")
    assert [t.stop_reason for t in batch] == ["done", "done", "env_error", "done"]
    assert "simulator crashed" in batch.trajectories[2].error
    assert not any(batch.trajectories[2].loss_mask)
    # A native env that panics in Rust: same outcome, the batch keeps its shape.
    panics = engine(tokenizer, policy="random").collect_sync(40, "_test_panic", max_turns=6)
    kinds = {t.stop_reason for t in panics}
    assert "env_error" in kinds and kinds <= {"env_error", "done", "horizon"}
    assert len(panics) == 40


class StallingBackend(ScriptedBackend):
    """Answers at once, except that the requests ``stall(key, turn)`` picks wait
    ``stall_s`` seconds first (a stand-in for a stuck inference server: the real backends
    cannot be made to stall on demand). Records every request id, and each request
    cancelled or aborted while it waited."""

    def __init__(self, tokenizer, stall, stall_s=60.0, **kw):
        super().__init__(tokenizer, **kw)
        self.stall = stall
        self.stall_s = stall_s
        self.request_ids = []
        self.cancelled = []
        self.aborted = []

    async def generate(self, prompt_ids, sampling, request_id=None, context=None):
        self.request_ids.append(request_id)
        _, key, turn, _ = request_id.rsplit("-", 3)
        if self.stall(int(key), int(turn)):
            try:
                await asyncio.sleep(self.stall_s)
            except asyncio.CancelledError:
                self.cancelled.append(request_id)
                raise
        return await super().generate(prompt_ids, sampling, request_id, context)

    async def abort(self, request_id):
        self.aborted.append(request_id)

    def turn_requests(self, key, turn):
        return [r for r in self.request_ids if r.rsplit("-", 3)[1:3] == [str(key), str(turn)]]


async def test_turn_timeout_is_recorded(tokenizer):
    # Every episode's second turn stalls: turn 0 is played and stored, turn 1 times out.
    backend = StallingBackend(tokenizer, stall=lambda key, turn: turn == 1)
    batch = await engine(tokenizer, backend=backend, turn_timeout_s=1.0).collect(3, "maze")
    assert [t.stop_reason for t in batch] == ["timeout"] * 3
    for key, traj in enumerate(batch):
        assert traj.num_turns == 1 and "timed out" in traj.error
        assert len(traj.token_ids) > traj.prompt_len  # the first reply is kept ...
        assert len(traj.loss_mask) == len(traj.token_ids)
        assert not any(traj.loss_mask)  # ... but not trained on
        (rid,) = backend.turn_requests(key, 1)  # one request for the turn: no retry
        # Stopped at the backend by the time the batch is back (not left running).
        assert rid in backend.cancelled or rid in backend.aborted
    assert len(backend.request_ids) == 6


async def test_cancelling_collect_leaves_no_request_running(tokenizer):
    backend = FlakyBackend(tokenizer, fail_keys=(), delay=10.0)
    eng = engine(tokenizer, backend=backend)
    task = asyncio.ensure_future(eng.collect(8, "maze"))
    while len(backend.in_flight) < 8:
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert backend.in_flight == set()


async def test_stream_yields_in_completion_order_without_barrier(tokenizer):
    class SlowFor(FlakyBackend):
        async def generate(self, prompt_ids, sampling, request_id=None, context=None):
            if request_id.split("-")[1] == "0":
                await asyncio.sleep(0.3)
            return await super().generate(prompt_ids, sampling, request_id, context)

    eng = engine(tokenizer, backend=SlowFor(tokenizer, fail_keys=()))
    order = [t.group_id async for t in eng.stream(6, "maze", max_concurrency=3)]
    assert sorted(order) == list(range(6)) and order[-1] == 0


@pytest.mark.slow
def test_python_envs_in_worker_processes(tokenizer):
    eng = engine(tokenizer, max_turns=12)
    threads = eng.collect_sync(4, "office", env_kwargs={"split": "test"})
    procs = eng.collect_sync(4, "office", env_kwargs={"split": "test"}, env_workers=2)
    assert [t.stop_reason for t in procs] == ["done"] * 4
    assert all(t.success for t in procs)
    # Same tasks and seeds, same oracle: the process pool plays the same episodes.
    assert [t.token_ids for t in procs] == [t.token_ids for t in threads]
    eng.close()


def test_gc_threshold_is_raised_during_a_run_and_restored(tokenizer):
    import gc

    before = gc.get_threshold()
    seen = []

    class Probe(ScriptedBackend):
        async def generate(self, *a, **kw):
            seen.append(gc.get_threshold()[0])
            return await super().generate(*a, **kw)

    engine(tokenizer, backend=Probe(tokenizer), gc_threshold=12345).collect_sync(2, "maze")
    assert seen and set(seen) == {max(12345, before[0])}
    assert gc.get_threshold() == before


@pytest.mark.parametrize("budget", [0.0, 10.0])
def test_fast_python_envs_step_inline_only_within_the_budget(tokenizer, budget):
    agentgym.register("test/thread_probe", ThreadProbeEnv, override=True)
    ThreadProbeEnv.threads = set()
    ThreadProbeEnv.step_threads = []
    eng = engine(tokenizer, policy="random", max_concurrency=4, inline_env_budget_s=budget)
    batch = eng.collect_sync(12, "test/thread_probe")
    assert [t.num_turns for t in batch] == [3] * 12
    driver, _ = next(iter(eng._drivers.values()))
    assert driver.step_cost is not None  # measured
    loop_thread = threading.get_ident()
    inline = [t == loop_thread for t in ThreadProbeEnv.step_threads]
    assert len(inline) == 36
    if budget == 0:
        assert not any(inline)  # a zero budget always uses the thread pool
    else:
        # A step runs on the pool only while its cost is unknown: the steps sent before the
        # first measurement came back, at most one per live episode. All later ones inline.
        assert 1 <= inline.count(False) <= 4
        assert inline.count(True) >= 32
    eng.close()


async def test_episode_timeout_ends_only_the_slow_episode(tokenizer):
    # Episode 1's second turn stalls far past the episode budget; the others play on.
    backend = StallingBackend(tokenizer, stall=lambda key, turn: key == 1 and turn == 1,
                              stall_s=30.0)
    batch = await engine(tokenizer, backend=backend, episode_timeout_s=3.0).collect(4, "maze")
    assert [t.stop_reason for t in batch] == ["done", "timeout", "done", "done"]
    slow = batch.trajectories[1]
    assert slow.num_turns == 1 and "timed out" in slow.error
    assert len(slow.token_ids) > slow.prompt_len and not any(slow.loss_mask)
    (rid,) = backend.turn_requests(1, 1)
    assert rid in backend.cancelled or rid in backend.aborted
    # The other episodes are exactly those of a run without the stall or the budget.
    plain = await engine(tokenizer).collect(4, "maze")
    for i in (0, 2, 3):
        got, want = batch.trajectories[i], plain.trajectories[i]
        assert got.success and got.error is None
        assert (got.token_ids, got.loss_mask, got.turn_rewards) == (
            want.token_ids, want.loss_mask, want.turn_rewards)


class ChattyEnv(BaseEnv):
    """Never ends by itself; each observation is long (longer for higher tasks)."""

    instructions = "Say anything."
    num_tasks = 100

    def reset(self, task=None, seed=None):
        self.task, self.t = task or 0, 0
        return "start " + "and so on " * (2 + self.task)

    def step(self, action):
        self.t += 1
        return f"turn {self.t}: " + "more words here " * (3 + self.task), 0.5, False, {}

    def valid_actions(self):
        return ["go"]


def test_context_cap_ends_python_env_episodes_with_length(tokenizer):
    agentgym.register("test/chatty", ChattyEnv, override=True)
    eng = engine(tokenizer, policy="random", max_turns=100)
    prompt_len = eng.collect_sync([0], "test/chatty", max_turns=1).trajectories[0].prompt_len
    cap = prompt_len + 150
    batch = eng.collect_sync(8, "test/chatty", max_total_tokens=cap)
    assert len(batch) == 8
    for traj in batch:
        assert traj.stop_reason == "length", (traj.stop_reason, traj.error)
        assert traj.num_turns >= 1  # cut mid-episode, after some turns
        n = len(traj.token_ids)
        assert n <= cap and len(traj.loss_mask) == n == len(traj.logprobs)
        assert not any(traj.loss_mask[: traj.prompt_len])
        model_runs = [ids for m, ids in segments(traj) if m == 1]
        assert traj.num_turns <= len(model_runs) <= traj.num_turns + 1
        assert len(traj.turn_rewards) == traj.num_turns
        assert traj.reward == pytest.approx(0.5 * traj.num_turns)
    # The cap lands at different points of different tasks' conversations.
    assert len({t.num_turns for t in batch}) > 1
    eng.close()


class WorkerCrashEnv(TaskEnv):
    """Three turns of reward 1; task 1's second step kills its worker process (a stand-in
    for a simulator that segfaults)."""

    def step(self, action):
        if self.task == 1 and self.n == 1:
            os._exit(3)
        self.n += 1
        return f"task {self.task} turn {self.n}", 1.0, self.n >= 3, {}

    def valid_actions(self):
        return ["go"]


@pytest.mark.slow  # spawns and restarts worker processes
async def test_worker_crash_ends_its_episode_and_the_pool_restarts(tokenizer):
    agentgym.register("test/worker_crash", WorkerCrashEnv, override=True)
    eng = engine(tokenizer, policy="random", max_concurrency=4)
    try:
        # Tasks 0 and 1 share worker 0 (slots 0-1), tasks 2 and 3 worker 1.
        batch = await asyncio.wait_for(
            eng.collect(4, "test/worker_crash", env_workers=2), timeout=120)
        assert [t.stop_reason for t in batch] == ["done", "env_error", "done", "done"]
        crashed = batch.trajectories[1]
        assert "worker process died (exit code 3)" in crashed.error
        assert crashed.num_turns == 2 and not any(crashed.loss_mask)
        for i in (0, 2, 3):  # task 0 was replayed into the restarted worker and finished
            traj = batch.trajectories[i]
            assert (traj.num_turns, traj.reward, traj.error) == (3, 3.0, None)
        driver, _ = next(iter(eng._drivers.values()))
        assert driver.pool.restarts == 1
        again = await asyncio.wait_for(  # the restarted pool serves the next collect
            eng.collect([0, 2], "test/worker_crash", env_workers=2), timeout=120)
        assert [t.stop_reason for t in again] == ["done", "done"]
    finally:
        eng.close()


@pytest.mark.slow  # spawns worker processes
async def test_engine_failure_with_a_process_pool_is_raised_not_hung(tokenizer, monkeypatch):
    from agentgym.engine.drivers import ProcessDriver

    def broken_finish(self, items):  # fault injection: a driver call outside any
        raise RuntimeError("driver bookkeeping failed")  # episode's own error handling

    agentgym.register("test/worker_crash", WorkerCrashEnv, override=True)
    eng = engine(tokenizer, policy="random", max_concurrency=2)
    try:
        with monkeypatch.context() as m:
            m.setattr(ProcessDriver, "finish", broken_finish)
            with pytest.raises(RuntimeError, match="driver bookkeeping failed"):
                await asyncio.wait_for(
                    eng.collect([0, 2, 3], "test/worker_crash", env_workers=1), timeout=120)
        ok = await asyncio.wait_for(  # the engine (its driver lock, the pool) still works
            eng.collect([0, 2], "test/worker_crash", env_workers=1), timeout=120)
        assert [t.stop_reason for t in ok] == ["done", "done"]
    finally:
        eng.close()


class GatedStepEnv(TaskEnv):
    """One turn per episode; task 0's step writes ``<gate>/started`` and returns only once
    ``<gate>/go`` exists, so a test can hold it in flight."""

    def __init__(self, gate=""):
        self.gate = gate

    def step(self, action):
        if self.task == 0:
            open(os.path.join(self.gate, "started"), "w").close()
            deadline = time.monotonic() + 60
            while not os.path.exists(os.path.join(self.gate, "go")) and time.monotonic() < deadline:
                time.sleep(0.01)
        return "ok", 1.0, True, {}

    def valid_actions(self):
        return ["go"]


@pytest.mark.slow  # spawns worker processes
async def test_cancelled_collect_frees_process_pool_slots(tokenizer, tmp_path):
    agentgym.register("test/gated_step", GatedStepEnv, override=True)
    eng = engine(tokenizer, policy="random", max_concurrency=1)
    kw = dict(env_kwargs={"gate": str(tmp_path)}, env_workers=1)
    try:
        first = asyncio.ensure_future(eng.collect([0], "test/gated_step", **kw))
        while not (tmp_path / "started").exists():  # its env step is running in the worker
            assert not first.done()
            await asyncio.sleep(0.01)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        second = asyncio.ensure_future(eng.collect([1], "test/gated_step", **kw))
        driver, _ = next(iter(eng._drivers.values()))
        slot = driver.pool._slots[0]
        while not second.done() and slot.epoch < 2:  # until its reset is queued
            await asyncio.sleep(0.01)
        (tmp_path / "go").touch()  # the held step returns; the new episode runs
        batch = await asyncio.wait_for(second, 120)
        assert [(t.stop_reason, t.error) for t in batch] == [("done", None)]
    finally:
        (tmp_path / "go").touch()
        eng.close()
