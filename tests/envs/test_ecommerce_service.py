"""The ``ecommerce_service`` env: generation, policy scoring, oracle, registry, Gymnasium API."""

from __future__ import annotations

import collections
import random

import pytest
from gymnasium.utils.env_checker import check_env

import agentgym
from agentgym.envs.ecommerce_service import CATEGORIES, ECommerceServiceEnv, generate
from agentgym.errors import EpisodeFinishedError, InvalidTaskError
from tests.helpers import play_actions

pytestmark = pytest.mark.timeout(120)


def _find(split: str, pred) -> tuple[ECommerceServiceEnv, int]:
    env = ECommerceServiceEnv(split)
    for t in range(env.num_tasks):
        env.reset(task=t, seed=0)
        if pred(env.sc):
            return env, t
    raise AssertionError("no such task")


def test_splits_and_determinism():
    train, test = ECommerceServiceEnv("train"), ECommerceServiceEnv("test")
    assert (train.num_tasks, test.num_tasks) == (800, 200)
    assert ECommerceServiceEnv("all").num_tasks == 1000
    a, b = ECommerceServiceEnv(), ECommerceServiceEnv()
    assert a.reset(task=5, seed=3) == b.reset(task=5, seed=3)
    assert a.sc.resolution == generate(5).resolution
    test.reset(task=0, seed=3)
    assert test.sc.order.order_id == generate(800).order.order_id
    with pytest.raises(InvalidTaskError):
        test.reset(task=200)
    with pytest.raises(ValueError):
        ECommerceServiceEnv("dev")


def test_seed_changes_wording_not_facts():
    env = ECommerceServiceEnv()
    texts = {env.reset(task=11, seed=s) for s in range(8)}
    assert len(texts) > 1
    assert {generate(11).resolution} == {env.sc.resolution}


def test_every_category_has_granted_and_declined_cases():
    seen = collections.Counter()
    for i in range(1000):
        sc = generate(i)
        seen[(sc.category, sc.resolution[0] in ("deny", "none"))] += 1
        assert sc.order in sc.orders and sc.item in sc.order.items
        assert len({o.order_id for o in sc.orders}) == len(sc.orders)
    for cat in CATEGORIES:
        assert seen[(cat, True)] >= 20 and seen[(cat, False)] >= 20, cat


def test_policy_windows_on_hand_picked_cases():
    for i in range(300):
        sc = generate(i)
        age = (sc.today - sc.order.delivered).days if sc.order.delivered else None
        if sc.category == "refund":
            window = 15 if sc.item.category == "electronics" else 30
            eligible = age <= window and not sc.item.final_sale
            assert (sc.resolution[0] == "refund") == eligible
            if eligible:
                assert sc.resolution[2] == round(sc.item.price * sc.item.qty, 2)
        if sc.category == "damaged":
            assert (sc.resolution[0] == "deny") == (age > 14)
        if sc.category == "shipping":
            late = (sc.today - sc.order.eta).days
            assert sc.resolution == (("reship", sc.order.order_id) if late > 3 else ("none",))


def test_scoring_rewards_and_penalties():
    env, t = _find("train", lambda sc: sc.resolution[0] == "refund")
    oid, amount, cat = env.sc.order.order_id, env.sc.resolution[2], env.sc.category
    good = [f"classify[{cat}]", f"lookup_order[{oid}]", f"refund[{oid}, ${amount:.2f}]",
            f"reply[Refund issued for {oid}.]"]
    assert play_actions(env, good)[0] == pytest.approx(1.0)
    env.reset(task=t, seed=0)
    reward, info = play_actions(env, good[1:])  # never classified
    assert reward == pytest.approx(0.8) and not info["classified"]
    env.reset(task=t, seed=0)
    reward, info = play_actions(env, good[:3] + ["reply[Done.]"])  # reply without the order id
    assert reward == pytest.approx(0.8) and not info["replied"]
    env.reset(task=t, seed=0)
    reward, info = play_actions(env, [good[0], f"refund[{oid}, {amount + 10:.2f}]", good[3]])
    assert reward == pytest.approx(0.2 + 0.2 - 0.3) and info["wrong_actions"] == 1
    env.reset(task=t, seed=0)
    reward, info = play_actions(env, good[:3] + [f"refund[{oid}, {amount:.2f}]", good[3]])  # twice
    assert reward == pytest.approx(1.0 - 0.3)


