"""``agentgym-rl list``."""

import agentgym
from agentgym.cli import main


def test_list_prints_every_env(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for env_id in agentgym.list_envs():
        assert env_id in out
