"""Planning turns (``RolloutConfig.plan``): a model reply the env never sees.

A plan turn's assistant reply opens with :data:`PLAN_PREFIX` (or
``RolloutConfig.plan_prefix``; prompt tokens, mask 0), the model writes its plan (policy
tokens, mask 1, at most ``plan_max_tokens``, reward 0, or ``plan_bonus`` once the episode is
solved), then :data:`ACT_PROMPT` follows as a user turn (mask 0) and the model's next reply
is an action as usual. The first plan comes before the first action; with
``replan_every = m`` another comes after every ``m`` env turns. docs/mechanisms.md has the
rules and why.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import msgspec
import numpy as np

from agentgym.data.trajectories import solved
from agentgym.engine.mechanisms.base import Mechanism
from agentgym.envs.registry import success_rule

#: Opens a plan turn's assistant reply (prompt tokens): the model continues it.
PLAN_PREFIX = "Plan (no action yet):"

#: The user turn after a plan: the next reply is the action.
ACT_PROMPT = "Now reply with your next action."


def plan_due(env_turns: int, planned_at: int, replan_every: int) -> bool:
    """Whether a plan turn comes before the next action: none yet (``planned_at`` is the env
    turn count at the last plan, -1 before any), or ``replan_every`` env turns since the last
    one."""
    if planned_at < 0:
        return True
    return replan_every > 0 and env_turns - planned_at >= replan_every


@dataclass(slots=True)
class Plans:
    """One episode's plan turns."""

    #: Plan turns played.
    count: int = 0
    #: The env turn count at the last plan turn (-1: none yet).
    planned_at: int = -1
    #: The store's turn index of each plan turn (``plan_bonus`` only).
    at: list[int] = field(default_factory=list)

    def copy(self) -> Plans:
        return Plans(self.count, self.planned_at, list(self.at))


class Planning(Mechanism):
    """Plays a plan turn before an action when one is due (see the module docs)."""

    name = "plan"
    default_count, count_field, aliases = 0, "replan_every", ("planning",)
    row_defaults = {"plan_turns": 0}
    with_images = True

    def __init__(self, loop):
        super().__init__(loop)
        cfg = self.cfg
        prefix = cfg.plan_prefix if cfg.plan_prefix is not None else PLAN_PREFIX
        self.plan_ids = loop.fmt.fast.encode(prefix, add_special_tokens=False).ids
        self.act_ids = loop.codec.observation_ids([ACT_PROMPT])[0]
        self.sampling = loop.sampling if cfg.plan_max_tokens is None else \
            msgspec.structs.replace(loop.sampling, max_new_tokens=cfg.plan_max_tokens)
        if not cfg.plan_bonus:
            self.closing = None
        #: The return that solves an episode of this env (its success rule).
        self.threshold = success_rule(loop.driver.env_id).threshold

    def _plans(self, ep) -> Plans:
        plans = ep.state.get("plan")
        if plans is None:
            plans = ep.state["plan"] = Plans()
        return plans

    async def before_reply(self, ep) -> None:
        plans = self._plans(ep)
        if plan_due(ep.turns, plans.planned_at, self.cfg.replan_every):
            await self.plan(ep, plans)

    async def plan(self, ep, plans: Plans) -> None:
        """One plan turn of ``ep``: the plan prefix (mask 0), the model's plan (mask 1,
        closed with a masked end-of-turn token when cut at ``plan_max_tokens``), a turn
        reward of 0 and the note asking for the action (mask 0). The env is not stepped. An
        episode whose context cannot hold the prefix, a reply token and the note ends with
        ``length``."""
        loop = self.loop
        plans.planned_at = ep.turns
        ids, eot = ep.ids, loop.fmt.end_of_turn_id
        prompt, resume = loop.context_of(ep)
        budget = self.cfg.max_total_tokens - len(prompt) - len(self.plan_ids) \
            - len(self.act_ids) - 1
        if budget <= 0:
            ep.stop_reason = "length"
            return
        loop.append(ep, self.plan_ids)
        if prompt is not ids:
            prompt.extend(self.plan_ids)
        t0 = time.perf_counter()
        res = await loop.generate(ep, loop.limited(self.sampling, budget), prompt=prompt)
        start = len(ids)
        ep.gen_s += time.perf_counter() - t0
        toks = res.token_ids
        ep.replied(res.policy_version)
        loop.append(ep, toks, True, res.logprobs)
        if not (toks and toks[-1] == eot):  # cut at the plan's budget: close it
            loop.append(ep, [eot])
        loop.stored_reply(ep, resume, start, len(ids))
        store = loop.store
        if self.cfg.plan_bonus:
            plans.at.append(store.num_turns(ep.key))
        store.add_turn(ep.key, 0.0)
        loop.append(ep, self.act_ids)
        plans.count += 1
        ep.side_turns += 1

    def forked(self, root, child) -> None:
        if (plans := root.state.get("plan")) is not None:
            child.state["plan"] = plans.copy()

    def closing(self, eps, overrides):
        """``plan_bonus`` onto each plan turn of the closing episodes that are solved (by
        the one success rule: on their turn rewards' sum, or where they retried on their
        last attempt's return); an episode whose reward ``overrides`` replaces gets the
        bonuses there too."""
        bonus, store = self.cfg.plan_bonus, self.loop.store
        for k, e in enumerate(eps):
            plans = e.state.get("plan")
            if plans is None or not plans.at or e.stop_reason != "done":
                continue
            own = overrides is None or np.isnan(overrides[k])
            ret = e.judged_return if e.judged_return is not None else store.reward(e.key)
            if not solved(True, ret, threshold=self.threshold):
                continue
            for turn in plans.at:
                store.add_reward(e.key, turn, bonus)
            if not own:
                overrides[k] += bonus * len(plans.at)
        return overrides

    def row(self, eps) -> dict:
        return {"plan_turns": [p.count if (p := e.state.get("plan")) is not None else 0
                               for e in eps]}
