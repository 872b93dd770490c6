"""``code_debug``: fix a buggy Python function so that its unit tests pass.

Each task is one bug planted in a correct function from
:mod:`agentgym.envs.code_debug.templates` (off-by-one, wrong operator, wrong comparison,
missing base case, wrong initial value, ...). The agent sees the code with line numbers and
the visible tests, edits lines, runs the tests, and submits. The code only ever runs in
:mod:`agentgym.runtime.sandbox`; expected values never enter the sandbox (the child returns
``repr`` of each result and the parent compares).

Reward: at ``submit`` the episode ends with reward = fraction of all tests passed (visible and
hidden). Optional ``step_penalty`` (per non-submit action) and ``invalid_penalty`` (per
unparseable action) are subtracted; both default to 0.
"""

from __future__ import annotations

import ast
import copy
import functools
import json
import random
import re
from dataclasses import dataclass
from typing import Any

from agentgym.envs.base import BaseEnv, action_line
from agentgym.envs.code_debug.templates import TEMPLATES, Template
from agentgym.errors import InvalidTaskError
from agentgym.runtime.sandbox import SandboxLimits, run_python

VARIANTS = 6  #: tasks per bug site (name and test inputs vary)
NUM_VISIBLE = 4
NUM_HIDDEN = 4
TEST_EVERY = 5  #: every 5th bug site is held out for the test split
PER_TEST_S = 0.5
SANDBOX_LIMITS = SandboxLimits(cpu_s=8, wall_s=12.0, memory_mb=512)

INSTRUCTIONS = """You are debugging a Python function. It has one bug; its docstring says what \
it should do. Actions:
  view                      show the current code with line numbers
  run_tests                 run the visible tests on the current code
  replace <n> <code>        replace line n with <code>; if <code> has no leading spaces,
                            line n's indentation is kept
  replace <a>-<b> <code>    replace lines a..b (inclusive) with <code>, which may span several
                            lines (put the code on the following lines; empty code deletes)
  submit                    finish; reward = fraction of all tests passed, hidden tests \
included""" + action_line("view")

_SITES: list[tuple[int, int]] = [(t, b) for t, tpl in enumerate(TEMPLATES) for b in
                                 range(len(tpl.bugs))]


def split_sites(split: str) -> list[int]:
    """Bug-site indices of a split: ``test`` holds out every 5th site, ``train`` the rest."""
    if split == "all":
        return list(range(len(_SITES)))
    if split == "test":
        return [s for s in range(len(_SITES)) if s % TEST_EVERY == TEST_EVERY - 1]
    if split == "train":
        return [s for s in range(len(_SITES)) if s % TEST_EVERY != TEST_EVERY - 1]
    raise ValueError(f"split must be 'train', 'test' or 'all', got {split!r}")


@dataclass
class DebugTask:
    """One generated task: code lines, the bug's line, tests (args, expected repr)."""

    name: str
    family: str
    bug_kind: str
    buggy: list[str]
    fixed: list[str]
    bug_line: int  # 1-based
    visible: list[tuple[tuple, Any]]
    hidden: list[tuple[tuple, Any]]


def _render(tpl: Template, name: str, body: str) -> list[str]:
    lines = [f"def {name}({tpl.params}):", f'    """{tpl.doc}"""']
    return lines + ["    " + ln if ln else "" for ln in body.replace("$f", name).split("\n")]


def _plant(tpl: Template, name: str, bug: tuple[str, str, str]) -> tuple[list[str], int]:
    _, old, new = (s.replace("$f", name) for s in bug)
    body = tpl.body.replace("$f", name).split("\n")
    hits = [i for i, ln in enumerate(body) if ln == old] or [
        i for i, ln in enumerate(body) if old in ln
    ]
    if len(hits) != 1:
        raise AssertionError(f"bug site {old!r} of {tpl.names[0]} matches {len(hits)} lines")
    i = hits[0]
    body[i] = new if body[i] == old else body[i].replace(old, new, 1)
    return _render(tpl, name, "\n".join(body)), i + 3


