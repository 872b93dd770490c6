"""BabyAI (minigrid) text env: hand-checked observation, actions, determinism, oracle."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

pytest.importorskip("minigrid")

import agentgym  # noqa: E402
from agentgym.envs.babyai import AGENTGYM_LEVELS, CHECK, BabyAIEnv  # noqa: E402
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
        "4 steps in front of you and 3 steps to your right.  The room has walls around you. "
        "You are facing a wall 6 steps away. You are not carrying anything."
    )
    assert env.valid_actions() == [
        "turn left",
        "turn right",
        "move forward",
        "pickup red ball 1",
        "go to red ball 1",
    ]
    obs, reward, done, _ = env.step("turn left")  # now facing +y: wall at y = 7 is 2 ahead
    assert obs == (
        "In front of you in this room, you can see several objects: The room has walls around "
        "you. You are facing a wall 2 steps away. You are not carrying anything."
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


def play_oracle(env: BabyAIEnv, task, max_turns: int = 64, rng=None, every: int = 0):
    """Play ``task`` with ``oracle_action()`` (every ``every``-th turn a random turn or step
    forward instead, when ``every``); returns (solved, turns, low-level steps)."""
    env.reset(task)
    info: dict = {}
    for turn in range(1, max_turns + 1):
        action = env.oracle_action()
        assert action is not None
        assert action in env.valid_actions() or action in ("pick up", "toggle", "drop")
        if every and turn % every == 0:
            action = rng.choice([a for a in PRIMITIVES[:3] if a in env.valid_actions()])
        _, reward, done, info = env.step(action)
        assert info["action_is_valid"]
        if done:
            return bool(info["success"] and reward == 1.0), turn, info["low_level_steps"]
    return False, max_turns, info.get("low_level_steps", 0)


@pytest.mark.parametrize("level", ["GoToRedBall", "PickupLoc"])
def test_bot_oracle_solves_with_macro_actions_while_random_rarely_does(level):
    env = BabyAIEnv(level=level, reward="binary")
    runs = [play_oracle(env, task) for task in range(10)]
    assert sum(solved for solved, _, _ in runs) >= 9
    # macro actions: the bot's low-level steps take far fewer turns
    assert sum(turns for _, turns, _ in runs) <= 0.6 * sum(steps for _, _, steps in runs)
    random_wins = 0
    for task in range(10):
        rng = random.Random(task)
        env.reset(task)
        for _ in range(30):
            _, _, done, info = env.step(rng.choice(PRIMITIVES))
            if done:
                break
        random_wins += info["success"]
    assert random_wins <= 3


def test_oracle_advises_after_actions_it_did_not_choose():
    """The bot is told every low-level action actually taken (BabyAIBot's advising mode), so
    the oracle still solves when another policy moves the agent every third turn."""
    env = BabyAIEnv(level=["GoToLocal", "PickupLoc", "Open"], reward="binary")
    rng = random.Random(0)
    runs = [play_oracle(env, task, rng=rng, every=3) for task in range(12)]
    assert sum(solved for solved, _, _ in runs) >= 11


@pytest.mark.parametrize("level", ["PutNextS7N4Carrying", "KeyInBox"])
def test_oracle_solves_the_levels_the_stock_bot_cannot(level):
    """minigrid's BabyAIBot fails these (it plans to pick up the object the agent already
    carries; it does not look into boxes): the oracle drops the carried object's pickup from
    the bot's plan, and opens the box that hides the key first."""
    from minigrid.utils.baby_ai_bot import BabyAIBot

    env = BabyAIEnv(level=level, reward="binary")
    runs = [play_oracle(env, task) for task in range(6)]
    assert sum(solved for solved, _, _ in runs) >= 5
    stock = 0
    for task in range(6):
        env.reset(task)
        u = env.env
        bot, action = BabyAIBot(u), None
        for _ in range(200):
            try:
                action = bot.replan(action)
            except Exception:
                break
            _, reward, terminated, truncated, _ = u.step(action)
            if terminated or truncated:
                stock += terminated and reward > 0
                break
    assert stock <= 2


def test_bot_that_replans_for_ever_raises_and_the_oracle_still_answers():
    """On UnlockToUnlock seed 9998 the stock bot's replan never returns (its subgoals keep
    replacing each other: the key it wants is behind the door it explores); the env's bot
    raises instead, and the oracle answers at once (a fresh bot, or no advice)."""
    from agentgym.envs.babyai import _bot_class

    env = BabyAIEnv(level="UnlockToUnlock")
    env.reset(9998)
    bot = _bot_class()(env.env)
    action = bot.replan()
    with pytest.raises(RuntimeError, match="does not converge"):
        for _ in range(5):
            env.env.step(action)
            action = bot.replan(action)
    env.reset(9998)
    for _ in range(4):
        action = env.oracle_action()
        if action is None:
            break
        env.step(action)


