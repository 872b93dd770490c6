"""Bounded contexts (``RolloutConfig.context_window``): each reply sees the first prompt
(system prompt and first observation) and its last ``context_window`` replies with what
followed each, so ``max_total_tokens`` caps that window and a reply, while the trajectory
still records the whole episode (up to ``max_record_tokens``). Every reply's step (where its
window resumes, where the reply begins and ends) is recorded, so the learner trains each
reply on exactly the context it was generated from (``PackedBatch.step_samples``).
docs/mechanisms.md has the rules and why.
"""

from __future__ import annotations

import itertools

import numpy as np

from agentgym.engine.mechanisms.base import Mechanism


class Steps:
    """One episode's replies: per reply, where its window resumes after the first prompt,
    where it begins and where it ends."""

    __slots__ = ("context", "reply", "end")

    def __init__(self, context=None, reply=None, end=None):
        self.context: list[int] = context or []
        self.reply: list[int] = reply or []
        self.end: list[int] = end or []

    def copy(self) -> Steps:
        return Steps(list(self.context), list(self.reply), list(self.end))


_NO_STEPS = ([], [], [])


class ContextWindow(Mechanism):
    """Builds each reply's bounded context and records its step (see the module docs)."""

    name = "context_window"
    default_count, aliases = 4, ("memory",)

    def __init__(self, loop):
        super().__init__(loop)
        self.window = self.cfg.context_window
        loop.record_cap = self.cfg.max_record_tokens

    async def begun(self, eps, obs) -> list:
        for e in eps:
            e.state["context_window"] = Steps()
        return [None] * len(eps)

    def context(self, ep) -> tuple[list[int], int]:
        """The first prompt and the record from the ``window``-th last reply on (the whole
        record while it holds fewer replies), and where that window resumes."""
        starts, head = ep.state["context_window"].reply, ep.prompt_len
        if len(starts) < self.window:
            return ep.ids, head
        resume = starts[-self.window]
        return ep.ids[:head] + ep.ids[resume:], resume

    def replied(self, ep, resume: int, start: int, end: int) -> None:
        steps = ep.state["context_window"]
        steps.context.append(resume)
        steps.reply.append(start)
        steps.end.append(end)

    def forked(self, root, child) -> None:
        child.state["context_window"] = root.state["context_window"].copy()

    def _steps(self, eps) -> list[tuple[list[int], list[int], list[int]]]:
        """Each episode's steps (none where it never began)."""
        return [(s.context, s.reply, s.end) if (s := e.state.get("context_window")) is not None
                else _NO_STEPS for e in eps]

    def trajectory_fields(self, eps) -> dict:
        return {"steps": [tuple(map(list, s)) if s is _NO_STEPS else s
                          for s in self._steps(eps)]}

    def packed_fields(self, eps) -> dict[str, np.ndarray]:
        """The step fields of a packed batch of ``eps``."""
        steps = self._steps(eps)
        offsets = np.zeros(len(eps) + 1, np.int64)
        np.cumsum([len(s[1]) for s in steps], out=offsets[1:])
        flat = [np.fromiter(itertools.chain.from_iterable(s[i] for s in steps), np.uint32,
                            int(offsets[-1])) for i in range(3)]
        return {"step_offsets": offsets, "step_context": flat[0], "step_reply": flat[1],
                "step_end": flat[2]}
