"""Valid-action decoding (``RolloutConfig.valid_action_decoding``): every reply is one of
the env's listed actions, chosen by the model's probability of each action's reply text, and
its logprobs are the model's own for those tokens."""

from __future__ import annotations

import numpy as np
import pytest

import agentgym
from agentgym.backends.base import SamplingParams, choose
from agentgym.backends.scripted import ScriptedBackend
from agentgym.backends.transformers_backend import TransformersBackend
from agentgym.engine import RolloutEngine
from agentgym.engine.config import ConfigError, RolloutConfig
from agentgym.parse import reply_text
from tests.helpers import TaskEnv, mask_runs

ACTIONS = ["left", "right", "jump over the wall", "wait here", "right"]  # one listed twice


class ListedEnv(TaskEnv):
    """Lists four actions of one to four words; any listed one earns 0.25, anything else is
    refused as invalid; four turns."""

    def valid_actions(self):
        return list(ACTIONS)

    def step(self, action):
        self.n += 1
        ok = action in ACTIONS
        return f"you did {action}", 0.25 if ok else 0.0, self.n >= 4, {"invalid": not ok}


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def backend(tiny_model_dir):
    return TransformersBackend(tiny_model_dir, device="cpu", seed=0)


def _teacher_forced(model, ids: list[int]) -> np.ndarray:
    """Each token's logprob given the tokens before it (entry 0 is 0)."""
    import torch

    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    lp = torch.log_softmax(logits[:-1], -1)[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
    return np.concatenate([[0.0], lp.numpy()])


@pytest.mark.parametrize("prefix", ["", "Action:"])
def test_every_reply_is_a_listed_action_with_the_models_own_logprobs(tokenizer, backend, prefix):
    agentgym.register("test/listed", ListedEnv, override=True)
    eng = RolloutEngine(backend, tokenizer, max_turns=4, max_total_tokens=4096,
                        valid_action_decoding=True, reply_prefix=prefix, temperature=1.0)
    batch = eng.collect_sync(4, "test/listed", n_samples=2)
    eot = eng.formatter.end_of_turn_id
    replies = {tuple(tokenizer.encode(reply_text(a, prefix), add_special_tokens=False)) + (eot,)
               for a in ACTIONS}
    seen = set()
    for t in batch:
        assert t.stop_reason == "done" and t.reward == pytest.approx(1.0)
        runs = [(s, e) for m, s, e in mask_runs(t.loss_mask) if m == 1]
        assert len(runs) == 4
        forced = _teacher_forced(backend.model, t.token_ids)
        for s, e in runs:
            reply = tuple(t.token_ids[s:e])
            assert reply in replies
            seen.add(reply)
            np.testing.assert_allclose(t.logprobs[s:e], forced[s:e], atol=2e-4)
    assert len(seen) > 1  # sampled at temperature 1: not one action every time


def test_at_temperature_zero_the_reply_is_the_action_the_model_scores_highest(tokenizer,
                                                                              backend):
    agentgym.register("test/listed", ListedEnv, override=True)
    eng = RolloutEngine(backend, tokenizer, max_turns=1, max_total_tokens=4096,
                        valid_action_decoding=True, temperature=0.0)
    t = eng.collect_sync(1, "test/listed").trajectories[0]
    (s, e), = [(s, e) for m, s, e in mask_runs(t.loss_mask) if m == 1]
    eot = eng.formatter.end_of_turn_id
    scores = {}
    for a in dict.fromkeys(ACTIONS):
        reply = tokenizer.encode(reply_text(a), add_special_tokens=False) + [eot]
        ids = t.token_ids[:s] + reply
        scores[a] = _teacher_forced(backend.model, ids)[s:].sum()
    best = max(scores, key=scores.get)
    assert tokenizer.decode(t.token_ids[s:e - 1]) == reply_text(best)


def test_choose_draws_each_choice_by_the_probability_of_its_text():
    choices = [[1, 9], [2], [3, 4, 9]]
    logprobs = [[-1.0, -0.5], [-0.7], [-0.2, -0.3, -0.4]]  # sums -1.5, -0.7, -0.9
    sampling = SamplingParams(temperature=0.5, max_new_tokens=8)
    picks = [choose(choices, logprobs, sampling, seed, 0).token_ids for seed in range(4000)]
    freq = np.array([sum(p == c for p in picks) for c in choices]) / len(picks)
    z = np.array([-1.5, -0.7, -0.9]) / 0.5
    want = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    np.testing.assert_allclose(freq, want, atol=0.03)
    got = choose(choices, logprobs, SamplingParams(temperature=0, max_new_tokens=2), 0, 7)
    assert got.token_ids == [2] and got.logprobs == [-0.7] and got.policy_version == 7
    cut = choose(choices, logprobs, SamplingParams(temperature=0, max_new_tokens=1), 0, 0)
    assert cut.finish_reason == "stop"
    long = choose([[3, 4, 9]], [[-0.2, -0.3, -0.4]],
                  SamplingParams(temperature=0, max_new_tokens=2), 0, 0)
    assert long.token_ids == [3, 4] and long.finish_reason == "length"


def test_it_needs_a_backend_that_scores_choices_and_does_not_combine_with_plans(tokenizer):
    agentgym.register("test/listed", ListedEnv, override=True)
    eng = RolloutEngine(ScriptedBackend(tokenizer), tokenizer, valid_action_decoding=True)
    with pytest.raises(ValueError, match="valid_action_decoding needs a backend that scores"):
        eng.collect_sync(1, "test/listed")
    with pytest.raises(ConfigError, match="plan and valid_action_decoding"):
        RolloutConfig(plan=True, valid_action_decoding=True)


async def test_a_bad_choice_is_refused_in_one_line(backend):
    with pytest.raises(agentgym.backends.base.InvalidRequestError, match="choice 1"):
        await backend.generate([1, 2, 3], SamplingParams(), choices=[[4], [-1]])
