"""``agentgym-rl list --suite NAME``: a community suite's envs with kind, seats and source."""

import pytest

from agentgym.cli import main


@pytest.mark.parametrize("suite, expected", [
    ("openspiel", {"openspiel:leduc_poker": "game", "openspiel:catch": "python"}),
    ("textarena", {"textarena:TicTacToe-v0": "game", "textarena:Sudoku-v0": "python"}),
    ("reasoning_gym", {"reasoning_gym:gcd": "python"}),
])
def test_list_suite_prints_its_envs(capsys, suite, expected):
    assert main(["list", "--suite", suite]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()}
    for env_id, kind in expected.items():
        assert rows[env_id][1] == kind and len(rows[env_id]) >= 4


def test_list_suite_filters_by_kind(capsys):
    assert main(["list", "--suite", "openspiel", "--kind", "game"]) == 0
    kinds = {line.split()[1] for line in capsys.readouterr().out.splitlines()}
    assert kinds == {"game"}


def test_an_unknown_suite_is_a_one_line_error(capsys):
    assert main(["list", "--suite", "gym"]) == 2
    err = capsys.readouterr().err
    assert "--suite: unknown suite 'gym'" in err and "openspiel" in err
