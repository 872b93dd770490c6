"""Reflection retries (``RolloutConfig.reflection``): the texts and the reward rule.

An attempt that the env ended unsolved (``done`` below
:data:`~agentgym.data.trajectories.SUCCESS_REWARD`) or that the horizon ended, with
attempts left, is followed by a note (a user turn, mask 0) built from
:data:`REFLECTION_PROMPT` (or ``RolloutConfig.reflection_prompt``) while the env goes back
to the state it had right after reset. The model's next reply (mask 1) is its reflection
and the first action of the new attempt. The engine's side is in
``agentgym.engine.orchestrator`` (``_Run._play_reflect``); docs/mechanisms.md has the
rules and why.
"""

from __future__ import annotations

from agentgym.data.trajectories import solved

#: The default note before a retry. Fields: ``attempt`` (the number of the attempt that
#: ended, from 1), ``attempts_left`` (retries left after this one), ``outcome``
#: (:func:`outcome`), ``observation`` (the env's observation at the episode's start).
REFLECTION_PROMPT = (
    "Attempt {attempt} ended without success ({outcome}). Reflect in a few sentences on "
    "what went wrong and what to do differently, then continue: the environment is back at "
    "its start.\n{observation}"
)

#: The default note when the env went back to before the attempt's last turn
#: (``RolloutConfig.reflection_restore="last"``): the observation before that turn is in
#: the context already.
REFLECTION_PROMPT_LAST = (
    "Attempt {attempt} ended without success ({outcome}). Reflect in a few sentences on "
    "what went wrong and what to do differently, then continue: the environment is back "
    "where it was before your last action."
)

#: ``outcome`` of an attempt the env ended without success, and of one the horizon ended.
OUTCOME_DONE = "the episode ended with return {ret:g}"
OUTCOME_HORIZON = "the turn limit was reached"

_FIELDS = {"attempt": 1, "attempts_left": 1, "outcome": "", "observation": ""}


def check_prompt(prompt: str) -> None:
    """Raise ValueError unless ``prompt`` formats with the note's fields only."""
    try:
        prompt.format(**_FIELDS)
    except (KeyError, IndexError, ValueError) as e:
        raise ValueError(f"reflection_prompt must be a str.format template over "
                         f"{sorted(_FIELDS)}: {e!r}") from None


def outcome(stop_reason: str, ret: float) -> str:
    """The ``outcome`` text of an attempt that ended with ``stop_reason`` and return
    ``ret``."""
    return OUTCOME_HORIZON if stop_reason == "horizon" else OUTCOME_DONE.format(ret=ret)


def retries(stop_reason: str | None, ret: float) -> bool:
    """Whether an attempt that ended so is followed by another (attempts permitting): the
    env ended it unsolved (``done``) or the horizon ended it without a solving return.
    Failed attempts (``env_error``, ``backend_error``, ``length``, ...) never are."""
    return stop_reason in ("done", "horizon") and not solved(True, ret)


def note(prompt: str | None, attempt: int, attempts_left: int, stop_reason: str, ret: float,
         observation: str, back: bool = False) -> str:
    """The note after attempt ``attempt`` (from 1); ``back``: the env went back to before
    the attempt's last turn (default text :data:`REFLECTION_PROMPT_LAST`)."""
    default = REFLECTION_PROMPT_LAST if back else REFLECTION_PROMPT
    return (prompt or default).format(
        attempt=attempt, attempts_left=attempts_left, outcome=outcome(stop_reason, ret),
        observation=observation)


def final_reward(last_return: float, attempts: int, discount: float) -> float:
    """An episode's reward: its last attempt's return times ``discount ** (attempts - 1)``."""
    return last_return * discount ** (attempts - 1)
