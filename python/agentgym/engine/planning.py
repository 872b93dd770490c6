"""Planning turns (``RolloutConfig.plan``): the texts and when a plan is due.

A plan turn is a model reply the env never sees: the assistant turn opens with
:data:`PLAN_PREFIX` (or ``RolloutConfig.plan_prefix``; prompt tokens, mask 0), the model
writes its plan (policy tokens, mask 1, reward 0), then :data:`ACT_PROMPT` follows as a
user turn (mask 0) and the model's next reply is an action as usual. The first plan comes
before the first action; with ``replan_every = m`` another comes after every ``m`` env
turns. The engine's side is ``_Run._plan`` in ``agentgym.engine.orchestrator``;
docs/mechanisms.md has the rules and why.
"""

from __future__ import annotations

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
