"""BabyAI (real levels from ``minigrid``) as a text environment, in AgentGym's style.

The agent sees a text description of its partial (7x7, egocentric) view: the objects in
front of it with their positions relative to the agent, the nearest wall straight ahead,
and what it carries; it acts with AgentGym's action vocabulary (primitive moves plus
"go to <object> <k>", "pickup <object> <k>", "toggle and go through <door> <k>", ...).
Macro actions expand into low-level minigrid actions along a shortest path through the
visible cells. ``oracle_action()`` is minigrid's ``BabyAIBot``. See envs/babyai/README.md.
"""

from __future__ import annotations

import contextlib
import io
import re
from collections import deque
from typing import Any

from agentgym.envs.base import BaseEnv
from agentgym.envs.tasks import parse_task
from agentgym.errors import EnvError, InvalidTaskError

#: AgentGym's 40 levels in its order (task index i -> level i % 40, level seed i // 40).
#: AgentGym's "GoToObjS6-v0" is registered as "-v1" by minigrid 3.x.
AGENTGYM_LEVELS: tuple[str, ...] = tuple(
    f"BabyAI-{name}"
    for name in (
        "GoToRedBallGrey-v0", "GoToRedBall-v0", "GoToRedBallNoDists-v0", "GoToObjS6-v1",
        "GoToLocalS8N7-v0", "GoToObjMazeS7-v0", "GoToImpUnlock-v0", "GoToSeqS5R2-v0",
        "GoToRedBlueBall-v0", "GoToDoor-v0", "GoToObjDoor-v0", "Open-v0", "OpenRedDoor-v0",
        "OpenDoorLoc-v0", "OpenRedBlueDoorsDebug-v0", "OpenDoorsOrderN4Debug-v0", "Pickup-v0",
        "UnblockPickup-v0", "PickupLoc-v0", "PickupDistDebug-v0", "PickupAbove-v0",
        "PutNextLocalS6N4-v0", "PutNextS7N4Carrying-v0", "Unlock-v0", "UnlockLocalDist-v0",
        "KeyInBox-v0", "UnlockPickupDist-v0", "BlockedUnlockPickup-v0", "UnlockToUnlock-v0",
        "ActionObjDoor-v0", "FindObjS7-v0", "KeyCorridorS6R3-v0", "OneRoomS20-v0",
        "MoveTwoAcrossS8N9-v0", "SynthS5R2-v0", "SynthLoc-v0", "SynthSeq-v0",
        "MiniBossLevel-v0", "BossLevel-v0", "BossLevelNoUnlock-v0",
    )
)  # fmt: skip

# minigrid low-level actions
LEFT, RIGHT, FORWARD, PICKUP, DROP, TOGGLE, DONE = range(7)
_ORACLE_TEXT = {LEFT: "turn left", RIGHT: "turn right", FORWARD: "move forward",
                PICKUP: "pick up", DROP: "drop", TOGGLE: "toggle"}  # fmt: skip
CHECK = "check available actions"
#: primitives accepted without being listed, so minigrid's bot (``oracle_action``) can act
_PRIMITIVES = {"pick up": [PICKUP], "pickup": [PICKUP], "toggle": [TOGGLE], "drop": [DROP]}

INSTRUCTIONS = """You are an agent in a BabyAI grid world (rooms, doors, keys, balls, boxes).
Each turn you see what is in front of you: objects with their position relative to you
("2 steps in front of you and 1 steps to your left"), the nearest wall ahead and what you
carry. Reply with exactly one action from the list of available actions, e.g.:
"turn left", "turn right", "move forward", "pick up", "drop", "toggle",
"go to <color> <object> <k>", "pickup <color> <object> <k>", "go through <door> <k>",
"toggle and go through <door> <k>", "go to goal", "check available actions".
Objects are numbered by distance (1 = nearest of that kind). Complete the goal in few steps:
the reward on success is 1 - 0.9 * (steps used / step limit)."""


