"""BabyAI (minigrid) text env: hand-checked observation, actions, determinism, oracle."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("minigrid")

import agentgym  # noqa: E402
from agentgym.envs.babyai import AGENTGYM_LEVELS, BabyAIEnv  # noqa: E402
from agentgym.errors import EnvError, InvalidTaskError  # noqa: E402

PRIMITIVES = ["turn left", "turn right", "move forward", "pick up", "drop", "toggle"]


def test_observation_text_on_a_hand_checked_state():
    env = BabyAIEnv(level="GoToRedBallNoDists", show_actions=False)
    obs = env.reset(0)
    u = env.env
    # 8x8 room (walls on x/y = 0 and 7); agent at (6, 5) facing -x (dir 2); red ball at (2, 2):
    # 4 cells ahead along -x and 3 to the right (right of -x is -y); wall at x = 0 is 6 ahead.
    assert (int(u.agent_pos[0]), int(u.agent_pos[1]), u.agent_dir) == (6, 5, 2)
    ball = u.grid.get(2, 2)
    assert (ball.type, ball.color) == ("ball", "red")
    assert obs == (
        "Your goal: go to the red ball\n"
        "In front of you in this room, you can see several objects: There is a red ball 1 "
        "4 steps in front of you and 3 steps to your right. The room has walls around you. "
        "You are facing a wall 6 steps away. You are not carrying anything."
    )
    assert env.valid_actions() == [
        "turn left",
        "turn right",
        "move forward",
        "go to red ball 1",
        "pickup red ball 1",
    ]
    obs, reward, done, _ = env.step("turn left")  # now facing +y: wall at y = 7 is 2 ahead
    assert obs == (
        "You cannot see any objects within sight. The room has walls around you. "
        "You are facing a wall 2 steps away. You are not carrying anything."
    )
    assert (reward, done) == (0.0, False)
    env.step("turn right")
    obs, reward, done, info = env.step("go to red ball 1")  # 4 forward, right, 2 forward
    assert done and info["success"] and info["low_level_steps"] == 2 + 7
    assert reward == pytest.approx(1 - 0.9 * 9 / u.max_steps)  # minigrid's success weighting
    assert obs.endswith("The task is completed.")


def test_actions_listing_invalid_and_pickup():
    env = BabyAIEnv(level="PickupLoc")
    obs = env.reset(3)
    assert "\nAvailable actions: [" in obs and '"check available actions"' in obs
    text, reward, done, info = env.step("fly away")
    assert text.startswith("The action is not recognized") and not info["action_is_valid"]
    assert (reward, done) == (0.0, False)
    text, *_ = env.step("check available actions")
    assert text.startswith("You can take the following actions: turn left, turn right")
    text, *_ = env.step("drop")
    assert text.startswith("You cannot drop the object, as you are not carrying anything.")
    pickups = [a for a in env.valid_actions() if a.startswith("pickup ")]
    assert pickups
    text, *_ = env.step(pickups[0])
    kind = pickups[0][len("pickup ") : -2]
    assert f"You are carrying a {kind}." in text


def test_same_task_seed_and_actions_give_same_observations():
    def play(seed: int) -> list:
        env = agentgym.make("babyai", level=["GoToLocal", "PickupLoc"], max_turns=15)
        trace = [env.reset(seed=seed, options={"task": 5})]
        rng = random.Random(seed)
        for _ in range(15):
            step = env.step(rng.choice(env.unwrapped.valid_actions() or PRIMITIVES))
            trace.append(step)
            if step[2] or step[3]:
                break
        return trace

    from agentgym.envs.simulators import register_all

    register_all()
    assert play(1) == play(1)
    a, b = BabyAIEnv(level="GoToLocal"), BabyAIEnv(level="GoToLocal")
    assert a.reset(9) == b.reset(9) and a.reset(9) != a.reset(10)


def test_task_indexing_follows_agentgym():
    env = BabyAIEnv()
    assert env.num_tasks == 40 * 10_000
    assert env.task_of(0) == ("BabyAI-GoToRedBallGrey-v0", 0)
    assert env.task_of(41) == ("BabyAI-GoToRedBall-v0", 1)
    assert env.task_of(39) == ("BabyAI-BossLevelNoUnlock-v0", 0)
    assert env.task_of("GoToRedBall:5") == ("BabyAI-GoToRedBall-v0", 5)
    assert env.task_of("BabyAI-PickupLoc-v0:7") == ("BabyAI-PickupLoc-v0", 7)
    assert len(AGENTGYM_LEVELS) == 40
    for bad in (-1, "nonsense", "NoSuchLevel:3", 1.5):
        with pytest.raises(InvalidTaskError):
            env.task_of(bad)
    with pytest.raises(EnvError):
        BabyAIEnv(level="GoToRedBall").step("turn left")


@pytest.mark.parametrize("level", ["GoToRedBall", "PickupLoc"])
def test_bot_oracle_solves_while_random_rarely_does(level):
    env = BabyAIEnv(level=level, reward="binary")
    oracle = random_wins = 0
    for task in range(10):
        env.reset(task)
        for _ in range(64):
            action = env.oracle_action()
            assert action in PRIMITIVES
            _, reward, done, info = env.step(action)
            if done:
                break
        oracle += info["success"] and reward == 1.0
        rng = random.Random(task)
        env.reset(task)
        for _ in range(30):
            _, _, done, info = env.step(rng.choice(PRIMITIVES))
            if done:
                break
        random_wins += info["success"]
    assert oracle >= 9
    assert random_wins <= 3
