"""Collection of a multi-seat game: one row per seat under each key, the seats of an episode
in one shard, the seat columns read back, and a resumed run equal to an uninterrupted one."""

import contextlib

import pyarrow as pa
import pytest

from agentgym.backends.scripted import ScriptedBackend
from agentgym.collection import Collector
from agentgym.collection.schema import SCHEMA_VERSION, rows_to_trajectories
from agentgym.collection.store import ShardError, read_run
from agentgym.engine import RolloutEngine


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _collect(tokenizer, out, tasks, **kw):
    eng = RolloutEngine(ScriptedBackend(tokenizer, "random", seed=5), tokenizer, max_turns=6)
    try:
        return Collector(eng, "kuhn_poker", tasks, out, progress=False, **kw)
    except Exception:
        eng.close()
        raise


def _rows(out) -> pa.Table:
    return pa.concat_tables(list(read_run(out)))


def test_one_row_per_seat_with_the_episode_in_one_shard(tokenizer, tmp_path):
    out = tmp_path / "run"
    summary = _run(_collect(tokenizer, out, 6, n_samples=3, shard_size=5, opponent="solver"))
    assert SCHEMA_VERSION == 8
    assert summary["run"]["rows"] == 6 * 3 * 2 and summary["run"]["complete"]
    shards = list(read_run(out))
    for t in shards:  # every episode's two seats in the same shard
        keys = list(zip(t.column("task_index").to_pylist(), t.column("sample_index").to_pylist()))
        assert all(keys.count(k) == 2 for k in keys)
    rows = _rows(out)
    seats = rows.column("seat").to_pylist()
    assert sorted(seats) == [0] * 18 + [1] * 18
    for r in rows.to_pylist():
        assert r["role"] == ("first", "second")[r["seat"]]
        assert r["player"] == ("policy" if r["seat"] == r["group_id"] % 2 else "solver")
        assert r["episode_id"] is not None
    back = rows_to_trajectories(rows)
    assert [(t.seat, t.role, t.player, t.episode_id) for t in back] == [
        (r["seat"], r["role"], r["player"], r["episode_id"]) for r in rows.to_pylist()]


def test_a_resumed_game_run_equals_an_uninterrupted_one(tokenizer, tmp_path):
    from agentgym.engine.loop import run

    whole = tmp_path / "whole"
    _run(_collect(tokenizer, whole, 8, n_samples=2, shard_size=6))
    part = tmp_path / "part"
    first = _collect(tokenizer, part, 8, n_samples=2, shard_size=6)

    async def stop_early():  # the run is cut after a dozen rows: its full shards stay
        n = 0
        async with contextlib.aclosing(first.stream()) as it:
            async for _ in it:
                n += 1
                if n == 12:
                    break

    try:
        run(stop_early())
    finally:
        first.runner.close()
    kept = _rows(part).num_rows
    assert 0 < kept < 32 and kept % 2 == 0  # whole episodes only
    resumed = _run(_collect(tokenizer, part, 8, n_samples=2, shard_size=6))
    assert resumed["session"]["episodes"] == 32 - kept and resumed["run"]["complete"]
    key = ["task_index", "sample_index", "seat"]
    want = _rows(whole).sort_by([(k, "ascending") for k in key])
    got = _rows(part).sort_by([(k, "ascending") for k in key])
    drop = ["run_id", "time_total_s", "time_gen_s", "episode_id"]
    assert got.drop(drop).to_pylist() == want.drop(drop).to_pylist()


def test_a_seat_row_twice_is_refused_on_open(tokenizer, tmp_path):
    out = tmp_path / "run"
    _run(_collect(tokenizer, out, 2, shard_size=10))
    shard = sorted(out.glob("part-*.parquet"))[0]
    import pyarrow.parquet as pq

    t = pq.read_table(shard)
    pq.write_table(pa.concat_tables([t, t.slice(0, 1)]), out / "part-000009.parquet")
    with pytest.raises(ShardError, match="more than one shard"):
        _collect(tokenizer, out, 2, shard_size=10)


def _run(collector):
    from agentgym.engine.loop import run

    try:
        return run(collector.run())
    finally:
        collector.runner.close()