# AgentGym's agentenv-babyai server's texts (its environment.py run on minigrid 3.2) for
# data_idx -> reset observation, and for index 4 after each action.
AGENTGYM_RESETS = {
    15: 'Your goal: open the purple door and open the red door\nIn front of you in this room, you can see several objects: There is a grey closed door 1 3 steps in front of you and 1 steps to your right.  There is a red closed door 1 4 steps in front of you and 2 steps to your left.  The room has walls around you. You are facing a wall 4 steps away. You are not carrying anything.\nAvailable actions: ["turn left", "turn right", "move forward", "toggle and go through grey closed door 1", "toggle and go through red closed door 1", "go to grey closed door 1", "go to red closed door 1", "check available actions"]',  # noqa: E501
    22: 'Your goal: put the yellow box next to the green ball\nIn front of you in this room, you can see several objects: There is a purple box 1 1 steps in front of you and 1 steps to your right.  There is a yellow box 1 2 steps in front of you and 1 steps to your left.  There is a green key 1 2 steps in front of you and 3 steps to your right.  The room has walls around you. You are facing a wall 3 steps away. You are carrying a yellow box.\nAvailable actions: ["turn left", "turn right", "move forward", "drop", "go to purple box 1", "go to yellow box 1", "go to green key 1", "check available actions"]',  # noqa: E501
    53: 'Your goal: open a door in front of you\nIn front of you in this room, you can see several objects: There is a yellow closed door 1 4 steps in front of you and 1 steps to your left.  The room has walls around you. You are facing a wall 6 steps away. You are not carrying anything.\nAvailable actions: ["turn left", "turn right", "move forward", "toggle and go through yellow closed door 1", "go to yellow closed door 1", "check available actions"]',  # noqa: E501
    4: 'Your goal: go to a green key\nIn front of you in this room, you can see several objects: There is a yellow key 1 1 steps in front of you and 1 steps to your left.  There is a grey ball 1 1 steps in front of you and 1 steps to your right.  There is a purple key 1 2 steps in front of you and 1 steps to your left.  There is a green key 1 2 steps in front of you and 1 steps to your right.  There is a red box 1 2 steps in front of you and 2 steps to your right.  There is a grey ball 2 5 steps in front of you and 1 steps to your right.  There is a green key 2 4 steps in front of you and 2 steps to your right.  The room has walls around you. You are facing a wall 6 steps away. You are not carrying anything.\nAvailable actions: ["turn left", "turn right", "move forward", "pickup yellow key 1", "pickup grey ball 1", "pickup purple key 1", "pickup green key 1", "pickup red box 1", "pickup grey ball 2", "pickup green key 2", "go to yellow key 1", "go to grey ball 1", "go to purple key 1", "go to green key 1", "go to red box 1", "go to grey ball 2", "go to green key 2", "check available actions"]',  # noqa: E501
}
_AFTER_LEFT = ["turn left", "turn right", "move forward", "pickup yellow key 1",
               "pickup purple key 1", "go to yellow key 1", "go to purple key 1",
               "check available actions"]
AGENTGYM_STEPS_4 = [
    ("turn left", "In front of you in this room, you can see several objects: There is a yellow key 1 1 steps in front of you and 1 steps to your right.  There is a purple key 1 1 steps in front of you and 2 steps to your right.  The room has walls around you. You are facing a wall 2 steps away. You are not carrying anything."),  # noqa: E501
    ("go to blue key 1", "The action is not recognized. Please check valid actions."),
    ("nonsense", "The action is not recognized. Please check valid actions."),
]


def test_texts_equal_agentgyms_server():
    env = BabyAIEnv()
    for task, text in AGENTGYM_RESETS.items():
        assert env.reset(task) == text, task
    listed = "\nAvailable actions: [" + ", ".join(f'"{a}"' for a in _AFTER_LEFT) + "]"
    for action, text in AGENTGYM_STEPS_4:
        obs, reward, done, _ = env.step(action)
        assert (obs, reward, done) == (text + listed, 0.0, False), action


def test_texts_follow_agentgyms_rules_over_many_tasks():
    """Over two seeds of all 40 levels: AgentGym's goal rewrite, its object sentences (two
    spaces after each), "move forward" listed unless a wall or box is right ahead, the turns
    first and "check available actions" last, and no primitive "pick up" listed."""
    env = BabyAIEnv()
    for task in range(80):
        obs = env.reset(task)
        mission = env.env.mission
        goal, body = obs.split("\n", 1)
        assert goal == "Your goal: " + mission.replace("then", "and").replace("after you", "and")
        description, listed = body.split("\nAvailable actions: ")
        actions = json.loads(listed)
        assert actions[:2] == ["turn left", "turn right"] and actions[-1] == CHECK
        assert "pick up" not in actions and "pickup" not in actions
        ahead = env.env.grid.get(*env.env.front_pos)
        blocked = ahead is not None and ahead.type in ("wall", "box")
        assert ("move forward" in actions) == (not blocked), task
        if "There is a " in description:
            sentences = description.split("There is a ")[1:]
            assert all(s.endswith(".  ") for s in sentences[:-1]), task
            assert sentences[-1].split(".  ")[1].startswith("The room has walls around you.")


