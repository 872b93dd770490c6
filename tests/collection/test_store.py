"""The run folder: readers that take a whole folder (``datasets``, pyarrow) see only
committed shards; a shard renamed before a crash let the manifest record it is adopted; a
key in two shards and a vanished shard are handled by name."""

import json
import shutil

import pyarrow.dataset as ds
import pytest

from agentgym.collection import ShardError, store
from agentgym.collection.schema import trajectories_table
from tests.helpers import make_trajectory


def table(keys):
    trajs = [make_trajectory([1, 2, 3], [0, 1, 1], group_id=t, sample_index=s, task_id=t)
             for t, s in keys]
    return trajectories_table(trajs, run_id="r", max_turns=3, env_kwargs={})


def test_datasets_reads_the_folder_and_skips_temporaries(tmp_path):
    import datasets

    out = tmp_path / "run"
    st = store.RunStore(out, {"env_id": "x"})
    st.write_shard(table([(0, 0), (0, 1)]))
    st.write_shard(table([(1, 0)]))
    st.finish(True, {"rows": 3})
    st.close()
    (out / ".part-000002.parquet.99.tmp").write_bytes(b"PAR1 half written")
    d = datasets.load_dataset("parquet", data_dir=str(out), split="train",
                              cache_dir=str(tmp_path / "hf"))
    assert d.num_rows == 3
    assert sorted(zip(d["task_index"], d["sample_index"])) == [(0, 0), (0, 1), (1, 0)]
    assert d[0]["token_ids"] == [1, 2, 3] and d[0]["loss_mask"] == [0, 1, 1]
    assert ds.dataset(str(out), format="parquet").count_rows() == 3


def test_a_shard_missing_from_the_manifest_is_adopted(tmp_path):
    out = tmp_path / "run"
    st = store.RunStore(out, {})
    st.write_shard(table([(0, 0)]))
    before = (out / ".agentgym" / "manifest.json").read_bytes()
    st.write_shard(table([(1, 0), (2, 0)]))
    st.close()
    # A crash after the rename and before the manifest write: the old manifest is back.
    (out / ".agentgym" / "manifest.json").write_bytes(before)
    st = store.RunStore(out, {})
    assert st.done_mask(3, 1).tolist() == [True, True, True]
    manifest = json.loads((out / ".agentgym" / "manifest.json").read_text())
    assert [s["name"] for s in manifest["shards"]] == ["part-000000.parquet",
                                                       "part-000001.parquet"]
    assert st.write_shard(table([(3, 0)])) == "part-000002.parquet"
    st.close()


def test_a_key_in_two_shards_is_refused_and_a_vanished_shard_is_replayed(tmp_path):
    out = tmp_path / "run"
    st = store.RunStore(out, {})
    st.write_shard(table([(0, 0), (1, 0)]))
    st.write_shard(table([(2, 0)]))
    st.close()
    shutil.copy(out / "part-000000.parquet", out / "part-000005.parquet")
    with pytest.raises(ShardError, match=r"task_index=0, sample_index=0.*part-000005"):
        store.RunStore(out, {})
    (out / "part-000005.parquet").unlink()
    (out / "part-000000.parquet").unlink()
    st = store.RunStore(out, {})
    assert st.done_mask(3, 1).tolist() == [False, False, True]
    st.close()


def test_drop_failed_rewrites_shards_in_place(tmp_path):
    out = tmp_path / "run"
    st = store.RunStore(out, {})
    failed = make_trajectory([1, 2], [0, 0], group_id=1, task_id=1, stop_reason="timeout")
    ok = make_trajectory([1, 2], [0, 1], group_id=0, task_id=0)
    failed2 = make_trajectory([1, 2], [0, 0], group_id=2, task_id=2, stop_reason="timeout")
    st.write_shard(trajectories_table([ok, failed], run_id="r", max_turns=None, env_kwargs={}))
    st.write_shard(trajectories_table([failed2], run_id="r", max_turns=None, env_kwargs={}))
    assert st.num_failed == 2
    assert st.drop_failed() == 2
    assert sorted(p.name for p in store.shard_files(out)) == ["part-000000.parquet"]
    assert ds.dataset(str(out), format="parquet").to_table().column(
        "stop_reason").to_pylist() == ["done"]
    assert st.done_mask(3, 1).tolist() == [True, False, False] and st.num_failed == 0
    st.close()
