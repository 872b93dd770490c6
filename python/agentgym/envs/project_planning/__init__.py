"""``project_planning``: schedule a small project's tasks under dependencies and earliest
start dates, finishing as early as possible.

A project is 5-9 tasks from :data:`PLAN_STEPS` (in a topological order), generated from the
task index: durations of 1-5 calendar days, 0-2 dependencies on earlier tasks, and for about
one task in five an earliest start date. The agent schedules start dates and submits; the
reward is half the fraction of tasks scheduled without breaking a constraint, plus, once
every task is valid, half the ratio of the shortest possible span to the plan's span.
"""

from __future__ import annotations

import calendar
import datetime as dt
import random
from dataclasses import dataclass
from typing import Any

from agentgym.envs.base import action_line
from agentgym.envs.commands import CommandEnv

PLAN_STEPS = [
    "gather requirements", "write the design doc", "review the design", "build the prototype",
    "set up CI", "implement the backend", "implement the frontend", "write the tests",
    "run the security review", "prepare the launch email", "train the support team",
    "migrate the data", "run the load test", "fix the release blockers", "ship the release",
]
PLAN_INSTRUCTIONS = """You are planning a project. Each task has a duration in calendar days \
and may depend on other tasks or have an earliest start date. A task that starts on day D and \
takes N days occupies days D .. D+N-1; a task that depends on it may start on day D+N at the \
earliest. Nobody works on a task before the project start. Actions:
  schedule[TASK_ID | YYYY-MM-DD]   set (or change) a task's start date
  list                             show the plan so far and its finish date
  submit                           finish and be scored
Score: 0.5 * fraction of tasks scheduled without breaking a constraint + 0.5 * (shortest \
possible finish / your finish) when every task is scheduled validly.""" + action_line("list")


@dataclass
class PlanTask:
    tid: str
    name: str
    days: int
    deps: list[str]
    not_before: dt.date | None


@dataclass
class Project:
    start: dt.date
    tasks: list[PlanTask]
    earliest: dict[str, dt.date]  # the ASAP schedule
    finish: dt.date  # last day of the ASAP schedule

    def describe(self) -> str:
        weekday = calendar.day_name[self.start.weekday()]
        lines = [f"Project start: {weekday} {self.start}. Tasks:"]
        for t in self.tasks:
            extra = [f"after {', '.join(t.deps)}"] if t.deps else []
            if t.not_before:
                extra.append(f"not before {t.not_before}")
            lines.append(f"  {t.tid}: {t.name}, {t.days} day{'s' * (t.days > 1)}"
                         + (f" ({'; '.join(extra)})" if extra else ""))
        return "\n".join(lines)


def _earliest(tasks: list[PlanTask], start: dt.date) -> dict[str, dt.date]:
    out: dict[str, dt.date] = {}
    by_id = {t.tid: t for t in tasks}
    for t in tasks:  # tasks are listed in a topological order
        d = max([start] + [out[p] + dt.timedelta(days=by_id[p].days) for p in t.deps])
        out[t.tid] = max(d, t.not_before) if t.not_before else d
    return out


def generate_project(index: int) -> Project:
    """The project of task ``index`` (over all splits) and its ASAP schedule."""
    rng = random.Random(f"project_planning:{index}")
    start = dt.date(2024, 1, 1) + dt.timedelta(days=rng.randint(0, 700))
    start -= dt.timedelta(days=start.weekday())
    names = sorted(rng.sample(PLAN_STEPS, rng.randint(5, 9)), key=PLAN_STEPS.index)
    tasks: list[PlanTask] = []
    for k, name in enumerate(names):
        earlier = [t.tid for t in tasks]
        deps = sorted(rng.sample(earlier, min(len(earlier), rng.choice([0, 1, 1, 2]))))
        nb = start + dt.timedelta(days=rng.randint(2, 12)) if rng.random() < 0.2 else None
        tasks.append(PlanTask(f"T{k + 1}", name, rng.randint(1, 5), deps, nb))
    earliest = _earliest(tasks, start)
    finish = max(earliest[t.tid] + dt.timedelta(days=t.days - 1) for t in tasks)
    return Project(start, tasks, earliest, finish)


