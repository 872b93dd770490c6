"""The native ``tictactoe`` and ``kuhn_poker`` against OpenSpiel's ``tic_tac_toe`` and
``kuhn_poker`` (PyPI ``open-spiel``, ``pyspiel``): the same moves played through both must
end the same way (each seat's return, the winner, the move that ends the game), as
``tests/integrations/test_textarena.py`` checks against TextArena.

How the two are matched, as this file pins it:

* Seats: our seat ``s`` is OpenSpiel's player ``s`` in both games (seat 0 moves first).
* Tic-tac-toe cells: ours are ``"1"``..``"9"``, OpenSpiel's actions 0-8
  (``action_to_string``: ``x(row,col)``), our cell ``n`` is its action ``n - 1``. Its
  player 0 plays ``x`` as our seat 0 plays ``X``. OpenSpiel has no openings: our tasks 1-81
  are reached there by playing the opening's marks as moves.
* Kuhn poker actions: OpenSpiel has two, ``Pass`` (0) and ``Bet`` (1); ours are four words.
  ``check`` and ``fold`` are its ``Pass``, ``bet`` and ``call`` its ``Bet``.
* Kuhn poker deals: ours are the task (``DEALS``: seat 0's card, seat 1's card; 0 Jack,
  1 Queen, 2 King); OpenSpiel deals by two chance nodes, player 0's card then player 1's,
  each outcome being the card, so a deal is played there by applying its two cards.
* Returns of a finished game: equal. Tic-tac-toe +1 / -1 or 0 / 0; Kuhn poker the chips won
  or lost (+-1, +-2 after a called bet) in both.
* Illegal moves: ours end the game at once, -1 for the mover and 0 for the other seat.
  OpenSpiel has no such rule: a move outside ``legal_actions`` is the caller's error
  (tic-tac-toe raises ``SpielError`` on a taken cell), and every Kuhn poker decision has
  both of its actions legal (our ``call`` with no bet is its ``Bet``).
"""

import random
import warnings

import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    pyspiel = pytest.importorskip("pyspiel")

from agentgym import _core  # noqa: E402
from tests.integrations.native_games import (  # noqa: E402
    BETTINGS,
    DEALS,
    opening,
    oracle_for,
    our_board,
    our_card,
    random_move,
)

# --- tic-tac-toe -------------------------------------------------------------------------


def os_cell(cell: str) -> int:
    """Our cell ``"1"``..``"9"`` as OpenSpiel's action (0-based)."""
    return int(cell) - 1






def os_board(state) -> list[str]:
    """OpenSpiel's board (``str(state)``: ``x``, ``o``, ``.``) in our notation."""
    cells = "".join(str(state).split())
    return [{"x": "X", "o": "O"}.get(c, str(i + 1)) for i, c in enumerate(cells)]


def play_tictactoe(task: int, seed: int, choose) -> tuple[list[str], list[float], list[float]]:
    """One game through both, ``choose(game, seat)`` picking our move; checks at every step
    that both agree on the player to move, the legal moves, the board and whether the game
    is over. Returns the moves (opening included), our rewards and OpenSpiel's returns."""
    game = _core.Game("tictactoe")
    game.reset(task, seed)
    state = pyspiel.load_game("tic_tac_toe").new_initial_state()
    moves = opening(task)
    for move in moves:
        state.apply_action(os_cell(move))
    assert not state.is_terminal()
    assert os_board(state) == our_board(game), f"task {task}: opening {moves}"
    while not game.over:
        (seat,) = game.to_move()
        assert state.current_player() == seat, moves
        assert [os_cell(c) for c in game.valid_actions(seat)] == state.legal_actions(seat)
        move = choose(game, seat)
        assert state.action_to_string(seat, os_cell(move)) == \
            f"{'xo'[seat]}({os_cell(move) // 3},{os_cell(move) % 3})"
        refused, over = game.step([move])
        state.apply_action(os_cell(move))
        moves.append(move)
        assert refused == [False]
        assert over == state.is_terminal(), moves
        assert os_board(state) == our_board(game), moves
    return moves, game.rewards(), list(state.returns())






def winner(returns) -> int | None:
    """The seat with the higher return (None: a draw)."""
    return None if returns[0] == returns[1] else int(returns[1] > returns[0])


