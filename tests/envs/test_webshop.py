"""The native ``webshop`` env through agentgym.EnvPool and agentgym.make."""

import random

import pytest
from gymnasium.utils.env_checker import check_env

import agentgym
from tests import helpers

pytestmark = pytest.mark.timeout(120)



def run_policy(pool, choose, max_steps=40):
    return helpers.run_policy(pool, choose, max_steps)


def oracle(pool, live):
    return pool.oracle_actions(live)


def test_oracle_succeeds_and_replays_identically():
    a, trace_a, _ = run_policy(agentgym.EnvPool("webshop", 64, seed=5, split="test"), oracle)
    b, trace_b, _ = run_policy(agentgym.EnvPool("webshop", 64, seed=5, split="test"), oracle)
    assert trace_a == trace_b
    assert (a == 1.0).mean() >= 0.95
    assert ((0.0 <= a) & (a <= 1.0)).all()


def test_random_policy_rarely_succeeds():
    rng = random.Random(0)

    def rand(pool, live):
        return [rng.choice(pool.valid_actions(i)) for i in live]

    rewards, _, _ = run_policy(agentgym.EnvPool("webshop", 200, seed=1), rand, max_steps=30)
    assert (rewards == 1.0).mean() < 0.15


def test_make_is_deterministic_and_scores_a_purchase():
    env = agentgym.make("webshop", split="test")
    obs1, info = env.reset(seed=3, options={"task": 7})
    obs2, _ = env.reset(seed=3, options={"task": 7})
    assert obs1 == obs2 and obs1.startswith("WebShop\nInstruction: i am looking for")
    assert env.unwrapped.num_tasks == 500
    total, terminated = 0.0, False
    while not terminated:
        obs, reward, terminated, truncated, info = env.step(env.unwrapped.oracle_action())
        total += reward
        assert not truncated
    assert total == 1.0 and "Your score" in obs
    with pytest.raises(agentgym.EpisodeFinishedError):
        env.step("click[buy now]")


def test_invalid_actions_are_messages_not_errors():
    pool = agentgym.EnvPool("webshop", 2, seed=0)
    pool.reset()
    obs, rew, term, trunc = pool.step([0, 1], ["dance", "click[B0NOTREAL0]"])
    assert all(o.startswith("Invalid action") for o in obs)
    assert rew.tolist() == [0.0, 0.0] and not term.any() and not trunc.any()
    # WebShop's own spellings work.
    obs, *_ = pool.step([0], [pool.valid_actions(0)[0].replace("search", "Search")])
    assert "[Next >]" in obs[0]


def test_kwargs_are_checked():
    with pytest.raises(ValueError, match="split"):
        agentgym.EnvPool("webshop", 1, split="dev")
    with pytest.raises(ValueError, match="unexpected keyword"):
        agentgym.EnvPool("webshop", 1, colour="red")
    pool = agentgym.EnvPool("webshop", 1)
    with pytest.raises(agentgym.InvalidTaskError):
        pool.reset(tasks=["not a number"])
    assert pool.num_tasks == 11_500


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_gymnasium_check_env():
    env = agentgym.make("webshop")
    check_env(env.unwrapped, skip_render_check=True)
