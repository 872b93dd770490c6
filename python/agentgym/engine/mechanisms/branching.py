"""Branched groups (``RolloutConfig.branch_at``): each group is played as trees. The
samples of a group go in runs of ``branch_width`` (sample indices ``k * width ... k * width
+ width - 1``); the first of a run plays alone until it has played ``branch_at`` turns (or,
with ``branch_entropy``, until the first turn whose reply's mean surprisal reaches it), then
forks: the driver copies its env into its siblings' slots, the trajectory store copies its
record (the copies' prefix has loss mask 0), and each sibling plays on from there. An
episode that ends before the fork leaves its siblings to play from the start.
docs/mechanisms.md has the rules and why.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from agentgym.engine.episode import Episode
from agentgym.engine.mechanisms.base import Mechanism

log = logging.getLogger(__name__)


class Branching(Mechanism):
    """Forks each tree's root into its siblings (see the module docs); its units of work
    are trees (:class:`TreePlay`)."""

    name = "branch_at"
    default_count, aliases = 2, ("branching",)

    @classmethod
    def driver_needs(cls, cfg) -> dict[str, Any]:
        return {"forks": True}

    def __init__(self, loop):
        super().__init__(loop)
        #: Each tree root's unstarted siblings, until it forks or ends, and the tasks of the
        #: children it forked into.
        self.siblings: dict[int, list[Episode]] = {}
        self.children: dict[int, list[asyncio.Future]] = {}

    def play_strategy(self) -> TreePlay:
        return TreePlay(self)

    def forks_now(self, ep: Episode, fork_at: int, logprobs) -> bool:
        """Whether tree root ``ep`` forks after the turn just played: at ``fork_at`` turns,
        or earlier where the reply's mean surprisal reaches ``branch_entropy``."""
        if ep.turns >= fork_at:
            return True
        limit = self.cfg.branch_entropy
        return limit is not None and bool(logprobs) and -sum(logprobs) / len(logprobs) >= limit

    async def after_turn(self, ep: Episode, logprobs) -> None:
        fork_at = ep.state.get("branch_at")
        if fork_at and self.forks_now(ep, fork_at, logprobs):
            await self.fork(ep)

    async def fork(self, root: Episode) -> None:
        """Fork running tree root ``root`` into its siblings' slots: the driver copies the
        env, the store copies the trajectory so far (the copies' loss mask 0), and each
        sibling plays on from there as its own coroutine. A fork the driver refuses ends
        those siblings with ``env_error``; the root plays on."""
        loop = self.loop
        root.state["branch_at"] = 0
        kids = self.siblings.pop(root.key, [])
        if not kids:
            return
        try:
            await loop.driver.fork(root.slot, [c.slot for c in kids])
        except Exception as e:  # e.g. a Python env whose snapshot() raised
            log.warning("episode %d could not fork: %r", root.key, e)
            failure = f"fork failed: {type(e).__name__}: {e}"
            self.children[root.key] = [asyncio.ensure_future(
                loop.run_episode(c, play=_failing(failure))) for c in kids]
            return
        loop.store.fork(root.key, [c.key for c in kids], [c.sample_index for c in kids])
        for c in kids:
            c.ids = list(root.ids)
            c.prompt_len, c.turns, c.side_turns = root.prompt_len, root.turns, root.side_turns
            c.cut_turns = root.cut_turns
            c.t0, c.gen_s, c.policy_version = root.t0, root.gen_s, root.policy_version
            c.version_pos, c.version_at = list(root.version_pos), list(root.version_at)
            c.max_turns = root.max_turns
            if loop.pool is None:  # a native pool copied its counts with the episode record
                c.invalid_turns = root.invalid_turns
            for hook in loop.forked:
                hook(root, c)
        self.children[root.key] = [asyncio.ensure_future(
            loop.run_episode(c, play=loop.attempt, begun=True)) for c in kids]

    async def run_tree(self, eps: list[Episode], slots: Sequence[int]) -> list:
        """Play one tree (``eps[0]`` its root, the rest its siblings, ``slots`` theirs):
        the root until it forks, then every child concurrently; where the root ended before
        forking, its siblings play from the start."""
        loop = self.loop
        for e, slot in zip(eps, slots):
            e.slot = slot
        root, rest = eps[0], eps[1:]
        if rest:
            root.state["branch_at"] = self.cfg.branch_at
            self.siblings[root.key] = rest
        try:
            first = await loop.run_episode(root)
            tasks = self.children.pop(root.key, None)
            if tasks is None:  # no fork: the siblings are independent samples
                unforked = self.siblings.pop(root.key, [])
                tasks = [asyncio.ensure_future(loop.run_episode(c)) for c in unforked]
            return [first, *await asyncio.gather(*tasks)]
        finally:
            self.siblings.pop(root.key, None)
            for t in self.children.pop(root.key, ()):
                t.cancel()


def _by_sample(tree: list[Episode]) -> list[Episode]:
    return sorted(tree, key=lambda e: e.sample_index)


class TreeBuilder:
    """Trees of branched groups from episodes in any order: the samples ``k * width ...
    k * width + width - 1`` of one group, by sample index. A tree is handed out once its
    ``width`` samples have arrived; :meth:`rest` gives the incomplete ones (a feed that
    ended, or a request list that holds part of a tree)."""

    def __init__(self, width: int):
        self.width = width
        self.open: dict[tuple[int, int], list[Episode]] = {}

    def add(self, ep: Episode) -> list[Episode] | None:
        key = (ep.group_id, ep.sample_index // self.width)
        tree = self.open.setdefault(key, [])
        tree.append(ep)
        if len(tree) < self.width:
            return None
        del self.open[key]
        return _by_sample(tree)

    def rest(self) -> list[list[Episode]]:
        out = [_by_sample(t) for t in self.open.values()]
        self.open.clear()
        return out


class TreePlay:
    """Branched groups' play strategy: a unit is one tree, ``branch_width`` slots."""

    per_request = 1

    def __init__(self, branching: Branching):
        self.branching = branching
        self.width = branching.cfg.branch_width

    def units(self, eps: list[Episode]) -> list[list[Episode]]:
        """A request list as trees: the complete ones in the order they complete, then the
        incomplete ones."""
        builder = self.builder()
        return [t for ep in eps if (t := builder.add(ep)) is not None] + builder.rest()

    def builder(self) -> TreeBuilder:
        return TreeBuilder(self.width)

    async def play(self, tree: list[Episode], slots: Sequence[int]) -> list:
        return await self.branching.run_tree(tree, slots)


def _failing(message: str):
    """A ``play`` for :meth:`TurnLoop.run_episode` that fails at once: the episode ends
    with ``env_error`` and ``message``."""

    async def play(ep: Episode) -> None:
        raise RuntimeError(message)

    return play
