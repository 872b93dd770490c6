"""Planning turns (``RolloutConfig.plan``): replies the env never sees, before the first
action and every ``replan_every`` env turns, through the native pool and a Python env."""

import pytest

from agentgym.backends.scripted import ScriptedBackend
from agentgym.engine import RolloutEngine
from agentgym.engine.config import RolloutConfig
from agentgym.engine.planning import ACT_PROMPT, PLAN_PREFIX, plan_due
from tests.helpers import mask_runs


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_plan_due():
    assert plan_due(0, -1, 0) and not plan_due(3, 0, 0)
    assert [plan_due(t, 0, 2) for t in (1, 2, 3)] == [False, True, True]
    assert not plan_due(3, 2, 2) and plan_due(4, 2, 2)


@pytest.mark.parametrize("env_id", ["maze", "office"])
def test_a_plan_turn_comes_first_and_the_env_never_sees_it(tokenizer, env_id):
    plain = RolloutEngine(ScriptedBackend(tokenizer), tokenizer, max_turns=30,
                          max_total_tokens=8192)
    base = plain.collect_sync(3, env_id)
    eng = RolloutEngine(ScriptedBackend(tokenizer), tokenizer, max_turns=30,
                        max_total_tokens=8192, plan=True)
    batch = eng.collect_sync(3, env_id)
    for ref, t in zip(base, batch):
        # the oracle plays the same episode: the plan turn changed nothing in the env
        assert t.stop_reason == ref.stop_reason and t.success == ref.success
        assert t.reward == pytest.approx(ref.reward)
        assert t.num_turns == ref.num_turns + 1 and t.timings["plan_turns"] == 1.0
        assert t.turn_rewards == [0.0, *ref.turn_rewards]
        # every reply, the plan included, is one run of policy tokens
        runs = [(a, z) for m, a, z in mask_runs(t.loss_mask) if m]
        assert len(runs) == t.num_turns
        text = tokenizer.decode(t.token_ids)
        assert text.count(PLAN_PREFIX) == 1 and text.count(ACT_PROMPT) == 1
        # the plan prefix opens the first reply and the note follows it
        before = tokenizer.decode(t.token_ids[:runs[0][0]])
        assert before.endswith(PLAN_PREFIX)
        assert ACT_PROMPT in tokenizer.decode(t.token_ids[runs[0][1]:runs[1][0]])
        # after the plan, the episode is the plain one, token for token
        assert t.token_ids[runs[1][0]:] == ref.token_ids[ref.prompt_len:]
    assert batch.metrics["plan_turns/mean"] == 1.0
    assert batch.metrics["invalid_turns/share"] == base.metrics["invalid_turns/share"]
    eng.close()
    plain.close()


def test_replanning_and_the_horizon_count_env_turns(tokenizer):
    eng = RolloutEngine(ScriptedBackend(tokenizer, policy="random"), tokenizer, max_turns=5,
                        max_total_tokens=8192, plan=True, replan_every=2,
                        plan_max_tokens=4)
    for t in eng.collect_sync(4, "maze"):
        env_turns = t.num_turns - int(t.timings["plan_turns"])
        assert env_turns <= 5
        # plans before env turns 0, 2 and 4 of those played
        assert t.timings["plan_turns"] == len([k for k in (0, 2, 4) if k < env_turns])
        if t.stop_reason == "horizon":
            assert env_turns == 5
        assert len(t.turn_rewards) == t.num_turns
    eng.close()


def test_plan_settings_are_checked():
    with pytest.raises(ValueError, match="reply_prefix"):
        RolloutConfig(plan=True, reply_prefix="Action:")
    with pytest.raises(ValueError, match="replan_every"):
        RolloutConfig(plan=True, replan_every=-1)
    with pytest.raises(ValueError, match="plan_max_tokens"):
        RolloutConfig(plan=True, plan_max_tokens=0)
