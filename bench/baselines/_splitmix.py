"""SplitMix64 in pure Python, bit-identical to ``rust/core/src/util/splitmix.rs``."""

from __future__ import annotations

M64 = 0xFFFFFFFFFFFFFFFF
GOLDEN = 0x9E3779B97F4A7C15
ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
STRIP = " \t\n\r\x0c."


def mix(z: int) -> int:
    """The SplitMix64 output function."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def derive(*parts: int) -> int:
    """A seed derived from several integers (same fold as the Rust ``derive``)."""
    h = 0x6A09E667F3BCC908
    for p in parts:
        h = (mix(h ^ (p & M64)) + GOLDEN) & M64
    return h


class SplitMix64:
    """SplitMix64 generator state."""

    __slots__ = ("state",)

    def __init__(self, seed: int):
        self.state = seed & M64

    def next_u64(self) -> int:
        self.state = (self.state + GOLDEN) & M64
        return mix(self.state)

    def below(self, n: int) -> int:
        """A number in ``range(n)`` (multiply-shift)."""
        return (self.next_u64() * n) >> 64
