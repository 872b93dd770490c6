"""ScienceWorld (the real simulator, ``scienceworld`` on PyPI) as a text environment.

Each :class:`SciWorldEnv` owns one JVM (the Scala simulator behind py4j), started lazily on
the first ``reset`` and reused across resets; ``close()`` shuts it down (the JVM also exits
when its parent process dies, so a killed worker leaves no orphan). Task index -> (task
family, variation) over a split; observations are the simulator's text (the task
description is prepended at reset); actions are its text commands. See
envs/sciworld/README.md.
"""

from __future__ import annotations

import bisect
import shutil
import subprocess
import tempfile
import time
import weakref
from typing import Any

from agentgym.envs.base import BaseEnv, action_line
from agentgym.envs.tasks import parse_task
from agentgym.errors import EnvError, InvalidTaskError

#: (task id, task name, variations, train variations, dev variations) as ScienceWorld 1.2
#: defines them; each split is a contiguous range: train [0, n_train), dev next, test rest.
TASKS: tuple[tuple[str, str, int, int, int], ...] = (
    ("1-1", "boil", 30, 14, 7),
    ("1-2", "melt", 30, 14, 7),
    ("1-3", "freeze", 30, 14, 7),
    ("1-4", "change-the-state-of-matter-of", 30, 14, 7),
    ("2-1", "use-thermometer", 540, 270, 135),
    ("2-2", "measure-melting-point-known-substance", 436, 218, 109),
    ("2-3", "measure-melting-point-unknown-substance", 300, 150, 75),
    ("3-1", "power-component", 20, 10, 5),
    ("3-2", "power-component-renewable-vs-nonrenewable-energy", 20, 10, 5),
    ("3-3", "test-conductivity", 900, 450, 225),
    ("3-4", "test-conductivity-of-unknown-substances", 600, 300, 150),
    ("4-1", "find-living-thing", 300, 150, 75),
    ("4-2", "find-non-living-thing", 300, 150, 75),
    ("4-3", "find-plant", 300, 150, 75),
    ("4-4", "find-animal", 300, 150, 75),
    ("5-1", "grow-plant", 126, 62, 31),
    ("5-2", "grow-fruit", 126, 62, 31),
    ("6-1", "chemistry-mix", 32, 16, 8),
    ("6-2", "chemistry-mix-paint-secondary-color", 36, 18, 9),
    ("6-3", "chemistry-mix-paint-tertiary-color", 36, 18, 9),
    ("7-1", "lifespan-longest-lived", 125, 62, 31),
    ("7-2", "lifespan-shortest-lived", 125, 62, 31),
    ("7-3", "lifespan-longest-lived-then-shortest-lived", 125, 62, 31),
    ("8-1", "identify-life-stages-1", 14, 6, 3),
    ("8-2", "identify-life-stages-2", 10, 4, 2),
    ("9-1", "inclined-plane-determine-angle", 168, 84, 42),
    ("9-2", "inclined-plane-friction-named-surfaces", 1386, 692, 346),
    ("9-3", "inclined-plane-friction-unnamed-surfaces", 162, 80, 40),
    ("10-1", "mendelian-genetics-known-plant", 120, 60, 30),
    ("10-2", "mendelian-genetics-unknown-plant", 480, 240, 120),
)
#: Task families AgentGym's agentenv-sciworld leaves out (long-horizon ones).
AGENTGYM_EXCLUDED = frozenset({"5-1", "5-2", "9-1", "9-2", "9-3", "10-1", "10-2"})
SPLITS = ("train", "dev", "test", "all")
# Order in which action templates fill the bounded valid-action list (electrical last);
# each template takes at most a fifth of the bound, so "move X to Y" cannot crowd out the rest.
_TEMPLATE_ORDER = (
    "look around", "inventory", "task", "wait1", "wait", "go", "open", "close", "pick",
    "put", "activate", "deactivate", "focus", "look", "read", "use", "mix", "eat", "flush",
    "move", "pour", "dunk", "connect", "disconnect", "reset",
)  # fmt: skip

INSTRUCTIONS = """You are an agent in ScienceWorld, a text-based simulated world of rooms,
objects, substances, plants, animals and electrical parts. Complete the science task you are
given. Commands look like "look around", "inventory",
"go to kitchen", "open door to kitchen", "pick up thermometer", "move metal pot to stove",
"activate stove", "use thermometer on substance in metal pot", "focus on <object>",
"connect battery anode to red wire", "wait1", "task". Focusing on the wrong object ends the
task. The reward is the simulator's score progress (the whole episode sums to score/100).""" \
    + action_line("look around")

