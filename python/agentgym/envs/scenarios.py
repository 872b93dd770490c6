"""The business-scenario envs written in Python (the announcement's), as the registry holds
them (:mod:`agentgym.envs.registry`, their one registration).

``SCENARIOS`` maps each id to its ``("module:Class", description)``; ``register_all()``
registers them again (e.g. after a test overrode one). Constructor keyword arguments (e.g.
``split="test"``) pass through ``agentgym.make(id, **kwargs)``.
"""

from __future__ import annotations

from agentgym.envs import registry

_IDS = ("code_debug", "ecommerce_service", "office", "project_planning")

SCENARIOS: dict[str, tuple[str, str]] = {
    s.env_id: (s.entry_point, s.description) for s in registry._PYTHON if s.env_id in _IDS
}


def register_all(override: bool = False) -> list[str]:
    """Register the scenario envs as shipped; ids already registered are kept unless
    ``override``. Returns the ids registered."""
    return registry._reregister(_IDS, override)
