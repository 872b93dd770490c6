"""Episodes with image observations: each picture's placeholder markup in the token-exact
context, the frames beside the tokens to the backend, kept once per episode in the
trajectory; a malformed picture ends only its own episode."""

from __future__ import annotations

import json

import numpy as np
import pytest

import agentgym
from agentgym import _core
from agentgym.backends.scripted import ScriptedBackend
from agentgym.engine import RolloutEngine
from tests.helpers import TaskEnv


@pytest.fixture(scope="module")
def tokenizer(tiny_vl_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_vl_dir)


@pytest.fixture(scope="module")
def vision(tiny_vl_dir):
    from agentgym.models.vision import VisionSpec

    return VisionSpec.from_model(tiny_vl_dir)


class Recording(ScriptedBackend):
    """The scripted policy, recording each request's prompt and images (copies)."""

    def __init__(self, tokenizer, **kw):
        super().__init__(tokenizer, **kw)
        self.sent: dict[str, list] = {}

    async def generate(self, prompt_ids, sampling, request_id=None, context=None, images=None):
        episode = request_id.split("-")[1]
        self.sent.setdefault(episode, []).append(
            (list(prompt_ids), [np.array(a) for a in images or []]))
        return await super().generate(prompt_ids, sampling, request_id=request_id,
                                      context=context, images=images)


def _engine(tokenizer, vision, backend, **kw):
    return RolloutEngine(backend, tokenizer, vision=vision,
                         **{"max_concurrency": 8, "max_total_tokens": 4096, **kw})


@pytest.mark.parametrize("env_id, kwargs", [
    ("maze", {"obs": "image", "difficulty": "easy"}),
    ("gridworld", {"obs": "both", "difficulty": "easy"}),
])
def test_image_episodes_are_token_exact_and_carry_the_envs_frames(
        tokenizer, vision, env_id, kwargs):
    backend = Recording(tokenizer, policy="oracle")
    batch = _engine(tokenizer, vision, backend, max_turns=30).collect_sync(
        4, env_id, env_kwargs=kwargs)
    assert [t.stop_reason for t in batch] == ["done"] * 4
    for t in batch:
        spans = vision.image_spans(t.token_ids)
        # the reset's and every step's but the last (whose observation ends the episode
        # unstored)
        assert len(spans) == len(t.image_refs) == t.num_turns
        # replay the env with the same task, seed and (oracle) actions: the same pictures
        pool = _core.EnvPool(env_id, 1, json.dumps(kwargs))
        pool.reset([0], [t.task_id], [t.seed], [None])
        frames = [pool.frames([0])[0]]
        for _ in range(t.num_turns - 1):
            pool.step([0], [pool.oracle_action(0)])
            frames.append(pool.frames([0])[0])
        got = [t.images[r].array() for r in t.image_refs]
        assert len(got) == len(frames)
        for a, b in zip(got, frames):
            np.testing.assert_array_equal(a, b)
        assert len(t.images) == len({f.hash for f in t.images})  # each frame once
    # each request's tokens are a prefix of its episode's stored tokens and its images the
    # frames of the spans in that prefix, in order
    # (a fresh engine numbers its episodes' keys, which the request ids carry, like its
    # groups; image-only first prompts of different tasks have the same tokens)
    assert sorted(backend.sent) == sorted(str(t.group_id) for t in batch)
    for t in batch:
        for prompt, images in backend.sent[str(t.group_id)]:
            assert t.token_ids[:len(prompt)] == prompt
            n = len(vision.image_spans(prompt))
            assert len(images) == n
            for a, r in zip(images, t.image_refs[:n]):
                np.testing.assert_array_equal(a, t.images[r].array())


def test_text_observations_are_unchanged_by_the_obs_option(tokenizer, vision):
    text = _engine(tokenizer, vision, ScriptedBackend(tokenizer, policy="oracle"),
                   max_turns=30).collect_sync(3, "maze", env_kwargs={"difficulty": "easy"})
    default = _engine(tokenizer, vision, ScriptedBackend(tokenizer, policy="oracle"),
                      max_turns=30).collect_sync(
        3, "maze", env_kwargs={"difficulty": "easy", "obs": "text"})
    assert [t.token_ids for t in text] == [t.token_ids for t in default]
    assert all(t.images == [] and t.image_refs == [] for t in text)


