"""What every env reads from a small instruct model's reply: its instructions end with the one
format line (``action_line``: ``Action:`` and one example); the forms such a model writes
around an action (no ``Action:``, a trailing full stop, quotes, markdown bold) play as the
action itself; text that is no action is refused and flagged (``info["invalid"]``, counted as
``invalid_turns`` by the rollout engine)."""

from __future__ import annotations

import pytest

import agentgym
from agentgym.envs.base import action_line
from agentgym.parse import parse_action

#: Forms a small instruct model writes around the action ``{a}``.
TOLERATED = ["{a}", "Action: {a}", "Action: {a}.", "**Action:** {a}", 'Action: "{a}"',
             "I will do this.\nAction: `{a}`"]
#: Replies that are no action of any env.
REFUSED = ["I think we should explore the area first", "xyzzy plugh 42"]

def _shipped() -> list[str]:
    """The env ids agentgym registers itself (other test modules add their own)."""
    from agentgym.envs.registry import spec

    return [e for e in agentgym.list_envs(kind=("native", "python"))
            if isinstance(spec(e).entry_point, str)
            and spec(e).entry_point.startswith("agentgym.")]


ENVS = _shipped()


def _env(env_id: str):
    env = agentgym.make(env_id)
    return env


def _first_step(env_id: str, action: str):
    """Reset task 0 (seed 0) and step ``action``: (observation, info)."""
    env = _env(env_id)
    try:
        env.reset(seed=0, options={"task": 0})
        obs, _, _, _, info = env.step(action)
        return obs, info
    finally:
        env.close()


def _oracle_action(env_id: str) -> str:
    env = _env(env_id)
    try:
        env.reset(seed=0, options={"task": 0})
        action = env.unwrapped.oracle_action()
        assert action, f"{env_id}: no oracle action on task 0"
        return action
    finally:
        env.close()


@pytest.mark.parametrize("env_id", ENVS)
def test_instructions_end_with_the_format_line(env_id):
    env = _env(env_id)
    try:
        text = env.unwrapped.instructions
    finally:
        env.close()
    head, sep, example = text.rpartition("\nAction: ")
    assert sep, f"{env_id}: the instructions give no example line"
    assert text.endswith(action_line(example)), env_id  # native and Python envs alike
    assert parse_action(f"Action: {example}") == example


@pytest.mark.parametrize("env_id", ENVS)
def test_tolerated_forms_play_as_the_action(env_id):
    action = _oracle_action(env_id)
    want, want_info = _first_step(env_id, action)
    assert not want_info.get("invalid"), f"{env_id}: refused its oracle's {action!r}"
    for form in TOLERATED:
        reply = form.format(a=action)
        parsed = parse_action(reply)
        if "\n" in action and not reply.startswith(("Action", "**Action")):
            continue  # a multi-line action needs its Action: marker (else the last line)
        if reply.endswith(".") and not action[-1].isalnum() and action[-1] not in "])":
            continue  # `x:.` keeps its stop: after code punctuation it may be the action's
        assert parsed == action, f"{env_id}: {reply!r} parsed as {parsed!r}"
        obs, info = _first_step(env_id, parsed)
        assert obs == want and not info.get("invalid"), (env_id, reply)


@pytest.mark.parametrize("env_id", ENVS)
def test_replies_that_are_no_action_are_refused(env_id):
    for reply in REFUSED:
        _, info = _first_step(env_id, parse_action(reply) or "")
        assert info.get("invalid") is True, f"{env_id}: {reply!r} was not flagged invalid"
