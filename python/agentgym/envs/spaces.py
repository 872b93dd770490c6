"""Text spaces for Gymnasium: observations and actions are free text."""

from __future__ import annotations

import string

import numpy as np
from gymnasium import spaces

_PRINTABLE = frozenset(string.printable)


class TextSpace(spaces.Text):
    """A ``gymnasium.spaces.Text`` that contains any ``str`` up to ``max_length`` characters.

    Gymnasium's ``Text`` only contains strings over its character set; environment text
    (newlines, punctuation, any Unicode a server returns) is open-ended, so membership here is
    by type and length, and sampling draws from printable ASCII.
    """

    def __init__(self, max_length: int = 65536, *, seed: int | np.random.Generator | None = None):
        super().__init__(max_length=max_length, min_length=0, charset=string.printable, seed=seed)

    def contains(self, x) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"TextSpace(max_length={self.max_length})"