class ProjectPlanningEnv(CommandEnv):
    """Schedule a project's tasks under dependencies and earliest dates; finish early."""

    instructions = PLAN_INSTRUCTIONS
    snapshot_safe = True
    env_name = "project_planning"

    def __init__(self, split: str = "train"):
        super().__init__(split)
        self.project: Project | None = None
        self.plan: dict[str, dt.date] = {}

    def reset(self, task: int | str | None = None, seed: int | None = None) -> str:
        index = self._tasks.resolve(task, seed)
        self.project = generate_project(index)
        self.plan = {}
        self.done = False
        return self.project.describe()

    def _valid(self, t: PlanTask) -> bool:
        s = self.plan.get(t.tid)
        if s is None or s < self.project.start or (t.not_before and s < t.not_before):
            return False
        by_id = {x.tid: x for x in self.project.tasks}
        return all(p in self.plan and self.plan[p] + dt.timedelta(days=by_id[p].days) <= s
                   for p in t.deps)

    def evaluate(self) -> dict[str, Any]:
        """Validity per task, the plan's finish date and the reward it would get."""
        tasks = self.project.tasks
        valid = [t.tid for t in tasks if self._valid(t)]
        frac = len(valid) / len(tasks)
        finish = None
        reward = 0.5 * frac
        if len(valid) == len(tasks):
            finish = max(self.plan[t.tid] + dt.timedelta(days=t.days - 1) for t in tasks)
            span_best = (self.project.finish - self.project.start).days + 1
            span = (finish - self.project.start).days + 1
            reward += 0.5 * span_best / span
        return {"valid": valid, "finish": finish, "reward": reward,
                "optimal_finish": self.project.finish, "solved": reward >= 0.999}

    def command(self, name: str, arg: str) -> tuple[str, float, bool, dict[str, Any]]:
        if name == "schedule":
            parts = [x.strip() for x in arg.split("|")]
            ids = {t.tid.lower(): t.tid for t in self.project.tasks}
            if len(parts) != 2 or parts[0].lower() not in ids:
                return "Usage: schedule[TASK_ID | YYYY-MM-DD] with a listed task id.", 0.0, \
                    False, {"invalid": True}
            try:
                self.plan[ids[parts[0].lower()]] = dt.date.fromisoformat(parts[1])
            except ValueError:
                return f"Bad date {parts[1]!r}; use YYYY-MM-DD.", 0.0, False, {"invalid": True}
            return f"{ids[parts[0].lower()]} starts {parts[1]}.", 0.0, False, {}
        if name == "list":
            ev = self.evaluate()
            lines = [f"{t.tid}: {self.plan.get(t.tid, 'unscheduled')}"
                     + ("" if t.tid in ev["valid"] or t.tid not in self.plan
                        else " (breaks a constraint)") for t in self.project.tasks]
            lines.append(f"Finish: {ev['finish'] or 'n/a'}")
            return "\n".join(lines), 0.0, False, {}
        if name == "submit":
            self.done = True
            ev = self.evaluate()
            return (f"Submitted: {len(ev['valid'])}/{len(self.project.tasks)} tasks valid, "
                    f"finish {ev['finish'] or 'n/a'}.", ev["reward"], True, ev)
        return f"Unknown action {name!r}.", 0.0, False, {"invalid": True}

    def valid_actions(self) -> list[str]:
        return [] if self.done or self.project is None else ["list", "submit"]

    def oracle_action(self) -> str | None:
        """Schedule every task at its earliest start (optimal), then submit."""
        if self.done or self.project is None:
            return None
        for t in self.project.tasks:
            if self.plan.get(t.tid) != self.project.earliest[t.tid]:
                return f"schedule[{t.tid} | {self.project.earliest[t.tid].isoformat()}]"
        return "submit"
