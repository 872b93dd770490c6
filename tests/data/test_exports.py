"""``agentgym.data.exports``: the veRL and SkyRL shapes of trajectories, and ``pack``, against
values written out by hand."""

from dataclasses import fields

import numpy as np

from agentgym.data import Trajectory, pack


def test_exports_match_a_hand_built_trajectory():
    """``to_verl``, ``to_skyrl`` and ``pack`` of two trajectories, field by field, against
    values written out by hand."""
    from agentgym.data.exports import to_skyrl, to_verl

    a = Trajectory(task_id=3, env_id="maze", group_id=7, sample_index=1,
                   token_ids=[101, 102, 103, 11, 12, 201, 13],
                   loss_mask=[0, 0, 0, 1, 1, 0, 1],
                   logprobs=[0.0, 0.0, 0.0, -0.5, -1.25, 0.0, -2.0],
                   prompt_len=3, turn_rewards=[0.0, 1.0], reward=1.0, num_turns=2,
                   stop_reason="done", policy_version=4,
                   timings={"total_s": 0.5, "gen_s": 0.25})
    b = Trajectory(task_id=4, env_id="maze", group_id=8, sample_index=0,
                   token_ids=[101, 102, 21], loss_mask=[0, 0, 1], logprobs=[0.0, 0.0, -0.75],
                   prompt_len=2, turn_rewards=[0.5], reward=0.5, num_turns=1,
                   stop_reason="length", policy_version=3)
    verl = to_verl(a)
    assert verl == {
        "prompt_ids": [101, 102, 103],
        "response_ids": [11, 12, 201, 13],
        "response_mask": [1, 1, 0, 1],
        "response_logprobs": [-0.5, -1.25, 0.0, -2.0],
        "num_turns": 2,
        "reward_score": 1.0,
        "metrics": {"total_s": 0.5, "gen_s": 0.25},
        "group_id": 7,  # extra fields verl ignores: the row's group and sample
        "sample_index": 1,
    }
    assert verl["metrics"] is not a.timings
    assert to_skyrl([a, b]) == {
        "prompt_token_ids": [[101, 102, 103], [101, 102]],
        "response_ids": [[11, 12, 201, 13], [21]],
        "rewards": [1.0, 0.5],
        "loss_masks": [[1, 1, 0, 1], [1]],
        "stop_reasons": ["done", "length"],
        "rollout_logprobs": [[-0.5, -1.25, 0.0, -2.0], [-0.75]],
    }
    want = {
        "token_ids": ([101, 102, 103, 11, 12, 201, 13, 101, 102, 21], np.uint32),
        "offsets": ([0, 7, 10], np.int64),
        "loss_mask": ([0, 0, 0, 1, 1, 0, 1, 0, 0, 1], np.uint8),
        "logprobs": ([0, 0, 0, -0.5, -1.25, 0, -2.0, 0, 0, -0.75], np.float32),
        # one version per row: each token its row's policy_version
        "token_version": ([4] * 7 + [3] * 3, np.uint32),
        "rewards": ([1.0, 0.5], np.float32),
        "turn_rewards": ([0.0, 1.0, 0.5], np.float32),
        "turn_offsets": ([0, 2, 3], np.int64),
        "num_turns": ([2, 1], np.uint32),
        "stop_reason": ([0, 2], np.uint8),
        "group_id": ([7, 8], np.uint64),
        "sample_index": ([1, 0], np.uint32),
        "policy_version": ([4, 3], np.uint32),
        "prompt_len": ([3, 2], np.uint32),
        "branch_parent": ([1, 0], np.uint32),  # unbranched: the row's own sample index
        "branch_turn": ([0, 0], np.uint32),
        "branch_pos": ([0, 0], np.uint32),
        "step_offsets": ([0, 0, 0], np.int64),  # played with the whole record: no steps
        "step_context": ([], np.uint32),
        "step_reply": ([], np.uint32),
        "step_end": ([], np.uint32),
        "seat": ([0, 0], np.uint32),  # single-agent rows: seat 0
    }
    packed = pack([a, b])
    assert {f.name for f in fields(packed)} == want.keys()
    for name, (values, dtype) in want.items():
        got = getattr(packed, name)
        assert got.dtype == dtype, name
        np.testing.assert_array_equal(got, np.array(values, dtype), err_msg=name)
    assert packed.lengths.tolist() == [7, 3] and packed.rewards.tolist() == [1.0, 0.5]


