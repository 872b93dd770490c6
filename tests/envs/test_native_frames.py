"""Image observations of the native envs (``obs="image" | "both"``, ``maze`` and
``gridworld``): ``_core.EnvPool.frames`` / ``frame_shape`` and the Gymnasium adapter's
``{"text", "image"}`` observations."""

from __future__ import annotations

import json

import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.utils.env_checker import check_env

import agentgym
from agentgym import _core
from agentgym.envs.native import NativeEnv
from agentgym.envs.spaces import TextSpace

SHAPES = [
    ("maze", {"difficulty": "easy"}, (28, 28)),
    ("maze", {}, (56, 56)),
    ("maze", {"difficulty": "hard"}, (84, 84)),
    ("gridworld", {"difficulty": "easy"}, (56, 56)),
    ("gridworld", {}, (56, 56)),
    ("gridworld", {"difficulty": "hard"}, (56, 56)),
]


def core_pool(env_id: str, n: int, **kwargs) -> _core.EnvPool:
    pool = _core.EnvPool(env_id, n, json.dumps(kwargs))
    pool.reset(list(range(n)), list(range(n)), [0] * n, [None] * n)
    return pool


@pytest.mark.parametrize(("env_id", "kwargs", "shape"), SHAPES)
def test_frames_are_uint8_rgb_arrays_of_the_pools_shape(env_id, kwargs, shape):
    pool = core_pool(env_id, 4, obs="image", **kwargs)
    assert pool.frame_shape == shape
    frames = pool.frames(np.array([3, 0]))
    for frame in frames:
        assert isinstance(frame, np.ndarray) and frame.dtype == np.uint8
        assert frame.shape == (*shape, 3) and frame.flags["C_CONTIGUOUS"]
    assert frames[0].nbytes == shape[0] * shape[1] * 3
    assert not np.array_equal(frames[0], frames[1])  # two tasks, two layouts
    np.testing.assert_array_equal(pool.frames([0])[0], frames[1])  # drawn again alike
    # Text mode (the default) draws nothing.
    text = core_pool(env_id, 2, **kwargs)
    assert text.frame_shape is None and text.frames([0, 1]) == [None, None]


def test_frames_follow_moves_and_finished_episodes_still_draw():
    pool = core_pool("maze", 2, obs="both", difficulty="easy")
    before = pool.frames([0, 1])
    action = pool.oracle_action(0)
    pool.step([0], [action])
    after = pool.frames([0, 1])
    assert not np.array_equal(before[0], after[0])
    np.testing.assert_array_equal(before[1], after[1])
    while pool.stop_reasons([0])[0] is None:
        pool.step([0], [pool.oracle_action(0)])
    assert pool.stop_reasons([0]) == ["done"]
    assert pool.frames([0])[0].shape == (28, 28, 3)  # the final state's picture


def test_bad_batches_raise_before_drawing():
    pool = _core.EnvPool("gridworld", 3, json.dumps({"obs": "image"}))
    with pytest.raises(agentgym.EpisodeNotStartedError):
        pool.frames([1])
    pool.reset([0, 1, 2], [0, 1, 2], [0] * 3, [None] * 3)
    with pytest.raises(IndexError):
        pool.frames([0, 7])
    with pytest.raises(ValueError):
        pool.frames([2, 2])
    assert pool.stop_reasons() == [None] * 3
    with pytest.raises(ValueError, match="obs must be text, image or both"):
        _core.EnvPool("gridworld", 1, json.dumps({"obs": "video"}))
    with pytest.raises(ValueError, match="goal_hint"):
        _core.EnvPool("maze", 1, json.dumps({"obs": "image", "goal_hint": True}))


def test_a_panicking_or_malformed_frame_is_an_error_value_for_its_row_only():
    # `_test_panic` with frames: after `frame_panic` its frames panic, after
    # `frame_malformed` they are one byte short.
    pool = core_pool("_test_panic", 4, frames=True)
    assert pool.frame_shape == (28, 28)
    pool.step([0, 1, 2, 3], ["frame_panic", "noop", "frame_malformed", "noop"])
    frames = pool.frames([0, 1, 2, 3])
    assert isinstance(frames[0], agentgym.EnvError) and "panic" in str(frames[0])
    assert isinstance(frames[2], agentgym.EnvError) and "malformed" in str(frames[2])
    for k in (1, 3):
        assert frames[k].shape == (28, 28, 3)
    assert pool.stop_reasons() == ["env_error", None, "env_error", None]
    # The panicked env was dropped: no picture, no new error; the others step on.
    assert pool.frames([0])[0] is None
    pool.step([1, 3], ["noop", "noop"])
    # A reset rebuilds the dropped env and clears the fault.
    pool.reset([0, 2], [0, 2], [0, 0], [None, None])
    assert all(f.shape == (28, 28, 3) for f in pool.frames([0, 2]))


@pytest.mark.parametrize(("env_id", "kwargs", "shape"), SHAPES)
def test_gymnasium_observation_is_text_and_image(env_id, kwargs, shape):
    env = agentgym.make(env_id, obs="image", **kwargs).unwrapped
    assert isinstance(env, NativeEnv) and env.frame_shape == shape
    space = env.observation_space
    assert isinstance(space, spaces.Dict) and set(space.spaces) == {"text", "image"}
    assert isinstance(space["text"], TextSpace)
    assert space["image"] == spaces.Box(0, 255, (*shape, 3), np.uint8)
    obs, info = env.reset(seed=1)
    assert obs in space and obs["image"].shape == (*shape, 3)
    pool = core_pool(env_id, 1, obs="image", **kwargs)
    pool.reset([0], [info["task"]], [info["seed"]], [None])
    np.testing.assert_array_equal(obs["image"], pool.frames([0])[0])
    action = env.oracle_action()
    obs2, _, _, _, _ = env.step(action)
    assert obs2 in space and not np.array_equal(obs["image"], obs2["image"])
    if env_id == "maze":
        assert "Position" not in obs["text"] and "Position" not in obs2["text"]


@pytest.mark.parametrize("env_id", ["maze", "gridworld"])
@pytest.mark.parametrize("obs", ["image", "both"])
def test_gymnasium_check_env_with_images(env_id, obs):
    check_env(agentgym.make(env_id, obs=obs).unwrapped, skip_render_check=True)


def test_text_mode_adapter_is_unchanged():
    env = agentgym.make("maze").unwrapped
    assert isinstance(env.observation_space, TextSpace) and env.frame_shape is None
    obs, _ = env.reset(seed=0)
    assert isinstance(obs, str) and "Position" in obs


def test_the_env_pool_wrapper_draws_the_core_pools_frames():
    pool = agentgym.EnvPool("maze", 2, obs="image", difficulty="easy")
    assert agentgym.EnvPool("maze", 1).frame_shape is None
    pool.reset([0, 1], tasks=[0, 1], seeds=[0, 0])
    h, w = pool.frame_shape
    got = pool.frames([1, 0])
    core = pool._pool.frames([1, 0])
    assert [f.shape for f in got] == [(h, w, 3)] * 2
    for a, b in zip(got, core):
        np.testing.assert_array_equal(a, b)