def test_refunding_an_ineligible_order_is_penalised():
    env, t = _find("train", lambda sc: sc.category == "refund" and sc.resolution[0] == "deny")
    oid = env.sc.order.order_id
    amount = env.sc.item.price
    reward, info = play_actions(env, ["classify[refund]", f"refund[{oid}, {amount}]",
                               f"reply[Refunded {oid}]"])
    assert reward == pytest.approx(0.2 + 0.2 - 0.3) and not info["resolved"]
    env.reset(task=t, seed=0)
    assert play_actions(env, ["classify[refund]", f"deny[{oid}]", f"reply[Sorry, {oid}]"])[0] == 1.0


def test_informational_shipping_case_needs_no_action():
    env, t = _find("train", lambda sc: sc.resolution == ("none",))
    oid = env.sc.order.order_id
    assert play_actions(env, ["classify[shipping]", f"reply[{oid} is on its way]"])[0] == 1.0
    env.reset(task=t, seed=0)
    assert play_actions(env, ["classify[shipping]", f"reship[{oid}]", f"reply[{oid}]"])[0] == \
        pytest.approx(0.4 - 0.3)


def test_tools_answer_and_bad_input_is_reported():
    env = ECommerceServiceEnv()
    env.reset(task=1, seed=0)
    oid = env.sc.order.order_id
    assert oid in env.step(f"lookup_order[{oid}]")[0]
    assert "No order" in env.step("lookup_order[Z0000]")[0]
    assert "Refunds:" in env.step("check_policy[refund]")[0]
    assert env.step("classify[weather]")[3]["invalid"]
    assert env.step("refund[]")[0].startswith("The first argument")
    assert env.step("refund[" + oid + ", lots]")[3]["invalid"]
    assert env.step("???")[3]["invalid"]
    assert oid in env.step("list_orders")[0]
    env.step("reply[bye]")
    with pytest.raises(EpisodeFinishedError):
        env.step("list_orders")


def test_oracle_solves_every_test_task_and_many_train_tasks():
    for split, tasks in (("test", range(200)), ("train", range(0, 800, 8))):
        env = ECommerceServiceEnv(split)
        for t in tasks:
            env.reset(task=t, seed=t)
            reward, done, info = 0.0, False, {}
            while not done:
                _, reward, done, info = env.step(env.oracle_action())
            assert reward == 1.0 and info["solved"], (split, t)


def test_random_policy_rarely_succeeds():
    env = ECommerceServiceEnv()
    rng = random.Random(0)
    rewards = []
    for t in range(100):
        env.reset(task=t, seed=t)
        reward = 0.0
        for _ in range(15):
            _, reward, done, _ = env.step(rng.choice(env.valid_actions()))
            if done:
                break
        rewards.append(reward if env.done else 0.0)
    assert sum(r >= 0.99 for r in rewards) <= 3
    assert sum(rewards) / len(rewards) < 0.3


def test_make_and_gymnasium_checker():
    env = agentgym.make("ecommerce_service", max_turns=12)
    check_env(env.unwrapped, skip_render_check=True)
    obs, info = env.reset(seed=0, options={"task": 4})
    assert "New message from customer" in obs
    assert "refund[ORDER_ID, AMOUNT]" in env.unwrapped.instructions
    while True:
        obs, reward, term, trunc, _ = env.step(env.unwrapped.oracle_action())
        if term or trunc:
            break
    assert term and reward == 1.0