def test_to_trl_is_the_pre_tokenized_sft_row():
    from agentgym.data.exports import to_trl

    t = Trajectory(task_id=0, env_id="maze", group_id=0, sample_index=0,
                   token_ids=[101, 102, 11, 201, 12], loss_mask=[0, 0, 1, 0, 1],
                   logprobs=[0.0] * 5, prompt_len=2, turn_rewards=[0.0, 0.5], reward=0.5,
                   num_turns=2, stop_reason="done", policy_version=0)
    assert to_trl(t) == {"input_ids": [101, 102, 11, 201, 12],
                         "assistant_masks": [0, 0, 1, 0, 1], "reward": 0.5}


def _image_trajectories():
    from agentgym.data.frames import frame_of

    pics = [np.zeros((28, 56, 3), np.uint8) for _ in range(2)]
    pics[0][..., 0], pics[1][..., 2] = 9, 200
    pics[1][27, 55] = (1, 2, 3)
    f1, f2 = frame_of(pics[0]), frame_of(pics[1])
    img = Trajectory(task_id=0, env_id="maze", group_id=0, sample_index=0,
                     token_ids=[101, 900, 102, 11, 900, 12], loss_mask=[0, 0, 0, 1, 0, 1],
                     logprobs=[0.0] * 6, prompt_len=3, turn_rewards=[0.0, 1.0], reward=1.0,
                     num_turns=2, stop_reason="done", policy_version=0,
                     images=[f1, f2], image_refs=[0, 1, 0])
    text = Trajectory(task_id=1, env_id="maze", group_id=1, sample_index=0,
                      token_ids=[101, 11], loss_mask=[0, 1], logprobs=[0.0, -1.0],
                      prompt_len=1, turn_rewards=[0.0], reward=0.0, num_turns=1,
                      stop_reason="done", policy_version=0)
    return pics, img, text


def test_a_verl_row_of_an_image_episode_lists_a_png_per_image_span():
    """``images``: per span in order, ``{"bytes": PNG, "path": None}`` that decodes to the
    frame exactly (what verl's dataset and ``process_image`` open); a text row has none."""
    import io

    from PIL import Image

    from agentgym.data.exports import to_verl

    pics, img, text = _image_trajectories()
    row = to_verl(img)
    assert [x["path"] for x in row["images"]] == [None] * 3
    assert row["images"][0]["bytes"] is row["images"][2]["bytes"]  # a frame encoded once
    for x, want in zip(row["images"], [pics[0], pics[1], pics[0]]):
        assert x["bytes"].startswith(b"\x89PNG\r\n\x1a\n")
        im = Image.open(io.BytesIO(x["bytes"]))
        assert im.mode == "RGB"
        np.testing.assert_array_equal(np.asarray(im), want)
    assert row["prompt_ids"] == [101, 900, 102]
    assert "images" not in to_verl(text)


