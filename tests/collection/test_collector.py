"""``Collector`` with the scripted oracle on native and Python envs: resume equals an
uninterrupted run, failed rows and ``retry_failed``, a foreign runner, named errors."""

import os

import pyarrow as pa
import pyarrow.dataset as ds
import pytest

import agentgym
from agentgym.backends.scripted import ScriptedBackend
from agentgym.collection import (
    Collector,
    DiskFullError,
    OutputNotWritableError,
    RunLockedError,
    RunMismatchError,
    store,
)
from agentgym.engine import RolloutEngine
from agentgym.engine.loop import run
from agentgym.envs import BaseEnv
from tests.helpers import collect_run

VOLATILE = ["run_id", "time_total_s", "time_gen_s"]


def engine(tokenizer, policy="oracle", **kw):
    kw.setdefault("max_turns", 12)
    kw.setdefault("max_total_tokens", 4096)
    return RolloutEngine(ScriptedBackend(tokenizer, policy=policy), tokenizer,
                         progress=False, **kw)


def folder_table(path) -> pa.Table:
    """Every row of a run folder, read as a plain reader would (pyarrow over the folder)."""
    fmt = "json" if any(f.endswith(".jsonl") for f in os.listdir(path)) else "parquet"
    t = ds.dataset(str(path), format=fmt).to_table()
    return t.sort_by([("task_index", "ascending"), ("sample_index", "ascending")])


def keys(t: pa.Table) -> list[tuple[int, int]]:
    return list(zip(t.column("task_index").to_pylist(), t.column("sample_index").to_pylist()))


def collect(tokenizer, out, tasks=range(30), env="maze", n_samples=2, stop_after=None,
            eng=None, **kw):
    """Collect into ``out``; with ``stop_after`` stop consuming after that many
    trajectories (the rest of the run is abandoned, as a crash would)."""
    eng = eng or engine(tokenizer)
    try:
        return collect_run(Collector(eng, env, tasks, out, n_samples=n_samples, shard_size=7,
                                     progress=False, **kw), stop_after)
    finally:
        eng.close()


def test_resumed_run_rows_equal_an_uninterrupted_run(tokenizer, tmp_path):
    full = collect(tokenizer, tmp_path / "full")
    assert full["run"]["complete"] and full["run"]["rows"] == 60
    # Stopped twice (the rows handed out so far are kept, the episodes in flight are not),
    # then resumed: the resume plays only the missing keys, each with the seed of its task.
    assert collect(tokenizer, tmp_path / "part", stop_after=20) is None
    assert collect(tokenizer, tmp_path / "part", stop_after=25) is None
    partial = folder_table(tmp_path / "part")
    assert 0 < partial.num_rows < 60
    resumed = collect(tokenizer, tmp_path / "part")
    assert resumed["session"]["episodes"] == 60 - partial.num_rows
    a = folder_table(tmp_path / "full").drop_columns(VOLATILE)
    b = folder_table(tmp_path / "part").drop_columns(VOLATILE)
    assert keys(b) == [(t, s) for t in range(30) for s in range(2)]
    assert a.equals(b)
    assert b.column("group_id").to_pylist() == b.column("task_index").to_pylist()


def test_a_resumed_random_policy_run_replays_the_same_episodes(tokenizer, tmp_path):
    """The scripted random policy draws from each episode's seed, sample and turn, not from
    the engine's counters: a run interrupted and resumed in other processes' order writes the
    rows of an uninterrupted run, and the samples of a task differ from each other."""
    full = collect(tokenizer, tmp_path / "full", eng=engine(tokenizer, "random"), n_samples=4)
    assert full["run"]["complete"]
    assert collect(tokenizer, tmp_path / "part", eng=engine(tokenizer, "random"), n_samples=4,
                   stop_after=50) is None
    collect(tokenizer, tmp_path / "part", eng=engine(tokenizer, "random"), n_samples=4)
    a = folder_table(tmp_path / "full").drop_columns(VOLATILE)
    b = folder_table(tmp_path / "part").drop_columns(VOLATILE)
    assert a.equals(b)
    token_ids = a.column("token_ids").to_pylist()
    per_task = [{tuple(x) for x in token_ids[4 * t:4 * t + 4]} for t in range(30)]
    assert sum(len(s) > 1 for s in per_task) > 15  # samples of one task play differently


