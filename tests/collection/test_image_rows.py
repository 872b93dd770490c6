"""Rows of image episodes (schema version 8): each distinct frame once per row
(``images``) and the frame of each image span (``image_refs``), byte-identical through
Parquet, JSONL, ``datasets`` and a resumed collection; older shards read without images."""

import json

import numpy as np
import pyarrow as pa
import pytest

from agentgym.backends.scripted import ScriptedBackend
from agentgym.collection import Collector, store
from agentgym.collection.schema import (
    FIELDS,
    SCHEMA,
    SCHEMA_VERSION,
    from_table,
    rows_to_trajectories,
    to_jsonl,
    trajectories_table,
)
from agentgym.data.frames import frame_of
from agentgym.engine import RolloutEngine
from tests.helpers import collect_run, make_trajectory

KW = dict(run_id="r1", max_turns=7, env_kwargs={})
T = {"total_s": 0.0, "gen_s": 0.0}  # the timings a row keeps
MAZE = {"obs": "image", "difficulty": "easy"}


def picture(value: int, h: int = 28, w: int = 56) -> np.ndarray:
    out = np.zeros((h, w, 3), np.uint8)
    out[..., 0] = value
    out[h - 1, w - 1] = (value, 255, 0)  # row-major: the last pixel differs from the first
    return out


def trajectories():
    f1, f2, f3 = (frame_of(picture(v)) for v in (1, 2, 3))
    a = make_trajectory([5, 6, 7, 8, 9], [0, 0, 1, 0, 1], group_id=1, task_id=1, timings=T,
                        images=[f1, f2], image_refs=[0, 1, 0])
    b = make_trajectory([5, 6, 11], [0, 0, 1], group_id=2, task_id=2, timings=T)  # text
    c = make_trajectory([5, 7, 12], [0, 0, 1], group_id=3, task_id=3, timings=T,
                        images=[f3], image_refs=[0])
    return [a, b, c]


def test_image_rows_round_trip_byte_identical_frames():
    assert SCHEMA_VERSION == 8 and SCHEMA.metadata[b"agentgym.schema_version"] == b"8"
    assert [n for n, _, _ in FIELDS][-2:] == ["images", "image_refs"]
    trajs = trajectories()
    table = trajectories_table(trajs, **KW)
    assert table.schema == SCHEMA
    assert table.column("image_refs").to_pylist() == [[0, 1, 0], [], [0]]
    rows = table.column("images").to_pylist()
    assert [len(r) for r in rows] == [2, 0, 1]
    assert rows[0][1] == {"hash": trajs[0].images[1].hash, "height": 28, "width": 56,
                          "data": picture(2).tobytes()}
    back = rows_to_trajectories(table)
    assert back == trajs
    for t, u in zip(back, trajs):
        assert [f.data for f in t.images] == [f.data for f in u.images]
    packed, _ = from_table(table)
    assert packed.images is not None and packed.images[1].refs == []
    # rows of a table sliced (an offset into its list columns) keep their own frames
    assert rows_to_trajectories(table.slice(2, 1)) == trajs[2:]
    assert rows_to_trajectories(table.slice(1, 1))[0].images == []


def test_text_rows_have_empty_image_columns_and_read_without_images():
    trajs = [make_trajectory([5, 6, 7], [0, 0, 1], timings=T),
             make_trajectory([5, 8], [0, 1], timings=T)]
    table = trajectories_table(trajs, **KW)
    assert table.column("images").to_pylist() == [[], []]
    assert table.column("image_refs").to_pylist() == [[], []]
    assert from_table(table)[0].images is None
    assert rows_to_trajectories(table) == trajs


def test_a_table_of_schema_version_7_reads_as_rows_without_images():
    table = trajectories_table(trajectories(), **KW).drop_columns(["images", "image_refs"])
    packed, _ = from_table(table)
    assert packed.images is None
    assert all(t.images == [] and t.image_refs == [] for t in rows_to_trajectories(table))
    assert from_table(table.slice(0, 0))[0].images is None  # no rows at all


def test_jsonl_carries_frames_base64_and_reads_them_back(tmp_path):
    table = trajectories_table(trajectories(), **KW)
    path = tmp_path / "part-000000.jsonl"
    path.write_bytes(to_jsonl(table))
    line = json.loads(path.read_bytes().splitlines()[0])
    assert isinstance(line["images"][0]["data"], str)  # base64 text in JSON
    back = store.read_shard(path)
    assert back.equals(table)
    assert rows_to_trajectories(back) == trajectories()


def test_datasets_reads_the_frames_of_a_parquet_shard(tmp_path):
    import pyarrow.parquet as pq
    from datasets import Dataset

    table = trajectories_table(trajectories(), **KW)
    pq.write_table(table, tmp_path / "part-000000.parquet")
    ds = Dataset.from_parquet(str(tmp_path / "part-000000.parquet"),
                              cache_dir=str(tmp_path / "cache"))
    assert ds.num_rows == 3
    row = ds[0]
    assert row["image_refs"] == [0, 1, 0]
    got = [np.frombuffer(f["data"], np.uint8).reshape(f["height"], f["width"], 3)
           for f in row["images"]]
    np.testing.assert_array_equal(got[0], picture(1))
    np.testing.assert_array_equal(got[1], picture(2))
    assert ds[1]["images"] == [] and ds[1]["image_refs"] == []


# -- collected image episodes -------------------------------------------------------------


@pytest.fixture(scope="module")
def vl_tokenizer(tiny_vl_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_vl_dir)


def collect(tokenizer, tiny_vl_dir, out, tasks, *, stop_after=None, fmt="parquet"):
    from agentgym.models.vision import VisionSpec

    eng = RolloutEngine(ScriptedBackend(tokenizer, policy="oracle"), tokenizer,
                        vision=VisionSpec.from_model(tiny_vl_dir), max_turns=30,
                        max_total_tokens=4096, progress=False)
    try:
        return collect_run(Collector(eng, "maze", tasks, out, env_kwargs=MAZE, shard_size=2,
                                     format=fmt, progress=False), stop_after)
    finally:
        eng.close()


def read_all(path) -> pa.Table:
    t = pa.concat_tables(store.read_shard(f) for f in store.shard_files(path))
    return t.sort_by([("task_index", "ascending"), ("sample_index", "ascending")])


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_frames_survive_an_interrupted_and_resumed_collection(vl_tokenizer, tiny_vl_dir,
                                                              tmp_path, fmt):
    tasks = range(6)
    full = collect(vl_tokenizer, tiny_vl_dir, tmp_path / "full", tasks, fmt=fmt)
    assert full["run"]["complete"]
    assert collect(vl_tokenizer, tiny_vl_dir, tmp_path / "part", tasks, stop_after=3,
                   fmt=fmt) is None
    assert 0 < read_all(tmp_path / "part").num_rows < 6
    assert collect(vl_tokenizer, tiny_vl_dir, tmp_path / "part", tasks, fmt=fmt)["run"][
        "complete"]
    a, b = read_all(tmp_path / "full"), read_all(tmp_path / "part")
    assert a.column("images").equals(b.column("images"))
    assert a.column("image_refs").equals(b.column("image_refs"))
    ta, tb = rows_to_trajectories(a), rows_to_trajectories(b)
    assert all(t.images and len(t.image_refs) == t.num_turns for t in tb)
    for x, y in zip(ta, tb):
        assert x.token_ids == y.token_ids and x.image_refs == y.image_refs
        assert [f.data for f in x.images] == [f.data for f in y.images]
        # the stored bytes are the frames the hashes name
        assert all(frame_of(f.array()).hash == f.hash for f in y.images)
