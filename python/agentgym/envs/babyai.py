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
# view-grid direction vectors: 0 = the agent's facing (up in the egocentric grid), clockwise
_DIRS = ((0, -1), (1, 0), (0, 1), (-1, 0))

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
            self.env.reset(seed=level_seed)
        self.level, self.level_seed = level, level_seed
        self._bot, self._bot_action, self._done = None, None, False
        return f"Your goal: {self.env.mission}\n{self._with_actions(self._observe())}"

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        if self.env is None or self._done:
            raise EnvError("babyai: call reset() before step() (episode not running)")
        act = " ".join(str(action).lower().split()).strip(" .\"'")
        info: dict[str, Any] = {"action_is_valid": True, "success": False}
        if act.startswith("check"):
            text = "You can take the following actions: " + ", ".join(self._actions)
            return self._with_actions(text), 0.0, False, info
        if act == "pickup":
            act = "pick up"
        if act in self._actions:
            low = self._actions[act]
        else:
            info["action_is_valid"] = False
            msg = self._errors.get(act, "The action is not recognized. Please check valid actions.")
            return self._with_actions(msg), 0.0, False, info
        reward, terminated, truncated = self._run(low)
        text = self._observe()
        success = terminated and reward > 0
        if terminated:
            text += "\nThe task is completed." if success else "\nThe task has failed."
        self._done = terminated or truncated
        if not self._done:
            text = self._with_actions(text)
        info.update(success=success, low_level_steps=int(self.env.step_count))
        if truncated and not terminated:
            info["truncated"] = True
        if success and self.reward_mode == "binary":
            reward = 1.0
        return text, float(reward), terminated or truncated, info

    def valid_actions(self) -> list[str]:
        return list(self._actions) if not self._done else []

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
        """Execute low-level actions; stop early when one changes nothing (as AgentGym)."""
        env = self.env
        total, terminated, truncated = 0.0, False, False
        for a in low:
            before = _state_key(env)
            _, r, terminated, truncated, _ = env.step(a)
            total += float(r)
            if self._bot is not None and not (terminated or truncated):
                try:
                    self._bot_action = int(self._bot.replan(a))
                except Exception:  # the bot gives up on states it cannot parse: rebuild later
                    self._bot, self._bot_action = None, None
            if terminated or truncated:
                break
            after = _state_key(env)
            if after == before:
                break
        return total, terminated, truncated

    def _with_actions(self, text: str) -> str:
        if not self.show_actions:
            return text
        listed = ", ".join(f'"{a}"' for a in [*self._actions, CHECK])
        return f"{text}\nAvailable actions: [{listed}]"

    def _observe(self) -> str:
        """Describe the view (AgentGym's wording) and recompute the available actions."""
        env = self.env
        grid, vis = env.gen_obs_grid()
        view = env.agent_view_size
        me = (view // 2, view - 1)
        objs: list[tuple[int, str, tuple[int, int]]] = []  # (distance, name, cell)
        for j in range(view):  # far rows first, then left to right (AgentGym's scan order)
            for i in range(view):
                if (i, j) == me or not vis[i, j]:
                    continue
                cell = grid.get(i, j)
                if cell is None or cell.type not in ("door", "key", "ball", "box", "goal", "lava"):
                    continue
                if cell.type == "door":
                    state = "locked" if cell.is_locked else ("open" if cell.is_open else "closed")
                    name = f"{cell.color} {state} door"
                else:
                    name = (
                        cell.type if cell.type in ("goal", "lava") else f"{cell.color} {cell.type}"
                    )
                objs.append((abs(i - me[0]) + abs(j - me[1]), name, (i, j)))
        objs.sort(key=lambda o: o[0])
        numbered: list[tuple[str, tuple[int, int]]] = []
        counts: dict[str, int] = {}
        parts = []
        for _, name, (i, j) in objs:
            counts[name] = counts.get(name, 0) + 1
            label = f"{name} {counts[name]}"
            numbered.append((label, (i, j)))
            front, right = me[1] - j, i - me[0]
            if right == 0:
                where = f"right in front of you {front} steps away."
            else:
                side = "right" if right > 0 else "left"
                where = f"{front} steps in front of you and {abs(right)} steps to your {side}."
            parts.append(f"There is a {label} {where}")
        if parts:
            text = "In front of you in this room, you can see several objects: " + " ".join(parts)
        else:
            text = "You cannot see any objects within sight."
        text += " The room has walls around you."
        for k in range(1, me[1] + 1):  # straight ahead
            cell = grid.get(me[0], me[1] - k) if vis[me[0], me[1] - k] else None
            if cell is not None and cell.type in ("wall", "box"):
                text += f" You are facing a {cell.type} {k} steps away."
                break
        carry = env.carrying
        text += (
            f" You are carrying a {carry.color} {carry.type}."
            if carry is not None
            else " You are not carrying anything."
        )
        self._compute_actions(grid, vis, me, numbered)
        return text

    def _compute_actions(self, grid, vis, me, numbered) -> None:
        actions: dict[str, list[int]] = {"turn left": [LEFT], "turn right": [RIGHT]}
        errors: dict[str, str] = {}
        front_cell = grid.get(me[0], me[1] - 1)
        if front_cell is None or (front_cell.can_overlap() and front_cell.type != "lava"):
            actions["move forward"] = [FORWARD]
        else:
            errors["move forward"] = "There is a barrier in front of you, you can't move forward."
        carry = self.env.carrying
        if carry is None and front_cell is not None and front_cell.can_pickup():
            actions["pick up"] = [PICKUP]
        else:
            errors["pick up"] = (
                "You cannot pick up, as you are already carrying something."
                if carry is not None
                else "There is nothing to pick up right in front of you."
            )
        if carry is not None:
            if front_cell is None:
                actions["drop"] = [DROP]
            else:
                errors["drop"] = (
                    "You cannot drop the object, as there is already an object in front of you."
                )
        else:
            errors["drop"] = "You cannot drop the object, as you are not carrying anything."
        if front_cell is not None and front_cell.type in ("door", "box"):
            actions["toggle"] = [TOGGLE]
        else:
            errors["toggle"] = "There is no door or box right in front of you to toggle."
        paths = _Paths(grid, vis, me)
        for label, cell in numbered:
            name = label.rsplit(" ", 1)[0]
            kind = name.split()[-1]
            if kind == "goal":
                path = paths.arrive(cell)
                if path is not None:
                    actions["go to goal"] = path
                continue
            if kind == "lava":
                continue
            path = paths.face(cell)
            if path is None:
                errors[f"go to {label}"] = (
                    f"You cannot go to {label}, as there is no path leading to it."
                )
                continue
            actions[f"go to {label}"] = path
            if kind in ("key", "ball", "box") and carry is None:
                actions[f"pickup {label}"] = path + [PICKUP]
            if kind == "door":
                if " open " in f" {name} ":
                    through = paths.arrive(cell)
                    if through is not None:
                        actions[f"go through {label}"] = through
                elif "closed" in name or (
                    carry is not None and carry.type == "key" and name.startswith(carry.color)
                ):
                    actions[f"toggle and go through {label}"] = path + [TOGGLE, FORWARD]
                else:
                    errors[f"toggle and go through {label}"] = (
                        f"You cannot toggle and go through {label}, as you are not carrying "
                        "a key of its color."
                    )
        self._actions, self._errors = actions, errors


def _state_key(env) -> tuple:
    """What a low-level action can change: pose, carried object, the cell in front."""
    front = env.grid.get(*env.front_pos)
    return (
        int(env.agent_pos[0]),
        int(env.agent_pos[1]),
        env.agent_dir,
        id(env.carrying),
        id(front),
        getattr(front, "is_open", None),
        getattr(front, "is_locked", None),
    )


class _Paths:
    """Shortest low-level action paths from the agent, by one BFS over (cell, heading)
    through the visible free cells: ``face(cell)`` ends facing ``cell``, ``arrive(cell)``
    ends standing on it (None when unreachable)."""

    def __init__(self, grid, vis, start: tuple[int, int]):
        width, height = grid.width, grid.height

        def free(x: int, y: int) -> bool:
            if not (0 <= x < width and 0 <= y < height) or not vis[x, y]:
                return False
            cell = grid.get(x, y)
            return cell is None or (cell.can_overlap() and cell.type != "lava")

        s0 = (start[0], start[1], 0)
        self._prev: dict[tuple[int, int, int], tuple[tuple[int, int, int], int] | None] = {s0: None}
        self._face: dict[tuple[int, int], tuple[int, int, int]] = {}
        self._arrive: dict[tuple[int, int], tuple[int, int, int]] = {}
        queue = deque([s0])
        while queue:  # first visit = shortest, ties broken by forward, left, right
            x, y, d = state = queue.popleft()
            dx, dy = _DIRS[d]
            self._face.setdefault((x + dx, y + dy), state)
            self._arrive.setdefault((x, y), state)
            for a, nxt in (
                (FORWARD, (x + dx, y + dy, d)),
                (LEFT, (x, y, (d - 1) % 4)),
                (RIGHT, (x, y, (d + 1) % 4)),
            ):
                if nxt in self._prev or (a == FORWARD and not free(nxt[0], nxt[1])):
                    continue
                self._prev[nxt] = (state, a)
                queue.append(nxt)

    def _trace(self, state: tuple[int, int, int] | None) -> list[int] | None:
        if state is None:
            return None
        path = []
        while (step := self._prev[state]) is not None:
            state, a = step
            path.append(a)
        return path[::-1]

    def face(self, cell: tuple[int, int]) -> list[int] | None:
        return self._trace(self._face.get(cell))

    def arrive(self, cell: tuple[int, int]) -> list[int] | None:
        return self._trace(self._arrive.get(cell))
