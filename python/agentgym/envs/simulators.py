"""Registry entries of the real simulators: BabyAI (``minigrid``) and ScienceWorld.

``register_all()`` registers the ids below by ``"module:Class"`` entry points, so nothing is
imported (and no JVM started) until an env is made. The simulators themselves come with the
``sims`` extra: ``pip install 'agentgym-rl[sims]'`` (ScienceWorld also needs Java >= 11).
"""

from __future__ import annotations

from agentgym.envs.registry import is_registered, register

#: env id -> (entry point, default kwargs, description)
SIMULATORS: dict[str, tuple[str, dict, str]] = {
    "babyai": (
        "agentgym.envs.babyai:BabyAIEnv",
        {},
        "BabyAI (minigrid): AgentGym's 40 levels, text view of the grid, go-to/pickup actions",
    ),
    "sciworld": (
        "agentgym.envs.sciworld:SciWorldEnv",
        {},
        "ScienceWorld: 30 science task families x variations (real simulator, needs Java)",
    ),
    "sciworld-agentgym": (
        "agentgym.envs.sciworld:SciWorldEnv",
        {"tasks": "agentgym"},
        "ScienceWorld with AgentGym's 23 task families (task index = AgentGym's data_idx)",
    ),
}


def register_all(override: bool = False) -> None:
    """Register the simulator env ids (skips ids already registered unless ``override``)."""
    for env_id, (entry, defaults, description) in SIMULATORS.items():
        if is_registered(env_id) and not override:
            continue
        register(env_id, entry, description=description, override=override, **defaults)
