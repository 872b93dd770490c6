"""``agentgym-rl list``."""

import agentgym
from agentgym.cli import main


def test_list_prints_every_env(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for env_id in agentgym.list_envs():
        assert env_id in out


def test_list_shows_each_ids_kind_and_filters_by_kind(capsys):
    assert main(["list"]) == 0
    rows = {line.split()[0]: line.split()[1] for line in capsys.readouterr().out.splitlines()}
    assert rows["tictactoe"] == "game" and rows["maze"] == "native"
    assert rows["office"] == "python"
    assert main(["list", "--kind", "game"]) == 0
    out = capsys.readouterr().out.split()
    assert {"tictactoe", "kuhn_poker", "negotiation"} <= set(out) and "maze" not in out
