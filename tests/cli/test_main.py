"""The ``agentgym-rl`` entry point: the parser knows every subcommand, and
``python -m agentgym.cli`` runs one."""

import subprocess
import sys

import pytest

from agentgym.cli import build_parser


def test_parser_knows_every_subcommand():
    parser = build_parser()
    for argv in (["train", "--help"], ["eval", "--help"], ["serve-env", "--help"],
                 ["play", "--help"], ["make-tiny-model", "--help"], ["collect", "--help"],
                 ["export", "--help"]):
        try:
            parser.parse_args(argv)
        except SystemExit as e:
            assert e.code == 0


def test_console_script_make_tiny_model(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "agentgym.cli", "make-tiny-model", str(tmp_path / "m")],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "m" / "config.json").exists() and "tiny model written" in out.stdout


@pytest.mark.parametrize("argv", [
    ["eval", "--env", "nosuch", "--backend", "scripted", "--tasks", "2"],
    ["collect", "--env", "nosuch", "--backend", "scripted", "--tasks", "0:2"],
])
def test_an_unknown_env_id_is_one_line_naming_it(argv, tmp_path, capsys):
    from agentgym.cli import main

    assert main([*argv, "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "Traceback" not in "\n".join(err)
    assert "'nosuch'" in err[-1] and err[-1].startswith(f"agentgym-rl {argv[0]}: ")
