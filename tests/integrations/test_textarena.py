"""The native ``tictactoe`` and ``kuhn_poker`` against TextArena's ``TicTacToe-v0`` and
``KuhnPoker-v0`` (PyPI ``textarena``, 0.7.x): the same moves played through both must end
the same way (winner or draw, chips), and every difference between the two implementations
is asserted here and listed in ``envs/tictactoe/README.md`` and ``envs/kuhn_poker/README.md``
("TextArena").

The differences, as this file pins them:

* Actions: TextArena reads the first ``[...]`` in the text (``[4]``, ``[check]``; its
  default wrappers add the brackets when there are none); ours are bare (``5``, ``check``).
* Tic-tac-toe cells: TextArena numbers them 0-8, ours 1-9 (our cell n is its ``[n-1]``).
  Its first mover, player 0, plays ``O`` (player 1 plays ``X``); our first mover, seat 0,
  plays ``X``. Only the names differ: player 0 is seat 0. TextArena has no openings: our
  tasks 1-81 are reached there by playing the opening's marks as moves.
* Rewards of a finished legal game: both +1 / -1 for a tic-tac-toe win and 0 / 0 for a draw.
  Kuhn poker: ours are the chips won or lost in the hand (+-1, or +-2 after a called bet);
  TextArena's are the sign of its chips (+1 / -1; the chips are in its state). Its chips
  differ too: its pot never grows past the two antes (a bet or a call puts nothing in), so
  a called bet wins 1 chip there and 2 here; check-check and folds win 1 chip in both.
* Invalid moves: ours end the game at once, -1 for the mover and 0 for the other seat.
  TextArena gives the mover one retry (nothing changes, same player to move); a second
  invalid move in a row ends the game, -1 for the mover and +1 for the other player.
* Kuhn poker rounds: ``KuhnPoker-v0`` plays 3 hands (``max_rounds=3``) with the first player
  alternating and rewards the sign of the chip total; ours is one hand. ``max_rounds=1``
  gives one hand, in which TextArena's player 1 acts first: our seat s is its player 1 - s.
* Kuhn poker deals: ours are the task (``DEALS``); TextArena shuffles with Python's global
  ``random`` module, which its ``reset(seed=...)`` reseeds. A deal is set up here by
  finding the seed that deals it to a fresh env.
"""

import random
import re
import warnings

import pytest

with warnings.catch_warnings():
    # The repo's pytest config turns warnings into errors; none of TextArena's own import
    # warnings (if a version emits any) are about this code.
    warnings.simplefilter("ignore")
    ta = pytest.importorskip("textarena")

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


@pytest.fixture(autouse=True)
def _keep_global_random():
    """TextArena's ``reset(seed=...)`` calls ``random.seed``: leave the global generator as it
    was for the other tests."""
    state = random.getstate()
    yield
    random.setstate(state)


# --- tic-tac-toe -------------------------------------------------------------------------


def ta_cell(cell: str) -> str:
    """Our cell ``"1"``..``"9"`` as TextArena's action (0-based, in brackets)."""
    return f"[{int(cell) - 1}]"






def ta_board(env) -> list[str]:
    """TextArena's board in our notation: its player 0 (``O`` there) is our X."""
    swap = {"O": "X", "X": "O"}
    board = env.state.game_state["board"]
    cells = [board[r][c] for r in range(3) for c in range(3)]
    return [swap[mark] if mark else str(i + 1) for i, mark in enumerate(cells)]


def new_ta_tictactoe(seed: int):
    env = ta.make("TicTacToe-v0-raw")
    env.reset(num_players=2, seed=seed)
    return env


def play_tictactoe(task: int, seed: int, choose) -> tuple[list[str], list[float], dict]:
    """One game through both, ``choose(game, seat)`` picking our move; checks at every step
    that both agree on the player to move, the board and whether the game is over. Returns
    the moves (opening included), our rewards and TextArena's."""
    game = _core.Game("tictactoe")
    game.reset(task, seed)
    env = new_ta_tictactoe(seed)
    moves = opening(task)
    for move in moves:
        done, _ = env.step(ta_cell(move))
        assert not done
    assert ta_board(env) == our_board(game), f"task {task}: opening {moves}"
    while not game.over:
        (seat,) = game.to_move()
        assert env.state.current_player_id == seat
        move = choose(game, seat)
        refused, over = game.step([move])
        done, _ = env.step(ta_cell(move))
        moves.append(move)
        assert refused == [False]
        assert done == over, moves
        assert ta_board(env) == our_board(game), moves
    ta_rewards, info = env.close()
    assert not any(info[p]["invalid_move"] for p in (0, 1))
    return moves, game.rewards(), ta_rewards






def assert_same_outcome(moves, ours, theirs):
    """A finished legal game: the same winner or draw and the same rewards (+1 / -1, 0 / 0
    for a draw), TextArena's player p being our seat p."""
    assert sorted(ours) in ([-1.0, 1.0], [0.0, 0.0]), (moves, ours)
    assert theirs == {0: ours[0], 1: ours[1]}, (moves, ours, theirs)