def assert_same_tictactoe_outcome(moves, ours, theirs):
    """A finished legal game: the same returns (+1 / -1, or 0 / 0 for a draw), so the same
    winner."""
    assert sorted(ours) in ([-1.0, 1.0], [0.0, 0.0]), (moves, ours)
    assert ours == theirs, (moves, ours, theirs)
    assert winner(ours) == winner(theirs)


def test_random_games_from_the_empty_board_end_the_same():
    outcomes: dict = {}
    lengths = set()
    for seed in range(400):
        moves, ours, theirs = play_tictactoe(0, seed, random_move(random.Random(seed)))
        assert_same_tictactoe_outcome(moves, ours, theirs)
        outcomes[tuple(ours)] = outcomes.get(tuple(ours), 0) + 1
        lengths.add(len(moves))
    # X wins, O wins and draws all occur, and games of every length from 5 to 9 moves.
    assert set(outcomes) == {(1.0, -1.0), (-1.0, 1.0), (0.0, 0.0)}, outcomes
    assert lengths == {5, 6, 7, 8, 9}, lengths


@pytest.mark.parametrize("oracle_seat", [0, 1])
def test_the_solver_against_random_ends_the_same(oracle_seat):
    for seed in range(60):
        rng = random.Random(1000 + seed)
        moves, ours, theirs = play_tictactoe(0, seed, oracle_for(oracle_seat, rng))
        assert_same_tictactoe_outcome(moves, ours, theirs)
        assert theirs[oracle_seat] >= 0, moves  # the empty board is a draw with perfect play


def test_solver_self_play_is_a_draw_in_both():
    for seed in range(20):
        moves, ours, theirs = play_tictactoe(0, seed, lambda game, seat: game.oracle_action(seat))
        assert ours == theirs == [0.0, 0.0], moves


def test_every_opening_played_as_moves_ends_the_same():
    """Tasks 1-81 start from an opening; OpenSpiel's board starts empty, so the opening's
    marks are played as moves there (``play_tictactoe`` checks the two boards agree)."""
    for task in range(82):
        for seed in range(3):
            rng = random.Random(task * 10 + seed)
            choose = random_move(rng) if seed else oracle_for(task % 2, rng)
            moves, ours, theirs = play_tictactoe(task, seed, choose)
            assert_same_tictactoe_outcome(moves, ours, theirs)


def test_a_taken_cell_ends_ours_and_is_an_error_in_openspiel():
    game = _core.Game("tictactoe")
    game.reset(0, 0)
    assert game.step(["5"]) == ([False], False)
    assert game.step(["5"]) == ([True], True)
    assert game.rewards() == [0.0, -1.0]
    state = pyspiel.load_game("tic_tac_toe").new_initial_state()
    state.apply_action(os_cell("5"))
    assert os_cell("5") not in state.legal_actions()
    with pytest.raises(pyspiel.SpielError):
        state.apply_action(os_cell("5"))


# --- Kuhn poker --------------------------------------------------------------------------

# Our tasks' deals (rust/core/src/games/kuhn_poker/mod.rs, DEALS): (seat 0's card, seat
# 1's card), 0 = Jack, 1 = Queen, 2 = King (OpenSpiel numbers its cards the same way).
#: Our words as OpenSpiel's actions: Pass (0), Bet (1).
OS_ACTION = {"check": 0, "fold": 0, "bet": 1, "call": 1}
OS_NAME = {0: "Pass", 1: "Bet"}




def os_kuhn(deal: tuple[int, int]):
    """OpenSpiel's Kuhn poker with ``deal`` dealt: its two chance nodes (player 0's card,
    then player 1's) given those cards."""
    state = pyspiel.load_game("kuhn_poker").new_initial_state()
    for card in deal:
        assert state.is_chance_node()
        assert card in [a for a, _ in state.chance_outcomes()]
        state.apply_action(card)
    assert not state.is_chance_node()
    return state


