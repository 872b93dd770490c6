"""Registration of the business-scenario envs written in Python (the announcement's).

``register_all()`` registers each id with a ``"module:Class"`` entry point, so importing the
registry stays cheap and a scenario's module loads on its first ``make``. Constructor keyword
arguments (e.g. ``split="test"``) pass through ``agentgym.make(id, **kwargs)``.
"""

from __future__ import annotations

from agentgym.envs.registry import list_envs, register

SCENARIOS: dict[str, tuple[str, str]] = {
    "code_debug": (
        "agentgym.envs.code_debug:CodeDebugEnv",
        "Fix a buggy Python function so its unit tests pass (sandboxed test runs).",
    ),
    "ecommerce_service": (
        "agentgym.envs.ecommerce_service:ECommerceServiceEnv",
        "Customer service for an online shop: classify, look up orders, apply the policy.",
    ),
    "office": (
        "agentgym.envs.office:OfficeEnv",
        "Meeting notes to to-dos with owners and deadlines.",
    ),
    "project_planning": (
        "agentgym.envs.project_planning:ProjectPlanningEnv",
        "Schedule a project's tasks under dependencies and earliest dates; finish early.",
    ),
}


def register_all(override: bool = False) -> list[str]:
    """Register the scenario envs; ids already registered are kept unless ``override``."""
    known = set(list_envs())
    done = []
    for env_id, (entry_point, description) in SCENARIOS.items():
        if env_id in known and not override:
            continue
        register(env_id, entry_point, description=description, override=override)
        done.append(env_id)
    return done