def test_random_games_from_the_empty_board_end_the_same():
    outcomes = {}
    for seed in range(300):
        moves, ours, theirs = play_tictactoe(0, seed, random_move(random.Random(seed)))
        assert_same_outcome(moves, ours, theirs)
        outcomes[tuple(ours)] = outcomes.get(tuple(ours), 0) + 1
    # All three results occur (X wins, O wins, draws), and games that fill the board.
    assert set(outcomes) == {(1.0, -1.0), (-1.0, 1.0), (0.0, 0.0)}, outcomes


@pytest.mark.parametrize("oracle_seat", [0, 1])
def test_the_solver_against_random_ends_the_same(oracle_seat):
    for seed in range(60):
        rng = random.Random(1000 + seed)
        moves, ours, theirs = play_tictactoe(0, seed, oracle_for(oracle_seat, rng))
        assert_same_outcome(moves, ours, theirs)
        assert ours[oracle_seat] >= 0, moves  # the empty board is a draw with perfect play


def test_solver_self_play_is_a_draw_in_both():
    for seed in range(20):
        moves, ours, theirs = play_tictactoe(0, seed, lambda game, seat: game.oracle_action(seat))
        assert ours == [0.0, 0.0] and theirs == {0: 0, 1: 0}, moves


def test_every_opening_played_as_moves_ends_the_same():
    """Tasks 1-81 start from an opening; TextArena's board starts empty, so the opening's
    marks are played as moves there (``play_tictactoe`` checks the two boards agree)."""
    for task in range(82):
        for seed in range(3):
            rng = random.Random(task * 10 + seed)
            choose = random_move(rng) if seed else oracle_for(task % 2, rng)
            moves, ours, theirs = play_tictactoe(task, seed, choose)
            assert_same_outcome(moves, ours, theirs)


def test_an_occupied_cell_ends_ours_and_gets_a_retry_in_textarena():
    # Ours: X takes 5, O answers 5 (taken): the game ends, -1 for O, 0 for X, nothing placed.
    game = _core.Game("tictactoe")
    game.reset(0, 0)
    assert game.step(["5"]) == ([False], False)
    assert game.step(["5"]) == ([True], True)
    assert game.rewards() == [0.0, -1.0]
    assert our_board(game) == ["1", "2", "3", "4", "X", "6", "7", "8", "9"]

    # TextArena: the first invalid move is refused with a warning to the mover, who moves
    # again; nothing is placed and nobody is penalized.
    env = new_ta_tictactoe(0)
    assert env.step("[4]") == (False, {})
    assert env.step("[4]") == (False, {})
    assert env.state.current_player_id == 1
    assert env.state.rewards is None
    assert ta_board(env) == ["1", "2", "3", "4", "X", "6", "7", "8", "9"]
    _, seen = env.get_observation()
    assert any("attempted an invalid move" in text for _, text, _ in seen)
    # ... and a second invalid move in a row ends it: -1 for the mover, +1 for the other.
    assert env.step("[4]") == (True, {})
    rewards, info = env.close()
    assert rewards == {0: 1, 1: -1}
    assert info[1]["invalid_move"] and not info[0]["invalid_move"]

    # One invalid move and then a legal one: TextArena's game goes on as if nothing happened.
    env = new_ta_tictactoe(0)
    for action in ["[4]", "[4]", "[0]"]:
        assert env.step(action) == (False, {})
    assert env.state.current_player_id == 0
    assert ta_board(env) == ["O", "2", "3", "4", "X", "6", "7", "8", "9"]


def test_action_formats_differ():
    # Ours: a bare cell number 1-9; brackets or 0 are illegal and end the game.
    for bad in ["[5]", "0"]:
        game = _core.Game("tictactoe")
        game.reset(0, 0)
        assert game.step([bad]) == ([True], True), bad
        assert game.rewards() == [-1.0, 0.0]
    # TextArena (raw env): a cell 0-8 in brackets; a bare number or 9 is an invalid move
    # (a retry, see above). Its default ``TicTacToe-v0`` wrappers bracket a bare "5", which
    # is then cell 5 counted from 0: our cell 6.
    for bad in ["5", "[9]"]:
        env = new_ta_tictactoe(0)
        assert env.step(bad) == (False, {}), bad
        assert ta_board(env) == [str(c) for c in range(1, 10)]
        assert env.state.current_player_id == 0 and env.state.error_count == 1
    env = ta.make("TicTacToe-v0")
    env.reset(num_players=2, seed=0)
    env.step("5")
    assert ta_board(env) == ["1", "2", "3", "4", "5", "X", "7", "8", "9"]


# --- Kuhn poker --------------------------------------------------------------------------

# Our tasks' deals (rust/core/src/games/kuhn_poker/mod.rs, DEALS): (seat 0's card, seat
# 1's card), 0 = Jack, 1 = Queen, 2 = King (TextArena ranks its cards the same way).
ANTE = 1


def ta_player(seat: int) -> int:
    """TextArena's player for our seat: its player 1 acts first in the first hand."""
    return 1 - seat




