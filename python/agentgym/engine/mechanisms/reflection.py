"""Reflection retries (``RolloutConfig.reflection``): an attempt that the env ended
unsolved (``done`` below the return its success rule asks, ``registry.success_rule``) or
that the horizon ended, with attempts left, is followed by a note (a user turn, mask 0) built from
:data:`REFLECTION_PROMPT` (or ``RolloutConfig.reflection_prompt``) while the env goes back
to the state it had right after reset (``reflection_restore="last"``: an attempt the env
ended goes back to before its last turn). The model's next reply (mask 1) is its reflection
and the first action of the new attempt, in the same trajectory. The episode's reward is the
last attempt's return times ``reflection_discount ** (attempts - 1)``; docs/mechanisms.md
has the rules and why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agentgym.data.trajectories import solved
from agentgym.engine.mechanisms.base import Mechanism
from agentgym.envs.registry import success_rule

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


def retries(stop_reason: str | None, ret: float, threshold: float = 1.0) -> bool:
    """Whether an attempt that ended so is followed by another (attempts permitting): the
    env ended it unsolved (``done``, by the env's success rule: a return of at least
    ``threshold``) or the horizon ended it without a solving return. Failed attempts
    (``env_error``, ``backend_error``, ``length``, ...) never are."""
    return stop_reason in ("done", "horizon") and not solved(True, ret, threshold=threshold)


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


@dataclass(slots=True)
class Attempts:
    """One episode's attempts."""

    #: Attempts begun (1 without a retry).
    count: int = 1
    #: The running attempt's return (driven envs; a native env's pool keeps it in the
    #: episode record).
    ret: float = 0.0
    #: The observation after reset: the note before a retry repeats it.
    start_obs: str = ""
    #: The reward of the last turn (driven envs under ``reflection_restore="last"``).
    last_reward: float = 0.0
    #: Where each retry's first reply (its reflection) begins, in tokens.
    starts: list[int] = field(default_factory=list)


class Reflection(Mechanism):
    """Retries an unsolved attempt in the same trajectory (see the module docs)."""

    name = "reflection"
    default_count = 1
    row_defaults = {"attempts": 1, "attempt_return": None}

    @classmethod
    def driver_needs(cls, cfg) -> dict[str, Any]:
        return {"restarts": True, "lasts": cfg.reflection_restore == "last"}

    def __init__(self, loop):
        super().__init__(loop)
        #: The return that solves an episode of this env (its success rule).
        self.threshold = success_rule(loop.driver.env_id).threshold
        #: Retries back to the failing turn: each slot's state is kept before its step.
        self.keep_last = self.cfg.reflection_restore == "last"
        if not self.keep_last:
            self.before_step = None
        if loop.pool is not None:  # the pool's episode record holds the attempt's return
            self.stepped = None

    async def begun(self, eps, obs) -> list:
        """Each episode's start, kept for its retries."""
        failed = await self.loop.driver.save_starts([e.slot for e in eps])
        for e, o, err in zip(eps, obs, failed):
            if err is None:
                e.state["reflection"] = Attempts(start_obs=o)
        return failed

    def before_step(self, turns) -> None:
        self.loop.driver.save_lasts([t.slot for t in turns])

    async def stepped(self, turns, outs):
        for t, o in zip(turns, outs):
            a = t.episode.state.get("reflection")
            if a is not None:  # (a forked child plays one attempt, with no state)
                a.ret += o.reward
                a.last_reward = o.reward
        return outs

    def attempt_return(self, ep) -> float:
        """The return of ``ep``'s running (or just ended) attempt."""
        pool = self.loop.pool
        if pool is not None:  # the pool's episode record restarts with each attempt
            return float(pool.episode(ep.slot)[5])
        return ep.state["reflection"].ret

    async def retry(self, ep) -> bool:
        """Another attempt where the one that ended retries and attempts remain: the note
        appended (mask 0), the env put back. No retry when the note and a reply would not
        fit the context."""
        a, cfg, loop = ep.state.get("reflection"), self.cfg, self.loop
        if a is None or a.count > cfg.reflection:
            return False
        ret = self.attempt_return(ep)
        if not retries(ep.stop_reason, ret, self.threshold):
            return False
        back = (self.keep_last and ep.stop_reason == "done"
                and loop.driver.has_last(ep.slot))
        text = note(cfg.reflection_prompt, a.count, cfg.reflection - a.count,
                    ep.stop_reason, ret, "" if back else a.start_obs, back=back)
        ids = loop.codec.observation_ids([text])[0]
        if len(loop.context_of(ep)[0]) + len(ids) >= cfg.max_total_tokens:
            return False
        await loop.restart_env(ep, back)
        if back:
            a.ret -= a.last_reward
        else:
            a.ret = 0.0
        if ep.closed:
            return False
        loop.append(ep, ids)
        a.starts.append(len(ep.ids))
        a.count += 1
        ep.stop_reason = None
        return True

    def closing(self, eps, overrides):
        """The rewards of the closing episodes that retried (NaN: the store's own sum) and
        their start snapshots released; with ``reflection_credit="reflection"``, an episode
        solved on a retry keeps its loss mask on its reflections only."""
        self.loop.driver.drop_saved([e.slot for e in eps])
        retried = [k for k, e in enumerate(eps)
                   if (a := e.state.get("reflection")) is not None and a.count > 1]
        if not retried:
            return overrides
        out = np.full(len(eps), np.nan, np.float32) if overrides is None else overrides
        discount = self.cfg.reflection_discount
        credit_reflections = self.cfg.reflection_credit == "reflection"
        for k in retried:
            e = eps[k]
            a = e.state["reflection"]
            a.ret = ret = self.attempt_return(e)
            e.judged_return = ret
            out[k] = final_reward(ret, a.count, discount)
            if credit_reflections and solved(e.stop_reason == "done", ret,
                                             threshold=self.threshold):
                self.loop.store.credit_only(e.key, a.starts)
        return out

    def row(self, eps) -> dict:
        attempts = [a.count if (a := e.state.get("reflection")) is not None else 1
                    for e in eps]
        return {"attempts": attempts,
                "attempt_return": [e.state["reflection"].ret if n > 1 else None
                                   for e, n in zip(eps, attempts)]}

    def aborted(self, ep) -> None:
        self.loop.driver.drop_saved([ep.slot])