def test_rows_carry_the_schema_and_summary_counts_them(tokenizer, tmp_path):
    s = collect(tokenizer, tmp_path / "r", tasks=range(5), env="textcraft", n_samples=3)
    t = folder_table(tmp_path / "r")
    assert t.schema.metadata[b"agentgym.schema_version"] == b"8"
    assert t.column("attempts").to_pylist() == [1] * t.num_rows
    assert t.column("undo_turns").to_pylist() == [0] * t.num_rows
    assert t.schema.field("token_ids").type == pa.list_(pa.uint32())
    assert t.schema.field("loss_mask").type == pa.list_(pa.uint8())
    assert t.schema.field("logprobs").type == pa.list_(pa.float32())
    rows = t.to_pylist()
    assert {r["env_id"] for r in rows} == {"textcraft"}
    assert [r["task_id"] for r in rows] == [i for i in range(5) for _ in range(3)]
    assert all(r["task_text"] is None and r["max_turns"] == 12 for r in rows)
    assert all(len(r["token_ids"]) == len(r["loss_mask"]) == len(r["logprobs"]) for r in rows)
    assert all(r["num_turns"] == len(r["turn_rewards"]) for r in rows)
    assert s["run"]["rows"] == 15 and s["session"]["episodes"] == 15
    assert s["run"]["success_rate"] == pytest.approx(
        sum(r["stop_reason"] == "done" and r["reward"] >= 1 for r in rows) / 15)
    assert s["run"]["generated_tokens"] == sum(sum(r["loss_mask"]) for r in rows)
    assert s["run"]["stop_reasons"] == {"done": 15}


class FlakyEnv(BaseEnv):
    """Test-only env: the tasks in ``FlakyEnv.failing`` raise on their first step (an env
    error); every other episode ends after one ``go``."""

    instructions = "Say go."
    num_tasks = 100
    failing: set = set()

    def reset(self, task=None, seed=None):
        self.task = task
        return f"task {task}"

    def step(self, action):
        if self.task in FlakyEnv.failing:
            raise RuntimeError("flaky step")
        return "ok", 1.0, True, {}

    def oracle_action(self):
        return "go"


agentgym.register("test/flaky", FlakyEnv, override=True)


def test_task_texts_and_jsonl_give_the_same_rows_as_parquet(tokenizer, tmp_path):
    texts = ["bad", "a", "b"]
    kw = dict(tasks=texts, env="test/flaky", n_samples=2)
    FlakyEnv.failing = {"bad"}
    try:
        collect(tokenizer, tmp_path / "p", **kw)
        collect(tokenizer, tmp_path / "j", format="jsonl", **kw)
    finally:
        FlakyEnv.failing = set()
    assert all(f.endswith(".jsonl") for f in os.listdir(tmp_path / "j") if f[0] != ".")
    p = folder_table(tmp_path / "p").drop_columns(VOLATILE)
    jt = pa.concat_tables(store.read_shard(f) for f in store.shard_files(tmp_path / "j"))
    jt = jt.sort_by([("task_index", "ascending"), ("sample_index", "ascending")])
    assert jt.drop_columns(VOLATILE).equals(p)
    rows = p.to_pylist()
    assert [r["task_text"] for r in rows] == [x for x in texts for _ in range(2)]
    assert [r["task_id"] for r in rows] == [None] * 6
    assert [r["stop_reason"] for r in rows] == ["env_error"] * 2 + ["done"] * 4
    assert "flaky step" in rows[0]["error"]


def test_failed_rows_are_kept_and_retry_failed_replaces_them(tokenizer, tmp_path):
    out = tmp_path / "r"
    FlakyEnv.failing = {2, 5}
    try:
        s = collect(tokenizer, out, tasks=range(8), env="test/flaky")
        assert s["run"]["stop_reasons"] == {"done": 12, "env_error": 4}
        # A plain resume keeps failed rows (they are data) and plays nothing.
        s = collect(tokenizer, out, tasks=range(8), env="test/flaky")
        assert s["session"]["episodes"] == 0 and s["run"]["failed"] == 4
    finally:
        FlakyEnv.failing = set()
    s = collect(tokenizer, out, tasks=range(8), env="test/flaky", retry_failed=True)
    assert s["session"]["episodes"] == 4
    t = folder_table(out)
    assert keys(t) == [(i, j) for i in range(8) for j in range(2)]  # each key once
    assert set(t.column("stop_reason").to_pylist()) == {"done"}
    assert s["run"] == {**s["run"], "rows": 16, "failed": 0, "complete": True}


class OnlyStreamRequests:
    """A runner that is not a RolloutEngine: it exposes only ``stream_requests`` (as a
    pool of remote workers does) and forwards to an engine it keeps private."""

    def __init__(self, tokenizer):
        self._engine = engine(tokenizer)
        self.calls = 0

    async def stream_requests(self, requests, env_id, *, env_kwargs=None, **overrides):
        self.calls += 1
        async for t in self._engine.stream_requests(list(requests), env_id,
                                                    env_kwargs=env_kwargs, **overrides):
            yield t


