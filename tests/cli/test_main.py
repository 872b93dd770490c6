"""The ``agentgym-rl`` entry point: the parser knows every subcommand, and
``python -m agentgym.cli`` runs one."""

import subprocess
import sys

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
