"""BabyAI (real levels from ``minigrid``) as a text environment, in AgentGym's style.

The agent sees a text description of its partial (7x7, egocentric) view: the objects in
front of it with their positions relative to the agent, the nearest wall straight ahead,
and what it carries; it acts with AgentGym's action vocabulary (primitive moves plus
"go to <object> <k>", "pickup <object> <k>", "toggle and go through <door> <k>", ...).
Macro actions expand into low-level minigrid actions along a shortest path through the
visible cells. ``oracle_action()`` plays minigrid's ``BabyAIBot`` through these text actions
(the macro that leaves the bot the fewest steps). With ``obs="image"`` or ``"both"``,
``frame()`` is minigrid's own RGB render of the whole grid. See envs/babyai/README.md.
"""

from __future__ import annotations

import copy
import re
from collections import deque
from typing import Any

import numpy as np

from agentgym.envs.base import BaseEnv, action_line
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
carry. The actions (the observation lists the ones available) look like
"turn left", "turn right", "move forward", "pick up", "drop", "toggle",
"go to <color> <object> <k>", "pickup <color> <object> <k>", "go through <door> <k>",
"toggle and go through <door> <k>", "go to goal", "check available actions".
Objects are numbered by distance (1 = nearest of that kind). Complete the goal in few steps:
the reward on success is 1 - 0.9 * (steps used / step limit).""" + action_line(
    "move forward")

#: What the instructions say about the picture (``obs="image"`` or ``"both"``).
_PICTURE = """Each turn you see a picture of the whole grid from above: grey walls, black floor,
you are the red triangle pointing the way you face, and doors, keys, balls and boxes are
drawn in their colours (a locked door is filled and shows a keyhole, a closed door is an
outlined square with a handle, an open door a thin strip at the side of its cell)."""
#: The text mode's sentence about what the agent is told each turn.
_VIEW = """Each turn you see what is in front of you: objects with their position relative to you
("2 steps in front of you and 1 steps to your left"), the nearest wall ahead and what you
carry."""
#: The observation modes (``obs``) and their instructions.
_INSTRUCTIONS = {
    "text": INSTRUCTIONS,
    "image": INSTRUCTIONS.replace(
        _VIEW, _PICTURE + "\nThe text says your goal and what you carry."),
    "both": INSTRUCTIONS.replace(_VIEW, _PICTURE + "\nThe text also says" + _VIEW[
        len("Each turn you see"):]),
}
#: Frames are padded (bottom, right) to multiples of this many pixels, in minigrid's wall
#: grey: a vision model's 14-pixel patches merged 2 x 2.
FRAME_ALIGN = 28
_WALL_GREY = (100, 100, 100)


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


def _quiet_level_generation() -> None:
    """Silence minigrid's level generator, which prints "Sampling rejected: ..." each time
    it redraws a layout: its module's ``print`` is shadowed (resets run on several threads
    at once, where swapping the process-wide ``sys.stdout`` around each reset would leave
    it swapped for good)."""
    from minigrid.envs.babyai.core import roomgrid_level

    roomgrid_level.print = _no_print


def _no_print(*args: Any, **kwargs: Any) -> None:
    return None


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
        obs: ``"text"`` (AgentGym's view description), ``"image"`` (:meth:`frame` shows the
            grid; the text keeps the goal line, what the agent carries, the outcome of an
            action that could not run, the success or failure line and the action list) or
            ``"both"`` (the text of ``"text"`` and the picture).
        tile_size: pixels per grid cell of :meth:`frame` (minigrid's render), before the
            padding to multiples of 28.
    """

    instructions = INSTRUCTIONS
    snapshot_safe = True
    tasks_doc = ("index i is level levels[i % L] with minigrid seed i // L (AgentGym's "
                 "indexing); num_tasks counts num_seeds seeds per level, larger indices are "
                 "further seeds")

    def __init__(
        self,
        level: str | list[str] | None = None,
        num_seeds: int = 10_000,
        reward: str = "minigrid",
        show_actions: bool = True,
        obs: str = "text",
        tile_size: int = 7,
    ):
        if level is None:
            self.levels = [level_id(x) for x in AGENTGYM_LEVELS]
        elif isinstance(level, str):
            self.levels = [level_id(level)]
        else:
            self.levels = [level_id(x) for x in level]
        if reward not in ("minigrid", "binary"):
            raise ValueError(f"reward must be 'minigrid' or 'binary', got {reward!r}")
        if obs not in _INSTRUCTIONS:
            raise ValueError(f"obs must be 'text', 'image' or 'both', got {obs!r}")
        if isinstance(tile_size, bool) or not isinstance(tile_size, int) or tile_size < 1:
            raise ValueError(f"tile_size must be a positive int, got {tile_size!r}")
        self.reward_mode = reward
        self.show_actions = show_actions
        self.obs = obs
        self.tile_size = tile_size
        self.instructions = _INSTRUCTIONS[obs]
        self.num_tasks = len(self.levels) * int(num_seeds)
        self._envs: dict[str, Any] = {}
        self.env: Any = None
        self._actions: dict[str, list[int]] = {}
        self._errors: dict[str, str] = {}
        self._bot: Any = None
        self._bot_action: int | None = None
        self._visited: set[tuple] = set()
        #: (state key, bot plan from that state, the action) that the oracle's last choice
        #: leads to: the next call starts from that plan if that action was played
        self._plan: tuple | None = None
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

            _quiet_level_generation()
            self._envs[level] = gym.make(level).unwrapped
        return self._envs[level]

    # ---------------------------------------------------------------- API
    def reset(self, task: int | str | None = None, seed: int | None = None) -> str:
        level, level_seed = self.task_of(task, seed)
        self.env = self._make(level)
        self._image = self.env.reset(seed=level_seed)[0]["image"]
        self.level, self.level_seed = level, level_seed
        self._bot, self._bot_action, self._done = None, None, False
        self._visited = {_state(self.env)}
        self._plan = None
        self.goal = self.env.mission.replace("then", "and").replace("after you", "and")
        return f"Your goal: {self.goal}\n{self._with_actions(self._observe())}"

    def frame(self) -> np.ndarray | None:
        """minigrid's RGB render of the whole grid (``get_frame(highlight=False)``, the
        agent a red triangle) at ``tile_size`` pixels a cell, padded at the bottom and right
        with minigrid's wall grey to multiples of 28 pixels: a ``(height, width, 3)`` uint8
        array; None in text mode or before the first reset."""
        if self.obs == "text" or self.env is None:
            return None
        img = self.env.get_frame(highlight=False, tile_size=self.tile_size)
        h, w = img.shape[:2]
        out = np.empty((-(-h // FRAME_ALIGN) * FRAME_ALIGN, -(-w // FRAME_ALIGN) * FRAME_ALIGN,
                        3), np.uint8)
        out[...] = _WALL_GREY
        out[:h, :w] = img
        return out

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
            info["invalid"] = act not in self._errors  # not an action of this env at all
            msg = ("No change in state." if not act else self._errors.get(
                act, "The action is not recognized. Please check valid actions."))
            return self._with_actions(msg), 0.0, False, info
        if not low:
            return self._with_actions("No change in state."), 0.0, False, info
        if self._plan is not None and act != self._plan[2]:
            self._plan = None  # not the oracle's action: its plan does not apply
        reward, terminated, truncated = self._run(low)
        self._visited.add(_state(self.env))
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
        """The text action after which minigrid's ``BabyAIBot`` has the fewest low-level
        steps left (None when it has no advice); see :func:`choose_oracle_action`."""
        if self.env is None or self._done:
            return None
        if self._bot is None:
            self._bot, self._bot_action = _new_bot(self.env)
            self._plan = None
        plan = None
        if self._plan is not None and self._plan[0] == _key(self.env):
            plan = self._plan[1]
        action, plan, key = choose_oracle_action(
            self.env, self._image, self._actions, self._errors, self._bot, self._bot_action,
            self._visited, plan)
        self._plan = (key, plan, action) if plan else None
        return action

    def close(self) -> None:
        for env in self._envs.values():
            env.close()
        self._envs.clear()
        self.env = None

    # ---------------------------------------------------------------- internals
    def _run(self, low: list[int]) -> tuple[float, bool, bool]:
        """Execute low-level actions (:func:`_execute`), telling minigrid's bot, where it
        plays (``oracle_action``), each action actually taken."""

        def tell_bot(a: int) -> None:
            if self._bot is not None:
                try:
                    self._bot_action = int(self._bot.replan(a))
                except Exception:  # the bot gives up on states it cannot parse: rebuild later
                    self._bot, self._bot_action = None, None

        total, terminated, truncated, self._image, _ = _execute(self.env, low, self._image,
                                                                tell_bot)
        return total, terminated, truncated

    def _with_actions(self, text: str) -> str:
        if not self.show_actions:
            return text
        listed = ", ".join(f'"{a}"' for a in self._actions)
        return f"{text}\nAvailable actions: [{listed}]"

    def _observe(self) -> str:
        """Describe the view and recompute the available actions, by AgentGym's rules; in
        image mode only what the agent carries (the picture shows the rest)."""
        text, self._actions, self._errors = describe(self.env, self._image)
        if self.obs == "image":
            return _carrying(self.env)
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
    text += _carrying(env)

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


def _carrying(env) -> str:
    """The closing sentence of an observation: what the agent carries."""
    carry = env.carrying
    return (f"You are carrying a {carry.color} {carry.type}." if carry is not None
            else "You are not carrying anything.")


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


# ---------------------------------------------------------------- the oracle
#: minigrid's actions that change the world (the others only move the agent)
_INTERACT = (PICKUP, DROP, TOGGLE)
#: at most this many low-level steps of the bot's plan are played ahead
_LOOKAHEAD = 400
#: macro actions whose continuation is played out, best first, before the bot's primitive
_TRIES = 6


def _execute(env, low: list[int], before, on_step=None) -> tuple[float, bool, bool, Any, int]:
    """Run low-level actions ``low`` on minigrid ``env`` as a text action does: stop early
    when one leaves the view image unchanged (``before`` is the image before the first),
    or when the episode ends. ``on_step(a)`` is called after each step that did not end
    the episode. Returns (reward, terminated, truncated, last image, steps run)."""
    total, terminated, truncated, steps, image = 0.0, False, False, 0, before
    for a in low:
        obs, r, terminated, truncated, _ = env.step(a)
        steps += 1
        total += float(r)
        if on_step is not None and not (terminated or truncated):
            on_step(a)
        image = obs["image"]
        if terminated or truncated or (image == before).all():
            break
        before = image
    return total, terminated, truncated, image, steps


def _state(env) -> tuple:
    """What the oracle compares: agent cell, heading, what it carries and every non-wall
    object of the grid (with its door state)."""
    carry = env.carrying
    world = tuple((i, o.encode()) for i, o in enumerate(env.grid.grid)
                  if o is not None and o.type != "wall")
    return ((int(env.agent_pos[0]), int(env.agent_pos[1])), int(env.agent_dir),
            carry.encode() if carry is not None else None, world)


def _front(state: tuple) -> tuple[int, int]:
    (x, y), d = state[0], state[1]
    return x + _VEC[d][0], y + _VEC[d][1]


_BOT_CLASS: Any = None
#: replanning rounds in one ``replan`` call after which the bot is taken to be stuck
_REPLAN_ROUNDS = 256


def _bot_class():
    """minigrid's ``BabyAIBot`` with a bounded ``replan``: the same method, but one whose
    subgoals keep replacing each other without an action (exploration that finds no path,
    which macro actions can lead it into) raises instead of looping for ever."""
    global _BOT_CLASS
    if _BOT_CLASS is None:
        from minigrid.utils.baby_ai_bot import BabyAIBot

        class BoundedBabyAIBot(BabyAIBot):
            def replan(self, action_taken=None):  # minigrid 3.x's, with the bound
                self._process_obs()
                self._check_erroneous_box_opening(action_taken)
                for subgoal in self.stack:
                    subgoal.update_agent_attributes()
                if self.stack:
                    self.stack[-1].replan_after_action(action_taken)
                while self.stack and self.stack[-1].is_exploratory():
                    self.stack.pop()
                suggested_action = None
                rounds = 0
                while self.stack:
                    rounds += 1
                    if rounds > _REPLAN_ROUNDS or len(self.stack) > _REPLAN_ROUNDS:
                        raise RuntimeError("BabyAIBot: replanning does not converge")
                    suggested_action = self.stack[-1].replan_before_action()
                    if suggested_action is not None:
                        break
                if not self.stack:
                    suggested_action = self.mission.unwrapped.actions.done
                self._remember_current_state()
                return suggested_action

        _BOT_CLASS = BoundedBabyAIBot
    return _BOT_CLASS


def _new_bot(env) -> tuple[Any, int | None]:
    """A ``BabyAIBot`` for ``env``'s current state and its first action; (None, None) if it
    cannot plan, or while the key of a locked door lies hidden in a box (``KeyInBox``: the
    bot does not look into boxes; :func:`_open_box_plan` opens it first). Where the agent
    already carries the object a PutNext mission moves (the ``*Carrying`` levels), the
    bot's "go to it and pick it up" subgoals are dropped."""
    from minigrid.envs.babyai.core.verifier import PutNextInstr
    from minigrid.utils.baby_ai_bot import GoNextToSubgoal, PickupSubgoal

    if _hidden_key_boxes(env):
        return None, None
    try:
        bot = _bot_class()(env)
        instrs, carry = env.instrs, env.carrying
        if (isinstance(instrs, PutNextInstr) and carry is not None
                and any(o is carry for o in instrs.desc_move.obj_set)
                and len(bot.stack) >= 2 and isinstance(bot.stack[-1], GoNextToSubgoal)
                and isinstance(bot.stack[-2], PickupSubgoal)):
            del bot.stack[-2:]
        return bot, int(bot.replan())
    except Exception:
        return None, None


def _hidden_key_boxes(env) -> set[tuple[int, int]]:
    """Cells of the boxes that hold the only key of a locked door's color."""
    grid = env.grid
    locked, keys, boxes = set(), set(), {}
    if env.carrying is not None and env.carrying.type == "key":
        keys.add(env.carrying.color)
    for i, o in enumerate(grid.grid):
        if o is None:
            continue
        if o.type == "door" and o.is_locked:
            locked.add(o.color)
        elif o.type == "key":
            keys.add(o.color)
        elif o.type == "box" and o.contains is not None and o.contains.type == "key":
            boxes[(i % grid.width, i // grid.width)] = o.contains.color
    return {cell for cell, color in boxes.items() if color in locked and color not in keys}


def _open_box_plan(env) -> list[int]:
    """Low-level actions to face the nearest reachable box of :func:`_hidden_key_boxes`
    and open it (it turns into the key); [] if there is none."""
    targets = _hidden_key_boxes(env)
    if not targets:
        return []
    grid = env.grid
    start = ((int(env.agent_pos[0]), int(env.agent_pos[1])), int(env.agent_dir))
    parent: dict[tuple, tuple | None] = {start: None}
    queue = deque([start])
    while queue:
        state = queue.popleft()
        (x, y), d = state
        front = (x + _VEC[d][0], y + _VEC[d][1])
        if front in targets:
            out = [TOGGLE]
            while parent[state] is not None:
                state, a = parent[state]
                out.append(a)
            return out[::-1]
        ahead = grid.get(*front)
        nxt = [(LEFT, ((x, y), (d - 1) % 4)), (RIGHT, ((x, y), (d + 1) % 4))]
        if ahead is None or (ahead.type == "door" and ahead.is_open):
            nxt.insert(0, (FORWARD, (front, d)))
        for a, s in nxt:
            if s not in parent:
                parent[s] = (state, a)
                queue.append(s)
    return []


def bot_plan(env, bot, action: int | None, limit: int = _LOOKAHEAD, *,
             in_place: bool = False) -> list[tuple[int, tuple, bool]]:
    """The bot's next low-level actions from ``env``'s state, played on a copy (on ``env``
    and ``bot`` themselves with ``in_place``): a list of (action, state after it, whether
    it ended the episode with success), ending where the episode ends, the bot has no
    advice, or after ``limit`` steps. ``action`` is the bot's advice for the current state
    (its last ``replan``; ``bot`` None: a new one is made). Where there is no bot because a
    box hides the key of a locked door, the plan opens that box and a new bot takes over."""
    if not in_place:
        env, bot = copy.deepcopy((env, bot))
    if bot is None:
        bot, action = _new_bot(env)
    plan: list[tuple[int, tuple, bool]] = []
    pending: list[int] = []
    while len(plan) < limit:
        if pending:
            action = pending.pop(0)
        elif bot is None or action is None or action == DONE:
            pending = _open_box_plan(env)
            if not pending:
                break
            bot = None
            continue
        _, r, terminated, truncated, _ = env.step(action)
        plan.append((action, _state(env), bool(terminated and r > 0)))
        if terminated or truncated:
            break
        if pending:
            continue
        if bot is None:
            bot, action = _new_bot(env)
            continue
        try:
            action = int(bot.replan(action))
        except Exception:
            bot, action = None, None
    return plan


def choose_oracle_action(env, image, actions: dict[str, list[int]], errors: dict[str, str],
                         bot, bot_action: int | None, visited: set | frozenset = frozenset(),
                         plan: list | None = None) -> tuple[str | None, list | None, tuple]:
    """The text action (one of ``actions``, or an unlisted primitive) after which minigrid's
    bot has the fewest low-level steps left to solve the task, as played out.

    ``plan`` (:func:`bot_plan`, played here unless given) is the bot's way from here: ``n``
    steps, so its own next primitive leaves ``n - 1``. Every other candidate is played on a
    copy of ``env`` exactly as ``step`` would play it. One that ends the episode with
    success is taken at once (the fewest low-level steps first); one that fails it or runs
    out of steps is never taken; one that ends in a state of ``visited`` (the states the
    episode's turns ended in) neither, so that shortcuts never loop. The others are ranked
    by the plan step ``k`` they reach (``n - k`` steps left): the same cell, heading, load
    and objects; or, next to one of the plan's pickups, drops and toggles, the same load and
    objects facing the same cell; or the same cell, load and objects with ``t`` turns to
    face the plan's heading (``n - k + t``). The best ``_TRIES`` of those that beat the
    primitive are played again with the bot told each low-level action (as ``step`` tells
    it), and the bot's own continuation is played out from there: the one whose
    continuation solves the task in the fewest steps is taken if that is fewer than the
    primitive leaves (a macro that picks up, drops or toggles before the bot would, or
    leads it astray, is not); else the primitive.

    Returns (text action or None, the plan from the state it leads to, that state's key):
    the caller hands the plan back on the next call when the env is in that state.
    """
    if plan is None:
        plan = bot_plan(env, bot, bot_action, _limit(env))
    if not plan:
        return None, None, ()
    n = len(plan)
    solved = plan[-1][2]
    states = [_state(env)] + [s for _, s, _ in plan]
    acts = [a for a, _, _ in plan]
    first = _ORACLE_TEXT.get(acts[0])
    candidates = [t for t in actions if t != CHECK and actions[t]]
    if first is not None and first not in candidates and (
            first in actions or (first in _PRIMITIVES and first not in errors)):
        candidates.append(first)

    def reached(end: tuple) -> int | None:
        """Bot steps left at the furthest plan step ``end`` stands for (None: none)."""
        best = None
        for k in range(n, 0, -1):
            sk = states[k]
            if sk[2:] != end[2:]:
                continue
            if sk[:2] == end[:2]:
                return n - k if best is None else min(best, n - k)
            near = acts[k - 1] in _INTERACT or (k < n and acts[k] in _INTERACT)
            if near and _front(sk) == _front(end):
                left = n - k
            else:  # a lower bound of the moves from ``end`` to step k
                turns = 2 if (sk[1] - end[1]) % 4 == 2 else int(sk[1] != end[1])
                left = n - k + abs(sk[0][0] - end[0][0]) + abs(sk[0][1] - end[0][1]) + turns
            best = left if best is None else min(best, left)
        return best

    ranked = []
    for i, text in enumerate(candidates):
        if text == first:
            continue
        low = actions.get(text) or _PRIMITIVES[text]
        sim = copy.deepcopy(env)
        reward, terminated, truncated, _, steps = _execute(sim, low, image)
        if terminated:
            if reward > 0:
                ranked.append((-1, steps, i, text, low))
            continue
        end = _state(sim)
        if truncated or end in visited or end == states[0]:
            continue
        left = reached(end)
        if left is not None and left < n - 1:
            ranked.append((left, steps, i, text, low))
    ranked.sort()
    chosen = None  # (steps left, text, plan, key)
    for left, _, _, text, low in ranked[:_TRIES]:
        if left < 0:
            return text, None, ()
        sim, sim_bot = copy.deepcopy((env, bot))
        advice: list[int | None] = [None]

        def tell(a: int, sim_bot=sim_bot, advice=advice) -> None:
            if sim_bot is not None:
                advice[0] = int(sim_bot.replan(a))

        try:
            _execute(sim, low, image, tell)
        except Exception:
            continue
        key = _key(sim)
        rest = bot_plan(sim, sim_bot, advice[0], _limit(sim), in_place=True)
        if rest and rest[-1][2] and (not solved or len(rest) < n - 1) and (
                chosen is None or len(rest) < chosen[0]):
            chosen = (len(rest), text, rest, key)
    if chosen is not None:
        return chosen[1:]
    if first is None:
        return None, None, ()
    return first, plan[1:], (states[1], int(env.step_count) + 1)


def _key(env) -> tuple:
    """An env state and its step count: where a plan handed back applies."""
    return _state(env), int(env.step_count)


def _limit(env) -> int:
    """How far :func:`bot_plan` looks: the steps left in the episode, at most _LOOKAHEAD."""
    return max(1, min(_LOOKAHEAD, int(env.max_steps) - int(env.step_count)))