def test_any_runner_with_stream_requests(tokenizer, tmp_path):
    runner = OnlyStreamRequests(tokenizer)
    c = Collector(runner, "maze", range(10), tmp_path / "r", n_samples=2, window=6,
                  progress=False, max_turns=12)
    s = run(c.run())
    runner._engine.close()
    assert runner.calls == 4  # 20 keys in windows of 6
    assert s["run"]["complete"] and keys(folder_table(tmp_path / "r")) == \
        [(i, j) for i in range(10) for j in range(2)]
    with pytest.raises(TypeError, match="stream_requests"):
        Collector(object(), "maze", range(2), tmp_path / "x")


def test_shards_from_packed_rows_equal_shards_from_trajectory_lists(tokenizer, tmp_path,
                                                                     monkeypatch):
    """An engine hands its packed rows (``stream_batches``): the shards hold exactly what
    shards packed from a runner's trajectories hold, each of ``shard_size`` rows, whether
    the collection is consumed as trajectories (``stream``) or only run (``run``, which asks
    the engine for rows without trajectories)."""
    runner = OnlyStreamRequests(tokenizer)
    lists = Collector(runner, "textcraft", range(13), tmp_path / "l", n_samples=3,
                      shard_size=7, progress=False, max_turns=12)
    run(lists.run())
    runner._engine.close()
    # The engine's runs must not pack trajectories' lists: that path is made to fail.
    from agentgym.collection import collector

    def no_lists(trajs):
        raise AssertionError("shard packed from trajectory lists")

    monkeypatch.setattr(collector, "pack", no_lists)
    s = collect(tokenizer, tmp_path / "p", tasks=range(13), env="textcraft", n_samples=3)
    assert s["run"]["complete"]
    asked = []
    eng = engine(tokenizer)
    real = eng.stream_batches

    def spy(*args, trajectories, **kw):
        asked.append(trajectories)
        return real(*args, trajectories=trajectories, **kw)

    eng.stream_batches = spy
    rows_only = Collector(eng, "textcraft", range(13), tmp_path / "r", n_samples=3,
                          shard_size=7, progress=False)
    assert run(rows_only.run())["run"]["complete"]
    eng.close()
    assert asked == [False]
    for name in "pr":
        assert [store.read_shard(f).num_rows for f in store.shard_files(tmp_path / name)] \
            == [7] * 5 + [4]
    a = folder_table(tmp_path / "l").drop_columns(VOLATILE)
    for name in "pr":
        b = folder_table(tmp_path / name).drop_columns(VOLATILE)
        assert keys(b) == [(t, j) for t in range(13) for j in range(3)]
        assert b.equals(a)


def test_a_different_run_in_the_folder_is_refused_before_anything_changes(tokenizer,
                                                                          tmp_path):
    out = tmp_path / "r"
    collect(tokenizer, out, tasks=range(4), stop_after=3)
    before = {f: (out / f).read_bytes() for f in os.listdir(out) if f[0] != "."}
    meta = (out / ".agentgym" / "metadata.json").read_bytes()
    for kw, field in [({"env": "textcraft"}, "env_id"),
                      ({"eng": engine(tokenizer, max_turns=5)}, "rollout"),
                      ({"tasks": range(5)}, "tasks"),
                      ({"identity": {"model": "other"}}, "model"),
                      ({"format": "jsonl"}, "format")]:
        with pytest.raises(RunMismatchError, match=field):
            collect(tokenizer, out, **{"tasks": range(4), **kw})
    assert {f: (out / f).read_bytes() for f in os.listdir(out) if f[0] != "."} == before
    assert (out / ".agentgym" / "metadata.json").read_bytes() == meta


def test_unwritable_folder_and_a_second_writer_are_named_errors(tokenizer, tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputNotWritableError, match="cannot create"):
        store.RunStore(tmp_path / "file" / "run", {})
    first = store.RunStore(tmp_path / "r", {})
    with pytest.raises(RunLockedError):
        store.RunStore(tmp_path / "r", {})
    first.close()
    store.RunStore(tmp_path / "r", {}).close()  # released: opens again


def test_disk_full_keeps_the_committed_shards_and_resumes(tokenizer, tmp_path, monkeypatch):
    # Stand-in for a full disk: the third shard's temporary file is /dev/full, so its writes
    # fail with the kernel's real ENOSPC.
    real = store._open_temp

    def full_on_third(path):
        return open("/dev/full", "wb") if "part-000002" in path.name else real(path)

    monkeypatch.setattr(store, "_open_temp", full_on_third)
    out = tmp_path / "r"
    with pytest.raises(DiskFullError, match="no space left"):
        collect(tokenizer, out, tasks=range(20))
    assert sorted(f for f in os.listdir(out) if f[0] != ".") == \
        ["part-000000.parquet", "part-000001.parquet"]
    assert not [f for f in os.listdir(out) if f.endswith(".tmp")]
    assert folder_table(out).num_rows == 14
    monkeypatch.setattr(store, "_open_temp", real)
    s = collect(tokenizer, out, tasks=range(20))
    assert s["run"]["complete"] and keys(folder_table(out)) == \
        [(i, j) for i in range(20) for j in range(2)]