#: ScienceWorld's answer to a command its parser does not read (the step changes nothing).
UNKNOWN_ACTION = "No known action matches that input."


def _variations(split: str, n: int, n_train: int, n_dev: int) -> range:
    return {
        "train": range(0, n_train),
        "dev": range(n_train, n_train + n_dev),
        "test": range(n_train + n_dev, n),
        "all": range(0, n),
    }[split]


class SciWorldEnv(BaseEnv):
    """ScienceWorld: task index -> (task family, variation) over a split.

    Args:
        split: ``"train" | "dev" | "test" | "all"`` (ScienceWorld's variation splits).
        tasks: None for all 30 families, ``"agentgym"`` for AgentGym's 23 (with
            ``split="all"`` the task index equals AgentGym's ``data_idx``), or a list of task
            ids / names (``["1-1", "find-plant"]``).
        simplifications: ScienceWorld's simplification string (``"easy"``,
            ``"openDoors,teleportAction"``, ...).
        step_limit: the simulator's move limit; reaching it ends the episode (truncated).
        max_valid_actions: bound on ``valid_actions()`` (ordered by template usefulness).
        gold_path: generate the gold action sequence at every reset (otherwise lazily, on
            the first ``oracle_action()`` of an episode).
        sort_listings: sort each run of tab-indented lines ("In it, you see:" lists). The
            simulator lists objects in an order that varies between loads of the same
            variation (hash order); sorting makes equal states read the same.
    """

    instructions = INSTRUCTIONS
    splits = ("all", "train", "dev", "test")
    held_out_split = "test"

    def __init__(
        self,
        split: str = "all",
        tasks: str | list[str] | None = None,
        simplifications: str = "",
        step_limit: int = 100,
        max_valid_actions: int = 200,
        gold_path: bool = False,
        sort_listings: bool = True,
    ):
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        self.split = split
        self.families = _select(tasks)
        self.simplifications = simplifications
        self.step_limit = int(step_limit)
        self.max_valid_actions = int(max_valid_actions)
        self.gold_path = gold_path
        self.sort_listings = sort_listings
        self._ranges = [_variations(split, n, tr, dv) for _, _, n, tr, dv in self.families]
        self._offsets: list[int] = []
        total = 0
        for r in self._ranges:
            self._offsets.append(total)
            total += len(r)
        self.num_tasks = total
        self._sw: Any = None
        self.jvm_start_s: float | None = None
        self._live = False
        self._history: list[str] = []
        self._gold: list[str] | None = None

    # ---------------------------------------------------------------- tasks
    def task_of(self, task: int | str | None, seed: int | None = None) -> tuple[str, int]:
        """(task name, variation) for a task index or "name-or-id:variation" text."""
        task = parse_task(task, seed, self.num_tasks, "ScienceWorld", "task:variation")
        if isinstance(task, tuple):
            name, var = task
            (tid, tname, n, _, _) = _select([name])[0]
            if var >= n:
                raise InvalidTaskError(f"{tname} has {n} variations, got {var}")
            return tname, var
        if isinstance(task, bool) or not isinstance(task, int) or not 0 <= task < self.num_tasks:
            raise InvalidTaskError(
                f"ScienceWorld task index must be in [0, {self.num_tasks}), got {task!r}"
            )
        k = bisect.bisect_right(self._offsets, task) - 1
        return self.families[k][1], self._ranges[k][task - self._offsets[k]]

    # ---------------------------------------------------------------- API
    @property
    def simulator(self):
        """The ``scienceworld.ScienceWorldEnv`` (starts the JVM on first use)."""
        if self._sw is None:
            from scienceworld import ScienceWorldEnv

            t0 = time.perf_counter()
            sw = ScienceWorldEnv("", envStepLimit=self.step_limit)
            self.jvm_start_s = time.perf_counter() - t0
            # its TemporaryDirectory warns (ResourceWarning) when left to the GC at exit:
            # swap in a plain directory that close() (or a quiet finalizer) removes
            sw._obj_tree_tempdir.cleanup()
            sw._obj_tree_tempdir = _TempDir()
            self._sw = sw
        return self._sw

    def reset(self, task: int | str | None = None, seed: int | None = None) -> str:
        name, variation = self.task_of(task, seed)
        self._load(name, variation, self.gold_path)
        self.task_name, self.variation = name, variation
        self._history = []
        self._score = 0
        obs = self._text(self.simulator.server.step("look around"))
        self._live = True
        desc = str(self.simulator.server.getTaskDescription())
        return f"{desc}\n\n{obs}"

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        if not self._live:
            raise EnvError("sciworld: call reset() before step() (episode not running)")
        action = " ".join(str(action).split())
        server = self.simulator.server
        obs = self._text(server.step(action))
        self._history.append(action)
        raw = int(round(100 * float(server.getScore())))
        completed = bool(server.getCompleted())
        moves = int(server.getNumMoves())
        score = max(raw, 0)
        reward = (score - self._score) / 100.0
        self._score = score
        failed = raw < 0
        truncated = moves > self.step_limit and not (completed or failed)
        done = completed or failed or truncated
        info: dict[str, Any] = {
            "score": raw,
            "moves": moves,
            "success": raw >= 100,
            "task_name": self.task_name,
            "variation": self.variation,
        }
        if truncated:
            info["truncated"] = True
        if obs.startswith(UNKNOWN_ACTION):
            info["invalid"] = True
        self._live = not done
        return obs, float(reward), done, info

    def valid_actions(self) -> list[str]:
        """Valid action-object combinations of this state, most useful templates first."""
        if not self._live:
            return []
        combos = set(map(str, self.simulator.server.getValidActionObjectCombinations()))
        rank = {t: i for i, t in enumerate(_TEMPLATE_ORDER)}

        def template(a: str) -> str:
            return a if a in rank else a.split(" ", 1)[0]

        cap = max(8, self.max_valid_actions // 5)
        taken: dict[str, int] = {}
        out = []
        for a in sorted(combos, key=lambda a: (rank.get(template(a), len(rank)), a)):
            t = template(a)
            if taken.get(t, 0) < cap:
                taken[t] = taken.get(t, 0) + 1
                out.append(a)
        return out[: self.max_valid_actions]

    def action_hint(self) -> dict[str, list[str]]:
        """The simulator's action templates and the objects of this state (AgentGym's
        ``action_hint`` route)."""
        sim = self.simulator
        return {"possible_actions": list(sim.get_possible_actions()),
                "possible_objects": list(sim.get_possible_objects())}

    def goal_progress(self) -> str:
        """The simulator's report of the task's subgoals done so far."""
        return str(self.simulator.get_goal_progress())

    def oracle_action(self) -> str | None:
        """The next action of ScienceWorld's gold sequence, while the episode follows it."""
        if not self._live:
            return None
        if self._gold is None:
            self._load(self.task_name, self.variation, True)
            server = self.simulator.server
            server.step("look around")
            for a in self._history:  # the simulator is deterministic per variation
                server.step(a)
        k = len(self._history)
        gold = self._gold or []
        if k < len(gold) and self._history == gold[:k]:
            return gold[k]
        return None

    def close(self) -> None:
        sw, self._sw = self._sw, None
        self._live = False
        if sw is not None:
            sw.close()
            sw._obj_tree_tempdir.cleanup()
            proc = sw._gateway.java_process
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    # ---------------------------------------------------------------- internals
    def _text(self, raw: Any) -> str:
        text = str(raw)
        if not self.sort_listings or "\n\t" not in text:
            return text
        out: list[str] = []
        run: list[str] = []
        for line in text.split("\n"):
            if line.startswith("\t"):
                run.append(line)
                continue
            out.extend(sorted(run))
            run = []
            out.append(line)
        out.extend(sorted(run))
        return "\n".join(out)

    def _load(self, name: str, variation: int, gold: bool) -> None:
        sw = self.simulator
        try:
            sw.load(name, variation, self.simplifications, generateGoldPath=gold)
        except ValueError as e:
            raise InvalidTaskError(str(e)) from None
        self._gold = [str(a) for a in sw.get_gold_action_sequence()] if gold else None


class _TempDir:
    """A temporary directory removed by ``cleanup()`` or, silently, at garbage collection."""

    def __init__(self) -> None:
        self.name = tempfile.mkdtemp(prefix="agentgym-sciworld-")
        self._finalizer = weakref.finalize(self, shutil.rmtree, self.name, ignore_errors=True)

    def cleanup(self) -> None:
        self._finalizer()


def _select(tasks: str | list[str] | None) -> list[tuple[str, str, int, int, int]]:
    if tasks is None or tasks == "all":
        return list(TASKS)
    if tasks == "agentgym":
        return [t for t in TASKS if t[0] not in AGENTGYM_EXCLUDED]
    if isinstance(tasks, str):
        tasks = [tasks]
    by_key = {t[0]: t for t in TASKS} | {t[1]: t for t in TASKS}
    out = []
    for name in tasks:
        key = name.removeprefix("task-").replace("mendellian", "mendelian")
        if key not in by_key:
            raise InvalidTaskError(
                f"unknown ScienceWorld task {name!r}; known: {', '.join(t[1] for t in TASKS)}"
            )
        out.append(by_key[key])
    return out
