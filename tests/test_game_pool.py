"""``agentgym._core.GamePool`` from Python: batched resets and steps of many games, each
row's view or its own exception, and a malformed batch refused whole with a named error."""

import pytest

from agentgym import _core


def test_rows_come_back_as_views_or_their_own_exception():
    pool = _core.GamePool("kuhn_poker", 3)
    assert (pool.seats, pool.roles, pool.num_tasks, len(pool)) == (2, ["first", "second"], 6, 3)
    views = pool.reset([0, 1, 2], [0, "a deal in words", 5], [1, 1, 1])
    assert views[0][0] == [0] and "Your card: the Jack." in views[0][1][0]
    assert isinstance(views[1], _core.InvalidTaskError)  # the game refuses a task text
    assert views[2][2] is False  # not over
    after = pool.step([0, 2], [["bet"], ["raise"]])
    assert after[0][0] == [1] and after[0][4] == [False]
    assert after[1][2] is True and after[1][3] == [-1.0, 0.0] and after[1][4] == [True]


def test_a_malformed_batch_is_refused_whole():
    pool = _core.GamePool("tictactoe", 2)
    pool.reset([0, 1], [0, 0], [0, 0])
    with pytest.raises(ValueError, match="more than once"):
        pool.step([0, 0], [["5"], ["1"]])
    with pytest.raises(ValueError, match="1 seat\\(s\\) to move, got 2"):
        pool.step([0, 1], [["5"], ["1", "2"]])
    with pytest.raises(IndexError, match="out of range"):
        pool.step([7], [["5"]])
    with pytest.raises(ValueError, match="2 slots and 1 move lists"):
        pool.step([0, 1], [["5"]])
    # nothing moved: both boards are still empty with X to move
    views = pool.step([0, 1], [["5"], ["1"]])
    assert [v[0] for v in views] == [[1], [1]]
    with pytest.raises(ValueError, match="seat 2 out of range"):
        pool.oracle_actions([0], [2])
    solver, idle = pool.oracle_actions([0, 1], [1, 0])  # O to move in both games
    assert solver in pool.valid_actions(0, 1) and idle is None


def test_unknown_game_and_bad_kwargs_are_named_errors():
    with pytest.raises(_core.UnknownEnvError, match="tictactoe"):
        _core.GamePool("checkers", 1)
    with pytest.raises(ValueError):
        _core.GamePool("tictactoe", 1, "{not json")
