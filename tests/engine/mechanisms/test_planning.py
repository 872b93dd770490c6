"""Planning turns (``RolloutConfig.plan``): replies the env never sees, before the first
action and every ``replan_every`` env turns, through the native pool and a Python env."""

import pytest

from agentgym.backends.base import GenerateResult
from agentgym.backends.scripted import ScriptedBackend
from agentgym.engine import RolloutEngine
from agentgym.engine.config import RolloutConfig
from agentgym.engine.mechanisms.planning import ACT_PROMPT, PLAN_PREFIX, plan_due
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


@pytest.mark.parametrize("env_id", ["maze", "office"])
def test_a_plan_bonus_rewards_the_plans_of_solved_episodes_only(tokenizer, env_id):
    """``plan_bonus``: each plan turn of a solved episode earns it as its turn reward (and
    the episode's reward); an unsolved episode's plans earn nothing."""
    plain = RolloutEngine(ScriptedBackend(tokenizer), tokenizer, max_turns=30,
                          max_total_tokens=8192, plan=True)
    ref = plain.collect_sync(3, env_id)
    eng = RolloutEngine(ScriptedBackend(tokenizer), tokenizer, max_turns=30,
                        max_total_tokens=8192, plan=True, replan_every=3, plan_bonus=0.5)
    for t in eng.collect_sync(3, env_id):
        assert t.success
        plans = int(t.timings["plan_turns"])
        assert plans >= 2 or t.num_turns <= 4
        assert t.turn_rewards.count(0.5) >= plans
        assert t.reward == pytest.approx(sum(t.turn_rewards))
    for r, t in zip(ref, eng.collect_sync(3, env_id, replan_every=0)):
        assert t.turn_rewards == [0.5, *r.turn_rewards[1:]]
        assert t.reward == pytest.approx(r.reward + 0.5)
    # the random policy solves none of these in two turns: no bonus
    rnd = RolloutEngine(ScriptedBackend(tokenizer, policy="random"), tokenizer, max_turns=2,
                        max_total_tokens=8192, plan=True, plan_bonus=0.5)
    for t in rnd.collect_sync(4, env_id):
        assert not t.success and t.turn_rewards[0] == 0.0
    for e in (plain, eng, rnd):
        e.close()


class LateOracle(ScriptedBackend):
    """Replies that the env refuses for an episode's first ``late`` requests, then the
    oracle: its first attempt runs out of turns, its retry solves."""

    def __init__(self, tokenizer, late: int):
        super().__init__(tokenizer)
        self.late, self.seen = late, {}
        self.bad = self._encode("Action: xyzzy") + [self.end_of_turn_id]

    async def generate(self, prompt_ids, sampling, request_id=None, context=None):
        episode = request_id.rsplit("-", 2)[0]
        self.seen[episode] = self.seen.get(episode, 0) + 1
        if self.seen[episode] <= self.late:
            return GenerateResult(token_ids=self.bad, logprobs=[0.0] * len(self.bad))
        return await super().generate(prompt_ids, sampling, request_id, context)


def test_a_plan_bonus_joins_a_retried_episodes_reward(tokenizer):
    """With reflection, a retried episode's reward is set, not summed: the bonus is added
    to it as to its plan turn."""
    eng = RolloutEngine(LateOracle(tokenizer, late=31), tokenizer, max_turns=30,
                        max_total_tokens=8192, plan=True, plan_bonus=0.25, reflection=1,
                        reflection_discount=1.0)
    for t in eng.collect_sync(3, "maze"):
        assert t.timings["attempts"] == 2.0 and t.success
        assert t.turn_rewards[0] == 0.25 and t.reward == pytest.approx(1.25)
    with pytest.raises(ValueError, match="plan_bonus"):
        RolloutConfig(plan=True, plan_bonus=-1.0)
    eng.close()
