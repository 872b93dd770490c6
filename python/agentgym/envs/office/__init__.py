"""``office``: turn meeting notes into a to-do list (task, owner, deadline).

Notes are generated from templates: attendees, committed action items phrased in several ways
(self-assigned, assigned by someone else, "Action item:" lines), deadlines relative to the
meeting date ("tomorrow", "by Friday", "in two weeks", "by the end of the month", ...), and
distractors (chatter, suggestions that were turned down, vague "someday" ideas). The agent
adds items and submits; the reward is an F1 over matched items in which each match counts
(1 + owner correct + deadline correct) / 3.
"""

from __future__ import annotations

import calendar
import datetime as dt
import random
import re
from dataclasses import dataclass
from typing import Any

from agentgym.envs.base import action_line
from agentgym.envs.commands import CommandEnv

MAX_ITEMS = 20
MATCH_THRESHOLD = 0.5

INSTRUCTIONS = """You are an office assistant. Read the meeting notes and record every \
committed action item as a to-do with its owner and deadline. Actions:
  add_todo[TASK | OWNER | YYYY-MM-DD]   add a to-do (OWNER: first name as in the notes)
  list                                  show the to-dos so far, numbered
  remove[N]                             remove to-do number N
  notes                                 show the meeting notes again
  submit                                finish and be scored
Only commitments with an owner count: skip chatter, ideas that were turned down, and vague \
"someday" suggestions. Relative dates count from the meeting date: "tomorrow" = +1 day, \
"by <weekday>" = the first such weekday after the meeting, "in two weeks" = +14 days, \
"within N days" = +N days, "by the end of next week" = Friday of the following week, "by the \
end of the month" = the month's last day, "by the 20th" = the next 20th after the meeting.
Score: F1 over to-dos matched to the true ones (by the words of the task), where each match \
counts (1 + right owner + right deadline) / 3.""" + action_line("notes")

TASKS = [
    "send the updated budget to finance", "review the vendor contract",
    "book the venue for the offsite", "draft the release notes", "update the onboarding FAQ",
    "schedule a call with the design agency", "prepare the quarterly review slides",
    "fix the login timeout bug", "collect feedback from the beta users",
    "order new laptops for the interns", "write the launch blog post",
    "set up the staging server", "renew the software licenses", "organize the team lunch",
    "translate the user guide into Spanish", "audit the access permissions",
    "create the hiring plan for engineering", "file the travel expense reports",
    "test the payment flow on mobile", "send the meeting summary to the client",
    "clean up the shared drive", "negotiate the cloud hosting discount",
    "publish the job posting", "interview the two backend candidates",
    "migrate the wiki to the new platform", "benchmark the search service",
]
TITLES = ["Weekly sync", "Product launch planning", "Q3 kickoff", "Marketing stand-up",
          "Engineering retro", "Ops review", "Client onboarding prep", "Budget review"]
NAMES = ["Dana", "Luis", "Priya", "Tom", "Mei", "Omar", "Sara", "Jonas", "Aisha", "Ken",
         "Elena", "Raj", "Chloe", "Ivan", "Nora", "Sam"]
WEEKDAYS = list(calendar.day_name)
STOP = {"the", "a", "an", "to", "for", "of", "on", "with", "into", "and", "from", "our", "new",
        "two", "by", "in"}


def _deadline(rng: random.Random, d: dt.date) -> tuple[str, dt.date]:
    """A deadline phrase and the date it means, relative to meeting date ``d``."""
    kind = rng.randrange(8)
    if kind == 0:
        return "tomorrow", d + dt.timedelta(days=1)
    if kind == 1:
        wd = rng.randrange(5)
        ahead = (wd - d.weekday()) % 7 or 7
        return f"by {WEEKDAYS[wd]}", d + dt.timedelta(days=ahead)
    if kind == 2:
        n = rng.choice([2, 3])
        return ("in two weeks" if n == 2 else "in three weeks"), d + dt.timedelta(weeks=n)
    if kind == 3:
        n = rng.randint(2, 10)
        return f"within {n} days", d + dt.timedelta(days=n)
    if kind == 4:
        return "by the end of next week", d + dt.timedelta(days=4 - d.weekday() + 7)
    if kind == 5:
        last = calendar.monthrange(d.year, d.month)[1]
        return "by the end of the month", d.replace(day=last)
    if kind == 6:
        target = d + dt.timedelta(days=rng.randint(5, 40))
        return f"by {target:%B} {target.day}", target
    day = rng.randint(1, 28)
    if day > d.day:
        target = d.replace(day=day)
    else:
        target = (d.replace(day=1) + dt.timedelta(days=32)).replace(day=day)
    suffix = "th" if 10 <= day % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(day % 10, "th")
    return f"by the {day}{suffix}", target