def test_bounded_context_rows_carry_their_steps(tokenizer, tmp_path):
    """A run played with ``context_window`` stores each row's steps; read back, the rows
    give the same per-reply samples as the trajectories the engine returned."""
    from agentgym.collection.schema import from_table
    from agentgym.data.trajectories import pack

    eng = engine(tokenizer, context_window=2, max_total_tokens=512, max_turns=40)
    direct = eng.collect_sync(4, "maze")
    collect(tokenizer, tmp_path / "w", tasks=range(4), n_samples=1,
            eng=engine(tokenizer, context_window=2, max_total_tokens=512, max_turns=40))
    t = folder_table(tmp_path / "w")
    assert t.column("step_reply").to_pylist() == [x.step_reply for x in direct]
    packed, _ = from_table(t)
    got, want = packed.step_samples()[0], pack(direct.trajectories).step_samples()[0]
    assert got.token_ids.tolist() == want.token_ids.tolist()
    assert got.offsets.tolist() == want.offsets.tolist()
    assert got.loss_mask.tolist() == want.loss_mask.tolist()
    eng.close()


def test_finished_rows_reach_the_disk_within_flush_every(tokenizer, tmp_path):
    """``flush_every``: with shards far larger than the run, the finished rows are still
    written as they finish, in shards cut by time; every key once."""
    eng = RolloutEngine(ScriptedBackend(tokenizer, latency_s=0.02), tokenizer,
                        progress=False, max_turns=12, max_total_tokens=4096,
                        max_concurrency=2)
    out = tmp_path / "r"
    seen = []

    async def main():
        c = Collector(eng, "maze", range(16), out, shard_size=1000, flush_every=0.1,
                      progress=False)
        async for _ in c.stream():
            seen.append(len(store.shard_files(out)))
        return c.summary

    try:
        s = run(main())
    finally:
        eng.close()
    assert s["run"]["complete"] and s["shards"] > 1
    assert seen[-1] >= 1  # rows were on disk before the last episode finished
    assert keys(folder_table(out)) == [(t, 0) for t in range(16)]


def test_a_new_run_that_fails_before_its_first_row_leaves_no_folder(tokenizer, tmp_path):
    """Env kwargs the env refuses and task indices past its end are refused before the
    folder is touched; a run that fails before its first row removes the folder it made,
    so the corrected call is not refused as a different run."""
    from agentgym.errors import ConfigError

    out = tmp_path / "r"
    eng = engine(tokenizer)
    try:
        with pytest.raises(ConfigError, match="sizee"):
            Collector(eng, "maze", range(4), out, env_kwargs={"sizee": 4})
        with pytest.raises(ConfigError, match="544 tasks"):
            Collector(eng, "textcraft", range(540, 560), out)
        with pytest.raises(ConfigError, match="negative"):
            Collector(eng, "maze", [3, -1], out)
        assert not out.exists()

        class Broken:
            config = eng.config

            def stream_requests(self, requests, env_id, **kw):
                raise RuntimeError("the backend died")

        with pytest.raises(RuntimeError, match="died"):
            run(Collector(Broken(), "maze", range(4), out, progress=False).run())
        assert not out.exists()
        assert collect(tokenizer, out, tasks=range(4), stop_after=3) is None  # afresh
        kept = folder_table(out).num_rows
        assert 0 < kept < 8
        with pytest.raises(RuntimeError, match="died"):  # a run with rows is left alone
            run(Collector(Broken(), "maze", range(4), out, n_samples=2, shard_size=7,
                          progress=False).run())
        assert folder_table(out).num_rows == kept
    finally:
        eng.close()


def test_collect_takes_the_command_lines_policy_spelling(tmp_path):
    """``agentgym.collect(..., policy="random")`` as ``collect --policy random``: the
    scripted backend's policy, recorded in the run's identity."""
    import json

    from agentgym.errors import ConfigError

    s = agentgym.collect("maze", range(3), tmp_path / "r", policy="random", max_turns=4)
    assert s["run"]["rows"] == 3
    meta = json.loads((tmp_path / "r" / ".agentgym" / "metadata.json").read_text())
    assert meta["identity"]["policy"] == "random"
    with pytest.raises(ConfigError, match="scripted"):
        agentgym.collect("maze", range(3), tmp_path / "x", backend="vllm", policy="random")