def play_kuhn(task: int, seed: int, choose) -> tuple[list[str], list[float], list[float]]:
    """One hand through both on our task ``task``'s deal, ``choose(game, seat, played)``
    picking our word (``played``: the words so far); checks at every step that both agree
    on the player to move, each seat's card, the legal actions and whether the hand is
    over. Returns the words, our rewards and OpenSpiel's returns."""
    game = _core.Game("kuhn_poker")
    game.reset(task, seed)
    deal = DEALS[task % 6]
    assert (our_card(game, 0), our_card(game, 1)) == deal
    state = os_kuhn(deal)
    moves: list[str] = []
    while not game.over:
        (seat,) = game.to_move()
        assert state.current_player() == seat, moves
        # OpenSpiel's information state of a seat opens with its own card.
        assert state.information_state_string(seat)[0] == str(our_card(game, seat))
        legal = game.valid_actions(seat)
        assert sorted(OS_ACTION[w] for w in legal) == state.legal_actions(seat), moves
        move = choose(game, seat, moves)
        assert state.action_to_string(seat, OS_ACTION[move]) == OS_NAME[OS_ACTION[move]]
        refused, over = game.step([move])
        state.apply_action(OS_ACTION[move])
        moves.append(move)
        assert refused == [False]
        assert over == state.is_terminal(), moves
    return moves, game.rewards(), list(state.returns())


def assert_same_kuhn_outcome(deal, moves, ours, theirs):
    """A finished legal hand: the same chips won and lost (zero-sum, 2 after a called bet,
    else 1), so the same winner: the player who did not fold, or at a showdown the higher
    card (one hand is never a tie)."""
    assert ours == theirs, (deal, moves, ours, theirs)
    assert ours[0] == -ours[1] and abs(ours[0]) == (2 if moves[-1] == "call" else 1), moves
    folder = (len(moves) - 1) % 2 if moves[-1] == "fold" else None
    expected = 1 - folder if folder is not None else int(deal[1] > deal[0])
    assert winner(ours) == winner(theirs) == expected, (deal, moves, ours)


def equilibrium_for(seats, rng: random.Random):
    """A chooser for :func:`play_kuhn`: our equilibrium player (``oracle_action``) on
    ``seats`` (0, 1, ``"both"`` or ``"none"``), uniformly random legal words elsewhere."""
    def choose(game, seat, played):
        if seats == "both" or seat == seats:
            return game.oracle_action(seat)
        return rng.choice(game.valid_actions(seat))

    return choose


@pytest.mark.parametrize("task", range(6))
@pytest.mark.parametrize("betting", BETTINGS, ids="-".join)
def test_every_betting_on_every_deal_wins_the_same_chips(task, betting):
    moves, ours, theirs = play_kuhn(task, 0, lambda game, seat, played: betting[len(played)])
    assert moves == betting
    assert_same_kuhn_outcome(DEALS[task], moves, ours, theirs)


def test_random_hands_on_random_deals_end_the_same():
    seen = set()
    for seed in range(600):
        rng = random.Random(seed)
        task = rng.randrange(6)
        moves, ours, theirs = play_kuhn(task, seed, equilibrium_for("none", rng))
        assert_same_kuhn_outcome(DEALS[task], moves, ours, theirs)
        seen.add((task, tuple(moves)))
    assert len(seen) == 6 * len(BETTINGS)  # every betting on every deal came up


@pytest.mark.parametrize("oracle_seats", [0, 1, "both"])
def test_the_equilibrium_player_ends_the_same(oracle_seats):
    """Our scripted equilibrium player against a random one, or against itself."""
    for seed in range(120):
        task = seed % 6
        choose = equilibrium_for(oracle_seats, random.Random(5000 + seed))
        moves, ours, theirs = play_kuhn(task, seed, choose)
        assert_same_kuhn_outcome(DEALS[task], moves, ours, theirs)


def test_an_illegal_word_ends_ours_while_openspiel_has_only_legal_actions():
    # Ours: "call" with no bet ends the hand, -1 for the mover and 0 for the other seat.
    game = _core.Game("kuhn_poker")
    game.reset(0, 0)
    assert game.step(["call"]) == ([True], True)
    assert game.rewards() == [-1.0, 0.0]
    # OpenSpiel: every decision offers both Pass and Bet; "call" would be its legal Bet.
    state = os_kuhn(DEALS[0])
    assert state.legal_actions() == [0, 1]
    state.apply_action(OS_ACTION["call"])
    assert not state.is_terminal() and state.current_player() == 1