@dataclass
class Todo:
    task: str
    owner: str
    deadline: dt.date


@dataclass
class Meeting:
    date: dt.date
    title: str
    attendees: list[str]
    notes: str
    todos: list[Todo]


def generate(index: int) -> Meeting:
    """Meeting notes and the true to-dos of task ``index`` (over all splits)."""
    rng = random.Random(f"office:{index}")
    d = dt.date(2024, 1, 1) + dt.timedelta(days=rng.randint(0, 700))
    while d.weekday() > 4:
        d += dt.timedelta(days=1)
    people = rng.sample(NAMES, rng.randint(3, 6))
    lead = people[0]
    bank = rng.sample(TASKS, 10)
    n = rng.randint(2, 5)
    todos, lines = [], []
    for task in bank[:n]:
        when, date = _deadline(rng, d)
        style = rng.randrange(4)
        owner = rng.choice(people)
        if style == 0:
            lines.append([f"{owner}: I'll {task} {when}."])
        elif style == 1 and owner != lead:
            lines.append([f"{lead}: {owner}, can you {task} {when}?",
                          f"{owner}: {rng.choice(['Sure.', 'Yes, will do.', 'OK, on it.'])}"])
        elif style == 2:
            lines.append([f"Action item: {owner} to {task} {when}."])
        else:
            other = rng.choice([p for p in people if p != owner])
            lines.append([f"{other}: Let's have {owner} {task}, {when}.",
                          f"{owner}: Fine by me."])
        todos.append(Todo(task, owner, date))
    p = lambda: rng.choice(people)  # noqa: E731
    distractors = [
        [f"{p()}: The client call last week went well."],
        [f"{p()}: I'm out on {rng.choice(WEEKDAYS[:5])} afternoon."],
        [f"{p()}: Reminder that the coffee machine is fixed."],
        [f"{p()}: Should I {bank[n]}?", f"{lead}: No need, that's already done."],
        [f"{p()}: At some point someone should {bank[n + 1]}, but not now."],
        [f"{p()}: Great work on the demo, everyone."],
        [f"{p()}: We decided not to {bank[n + 2]} this quarter."],
    ]
    lines += rng.sample(distractors, rng.randint(2, 5))
    rng.shuffle(lines)
    body = "\n".join(ln for block in lines for ln in block)
    title = rng.choice(TITLES)
    notes = (f"Meeting notes: {title}, {WEEKDAYS[d.weekday()]} {d.isoformat()}\n"
             f"Attendees: {', '.join(people)}\n{body}")
    return Meeting(d, title, people, notes, todos)


def _words(text: str) -> set[str]:
    out = set()
    for w in re.findall(r"[a-z0-9]+", text.lower()):
        if w in STOP:
            continue
        for suf in ("ing", "es", "ed", "s"):
            if w.endswith(suf) and len(w) > len(suf) + 2:
                w = w[: -len(suf)]
                break
        out.add(w)
    return out


def task_similarity(a: str, b: str) -> float:
    """Token F1 between two task descriptions (stop words dropped, crude stemming)."""
    wa, wb = _words(a), _words(b)
    if not wa or not wb:
        return 0.0
    common = len(wa & wb)
    return 2 * common / (len(wa) + len(wb))


