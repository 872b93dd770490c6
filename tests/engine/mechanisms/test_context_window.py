"""Bounded contexts (``RolloutConfig.context_window``): each reply is generated from the
first prompt and the last ``k`` replies, the trajectory records every token once, and each
step's sample is exactly what the backend was sent, through the native pool and a Python
env, with plan turns and forks."""

import numpy as np
import pytest

from agentgym.backends.scripted import ScriptedBackend
from agentgym.data.trajectories import pack
from agentgym.engine import RolloutEngine
from agentgym.engine.config import RolloutConfig


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


class RecordingBackend(ScriptedBackend):
    """The oracle, keeping every prompt it was sent and the reply it gave, by episode."""

    def __init__(self, tokenizer, **kw):
        super().__init__(tokenizer, **kw)
        self.sent: dict[str, list[tuple[list[int], list[int]]]] = {}

    async def generate(self, prompt_ids, sampling, request_id=None, context=None):
        res = await super().generate(prompt_ids, sampling, request_id, context)
        episode = request_id.rsplit("-", 2)[0]
        self.sent.setdefault(episode, []).append((list(prompt_ids), list(res.token_ids)))
        return res


def _episode_prompts(backend, engine, key):
    return backend.sent[f"{engine.run_id}-{key}"]


def _play(tokenizer, env_id, window, **kw):
    backend = RecordingBackend(tokenizer)
    eng = RolloutEngine(backend, tokenizer, max_turns=kw.pop("max_turns", 12),
                        max_total_tokens=kw.pop("max_total_tokens", 4096),
                        context_window=window, **kw)
    return eng, backend


@pytest.mark.parametrize("env_id", ["maze", "office"])
def test_every_step_sample_is_what_the_backend_was_sent(tokenizer, env_id):
    full_eng, _ = _play(tokenizer, env_id, None)
    full = full_eng.collect_sync(4, env_id)
    eng, backend = _play(tokenizer, env_id, 2)
    batch = eng.collect_sync(4, env_id)
    # the oracle plays the same episodes: only what the model sees changed
    for ref, t in zip(full, batch):
        assert (t.stop_reason, t.reward, t.num_turns) == (ref.stop_reason, ref.reward,
                                                          ref.num_turns)
        assert t.token_ids == ref.token_ids and t.loss_mask == ref.loss_mask
        assert ref.step_reply == [] and len(t.step_reply) == t.num_turns
    sent = [[p for p, _ in v] for _, v in sorted(backend.sent.items(),
                                                  key=lambda kv: int(kv[0].rsplit("-", 1)[1]))]
    packed = pack(batch.trajectories)
    samples, source, row = packed.step_samples()
    assert len(samples) == sum(t.num_turns for t in batch)
    played = [t for t in batch]
    k = 0
    for b, t in enumerate(played):
        prompts = sent[b]
        assert len(prompts) == t.num_turns
        for s in range(t.num_turns):
            lo, hi = samples.offsets[k], samples.offsets[k + 1]
            toks = samples.token_ids[lo:hi].tolist()
            p = int(samples.prompt_len[k])
            assert toks[:p] == prompts[s]  # token-exact per sample
            reply = t.token_ids[t.step_reply[s]:t.step_end[s]]
            assert toks[p:] == reply
            mask = samples.loss_mask[lo:hi]
            assert mask[:p].sum() == 0
            assert mask[p:].tolist() == t.loss_mask[t.step_reply[s]:t.step_end[s]]
            assert np.array_equal(samples.token_ids[lo:hi], packed.token_ids[source[lo:hi]])
            assert row[k] == b
            # the window: the first prompt, then the last two replies on
            first = t.step_context[0]
            assert first == t.prompt_len
            if s >= 2:
                assert t.step_context[s] == t.step_reply[s - 2]
            else:
                assert t.step_context[s] == first
            k += 1
    # late prompts are shorter than the record they came from
    longest = max(len(p) for ps in sent for p in ps)
    assert longest < max(len(t.token_ids) for t in batch)
    eng.close()
    full_eng.close()


def test_the_window_caps_what_the_model_sees_not_the_record(tokenizer):
    # full history ends `length` long before the horizon; a window plays on to it
    cap = 384
    full_eng, _ = _play(tokenizer, "maze", None, max_turns=60, max_total_tokens=cap)
    full = full_eng.collect_sync(3, "maze")
    eng, backend = _play(tokenizer, "maze", 1, max_turns=60, max_total_tokens=cap)
    batch = eng.collect_sync(3, "maze")
    assert all(t.stop_reason == "length" and len(t.token_ids) <= cap for t in full)
    assert all(max(len(p) for p, _ in v) < cap for v in backend.sent.values())
    # the oracle solves every maze within the horizon once the context stops growing
    assert all(t.success and len(t.token_ids) > cap for t in batch)
    eng.close()
    full_eng.close()


def test_the_record_cap_ends_an_episode_with_length(tokenizer):
    eng = RolloutEngine(ScriptedBackend(tokenizer, policy="random"), tokenizer, max_turns=200,
                        max_total_tokens=256, max_record_tokens=600, context_window=1)
    for t in eng.collect_sync(3, "maze"):
        assert t.stop_reason == "length" and 256 < len(t.token_ids) <= 600
        assert len(t.step_reply) == t.num_turns
    eng.close()


def test_plan_turns_and_forks_keep_their_steps(tokenizer):
    eng, backend = _play(tokenizer, "maze", 2, plan=True, replan_every=2, plan_max_tokens=6)
    batch = eng.collect_sync(3, "maze")
    for t in batch:
        assert len(t.step_reply) == t.num_turns  # plan replies are steps too
    samples, _, _ = pack(batch.trajectories).step_samples()
    flat = [p for v in backend.sent.values() for p, _ in v]
    got = [samples.token_ids[samples.offsets[i]:samples.offsets[i] + samples.prompt_len[i]]
           .tolist() for i in range(len(samples))]
    assert sorted(map(tuple, got)) == sorted(map(tuple, flat))
    eng.close()
    tree, tb = _play(tokenizer, "maze", 1, branch_at=2, branch_width=3, max_concurrency=6)
    batch = tree.collect_sync(2, "maze", n_samples=3)
    for t in batch:
        assert len(t.step_reply) == t.num_turns
        if t.branch_parent is not None:  # a child's steps before the fork are its parent's
            parent = next(p for p in batch if p.group_id == t.group_id
                          and p.sample_index == t.branch_parent)
            n = t.branch_turn
            assert t.step_reply[:n] == parent.step_reply[:n]
            assert t.step_context[:n] == parent.step_context[:n]
    samples, _, _ = pack(batch.trajectories).step_samples()
    flat = [p for v in tb.sent.values() for p, _ in v]
    trained = [i for i in range(len(samples))
               if samples.loss_mask[samples.offsets[i]:samples.offsets[i + 1]].any()]
    got = [samples.token_ids[samples.offsets[i]:samples.offsets[i] + samples.prompt_len[i]]
           .tolist() for i in trained]
    # every trained sample is a prompt the backend saw; the children's copies of the
    # prefix's replies train nothing
    assert all(tuple(g) in set(map(tuple, flat)) for g in got)
    assert len(trained) == len(flat)
    tree.close()


def test_window_settings_are_checked():
    with pytest.raises(ValueError, match="context_window"):
        RolloutConfig(context_window=0)
    with pytest.raises(ValueError, match="max_record_tokens"):
        RolloutConfig(context_window=2, max_total_tokens=4096, max_record_tokens=1024)
