"""The format warm-up's transcripts of an env with image observations show its pictures."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers")

import agentgym  # noqa: E402
from agentgym.learner.warmup import random_policy_transcripts  # noqa: E402


def test_image_transcripts_carry_each_observations_picture(tiny_vl_dir):
    from transformers import AutoTokenizer

    from agentgym.models.vision import VisionSpec

    tok = AutoTokenizer.from_pretrained(tiny_vl_dir)
    vision = VisionSpec.from_model(tiny_vl_dir)
    kwargs = {"size": 2, "loops": 4, "obs": "image"}
    rows = random_policy_transcripts("maze", tok, episodes=6, max_turns=3, env_kwargs=kwargs,
                                     seed=0, vision=vision)
    assert len(rows) == 6
    for ids, mask, frames in rows:
        assert len(ids) == len(mask)
        spans = vision.image_spans(ids)
        assert len(spans) == len(frames) >= 1
        assert not any(mask[a:b].count(1) for a, b in spans)  # markup is never the policy's
    # the first pictures are the resets': a pool made and reset the same way draws them again
    pool = agentgym.EnvPool("maze", 6, seed=0, **kwargs)
    pool.reset(list(range(6)), tasks=list(range(6)), max_turns=[3] * 6)
    for (_, _, frames), again in zip(rows, pool.frames(range(6))):
        np.testing.assert_array_equal(frames[0], again)
    # text mode (and a model without vision) keeps the plain (ids, mask) pairs
    plain = random_policy_transcripts("maze", tok, episodes=2, max_turns=2,
                                      env_kwargs={"size": 2, "loops": 4}, seed=0,
                                      with_masks=True, vision=vision)
    assert all(len(p) == 2 and not vision.image_spans(p[0]) for p in plain)
    assert isinstance(rows[0][2][0], np.ndarray)


@pytest.mark.parametrize("env_id", ["maze", "tictactoe"])
def test_transcripts_with_a_reply_prefix_leave_it_to_the_prompt(tiny_model_dir, env_id):
    """With ``reply_prefix`` the prefix ends every prompt part and each policy span is the rest
    of the action, as the rollout engine renders turns with ``RolloutConfig.reply_prefix``."""
    from transformers import AutoTokenizer

    from agentgym.engine.chat import ChatFormatter

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    fmt = ChatFormatter(tok)
    kw = {"episodes": 4, "max_turns": 3, "seed": 0, "with_masks": True}
    plain = random_policy_transcripts(env_id, tok, **kw)
    rows = random_policy_transcripts(env_id, tok, reply_prefix="Action:", **kw)
    assert len(rows) == len(plain) >= 4
    for (ids, mask), (ids0, mask0) in zip(rows, plain):
        assert len(ids) == len(mask)
        starts = [t for t in range(len(mask)) if mask[t] and not mask[t - 1]]
        assert starts
        for s in starts:
            end = s + mask[s:].index(0) if 0 in mask[s:] else len(mask)
            assert ids[end - 1] == fmt.end_of_turn_id
            reply = tok.decode(ids[s:end - 1])
            assert reply.startswith(" ") and "Action" not in reply
            assert tok.decode(ids[:s]).endswith("Action:")
        if env_id == "maze":  # the same moves (a game's random seat keys on prompt length)
            assert mask.count(1) < mask0.count(1)
            assert tok.decode(ids) == tok.decode(ids0)  # only the split moved