def score(pred: list[Todo], gold: list[Todo]) -> dict[str, Any]:
    """Greedy one-to-one matching by similarity (>= 0.5); F1 of per-match quality."""
    pairs = sorted(((task_similarity(p.task, g.task), i, j) for i, p in enumerate(pred)
                    for j, g in enumerate(gold)), reverse=True)
    used_p, used_g, quality, matched = set(), set(), 0.0, 0
    owners = deadlines = 0
    for sim, i, j in pairs:
        if sim < MATCH_THRESHOLD or i in used_p or j in used_g:
            continue
        used_p.add(i)
        used_g.add(j)
        owner_ok = pred[i].owner.strip().lower() == gold[j].owner.lower()
        date_ok = pred[i].deadline == gold[j].deadline
        quality += (1 + owner_ok + date_ok) / 3
        matched += 1
        owners += owner_ok
        deadlines += date_ok
    precision = quality / len(pred) if pred else 0.0
    recall = quality / len(gold) if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"f1": f1, "precision": precision, "recall": recall, "matched": matched,
            "owners_correct": owners, "deadlines_correct": deadlines, "gold": len(gold),
            "predicted": len(pred)}


class OfficeEnv(CommandEnv):
    """Meeting notes -> to-dos with owners and deadlines; see the module doc."""

    instructions = INSTRUCTIONS
    snapshot_safe = True
    env_name = "office"

    def __init__(self, split: str = "train"):
        super().__init__(split)
        self.meeting: Meeting | None = None
        self.todos: list[Todo] = []

    def reset(self, task: int | str | None = None, seed: int | None = None) -> str:
        index = self._tasks.resolve(task, seed)
        self.meeting = generate(index)
        self.todos = []
        self.done = False
        return self.meeting.notes

    def _listing(self) -> str:
        if not self.todos:
            return "No to-dos yet."
        return "\n".join(f"{k}. {t.task} | {t.owner} | {t.deadline}"
                         for k, t in enumerate(self.todos, 1))

    def command(self, name: str, arg: str) -> tuple[str, float, bool, dict[str, Any]]:
        if name == "add_todo":
            parts = [x.strip() for x in arg.split("|")]
            if len(parts) != 3 or not parts[0] or not parts[1]:
                return ("Usage: add_todo[TASK | OWNER | YYYY-MM-DD].", 0.0, False,
                        {"invalid": True})
            try:
                deadline = dt.date.fromisoformat(parts[2])
            except ValueError:
                return f"Bad date {parts[2]!r}; use YYYY-MM-DD.", 0.0, False, {"invalid": True}
            if len(self.todos) >= MAX_ITEMS:
                return f"At most {MAX_ITEMS} to-dos.", 0.0, False, {"invalid": True}
            self.todos.append(Todo(parts[0], parts[1], deadline))
            return f"Added #{len(self.todos)}.", 0.0, False, {}
        if name == "list":
            return self._listing(), 0.0, False, {}
        if name == "notes":
            return self.meeting.notes, 0.0, False, {}
        if name == "remove":
            if not arg.isdigit() or not 1 <= int(arg) <= len(self.todos):
                return f"No to-do number {arg!r}.", 0.0, False, {"invalid": True}
            gone = self.todos.pop(int(arg) - 1)
            return f"Removed: {gone.task}.\n{self._listing()}", 0.0, False, {}
        if name == "submit":
            self.done = True
            res = score(self.todos, self.meeting.todos)
            res["solved"] = res["f1"] >= 0.999
            return (f"Submitted {len(self.todos)} to-dos: F1 {res['f1']:.3f}.", res["f1"], True,
                    res)
        return f"Unknown action {name!r}.", 0.0, False, {"invalid": True}

    def valid_actions(self) -> list[str]:
        if self.done or self.meeting is None:
            return []
        return ["list", "notes", "submit"] + [f"remove[{k}]" for k in
                                               range(1, len(self.todos) + 1)]

    def oracle_action(self) -> str | None:
        """Add each true to-do not yet matched, then submit."""
        if self.done or self.meeting is None:
            return None
        for g in self.meeting.todos:
            if not any(task_similarity(t.task, g.task) >= MATCH_THRESHOLD and t.owner == g.owner
                       and t.deadline == g.deadline for t in self.todos):
                return f"add_todo[{g.task} | {g.owner} | {g.deadline.isoformat()}]"
        return "submit"
