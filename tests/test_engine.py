"""RolloutEngine with the scripted backend and fault-injecting wrappers: token-exact
trajectories, group sampling, horizon, length, and failures recorded as data."""

import asyncio
import threading

import pytest

import agentgym
from agentgym.backends.base import BackendError
from agentgym.backends.scripted import ScriptedBackend
from agentgym.engine import RolloutEngine
from agentgym.envs import BaseEnv


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
            action = agentgym.parse.parse_action(text)
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
    assert packed["offsets"][-1] == len(packed["token_ids"]) == sum(len(t.token_ids) for t in batch)


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
    cut = eng.collect_sync(2, "maze", max_new_tokens=2)
    assert all(t.stop_reason == "length" and t.num_turns == 0 for t in cut)


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


class CrashyEnv(BaseEnv):
    instructions = "Say anything. 'boom' crashes the env."
    num_tasks = 100

    def reset(self, task=None, seed=None):
        self.task = task
        return f"task {task}"

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


def test_turn_timeout_is_recorded(tokenizer):
    backend = FlakyBackend(tokenizer, fail_keys=(), delay=0.5)
    batch = engine(tokenizer, backend=backend, turn_timeout_s=0.05).collect_sync(3, "maze")
    assert [t.stop_reason for t in batch] == ["timeout"] * 3


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


class ThreadProbeEnv(BaseEnv):
    """Records the thread of every step; ends after three turns."""

    instructions = "Say anything."
    num_tasks = 100
    threads: set = set()

    def reset(self, task=None, seed=None):
        self.t = 0
        return "start"

    def step(self, action):
        ThreadProbeEnv.threads.add(threading.get_ident())
        self.t += 1
        return f"turn {self.t}", 0.0, self.t >= 3, {}


@pytest.mark.parametrize("budget", [0.0, 1.0])
def test_fast_python_envs_step_inline_only_within_the_budget(tokenizer, budget):
    agentgym.register("test/thread_probe", ThreadProbeEnv, override=True)
    ThreadProbeEnv.threads = set()
    eng = engine(tokenizer, policy="random", max_concurrency=4, inline_env_budget_s=budget)
    batch = eng.collect_sync(12, "test/thread_probe")
    assert [t.num_turns for t in batch] == [3] * 12
    driver, _ = next(iter(eng._drivers.values()))
    assert driver.step_cost is not None and driver.step_cost < 0.25
    on_loop = threading.get_ident() in ThreadProbeEnv.threads
    # The first tick is measured on the pool; later ones run inline when the budget allows.
    assert on_loop == (budget > 0)
    assert len(ThreadProbeEnv.threads) >= 2 if budget > 0 else not on_loop
    eng.close()