def _outcomes(src: list[str], name: str, cases: list[tuple]) -> list[tuple[str, Any]]:
    """Run trusted template code in-process on each case (task generation only)."""
    ns: dict[str, Any] = {}
    exec(compile("\n".join(src), f"<{name}>", "exec"), ns)  # noqa: S102 - our own templates
    out = []
    for args in cases:
        try:
            out.append(("ok", ns[name](*copy.deepcopy(args))))
        except Exception as exc:  # noqa: BLE001 - the buggy code may raise anything
            out.append(("err", type(exc).__name__))
    return out


@functools.lru_cache(maxsize=1024)
def make_task(site: int, variant: int) -> DebugTask:
    """The task of bug site ``site`` (over all sites) and variant ``variant``."""
    t, b = _SITES[site]
    tpl = TEMPLATES[t]
    name = tpl.names[variant % len(tpl.names)]
    rng = random.Random(f"code_debug:{site}:{variant}")
    fixed = _render(tpl, name, tpl.body)
    buggy, bug_line = _plant(tpl, name, tpl.bugs[b])
    pool: list[tuple] = list(tpl.edge) + [tpl.inputs(rng) for _ in range(40)]
    seen, cases = set(), []
    for args in pool:
        if repr(args) not in seen:
            seen.add(repr(args))
            cases.append(args)
    rng.shuffle(cases)
    ref = _outcomes(fixed, name, cases)
    bad = _outcomes(buggy, name, cases)
    for r in ref:
        if r[0] != "ok":
            raise AssertionError(f"reference {name} raised on its own inputs")
    diff = [i for i in range(len(cases)) if bad[i] != ref[i] or type(bad[i][1]) is not type(
        ref[i][1])]
    same = [i for i in range(len(cases)) if i not in diff]
    if not diff:
        raise AssertionError(f"bug {tpl.bugs[b][0]} of {name} is not exposed by any input")
    # visible: one exposing case first, then a mix; hidden: exposing ones where possible
    order = [diff[0]] + [i for i in same[:2]] + diff[1:2] + same[2:] + diff[2:]
    vis = order[:NUM_VISIBLE]
    rest = [i for i in diff[1:] + same if i not in vis]
    hid = rest[:NUM_HIDDEN]
    return DebugTask(
        name=name,
        family=tpl.family,
        bug_kind=re.sub(r"_\d+$", "", tpl.bugs[b][0]),
        buggy=buggy,
        fixed=fixed,
        bug_line=bug_line,
        visible=[(cases[i], ref[i][1]) for i in vis],
        hidden=[(cases[i], ref[i][1]) for i in hid],
    )


_HARNESS = r'''
import ast, contextlib, io, json, signal, sys
def _alarm(*_):
    raise TimeoutError("test took longer than %(per_test)s s")
signal.signal(signal.SIGALRM, _alarm)
spec = ast.literal_eval(open("cases.txt", encoding="utf-8").read())
out = {"load_error": None, "results": [], "stdout": ""}
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    fn = None
    try:
        ns = {"__name__": "solution"}
        exec(compile(open("solution.py", encoding="utf-8").read(), "solution.py", "exec"), ns)
        fn = ns[spec["function"]]
    except BaseException as e:
        out["load_error"] = (type(e).__name__ + ": " + str(e))[:300]
    for args in spec["args"]:
        if fn is None:
            break
        signal.setitimer(signal.ITIMER_REAL, %(per_test)s)
        try:
            val = fn(*args)
            signal.setitimer(signal.ITIMER_REAL, 0)
            out["results"].append({"ok": repr(val)[:2000]})
        except BaseException as e:
            signal.setitimer(signal.ITIMER_REAL, 0)
            out["results"].append({"error": (type(e).__name__ + ": " + str(e))[:200]})
out["stdout"] = buf.getvalue()[:1000]
sys.__stdout__.write("\n@@RESULT@@" + json.dumps(out) + "\n")
'''


