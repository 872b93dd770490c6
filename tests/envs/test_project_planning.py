"""The ``project_planning`` env: scoring, actions, oracle, registry, Gymnasium API."""

from __future__ import annotations

import datetime as dt
import random

import pytest
from gymnasium.utils.env_checker import check_env

import agentgym
from agentgym.envs.project_planning import ProjectPlanningEnv
from tests.helpers import play_actions

pytestmark = pytest.mark.timeout(120)


def test_project_planning_scoring_hand_built():
    env = ProjectPlanningEnv()
    env.reset(task=0)
    proj = env.project
    asap = [f"schedule[{t.tid} | {proj.earliest[t.tid]}]" for t in proj.tasks]
    assert play_actions(env, asap + ["submit"])[0] == 1.0
    env.reset(task=0)
    late = [f"schedule[{t.tid} | {proj.earliest[t.tid] + dt.timedelta(days=10)}]"
            for t in proj.tasks]
    reward, info = play_actions(env, late + ["submit"])
    span = (proj.finish - proj.start).days + 1
    assert reward == pytest.approx(0.5 + 0.5 * span / (span + 10))
    assert info["finish"] == proj.finish + dt.timedelta(days=10)
    env.reset(task=0)
    dependent = next(t for t in proj.tasks if t.deps)
    early = [a for a, t in zip(asap, proj.tasks, strict=True) if t is not dependent]
    early.append(f"schedule[{dependent.tid} | {proj.start}]")  # before its dependency ends
    reward, info = play_actions(env, early + ["submit"])
    n = len(proj.tasks)
    assert dependent.tid not in info["valid"] and info["finish"] is None
    assert reward == pytest.approx(0.5 * len(info["valid"]) / n) and reward < 0.5


def test_project_planning_actions_oracle_and_random():
    env = ProjectPlanningEnv("test")
    env.reset(task=3)
    assert env.step("schedule[T99 | 2024-01-01]")[3]["invalid"]
    assert env.step("schedule[T1 | soon]")[3]["invalid"]
    assert "unscheduled" in env.step("list")[0]
    for t in range(0, 200, 4):
        env.reset(task=t)
        done, reward = False, 0.0
        while not done:
            _, reward, done, _ = env.step(env.oracle_action())
        assert reward == 1.0
        assert env.project.finish == max(env.project.earliest[x.tid] + dt.timedelta(
            days=x.days - 1) for x in env.project.tasks)
    rng = random.Random(0)
    env.reset(task=5)
    for t in env.project.tasks:
        env.step(f"schedule[{t.tid} | {env.project.start + dt.timedelta(days=rng.randint(0, 9))}]")
    assert env.step("submit")[1] < 1.0


def test_project_planning_make_and_checker():
    env = agentgym.make("project_planning", max_turns=15)
    check_env(env.unwrapped, skip_render_check=True)
    obs, _ = env.reset(seed=0, options={"task": 1})
    assert obs.startswith("Project start:")
