"""Pure-Python clean-room baseline of the native ``maze`` env (``rust/core/src/envs/maze/``).

Same layouts (SplitMix64), same texts and rewards, bit for bit; used by ``bench/`` to
measure the native env against plain Python and by the tests as an independent reference.
"""

from __future__ import annotations

from collections import deque

from bench.baselines._splitmix import ASCII_LOWER, STRIP, SplitMix64, derive

SALT = 0x6D617A65
DIRS = ("north", "south", "east", "west")
TITLES = ("North", "South", "East", "West")
_PARSE = {d: i for i, d in enumerate(DIRS)} | {d[0]: i for i, d in enumerate(DIRS)}
PRESETS = {"easy": 4, "medium": 6, "hard": 9}


def parse_direction(action: str) -> int | None:
    """Direction index of ``move north`` / ``go n`` / ``North.`` ..., else None."""
    s = action.strip(STRIP).translate(ASCII_LOWER)
    for prefix in ("move ", "go "):
        if s.startswith(prefix):
            s = s[len(prefix) :].lstrip(" ")
            break
    return _PARSE.get(s)


class Env:
    """A grid maze; ``open[c]`` has bit ``d`` set where side ``d`` of cell ``c`` is open."""

    def __init__(
        self,
        width: int,
        height: int,
        loops: int = 0,
        goal_hint: bool = False,
        signpost: bool = False,
        show_position: bool = True,
        shaping: float = 0.0,
        split: str = "train",
    ):
        self.w, self.h, self.loops = width, height, loops
        self.goal_hint, self.show_position, self.shaping = goal_hint, show_position, shaping
        self.signpost = signpost
        self.split = {"train": 0, "test": 1}[split]
        self.open: list[int] = []
        self.start = self.goal = self.pos = 0
        self.to_goal: list[int] = []
        self.done = True

    def neighbor(self, c: int, d: int) -> int | None:
        w = self.w
        x, y = c % w, c // w
        if d == 0:
            return c - w if y > 0 else None
        if d == 1:
            return c + w if y + 1 < self.h else None
        if d == 2:
            return c + 1 if x + 1 < w else None
        return c - 1 if x > 0 else None

    def carve(self, c: int, d: int) -> None:
        self.open[c] |= 1 << d
        self.open[self.neighbor(c, d)] |= 1 << (d ^ 1)

    def distances(self, src: int) -> list[int]:
        dist = [-1] * len(self.open)
        dist[src] = 0
        q = deque([src])
        while q:
            c = q.popleft()
            for d in range(4):
                if self.open[c] >> d & 1:
                    n = self.neighbor(c, d)
                    if dist[n] < 0:
                        dist[n] = dist[c] + 1
                        q.append(n)
        return dist

    def generate(self, key: int) -> None:
        n = self.w * self.h
        self.open = [0] * n
        rng = SplitMix64(key)
        visited = [False] * n
        first = rng.below(n)
        visited[first] = True
        stack = [first]
        while stack:
            c = stack[-1]
            options = [
                d for d in range(4) if (nb := self.neighbor(c, d)) is not None and not visited[nb]
            ]
            if not options:
                stack.pop()
                continue
            d = options[rng.below(len(options))]
            self.carve(c, d)
            nb = self.neighbor(c, d)
            visited[nb] = True
            stack.append(nb)
        for _ in range(self.loops):
            c = rng.below(n)
            d = rng.below(4)
            if self.neighbor(c, d) is not None:
                self.carve(c, d)
        self.start = rng.below(n)
        dist = self.distances(self.start)
        threshold = max(1, (max(dist) + 1) // 2)
        candidates = [c for c in range(n) if dist[c] >= threshold]
        self.goal = candidates[rng.below(len(candidates))]

    def describe(self) -> str:
        w, pos, parts = self.w, self.pos, []
        if self.show_position:
            parts.append(f" Position: row {pos // w + 1}, column {pos % w + 1}.")
        for d in range(4):
            if not self.open[pos] >> d & 1:
                what = "wall"
            elif self.neighbor(pos, d) == self.goal:
                what = "goal"
            elif self.signpost and self.to_goal[self.neighbor(pos, d)] + 1 == self.to_goal[pos]:
                what = "closer"
            else:
                what = "open"
            parts.append(f" {TITLES[d]}: {what}.")
        if self.goal_hint:
            dy, dx = self.goal // w - pos // w, self.goal % w - pos % w
            hint = " Goal:"
            if dy:
                hint += f" {abs(dy)} {'north' if dy < 0 else 'south'}"
            if dx:
                hint += f"{',' if dy else ''} {abs(dx)} {'west' if dx < 0 else 'east'}"
            parts.append(hint + ".")
        return "".join(parts)

    def reset(self, task: int, seed: int = 0) -> str:
        self.generate(derive(SALT, self.w, self.h, self.loops, self.split, task))
        self.to_goal = self.distances(self.goal)
        self.pos = self.start
        self.done = False
        return f"You are in a {self.w}x{self.h} maze. Find the goal." + self.describe()

    def step(self, action: str) -> tuple[str, float, bool]:
        if self.done:
            return "The episode is over.", 0.0, True
        d = parse_direction(action)
        if d is None:
            return (
                "Invalid action. Use move north, move south, move east or move west."
                + self.describe(),
                0.0,
                False,
            )
        if not self.open[self.pos] >> d & 1:
            return f"Blocked: wall to the {DIRS[d]}." + self.describe(), 0.0, False
        before = self.to_goal[self.pos]
        self.pos = self.neighbor(self.pos, d)
        if self.pos == self.goal:
            self.done = True
            return f"Moved {DIRS[d]}. You reached the goal!", 1.0, True
        reward = self.shaping * (before - self.to_goal[self.pos])
        return f"Moved {DIRS[d]}." + self.describe(), reward, False

    def valid_actions(self) -> list[str]:
        if self.done:
            return []
        return [f"move {DIRS[d]}" for d in range(4) if self.open[self.pos] >> d & 1]


def make(
    difficulty: str = "medium",
    size: int | None = None,
    width: int | None = None,
    height: int | None = None,
    **kwargs,
) -> Env:
    """Same kwargs and defaults as the native ``maze``."""
    side = PRESETS[difficulty] if size is None else size
    return Env(side if width is None else width, side if height is None else height, **kwargs)