def run_tests(code: str, name: str, cases: list[tuple[tuple, Any]]) -> dict[str, Any]:
    """Run ``code`` on ``cases`` in the sandbox; per case ``(passed, message)``."""
    spec = {"function": name, "args": [tuple(a) for a, _ in cases]}
    res = run_python(
        _HARNESS % {"per_test": PER_TEST_S},
        files={"solution.py": code, "cases.txt": repr(spec)},
        limits=SANDBOX_LIMITS,
    )
    marker = [ln for ln in res.stdout.splitlines() if ln.startswith("@@RESULT@@")]
    report: dict[str, Any] = {"passed": [], "messages": [], "load_error": None, "stdout": ""}
    payload = None
    if marker:
        try:
            payload = json.loads(marker[-1][len("@@RESULT@@"):])
        except ValueError:
            payload = None
    if payload is None:
        why = "timed out" if res.timed_out else f"exited with status {res.returncode}"
        tail = res.stderr.strip().splitlines()[-1:] or [""]
        report["load_error"] = f"the test process {why} without a result {tail[0][:200]}".strip()
        payload = {"results": []}
    else:
        report["load_error"] = payload.get("load_error")
        report["stdout"] = payload.get("stdout", "")
    results = payload.get("results", [])
    for k, (args, expected) in enumerate(cases):
        call = f"{name}({', '.join(repr(a) for a in args)})"
        got = results[k] if k < len(results) else {"error": "nothing (not run)"}
        if "ok" in got:
            try:
                value = ast.literal_eval(got["ok"])
                ok = value == expected and type(value) is type(expected)
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                ok = False
            msg = f"expected {expected!r}, got {got['ok'][:120]}"
        else:
            ok, msg = False, f"raised {got['error']}"
        report["passed"].append(ok)
        report["messages"].append(f"{'PASS' if ok else 'FAIL'} {call}" + ("" if ok else f": {msg}"))
    return report


_REPLACE = re.compile(
    r"^replace\s+(\d+)(?:\s*-\s*(\d+))?(?:[ \t]([^\n]*))?(?:\n(.*))?$", re.S | re.I
)


