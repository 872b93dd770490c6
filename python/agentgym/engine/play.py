"""Play strategies: how one ``stream`` call's units of work are played.

A strategy is chosen once per run (:meth:`TurnLoop._strategy`): the episodes of a
multi-seat game (:class:`~agentgym.engine.selfplay.GamePlay`), a mechanism's own units
(:meth:`Mechanism.play_strategy <agentgym.engine.mechanisms.base.Mechanism.play_strategy>`), or one
episode per unit (:class:`EpisodePlay`). The engine's workers only ask a strategy for its
units and hand each one its slots.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from agentgym.data.trajectories import Trajectory
from agentgym.engine.episode import Episode

if TYPE_CHECKING:
    from agentgym.engine.turn_loop import TurnLoop


class UnitBuilder(Protocol):
    """Units from episodes that arrive one by one (an async request feed)."""

    def add(self, ep: Episode):
        """The unit ``ep`` completes, or None while it waits for others."""

    def rest(self) -> list:
        """The incomplete units, once the feed has ended."""


class PlayStrategy(Protocol):
    #: Driver slots one unit takes.
    width: int
    #: Trajectories one request gives (a game: one per seat).
    per_request: int

    def units(self, eps: list[Episode]) -> list:
        """A request list's units, in the order they are played."""

    def builder(self) -> UnitBuilder: ...

    async def play(self, unit, slots: Sequence[int]) -> list[Trajectory | None]:
        """Play ``unit`` on ``slots`` to its end; its trajectories (None each where the
        rows went to the batch sink)."""


class SingleUnits:
    """Each episode is a unit of its own."""

    @staticmethod
    def add(ep: Episode) -> Episode:
        return ep

    @staticmethod
    def rest() -> list:
        return []


class EpisodePlay:
    """One episode per unit, on one slot."""

    width = 1
    per_request = 1

    def __init__(self, loop: TurnLoop):
        self.loop = loop

    def units(self, eps: list[Episode]) -> list[Episode]:
        return eps

    def builder(self) -> SingleUnits:
        return SingleUnits()

    async def play(self, ep: Episode, slots: Sequence[int]) -> list[Trajectory | None]:
        ep.slot = slots[0]
        return [await self.loop.run_episode(ep)]
