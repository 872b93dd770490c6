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
from agentgym.engine.mechanisms.valid_action_decoding import ValidActionDecoding
from agentgym.engine.mechanisms.vision import Vision

__all__ = ["HOOKS", "MECHANISMS", "Mechanism", "configured", "driver_needs", "mechanisms_for",
           "registered", "settings"]

#: Every mechanism, in the order the loop calls their hooks.
MECHANISMS: list[type[Mechanism]] = [Undo, Reflection, Branching, Planning, ContextWindow,
                                     Vision, ValidActionDecoding]


def registered() -> list[type[Mechanism]]:
    """Every registered mechanism, in hook order."""
    return MECHANISMS


def settings(mechanisms: Any) -> dict[str, Any]:
    """The :class:`~agentgym.engine.RolloutConfig` fields that switch ``mechanisms`` on:
    names (``["undo", "reflection"]``) or names with a count (``{"undo": 2,
    "reflection": 1}``). A ``ValueError`` names an unknown mechanism."""
    if not mechanisms:
        return {}
    by_name = {n: cls for cls in registered() if cls.default_count is not None
               for n in (cls.name, *cls.aliases)}
    items = mechanisms.items() if isinstance(mechanisms, dict) else \
        [(m, None) for m in ([mechanisms] if isinstance(mechanisms, str) else mechanisms)]
    out: dict[str, Any] = {}
    for name, count in items:
        cls = by_name.get(name)
        if cls is None:
            names = [c.name for c in registered() if c.default_count is not None]
            raise ValueError(f"unknown mechanism {name!r}; expected one of {', '.join(names)}")
        n = cls.default_count if count is None else int(count)
        if cls.count_field is None:
            out[cls.name] = n
        else:
            out.update({cls.name: True, cls.count_field: n})
    return out


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
