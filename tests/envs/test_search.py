"""The native ``search`` (deep search) env through agentgym.EnvPool and agentgym.make."""

import json
import random

import pytest
from gymnasium.utils.env_checker import check_env

import agentgym
from tests import helpers

pytestmark = pytest.mark.timeout(120)



def run_policy(pool, choose, max_steps=20):
    return helpers.run_policy(pool, choose, max_steps)


def oracle(pool, live):
    return pool.oracle_actions(live)


@pytest.mark.parametrize("hops", [1, 2, 3])
def test_oracle_answers_every_question_in_2h_plus_1_turns(hops):
    pool = agentgym.EnvPool("search", 48, seed=2, split="test", hops=hops)
    rewards, _, turns = run_policy(pool, oracle)
    assert (rewards == 1.0).all()
    assert (turns <= 2 * hops + 1).all()


def test_mixed_difficulty_replays_identically():
    a = run_policy(agentgym.EnvPool("search", 32, seed=9), oracle)
    b = run_policy(agentgym.EnvPool("search", 32, seed=9), oracle)
    assert a[1] == b[1]


def test_random_policy_rarely_succeeds():
    rng = random.Random(0)

    def rand(pool, live):
        return [rng.choice(pool.valid_actions(i)) for i in live]

    rewards, _, _ = run_policy(agentgym.EnvPool("search", 300, seed=1), rand)
    assert (rewards == 1.0).mean() < 0.1


def test_make_with_difficulty_and_custom_question():
    env = agentgym.make("search", difficulty="hard", split="test")
    obs, _ = env.reset(seed=0, options={"task": 4})
    assert obs.startswith("Question: ") and env.unwrapped.num_tasks == 500
    assert obs == env.reset(seed=0, options={"task": 4})[0]
    spec = json.dumps({"question": "Who founded Nothing Inc?", "answer": "Ada Byron"})
    obs, _ = env.reset(options={"task": spec})
    assert "Nothing Inc" in obs
    obs, reward, terminated, truncated, _ = env.step("answer[Ada]")
    assert terminated and not truncated and 0.0 < reward < 1.0
    env.reset(options={"task": spec})
    assert env.step("answer[the ada byron.]")[1] == 1.0


def test_invalid_actions_are_messages_not_errors():
    pool = agentgym.EnvPool("search", 3, seed=0)
    pool.reset()
    obs, rew, term, _ = pool.step([0, 1, 2], ["hello", "open[No Such Doc]", "search[]"])
    assert all(o.startswith("Invalid action") for o in obs)
    assert rew.tolist() == [0.0, 0.0, 0.0] and not term.any()


def test_kwargs_are_checked():
    with pytest.raises(ValueError, match="hops"):
        agentgym.EnvPool("search", 1, hops=5)
    with pytest.raises(ValueError, match="contradicts"):
        agentgym.EnvPool("search", 1, hops=1, difficulty="hard")
    with pytest.raises(ValueError, match="split"):
        agentgym.EnvPool("search", 1, split="valid")
    pool = agentgym.EnvPool("search", 1)
    with pytest.raises(agentgym.InvalidTaskError):
        pool.reset(tasks=["{not json"])


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_gymnasium_check_env():
    env = agentgym.make("search")
    check_env(env.unwrapped, skip_render_check=True)