class FrameFaults(TaskEnv):
    """Shows a 28x28 picture after every reset and step; task 1's picture is malformed
    (float32), task 2's ``frame()`` raises after its first step."""

    instructions = "Say anything."

    def __init__(self, obs="image"):
        self.obs = obs

    def step(self, action):
        self.n += 1
        return f"step {self.n}", 0.0, self.n >= 3, {}

    def frame(self):
        if self.task == 1:
            return np.zeros((28, 28, 3), np.float32)
        if self.task == 2 and self.n:
            raise RuntimeError("renderer crashed")
        out = np.zeros((28, 28, 3), np.uint8)
        out[..., 1] = 40 * self.n
        return out

    def valid_actions(self):
        return ["go"]


def test_a_malformed_or_failing_picture_ends_only_its_episode(tokenizer, vision):
    agentgym.register("test/frame_faults", FrameFaults, override=True)
    batch = _engine(tokenizer, vision, ScriptedBackend(tokenizer, policy="random")).collect_sync(
        4, "test/frame_faults", env_kwargs={"obs": "image"})
    assert [t.stop_reason for t in batch] == ["done", "env_error", "env_error", "done"]
    assert "uint8" in batch.trajectories[1].error
    assert "renderer crashed" in batch.trajectories[2].error
    for k in (1, 2):
        assert not any(batch.trajectories[k].loss_mask)
    assert [len(t.image_refs) for t in (batch.trajectories[0], batch.trajectories[3])] == [3, 3]
    # a native env's drawing panic: the same outcome, the batch keeps its shape
    panics = _engine(tokenizer, vision, ScriptedBackend(tokenizer, policy="random"),
                     max_turns=6).collect_sync(40, "_test_panic", env_kwargs={"frames": True})
    kinds = {t.stop_reason for t in panics}
    assert "env_error" in kinds and kinds <= {"env_error", "done", "horizon"}
    assert len(panics) == 40


def test_image_envs_need_a_model_that_sees_and_refuse_what_cannot_carry_them(
        tokenizer, vision):
    with pytest.raises(ValueError, match="no image input"):
        _engine(tokenizer, None, ScriptedBackend(tokenizer)).collect_sync(
            1, "maze", env_kwargs={"obs": "image"})
    with pytest.raises(ValueError, match="context_window"):
        _engine(tokenizer, vision, ScriptedBackend(tokenizer), context_window=2).collect_sync(
            1, "maze", env_kwargs={"obs": "image"})


def test_a_python_envs_pictures_reach_the_trajectory(tokenizer, vision):
    """BabyAI (minigrid, a Python env on the thread-pool driver) with ``obs="image"``: its
    oracle solves the tasks, and every stored picture is its own ``frame()`` render."""
    batch = _engine(tokenizer, vision, ScriptedBackend(tokenizer, policy="oracle"),
                    max_turns=64, max_total_tokens=16384).collect_sync(
        2, "babyai", env_kwargs={"obs": "image"})
    assert [t.stop_reason for t in batch] == ["done", "done"]
    for t in batch:
        assert len(vision.image_spans(t.token_ids)) == len(t.image_refs) == t.num_turns
        first = t.images[t.image_refs[0]].array()
        env = agentgym.make("babyai", obs="image")
        env.reset(seed=t.seed, options={"task": t.task_id})
        np.testing.assert_array_equal(first, env.unwrapped.frame())


def test_envs_in_worker_processes_refuse_pictures_by_name(tokenizer, vision):
    with pytest.raises(ValueError, match="not carried back from worker processes"):
        _engine(tokenizer, vision, ScriptedBackend(tokenizer), env_workers=1).collect_sync(
            1, "babyai", env_kwargs={"obs": "image"})
