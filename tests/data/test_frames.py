"""Frames (image observations as data) and how trajectories and packed batches carry them."""

from __future__ import annotations

import numpy as np
import pytest

from agentgym.data.frames import EpisodeFrames, Frame, FrameError, RowImages, frame_of
from agentgym.data.trajectories import (
    BatchFormatError,
    PackedBatch,
    RowInfo,
    Trajectory,
    pack,
    unpack,
)


def picture(value: int, h: int = 28, w: int = 28) -> np.ndarray:
    out = np.zeros((h, w, 3), np.uint8)
    out[..., 0] = value
    out[0, 0] = (value, 1, 2)
    return out


def test_frame_round_trips_and_hashes_content():
    a = frame_of(picture(7))
    assert (a.height, a.width, a.nbytes) == (28, 28, 28 * 28 * 3)
    np.testing.assert_array_equal(a.array(), picture(7))
    assert not a.array().flags.writeable  # a view over the stored bytes
    assert frame_of(picture(7)).hash == a.hash
    assert frame_of(picture(8)).hash != a.hash
    # same bytes, another shape: another frame
    assert frame_of(picture(7).reshape(56, 14, 3)).hash != a.hash
    assert frame_of(a) is a


@pytest.mark.parametrize("bad, what", [
    (np.zeros((28, 28, 3), np.float32), "uint8"),
    (np.zeros((28, 28), np.uint8), "shape"),
    (np.zeros((28, 28, 4), np.uint8), "shape"),
    (np.zeros((0, 28, 3), np.uint8), "shape"),
    ([[0, 0, 0]], "numpy array"),
])
def test_malformed_pictures_are_refused_by_name(bad, what):
    with pytest.raises(FrameError, match=what):
        frame_of(bad)


def test_episode_frames_store_a_repeated_picture_once():
    ep = EpisodeFrames()
    for v in (1, 2, 1, 1):
        ep.add(frame_of(picture(v)))
    assert len(ep) == 4 and len(ep.frames) == 2
    assert ep.refs == [0, 1, 0, 0]
    assert ep.arrays[0] is ep.arrays[2] is ep.arrays[3]  # one array, not copies
    np.testing.assert_array_equal(ep.arrays[1], picture(2))


def _traj(k: int, images: list[Frame], refs: list[int]) -> Trajectory:
    n = 5 + k
    return Trajectory(task_id=k, env_id="maze", group_id=k, sample_index=0,
                      token_ids=list(range(n)), loss_mask=[0] * (n - 2) + [1, 1],
                      logprobs=[0.0] * (n - 2) + [-0.5, -0.25], prompt_len=n - 2,
                      turn_rewards=[1.0], reward=1.0, num_turns=1, stop_reason="done",
                      policy_version=0, images=images, image_refs=refs)


def test_packed_batches_carry_each_rows_images_without_copying():
    f1, f2 = frame_of(picture(1)), frame_of(picture(2))
    trajs = [_traj(0, [f1, f2], [0, 1, 0]), _traj(1, [], []), _traj(2, [f2], [0])]
    pb = pack(trajs)
    assert pb.images is not None and len(pb.images) == 3
    assert [[f.hash for f in r.spans()] for r in pb.images] == [
        [f1.hash, f2.hash, f1.hash], [], [f2.hash]]
    assert pb.images[0].frames[0] is f1  # the trajectory's frame object itself
    back = unpack(pb, RowInfo.of(trajs))
    assert [(t.images, t.image_refs) for t in back] == [
        (t.images, t.image_refs) for t in trajs]
    assert back[1].images == [] and back[1].image_refs == []
    # slicing, selecting and concatenating keep each row's images with its row
    assert pb.rows(1, 3).images == pb.images[1:3]
    assert pb.select([2, 0]).images == [pb.images[2], pb.images[0]]
    both = PackedBatch.concat([pb.rows(0, 1), pack([_traj(3, [], [])]), pb.rows(2, 3)])
    assert both.images == [pb.images[0], RowImages([], []), pb.images[2]]
    text_only = pack([_traj(4, [], [])])
    assert text_only.images is None
    assert PackedBatch.concat([text_only, text_only]).images is None


def test_a_batch_whose_images_miss_rows_is_refused():
    pb = pack([_traj(0, [frame_of(picture(1))], [0]), _traj(1, [], [])])
    with pytest.raises(BatchFormatError, match="images has 1 rows"):
        PackedBatch.from_dict({**{f: getattr(pb, f) for f in pb.__dataclass_fields__},
                               "images": pb.images[:1]})


def test_a_frame_drawn_in_rust_and_one_made_in_python_have_the_same_id():
    import agentgym
    from agentgym import _core

    pool = agentgym.EnvPool("maze", 3, obs="image", difficulty="medium")
    pool.reset([0, 1, 2], tasks=[0, 1, 2], seeds=[0, 0, 0])
    records = pool._pool.frame_records([2, 0, 1])
    for (h, w, data, digest), array in zip(records, pool.frames([2, 0, 1])):
        assert (h, w) == array.shape[:2] and data == array.tobytes()
        assert frame_of(array).hash == digest == _core.frame_digest(h, w, data)
    assert len({r[3] for r in records}) == 3
    with pytest.raises(ValueError, match="28x28 frame has 2352 bytes"):
        _core.frame_digest(28, 28, b"\0" * 2351)