def level_id(name: str) -> str:
    """The minigrid id for a level name: "GoToRedBall" -> "BabyAI-GoToRedBall-v0"."""
    import gymnasium as gym
    import minigrid  # noqa: F401  (registers the BabyAI ids)

    full = name if name.startswith("BabyAI-") else f"BabyAI-{name}"
    if not re.search(r"-v\d+$", full):
        full += "-v0"
    if full not in gym.registry:
        alt = re.sub(r"-v\d+$", "-v1", full)
        if alt in gym.registry:
            return alt
        known = sorted(k for k in gym.registry if k.startswith("BabyAI-"))
        raise InvalidTaskError(f"unknown BabyAI level {name!r}; known: {', '.join(known)}")
    return full


class BabyAIEnv(BaseEnv):
    """A BabyAI level (minigrid) with AgentGym-style text observations and actions.

    Args:
        level: one level name or id (``"GoToRedBall"``, ``"BabyAI-PickupLoc-v0"``), a list
            of them, or None for AgentGym's 40 levels. Task index ``i`` is level
            ``levels[i % L]`` with minigrid seed ``i // L`` (AgentGym's indexing).
        num_seeds: seeds per level counted in ``num_tasks``.
        reward: ``"minigrid"`` (1 - 0.9 * steps/max_steps on success, as AgentGym) or
            ``"binary"`` (1 on success).
        show_actions: append "Available actions: [...]" to every observation (as AgentGym).
    """

    instructions = INSTRUCTIONS
    tasks_doc = ("index i is level levels[i % L] with minigrid seed i // L (AgentGym's "
                 "indexing); num_tasks counts num_seeds seeds per level, larger indices are "
                 "further seeds")

    def __init__(
        self,
        level: str | list[str] | None = None,
        num_seeds: int = 10_000,
        reward: str = "minigrid",
        show_actions: bool = True,
    ):
        if level is None:
            self.levels = [level_id(x) for x in AGENTGYM_LEVELS]
        elif isinstance(level, str):
            self.levels = [level_id(level)]
        else:
            self.levels = [level_id(x) for x in level]
        if reward not in ("minigrid", "binary"):
            raise ValueError(f"reward must be 'minigrid' or 'binary', got {reward!r}")
        self.reward_mode = reward
        self.show_actions = show_actions
        self.num_tasks = len(self.levels) * int(num_seeds)
        self._envs: dict[str, Any] = {}
        self.env: Any = None
        self._actions: dict[str, list[int]] = {}
        self._errors: dict[str, str] = {}
        self._bot: Any = None
        self._bot_action: int | None = None
        self._done = True

    # ---------------------------------------------------------------- tasks
    def task_of(self, task: int | str | None, seed: int | None = None) -> tuple[str, int]:
        """(minigrid level id, minigrid seed) for a task index or "Level:seed" text."""
        task = parse_task(task, seed, self.num_tasks, "BabyAI", "Level:seed")
        if isinstance(task, tuple):
            return level_id(task[0]), task[1]
        if isinstance(task, bool) or not isinstance(task, int) or task < 0:
            raise InvalidTaskError(f"BabyAI task must be a non-negative index, got {task!r}")
        return self.levels[task % len(self.levels)], task // len(self.levels)

    def _make(self, level: str):
        if level not in self._envs:
            import gymnasium as gym

            self._envs[level] = gym.make(level).unwrapped
        return self._envs[level]

    # ---------------------------------------------------------------- API
    def reset(self, task: int | str | None = None, seed: int | None = None) -> str:
        level, level_seed = self.task_of(task, seed)
        self.env = self._make(level)
        with contextlib.redirect_stdout(io.StringIO()):  # "Sampling rejected: ..." prints
            self._image = self.env.reset(seed=level_seed)[0]["image"]
        self.level, self.level_seed = level, level_seed
        self._bot, self._bot_action, self._done = None, None, False
        self.goal = self.env.mission.replace("then", "and").replace("after you", "and")
        return f"Your goal: {self.goal}\n{self._with_actions(self._observe())}"

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        if self.env is None or self._done:
            raise EnvError("babyai: call reset() before step() (episode not running)")
        act = " ".join(str(action).lower().split()).strip(" .\"'")
        info: dict[str, Any] = {"action_is_valid": True, "success": False}
        if "check" in act:
            text = "You can take the following actions: " + ", ".join(self._actions)
            return self._with_actions(text), 0.0, False, info
        if act in self._actions:
            low = self._actions[act]
        elif act in _PRIMITIVES and act not in self._errors:
            low = _PRIMITIVES[act]  # unlisted, for minigrid's bot (oracle_action)
        else:
            info["action_is_valid"] = False
            msg = ("No change in state." if not act else self._errors.get(
                act, "The action is not recognized. Please check valid actions."))
            return self._with_actions(msg), 0.0, False, info
        if not low:
            return self._with_actions("No change in state."), 0.0, False, info
        reward, terminated, truncated = self._run(low)
        text = self._observe()
        success = terminated and reward > 0
        if terminated:
            text += "\n The task is completed." if success else "\n The task has failed."
        self._done = terminated or truncated
        text = self._with_actions(text)
        info.update(success=success, low_level_steps=int(self.env.step_count))
        if truncated and not terminated:
            info["truncated"] = True
        if success and self.reward_mode == "binary":
            reward = 1.0
        return text, float(reward), terminated or truncated, info

    def valid_actions(self) -> list[str]:
        return [a for a in self._actions if a != CHECK] if not self._done else []

    def oracle_action(self) -> str | None:
        """``BabyAIBot``'s next low-level action as text (None when it has no advice)."""
        if self.env is None or self._done:
            return None
        if self._bot is None:
            from minigrid.utils.baby_ai_bot import BabyAIBot

            try:
                self._bot = BabyAIBot(self.env)
                self._bot_action = int(self._bot.replan())
            except Exception:
                self._bot, self._bot_action = None, None
        return _ORACLE_TEXT.get(self._bot_action) if self._bot_action is not None else None

    def close(self) -> None:
        for env in self._envs.values():
            env.close()
        self._envs.clear()
        self.env = None

    # ---------------------------------------------------------------- internals
    def _run(self, low: list[int]) -> tuple[float, bool, bool]:
        """Execute low-level actions; stop early when one leaves the agent's view image
        unchanged (as AgentGym), or when the episode ends."""
        env = self.env
        total, terminated, truncated = 0.0, False, False
        before = self._image
        for a in low:
            obs, r, terminated, truncated, _ = env.step(a)
            total += float(r)
            if self._bot is not None and not (terminated or truncated):
                try:
                    self._bot_action = int(self._bot.replan(a))
                except Exception:  # the bot gives up on states it cannot parse: rebuild later
                    self._bot, self._bot_action = None, None
            self._image = obs["image"]
            if terminated or truncated or (obs["image"] == before).all():
                break
            before = obs["image"]
        return total, terminated, truncated

    def _with_actions(self, text: str) -> str:
        if not self.show_actions:
            return text
        listed = ", ".join(f'"{a}"' for a in self._actions)
        return f"{text}\nAvailable actions: [{listed}]"

    def _observe(self) -> str:
        """Describe the view and recompute the available actions, by AgentGym's rules."""
        text, self._actions, self._errors = describe(self.env, self._image)
        return text


