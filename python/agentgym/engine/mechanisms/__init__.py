"""Agent mechanisms: each one module holding its behaviour and its per-episode state, the
turn loop calling its hooks (:mod:`agentgym.engine.mechanisms.base`).

:data:`MECHANISMS` is the one registration: a new mechanism is one module here and one
entry in that list (docs/mechanisms.md, "Writing a mechanism").
"""

from __future__ import annotations

from typing import Any

from agentgym.engine.mechanisms.base import HOOKS, Mechanism
from agentgym.engine.mechanisms.branching import Branching
from agentgym.engine.mechanisms.context_window import ContextWindow
from agentgym.engine.mechanisms.planning import Planning
from agentgym.engine.mechanisms.reflection import Reflection
from agentgym.engine.mechanisms.undo import Undo
from agentgym.engine.mechanisms.vision import Vision

__all__ = ["HOOKS", "MECHANISMS", "Mechanism", "configured", "driver_needs", "mechanisms_for",
           "registered"]

#: Every mechanism, in the order the loop calls their hooks.
MECHANISMS: list[type[Mechanism]] = [Undo, Reflection, Branching, Planning, ContextWindow,
                                     Vision]


def registered() -> list[type[Mechanism]]:
    """Every registered mechanism, in hook order."""
    return MECHANISMS


def configured(cfg) -> list[str]:
    """The names of the mechanisms ``cfg`` switches on (the config fields that do)."""
    return [cls.name for cls in MECHANISMS if cls.configured(cfg)]


def driver_needs(cfg) -> dict[str, Any]:
    """What the env driver must be built with for the mechanisms ``cfg`` switches on."""
    needs: dict[str, Any] = {}
    for cls in MECHANISMS:
        if cls.configured(cfg):
            needs.update(cls.driver_needs(cfg))
    return needs


def mechanisms_for(cfg, driver) -> list[type[Mechanism]]:
    """The mechanisms a run of ``cfg`` on ``driver`` plays with; a clear error where one
    cannot play the env's pictures."""
    wanted = [cls for cls in MECHANISMS if cls.wanted(cfg, driver)]
    if getattr(driver, "has_frames", False):
        on = [cls.name for cls in wanted if not cls.with_images]
        if on:
            raise ValueError(f"{', '.join(on)} cannot be played with image observations yet "
                             f"({driver.env_id} was built with obs='image' or 'both')")
    return wanted
