"""``KEY=VALUE`` option values (``--env-kwarg``, ``--set``) shared by ``train`` and ``eval``."""

from __future__ import annotations

import argparse
import json
from typing import Any


def parse_key_values(items: list[str] | None) -> dict[str, Any]:
    """``["a=1", "b=x"]`` -> ``{"a": 1, "b": "x"}``: each value is read as JSON, or kept as the
    string when it is not JSON; an item without ``=`` is an ``ArgumentTypeError``."""
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, val = item.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {item!r}")
        try:
            out[key] = json.loads(val)
        except json.JSONDecodeError:
            out[key] = val
    return out