class CodeDebugEnv(BaseEnv):
    """Fix the bug in a Python function (sandboxed test runs); see the module doc."""

    instructions = INSTRUCTIONS
    snapshot_safe = True
    splits = ("train", "test", "all")
    held_out_split = "test"

    def __init__(self, split: str = "train", step_penalty: float = 0.0,
                 invalid_penalty: float = 0.0):
        self.split = split
        self._sites = split_sites(split)
        self.num_tasks = len(self._sites) * VARIANTS
        self.step_penalty = float(step_penalty)
        self.invalid_penalty = float(invalid_penalty)
        self.task: DebugTask | None = None
        self.code: list[str] = []
        self.done = True

    def task_at(self, index: int) -> DebugTask:
        """Task ``index`` of this split (variant-major: consecutive indices differ in site)."""
        if not 0 <= index < self.num_tasks:
            raise InvalidTaskError(f"code_debug[{self.split}]: task {index} not in [0, "
                                   f"{self.num_tasks})")
        variant, k = divmod(index, len(self._sites))
        return make_task(self._sites[k], variant)

    def reset(self, task: int | str | None = None, seed: int | None = None) -> str:
        if task is None:
            task = random.Random(seed).randrange(self.num_tasks)
        if isinstance(task, str):
            if not task.strip().isdigit():
                raise InvalidTaskError(f"code_debug: task must be an index, got {task!r}")
            task = int(task)
        self.task = self.task_at(int(task))
        self.code = list(self.task.buggy)
        self.done = False
        tests = "\n".join(f"  assert {self._call(a)} == {e!r}" for a, e in self.task.visible)
        return (f"Fix the bug in `{self.task.name}` so that all tests pass "
                f"({len(self.task.hidden)} more tests are hidden).\n\n{self._listing()}\n\n"
                f"Visible tests:\n{tests}")

    def _call(self, args: tuple) -> str:
        return f"{self.task.name}({', '.join(repr(a) for a in args)})"

    def _listing(self) -> str:
        return "\n".join(f"{i:3d} | {ln}" for i, ln in enumerate(self.code, 1))

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        if self.task is None or self.done:
            from agentgym.errors import EpisodeFinishedError

            raise EpisodeFinishedError("code_debug: call reset() first")
        act = action.strip()
        head = act.split(None, 1)[0].lower() if act else ""
        if head == "submit":
            rep = run_tests("\n".join(self.code) + "\n", self.task.name,
                            self.task.visible + self.task.hidden)
            passed = sum(rep["passed"])
            total = len(rep["passed"])
            self.done = True
            return (f"Submitted: {passed}/{total} tests passed.", passed / total, True,
                    {"passed": passed, "total": total, "solved": passed == total})
        if head == "view":
            return self._listing(), -self.step_penalty, False, {}
        if head == "run_tests":
            rep = run_tests("\n".join(self.code) + "\n", self.task.name, self.task.visible)
            lines = []
            if rep["load_error"]:
                lines.append(f"Error while loading the code: {rep['load_error']}")
            lines += rep["messages"]
            lines.append(f"{sum(rep['passed'])}/{len(rep['passed'])} visible tests passed.")
            if rep["stdout"]:
                lines.append("Printed output:\n" + rep["stdout"])
            return "\n".join(lines), -self.step_penalty, False, {"passed": sum(rep["passed"])}
        if head == "replace":
            return self._replace(act)
        return (f"Unknown action {act[:60]!r}. Use view, run_tests, replace <n> <code>, "
                "replace <a>-<b> <code>, or submit.", -self.invalid_penalty, False,
                {"invalid": True})

    def _replace(self, act: str) -> tuple[str, float, bool, dict[str, Any]]:
        m = _REPLACE.match(act)
        if not m:
            return ("Could not parse replace; use `replace <n> <code>` or `replace <a>-<b>` "
                    "followed by code lines.", -self.invalid_penalty, False, {"invalid": True})
        a = int(m.group(1))
        b = int(m.group(2)) if m.group(2) else a
        n = len(self.code)
        if not 1 <= a <= b <= n:
            return (f"Line numbers must satisfy 1 <= a <= b <= {n}.", -self.invalid_penalty,
                    False, {"invalid": True})
        first = m.group(3)
        rest = m.group(4)
        new = ([first] if first is not None and first.strip() else []) + (
            rest.split("\n") if rest is not None else [])
        if m.group(2) is None and not new:
            new = [""]
        if new and new[0] and not new[0][0].isspace():
            indent = self.code[a - 1][: len(self.code[a - 1]) - len(self.code[a - 1].lstrip())]
            new = [indent + ln if ln else ln for ln in new]
        self.code[a - 1:b] = new
        return (f"Replaced lines {a}-{b}.\n{self._listing()}", -self.step_penalty, False, {})

    def valid_actions(self) -> list[str]:
        return [] if self.done else ["view", "run_tests", "submit"]

    def oracle_action(self) -> str | None:
        """Fix the bug line (or restore the whole function after other edits), then submit."""
        if self.task is None or self.done:
            return None
        if self.code == self.task.fixed:
            return "submit"
        if self.code == self.task.buggy:
            k = self.task.bug_line
            return f"replace {k} {self.task.fixed[k - 1]}"
        return f"replace 1-{len(self.code)}\n" + "\n".join(self.task.fixed)


def task_counts() -> dict[str, int]:
    """Tasks per split."""
    return {s: len(split_sites(s)) * VARIANTS for s in ("train", "test", "all")}