# the view scan's object kinds, and the names that block a path (AgentGym's rules)
_SEEN = ("door", "key", "ball", "box", "goal", "lava", "wall")
_BLOCKING = ("wall", "box", "lava", "ball", "key")
_STATES = ("open", "closed", "locked")
# absolute direction vectors (minigrid's DIR_TO_VEC): right, down, left, up
_VEC = ((1, 0), (0, 1), (-1, 0), (0, -1))


def describe(env, image) -> tuple[str, dict[str, list[int]], dict[str, str]]:
    """AgentGym's text for minigrid ``env``'s view ``image`` (the egocentric encoding its
    last reset or step returned) and its action space.

    Returns ``(description, actions, errors)``: ``actions`` maps each available action
    (AgentGym's names, in its order, ``check available actions`` last) to its low-level
    minigrid actions; ``errors`` maps known-but-unavailable actions to AgentGym's reason.
    The rules, as AgentGym's agentenv-babyai applies them: every door, key, ball, box,
    goal, lava and wall cell of the egocentric image (unseen cells excluded) with its
    absolute position is an object, sorted by Manhattan distance (stable, far rows
    first); walls and boxes straight ahead are barriers. Paths are a breadth-first search
    over (cell, heading) inside the view's coordinate range, where walls, boxes, lava,
    balls and keys block and a state is expanded once.
    """
    from minigrid.core.constants import IDX_TO_COLOR, IDX_TO_OBJECT

    view = env.agent_view_size
    pos = (int(env.agent_pos[0]), int(env.agent_pos[1]))
    d = int(env.agent_dir)
    f, r = _VEC[d], _VEC[(d + 1) % 4]
    top = (pos[0] + f[0] * (view - 1) - r[0] * (view // 2),
           pos[1] + f[1] * (view - 1) - r[1] * (view // 2))
    edge = (top[0] + view * (r[0] - f[0]), top[1] + view * (r[1] - f[1]))
    ranges = tuple(range(edge[k], top[k] + 1) if edge[k] < top[k] else range(top[k], edge[k])
                   for k in (0, 1))
    objs: list[tuple[str, tuple[int, int], int]] = []  # (name, cell, distance)
    barriers: list[tuple[str, int]] = []  # (kind, distance ahead)
    for vj in range(view):
        for vi in range(view):
            cell = (top[0] - f[0] * vj + r[0] * vi, top[1] - f[1] * vj + r[1] * vi)
            rel = (cell[0] - pos[0], cell[1] - pos[1])
            dist = abs(rel[0]) + abs(rel[1])
            if cell[0] < 0 or cell[1] < 0 or dist == 0:
                continue
            kind = IDX_TO_OBJECT[int(image[vi, vj, 0])]
            color = IDX_TO_COLOR[int(image[vi, vj, 1])]
            if kind in _SEEN:
                state = _STATES[int(image[vi, vj, 2])] if kind == "door" else None
                name = f"{color} {state} door" if state else f"{color} {kind}"
                objs.append((name, cell, dist))
            if kind in ("box", "wall") and f[0] * rel[1] - f[1] * rel[0] == 0:
                barriers.append((kind, f[0] * rel[0] + f[1] * rel[1]))
    objs.sort(key=lambda o: o[2])
    barriers.sort(key=lambda b: b[1])

    text = "You cannot see any objects within sight."
    if objs:
        text = "In front of you in this room, you can see several objects: "
        seen: dict[str, int] = {}
        for name, cell, _ in objs:
            if "wall" in name:
                continue
            rel = (cell[0] - pos[0], cell[1] - pos[1])
            front, right = f[0] * rel[0] + f[1] * rel[1], r[0] * rel[0] + r[1] * rel[1]
            if right == 0:
                where = f"right in front of you {front} steps away. "
            else:
                side = "right" if right > 0 else "left"
                where = f"{front} steps in front of you and {abs(right)} steps to your {side}. "
            seen[name] = seen.get(name, 0) + 1
            text += f"There is a {name} {seen[name]} {where} "
    text += "The room has walls around you. "
    if barriers:
        text += f"You are facing a {barriers[0][0]} {barriers[0][1]} steps away. "
    carry = env.carrying
    text += (f"You are carrying a {carry.color} {carry.type}." if carry is not None
             else "You are not carrying anything.")

    found: dict[tuple, list[int] | None] = {}

    def path(goal: tuple[int, int], arrive: bool) -> list[int] | None:
        if (goal, arrive) not in found:  # pickup and go to ask for the same paths
            found[goal, arrive] = _find_path(pos, d, goal, objs, ranges, arrive)
        low = found[goal, arrive]
        return None if low is None else list(low)

    actions: dict[str, list[int]] = {"turn left": [LEFT], "turn right": [RIGHT]}
    errors: dict[str, str] = {}
    if not barriers or barriers[0][1] > 1:
        actions["move forward"] = [FORWARD]
    else:
        errors["move forward"] = "There is a barrier in front of you, you can't move forward."

    def numbered(verb: str, skip: tuple[str, ...], tail: list[int]) -> None:
        count: dict[str, int] = {}
        for name, cell, _ in objs:
            if any(word in name for word in skip):
                continue
            low = path(cell, False)
            k = count.get(name, 0) + 1
            if low is not None:
                count[name] = k
                actions[f"{verb} {name} {k}"] = low + tail
            else:
                what = "pickup" if verb == "pickup" else "go to"
                errors[f"{verb} {name} {k}"] = (
                    f"You cannot {what} {name} {k}, as there is no path leading to it.")

    if carry is None:
        numbered("pickup", ("wall", "door", "goal"), [PICKUP])
    if carry is not None:
        ahead = (pos[0] + f[0], pos[1] + f[1])
        if any(c == ahead and any(w in n for w in _BLOCKING) for n, c, _ in objs):
            errors["drop"] = ("You cannot drop the object, as there is already an object in "
                              "front of you.")
        else:
            actions["drop"] = [DROP]
    else:
        errors["drop"] = "You cannot drop the object, as you are not carrying anything."
    doors: dict[str, int] = {}
    for name, cell, _ in objs:
        if "door" not in name:
            continue
        doors[name] = k = doors.get(name, 0) + 1
        label = f"{name} {k}"
        if "open door" in name:
            low = path(cell, True)
            if low is not None:
                actions[f"go through {label}"] = low
            else:
                errors[f"go through {label}"] = (
                    f"You cannot go through {label}, as there is no path leading to it.")
            continue
        if "locked door" in name:
            if carry is None or carry.type != "key" or carry.color != name.split(" ")[0]:
                why = ("you are not carrying a key" if carry is None or carry.type != "key"
                       else "the color of the key you are carrying does not match the color "
                            "of door")
                errors[f"toggle and go through {label}"] = (
                    f"You cannot toggle and go through {label}, as {why}.")
                continue
        low = path(cell, False)
        if low is not None:
            actions[f"toggle and go through {label}"] = low + [TOGGLE, FORWARD]
        else:
            errors[f"toggle and go through {label}"] = (
                f"You cannot toggle and go through {label}, as there is no path leading to it.")
        if low == []:
            actions["toggle"] = [TOGGLE]
        if "closed door" in name:
            errors[f"go through {label}"] = (
                f"You cannot go through {label}, as it is closed. You should toggle it first.")
    for name, cell, _ in objs:
        if "goal" in name:
            low = path(cell, True)
            if low is not None:
                actions["go to goal"] = low
            else:
                errors["go to goal"] = ("You cannot go to the goal, as there is no path "
                                        "leading to it.")
    numbered("go to", ("wall", "goal"), [])
    actions[CHECK] = []
    return text, actions, errors


def _find_path(start, heading, goal, objs, ranges, arrive) -> list[int] | None:
    """AgentGym's path search: breadth-first over (cell, heading) from the agent, moves
    tried forward, left, right; a move is blocked outside ``ranges``, into an already
    expanded state, or onto a cell holding a wall, box, lava, ball or key; the parent link
    of a state is the last one that reached it before it was expanded. The path ends on
    ``goal`` (``arrive``) or facing it."""
    blocked = {cell for name, cell, _ in objs if any(w in name for w in _BLOCKING)}
    parent: dict[tuple, tuple] = {}
    expanded: set[tuple] = set()
    queue = deque([(start, heading)])
    while queue:
        state = queue.popleft()
        expanded.add(state)
        (x, y), d = state
        dx, dy = _VEC[d]
        if (arrive and (x, y) == goal) or (not arrive and (goal[0] - x, goal[1] - y) == (dx, dy)):
            out = []
            while state != (start, heading):
                state, a = parent[state]
                out.append(a)
            return out[::-1]
        for a, nxt in ((FORWARD, ((x + dx, y + dy), d)), (LEFT, ((x, y), (d - 1) % 4)),
                       (RIGHT, ((x, y), (d + 1) % 4))):
            (nx, ny), _ = nxt
            if nx not in ranges[0] or ny not in ranges[1] or nxt in expanded \
                    or (nx, ny) in blocked:
                continue
            queue.append(nxt)
            parent[nxt] = (state, a)
    return None