def test_export_run_writes_verl_images_that_datasets_decodes(tmp_path):
    """A run folder with image and text rows exported to verl: every row has ``images``
    (the text row's empty), and ``datasets`` reads them as ``Image`` features."""
    import pyarrow.parquet as pq
    from datasets import Dataset, Image, List

    from agentgym.collection.export import export_run
    from agentgym.collection.schema import trajectories_table

    pics, img, text = _image_trajectories()
    run = tmp_path / "run"
    run.mkdir()
    # the text row first: the shard's columns must not depend on its first row
    pq.write_table(trajectories_table([text, img], run_id="r", max_turns=None, env_kwargs={}),
                   run / "part-000000.parquet")
    out = export_run(run, "verl", tmp_path / "verl")
    assert out["rows"] == 2
    ds = Dataset.from_parquet(str(tmp_path / "verl" / "part-000000.parquet"),
                              cache_dir=str(tmp_path / "cache"))
    assert ds.features["images"] == List(Image())
    assert ds[0]["images"] == []
    got = ds[1]["images"]
    assert len(got) == 3
    for im, want in zip(got, [pics[0], pics[1], pics[0]]):
        np.testing.assert_array_equal(np.asarray(im.convert("RGB")), want)
    # skyrl and trl rows carry no pictures
    export_run(run, "trl", tmp_path / "trl")
    assert "images" not in pq.read_schema(tmp_path / "trl" / "part-000000.parquet").names


def _run_folder(path, keys):
    """A run folder of one shard with a row per (task_index, sample_index) of ``keys``."""
    import pyarrow.parquet as pq

    from agentgym.collection.schema import trajectories_table

    trajs = [Trajectory(task_id=t, env_id="maze", group_id=t, sample_index=s,
                        token_ids=[101, 102, 11], loss_mask=[0, 0, 1], logprobs=[0, 0, -0.5],
                        prompt_len=2, turn_rewards=[1.0], reward=1.0, num_turns=1,
                        stop_reason="done", policy_version=0) for t, s in keys]
    path.mkdir()
    pq.write_table(trajectories_table(trajs, run_id="r", max_turns=None, env_kwargs={}),
                   path / "part-000000.parquet")
    return path


def test_an_export_never_mixes_with_another_in_its_folder(tmp_path):
    """Two runs exported to one folder: the second is refused before anything is written
    (the folder still reads back the first run's rows); ``overwrite`` replaces the first
    export; a folder holding other files, and the run folder itself, are never cleared."""
    import pyarrow.dataset as pads
    import pytest

    from agentgym.collection.export import export_run
    from agentgym.errors import OutputPathError

    a = _run_folder(tmp_path / "a", [(t, s) for t in range(3) for s in range(2)])
    b = _run_folder(tmp_path / "b", [(0, 0), (1, 0)])
    out = tmp_path / "v"

    def rows():
        return pads.dataset(str(out), format="parquet").count_rows()

    assert export_run(a, "verl", out)["rows"] == 6
    with pytest.raises(OutputPathError, match="not empty.*--overwrite"):
        export_run(b, "verl", out)
    assert rows() == 6
    (out / "part-000007.parquet").write_bytes((out / "part-000000.parquet").read_bytes())
    assert export_run(b, "verl", out, overwrite=True)["rows"] == 2
    assert rows() == 2  # the earlier export's shards are gone, part-000007 included
    (out / "notes.txt").write_text("mine")
    with pytest.raises(OutputPathError, match="notes.txt"):
        export_run(a, "verl", out, overwrite=True)
    assert sorted(f.name for f in out.iterdir()) == ["notes.txt", "part-000000.parquet"]
    for bad in (a, a / "sub"):
        with pytest.raises(OutputPathError, match="run folder"):
            export_run(a, "verl", bad, overwrite=True)
    assert (a / "part-000000.parquet").exists()


def test_a_verl_export_keeps_each_rows_key_and_group(tmp_path):
    import pyarrow.dataset as pads

    from agentgym.collection.export import export_run

    keys = [(t, s) for t in (4, 9) for s in range(3)]
    export_run(_run_folder(tmp_path / "run", keys), "verl", tmp_path / "v")
    got = pads.dataset(str(tmp_path / "v"), format="parquet").to_table()
    assert sorted(zip(got.column("task_index").to_pylist(),
                      got.column("sample_index").to_pylist())) == keys
    assert got.column("group_id").to_pylist() == got.column("task_index").to_pylist()