def new_ta_kuhn(deal: tuple[int, int]):
    """A one-hand TextArena Kuhn poker whose player for our seat s holds ``deal[s]``: the
    first seed that deals it to a fresh env (the deck's order is kept across resets, so
    each hand gets a fresh env)."""
    for seed in range(200):
        env = ta.make("KuhnPoker-v0-raw", max_rounds=1)
        env.reset(num_players=2, seed=seed)
        cards = env.state.game_state["player_cards"]
        if (cards[ta_player(0)], cards[ta_player(1)]) == deal:
            return env
    raise AssertionError(f"no seed below 200 deals {deal}")


def ta_chips(env) -> dict[int, int]:
    """The chips each TextArena player won in the hand. After the last hand TextArena still
    starts the next one (``_init_round``), taking its ante from both: its ``player_chips``
    read 1 below the result, which its last "Current scores" message states."""
    chips = env.state.game_state["player_chips"]
    scores = [text for _, text in env.state.logs if "Current scores" in text]
    p0, p1 = re.search(r"Player 0: '(-?\d+)'; Player 1: '(-?\d+)'", scores[-1]).groups()
    assert {0: int(p0), 1: int(p1)} == {p: chips[p] + ANTE for p in (0, 1)}
    return {0: int(p0), 1: int(p1)}


def sign(x: float) -> int:
    return (x > 0) - (x < 0)


@pytest.mark.parametrize("task", range(6))
@pytest.mark.parametrize("betting", BETTINGS, ids="-".join)
def test_every_betting_on_every_deal_wins_the_same_chips(task, betting):
    game = _core.Game("kuhn_poker")
    game.reset(task, 0)
    assert (our_card(game, 0), our_card(game, 1)) == DEALS[task]
    env = new_ta_kuhn(DEALS[task])
    assert env.state.game_state["current_round"] == 1
    for i, move in enumerate(betting):
        (seat,) = game.to_move()
        assert env.state.current_player_id == ta_player(seat)
        refused, over = game.step([move])
        done, _ = env.step(f"[{move}]")
        assert refused == [False]
        assert over == done == (i == len(betting) - 1), betting
        # TextArena's pot holds the two antes only: a bet or a call adds nothing to it.
        assert env.state.game_state["pot"] == 2 * ANTE
    ours = game.rewards()
    assert abs(ours[0]) == (2 if betting[-1] == "call" else 1)
    # The chips: the same winner, and the same amount after check-check or a fold (1 chip);
    # after a called bet ours are 2 chips and TextArena's 1, its bets moving no chips.
    chips = [ta_chips(env)[ta_player(s)] for s in (0, 1)]
    if betting[-1] == "call":
        assert chips == [r / 2 for r in ours]
    else:
        assert chips == ours
    # TextArena's reward: the sign of the chips (the player with more chips after all its
    # hands wins; one hand is never a tie).
    rewards, info = env.close()
    assert rewards == {ta_player(s): sign(ours[s]) for s in (0, 1)}
    assert not any(info[p]["invalid_move"] for p in (0, 1))


def test_textarena_kuhn_poker_v0_plays_three_hands_with_the_first_player_alternating():
    env = ta.make("KuhnPoker-v0-raw")
    env.reset(num_players=2, seed=0)
    assert env.max_rounds == 3
    for hand, first in [(1, 1), (2, 0), (3, 1)]:
        gs = env.state.game_state
        assert gs["current_round"] == hand and env.state.current_player_id == first
        assert env.step("[check]") == (False, {})
        done, _ = env.step("[check]")
        assert done == (hand == 3)
    rewards, _ = env.close()
    assert sorted(rewards.values()) == [-1, 1]  # three showdowns of 1 chip: never a tie


def test_an_illegal_word_ends_ours_and_gets_a_retry_in_textarena():
    # Ours: "call" with no bet ends the game, -1 for the mover and 0 for the other seat.
    game = _core.Game("kuhn_poker")
    game.reset(0, 0)
    assert game.step(["call"]) == ([True], True)
    assert game.rewards() == [-1.0, 0.0]

    # TextArena: a retry, then -1 for the mover and +1 for the other (whatever the cards).
    env = new_ta_kuhn(DEALS[0])
    first = ta_player(0)
    assert env.step("[call]") == (False, {})
    assert env.state.current_player_id == first and env.state.rewards is None
    assert env.step("[call]") == (True, {})
    rewards, info = env.close()
    assert rewards == {first: -1, 1 - first: 1}
    assert info[first]["invalid_move"]


def test_kuhn_action_formats_differ():
    # Ours: the bare word, any case; brackets are illegal.
    game = _core.Game("kuhn_poker")
    game.reset(0, 0)
    assert game.step(["[check]"]) == ([True], True)
    game.reset(0, 0)
    assert game.step(["CHECK"]) == ([False], False)
    # TextArena (raw env): the word in brackets, any case; a bare word is an invalid move.
    env = new_ta_kuhn(DEALS[0])
    assert env.step("check") == (False, {})
    assert env.state.error_count == 1 and env.state.current_player_id == ta_player(0)
    assert env.step("[CHECK]") == (False, {})
    assert env.state.current_player_id == ta_player(1)