def test_image_observations_frame_and_text():
    text_env = BabyAIEnv(level="GoToRedBallNoDists", show_actions=False)
    env = BabyAIEnv(level="GoToRedBallNoDists", show_actions=False, obs="image")
    both = BabyAIEnv(level="GoToRedBallNoDists", show_actions=False, obs="both")
    assert env.frame() is None and text_env.frame() is None  # before a reset; text mode
    full = text_env.reset(0)
    assert both.reset(0) == full
    assert env.reset(0) == "Your goal: go to the red ball\nYou are not carrying anything."
    assert text_env.frame() is None
    frame = env.frame()
    # minigrid's render of the 8x8 grid at 7 pixels a cell: 56 x 56, no padding.
    assert isinstance(frame, np.ndarray) and frame.dtype == np.uint8
    assert frame.shape == (56, 56, 3)
    np.testing.assert_array_equal(frame, env.env.get_frame(highlight=False, tile_size=7))
    np.testing.assert_array_equal(both.frame(), frame)
    # The agent is minigrid's red triangle in its cell (6, 5): cell pixels rows 35-41,
    # columns 42-48.
    cell = frame[35:42, 42:49].reshape(-1, 3)
    assert any(tuple(p) == (255, 0, 0) for p in cell)
    assert "picture" in env.instructions and "what is in front of you" not in env.instructions
    assert "picture" in both.instructions and "what is in front of you" in both.instructions
    assert "picture" not in text_env.instructions and env.instructions.endswith(
        "Action: move forward")
    obs, reward, done, _ = env.step("turn left")
    assert obs == "You are not carrying anything." and (reward, done) == (0.0, False)
    turned = env.frame()
    assert not np.array_equal(turned, frame)  # the triangle turned
    env.step("turn right")
    np.testing.assert_array_equal(env.frame(), frame)  # the same state, the same picture
    env.step("move forward")
    assert not np.array_equal(env.frame(), frame)
    text, _, _, _ = env.step("fly away")
    assert text.startswith("The action is not recognized")
    # A snapshot keeps the mode and the picture.
    state = env.snapshot()
    before = env.frame()
    env.step("turn left")
    env.restore(state)
    np.testing.assert_array_equal(env.frame(), before)


def test_make_passes_obs_and_the_adapter_draws():
    env = agentgym.make("babyai", level="GoToRedBall", obs="image")
    obs, _ = env.reset(seed=0, options={"task": 0})
    assert obs.startswith("Your goal: ") and "In front of you" not in obs
    frame = env.unwrapped.frame()
    assert frame.shape == (56, 56, 3) and frame.dtype == np.uint8
    assert agentgym.make("babyai", level="GoToRedBall").unwrapped.frame() is None


def test_image_frames_are_padded_to_multiples_of_28():
    env = BabyAIEnv(level="BossLevel", obs="image", tile_size=7)
    obs = env.reset(0)
    assert obs.startswith("Your goal: ") and "In front of you" not in obs
    frame = env.frame()
    # 22 x 22 cells of 7 pixels: 154, padded with wall grey to 168.
    assert frame.shape == (168, 168, 3) and frame.dtype == np.uint8
    assert (frame[154:, :] == 100).all() and (frame[:, 154:] == 100).all()
    for level, tile in [("GoToObjS6", 5), ("OpenRedDoor", 8), ("MoveTwoAcrossS8N9", 7)]:
        e = BabyAIEnv(level=level, obs="both", tile_size=tile)
        e.reset(1)
        h, w, c = e.frame().shape
        assert c == 3 and h % 28 == 0 and w % 28 == 0
        assert (h - e.env.height * tile) < 28 and (w - e.env.width * tile) < 28
    with pytest.raises(ValueError, match="obs"):
        BabyAIEnv(obs="video")
    with pytest.raises(ValueError, match="tile_size"):
        BabyAIEnv(obs="image", tile_size=0)


def test_resets_on_many_threads_print_nothing_and_leave_stdout_alone(capsys):
    """The engine resets Python envs on a thread pool: minigrid's "Sampling rejected"
    prints stay silent without swapping the process-wide ``sys.stdout`` (which, swapped
    around overlapping resets, stayed swapped and swallowed every later print)."""
    import sys
    from concurrent.futures import ThreadPoolExecutor

    before = sys.stdout
    envs = [BabyAIEnv() for _ in range(8)]

    def reset(k: int) -> str:
        return envs[k % 8].reset(task=399_936 + k)

    with ThreadPoolExecutor(8) as pool:
        for b in range(8):  # eight envs at once, each on one thread
            list(pool.map(reset, range(8 * b, 8 * b + 8)))
    assert sys.stdout is before
    print("still here")
    assert capsys.readouterr().out == "still here\n"
