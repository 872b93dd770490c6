"""The native ``tictactoe`` and ``kuhn_poker`` as the comparison tests against other
libraries' games read them (tests/integrations/test_textarena.py, test_openspiel_native.py):
task openings as moves, the board and a seat's card read from the observations, and the
move choosers both sides play."""

from __future__ import annotations

import random
import re


def opening(task: int) -> list[str]:
    """The marks of our task ``task`` (envs/tictactoe/README.md, Tasks) as moves: X's, then
    O's."""
    task %= 82
    if task == 0:
        return []
    if task <= 9:
        return [str(task)]
    x = (task - 10) // 8 + 1
    others = [c for c in range(1, 10) if c != x]
    return [str(x), str(others[(task - 10) % 8])]


def our_board(game) -> list[str]:
    """Our board, cell by cell: ``X``, ``O`` or the free cell's number."""
    rows = game.observation(0).splitlines()[:3]
    return [c.strip() for row in rows for c in row.split("|")]


def random_move(rng: random.Random):
    """A chooser ``(game, seat) -> move``: a uniformly random valid move."""
    return lambda game, seat: rng.choice(game.valid_actions(seat))


def oracle_for(oracle_seat: int, rng: random.Random):
    """A chooser: the game's oracle on ``oracle_seat``, a random valid move elsewhere."""
    def choose(game, seat):
        if seat == oracle_seat:
            return game.oracle_action(seat)
        return rng.choice(game.valid_actions(seat))

    return choose


#: Kuhn poker: every deal (seat 0's card, seat 1's card), the card names, every betting.
DEALS = [(0, 1), (0, 2), (1, 0), (1, 2), (2, 0), (2, 1)]
CARD_NAMES = {"Jack": 0, "Queen": 1, "King": 2}
BETTINGS = [
    ["check", "check"],
    ["check", "bet", "call"],
    ["check", "bet", "fold"],
    ["bet", "call"],
    ["bet", "fold"],
]


def our_card(game, seat: int) -> int:
    """The card our ``seat`` holds, read from its observation."""
    name = re.match(r"Your card: the (\w+)\.", game.observation(seat)).group(1)
    return CARD_NAMES[name]
