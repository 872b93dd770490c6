"""The real simulators, BabyAI (``minigrid``) and ScienceWorld, as the registry holds them
(:mod:`agentgym.envs.registry`, their one registration).

Their ``"module:Class"`` entry points load nothing (and start no JVM) until an env is made.
The simulators come with the ``sims`` extra: ``pip install 'agentgym-rl[sims]'``
(ScienceWorld also needs Java >= 11).
"""

from __future__ import annotations

from agentgym.envs import registry

_IDS = ("babyai", "sciworld", "sciworld-agentgym")

#: env id -> (entry point, default kwargs, description)
SIMULATORS: dict[str, tuple[str, dict, str]] = {
    s.env_id: (s.entry_point, dict(s.kwargs), s.description)
    for s in registry._PYTHON if s.env_id in _IDS
}


def register_all(override: bool = False) -> None:
    """Register the simulator env ids as shipped (skips ids already registered unless
    ``override``)."""
    registry._reregister(_IDS, override)
