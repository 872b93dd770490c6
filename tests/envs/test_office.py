"""The ``office`` env: generation, dates, scoring, oracle, registry."""

from __future__ import annotations

import calendar
import datetime as dt
import random
import re

import pytest
from gymnasium.utils.env_checker import check_env

import agentgym
from agentgym.envs.office import OfficeEnv, Todo, generate, score, task_similarity
from agentgym.errors import EpisodeFinishedError, InvalidTaskError

pytestmark = pytest.mark.timeout(120)
D = dt.date


def _resolve_phrase(phrase: str, d: dt.date) -> dt.date:
    """An independent reading of the deadline phrases the instructions define."""
    if phrase == "tomorrow":
        return d + dt.timedelta(days=1)
    if phrase in ("in two weeks", "in three weeks"):
        return d + dt.timedelta(weeks=2 if "two" in phrase else 3)
    if m := re.fullmatch(r"within (\d+) days", phrase):
        return d + dt.timedelta(days=int(m.group(1)))
    if phrase == "by the end of next week":
        monday = d - dt.timedelta(days=d.weekday())
        return monday + dt.timedelta(days=11)
    if phrase == "by the end of the month":
        return D(d.year, d.month, calendar.monthrange(d.year, d.month)[1])
    if m := re.fullmatch(r"by the (\d+)(st|nd|rd|th)", phrase):
        day = int(m.group(1))
        y, mo = (d.year, d.month) if day > d.day else (
            (d.year + (d.month == 12), d.month % 12 + 1))
        return D(y, mo, day)
    if m := re.fullmatch(r"by (\w+)", phrase):
        wd = list(calendar.day_name).index(m.group(1))
        return next(d + dt.timedelta(days=k) for k in range(1, 8)
                    if (d + dt.timedelta(days=k)).weekday() == wd)
    m = re.fullmatch(r"by (\w+) (\d+)", phrase)
    month = list(calendar.month_name).index(m.group(1))
    cand = D(d.year, month, int(m.group(2)))
    return cand if cand > d else D(d.year + 1, month, int(m.group(2)))


def test_deadlines_match_the_documented_phrases():
    kinds = set()
    for i in range(300):
        mt = generate(i)
        for todo in mt.todos:
            line = next(ln for ln in mt.notes.splitlines() if todo.task in ln)
            phrase = re.search(
                r"(tomorrow|in \w+ weeks|within \d+ days|by the end of next week|by the end "
                r"of the month|by the \d+\w\w|by [A-Z]\w+ \d+|by [A-Z]\w+day)", line).group(1)
            kinds.add(re.sub(r"\d+", "N", phrase.split()[0] + " " + phrase.split()[-1]))
            assert _resolve_phrase(phrase, mt.date) == todo.deadline, (i, phrase)
    assert len(kinds) >= 7


def test_hand_checked_deadlines():
    env = OfficeEnv()
    env.reset(task=0)
    assert env.meeting.date == D(2025, 7, 21)  # a Monday
    got = {t.task: t.deadline for t in env.meeting.todos}
    assert got["benchmark the search service"] == D(2025, 7, 22)  # tomorrow
    assert got["collect feedback from the beta users"] == D(2025, 8, 1)  # end of next week
    assert got["set up the staging server"] == D(2025, 7, 31)  # end of the month
    assert got["fix the login timeout bug"] == D(2025, 8, 4)  # "by the 4th"


def test_splits_and_determinism():
    assert (OfficeEnv("train").num_tasks, OfficeEnv("test").num_tasks) == (800, 200)
    a, b = OfficeEnv(), OfficeEnv()
    assert a.reset(task=3, seed=1) == b.reset(task=3, seed=9)
    assert a.reset(task=3) != a.reset(task=4)
    assert OfficeEnv("test").reset(task=0) == generate(800).notes
    with pytest.raises(InvalidTaskError):
        a.reset(task=800)


def test_distractors_are_not_todos():
    for i in range(100):
        mt = generate(i)
        gold = {t.task for t in mt.todos}
        for ln in mt.notes.splitlines():
            if "No need" in ln or "someday" in ln or "decided not to" in ln or "At some point" \
                    in ln:
                assert not any(g in ln for g in gold)


def test_score_hand_built_cases():
    gold = [Todo("send the updated budget to finance", "Priya", D(2024, 5, 17)),
            Todo("review the vendor contract", "Tom", D(2024, 5, 24))]
    assert score(gold, gold)["f1"] == 1.0
    assert score([], gold)["f1"] == 0.0
    para = [Todo("Send updated budget to Finance", "priya", D(2024, 5, 17)),
            Todo("Review contract with the vendor", "Tom", D(2024, 5, 24))]
    assert score(para, gold)["f1"] == 1.0
    wrong_owner = [gold[0], Todo(gold[1].task, "Dana", gold[1].deadline)]
    assert score(wrong_owner, gold)["f1"] == pytest.approx((1 + 2 / 3) / 2)
    extra = gold + [Todo("order pizza", "Sam", D(2024, 5, 20))]
    res = score(extra, gold)
    assert res["precision"] == pytest.approx(2 / 3) and res["recall"] == 1.0
    dup = gold + [gold[0]]  # a duplicate matches nothing the second time
    assert score(dup, gold)["matched"] == 2
    assert task_similarity("fix the login timeout bug", "review the vendor contract") == 0.0


def test_actions_list_remove_and_bad_input():
    env = OfficeEnv()
    env.reset(task=1)
    assert env.step("list")[0] == "No to-dos yet."
    assert env.step("add_todo[do a thing | Tom | 2024-01-05]")[0] == "Added #1."
    for bad in ("add_todo[only task]", "add_todo[x | Tom | next friday]", "remove[4]",
                "jump", "((("):
        assert env.step(bad)[3]["invalid"], bad
    assert "1. do a thing | Tom | 2024-01-05" in env.step("list")[0]
    assert "Removed" in env.step("remove[1]")[0]
    assert env.step("notes")[0] == env.meeting.notes
    _, reward, done, info = env.step("submit")
    assert done and reward == 0.0 and info["gold"] == len(env.meeting.todos)
    with pytest.raises(EpisodeFinishedError):
        env.step("list")


def test_oracle_solves_tasks_from_both_splits():
    for split in ("train", "test"):
        env = OfficeEnv(split)
        for t in random.Random(1).sample(range(env.num_tasks), 50):
            env.reset(task=t)
            done, reward = False, 0.0
            while not done:
                _, reward, done, _ = env.step(env.oracle_action())
            assert reward == 1.0, (split, t)


def test_random_policy_rarely_succeeds():
    env = OfficeEnv()
    rng = random.Random(0)
    rewards = []
    for t in range(50):
        env.reset(task=t)
        reward = 0.0
        for _ in range(10):
            acts = env.valid_actions() + [
                f"add_todo[{rng.choice(['send', 'review', 'fix'])} the report | "
                f"{rng.choice(env.meeting.attendees)} | {env.meeting.date}]"]
            _, reward, done, _ = env.step(rng.choice(acts))
            if done:
                break
        rewards.append(reward)
    assert max(rewards) < 0.5


def test_make_and_gymnasium_checker():
    env = agentgym.make("office", max_turns=20)
    check_env(env.unwrapped, skip_render_check=True)
    obs, _ = env.reset(seed=0, options={"task": 2})
    assert obs.startswith("Meeting notes:")
    assert "add_todo[TASK | OWNER | YYYY-MM-DD]" in env.unwrapped.instructions
