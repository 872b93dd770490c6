"""The action syntax of the business-scenario envs (``office``, ``project_planning``,
``ecommerce_service``): one command per turn, ``name`` or ``name[arguments]``."""

from __future__ import annotations

import re

_COMMAND = re.compile(r"^\s*([a-z_]+)\s*(?:\[(.*)\])?\s*$", re.S | re.I)

#: The observation for an action that is not a command (the step also sets ``info["invalid"]``).
BAD_FORMAT = "Invalid action format. Use name[arguments]."


def parse_command(action: str) -> tuple[str, str] | None:
    """``(name, argument)`` of ``action``: the name lower-cased, the text between the brackets
    stripped (``""`` without brackets); None when ``action`` is not a command."""
    m = _COMMAND.match(action)
    if not m:
        return None
    return m.group(1).lower(), (m.group(2) or "").strip()
