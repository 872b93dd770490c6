"""Every ``agentgym-rl`` subcommand's ``--help`` ends with two example command lines, and
each one parses with the real parser (parse only: no job runs), names only flags the
subcommand has (spelled out: an abbreviation argparse would accept does not count), and
names env ids that are registered and config files that exist."""

from __future__ import annotations

import argparse
import contextlib
import io
import shlex
from pathlib import Path

import pytest

import agentgym
from agentgym.cli import SUBCOMMANDS, build_parser

ROOT = Path(__file__).resolve().parents[2]

#: How an example line calls the command line (both are the same entry point).
PROGRAMS = (["agentgym-rl"], ["python", "-m", "agentgym.cli"])


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def examples(name: str) -> list[list[str]]:
    """The argv (program name removed) of every example line in ``name``'s epilog."""
    sub = _subparsers(build_parser())[name]
    out = []
    for line in (sub.epilog or "").splitlines():
        words = shlex.split(line, comments=True)
        for prog in PROGRAMS:
            if words[: len(prog)] == prog:
                out.append(words[len(prog):])
                break
    return out


def parse(argv: list[str]) -> argparse.Namespace:
    """``argv`` parsed by the real parser; fails the test with argparse's message if it
    refuses it, or if a flag is not spelled exactly as the subcommand declares it."""
    parser = build_parser()
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = parser.parse_args(argv)
    except SystemExit:
        pytest.fail(f"parser refused {shlex.join(argv)!r}: {err.getvalue().strip()}")
    sub = _subparsers(parser)[argv[0]]
    for word in argv[1:]:
        if word == "--":
            break
        if word.startswith("-") and not word[1:2].isdigit():
            flag = word.split("=", 1)[0]
            if flag not in sub._option_string_actions:
                pytest.fail(f"{shlex.join(argv)!r}: {argv[0]} has no flag {flag}")
    return args


@pytest.mark.parametrize("name", list(SUBCOMMANDS))
def test_help_ends_with_two_examples(name):
    got = examples(name)
    assert len(got) == 2, f"{name}: expected 2 example lines in the epilog, got {got}"
    assert all(argv[:1] == [name] for argv in got), got
    sub = _subparsers(build_parser())[name]
    help_text = sub.format_help()
    # the epilog comes through verbatim (RawDescriptionHelpFormatter) at the end
    assert help_text.rstrip().endswith(sub.epilog.rstrip()), help_text


@pytest.mark.parametrize("name", list(SUBCOMMANDS))
def test_examples_parse(name):
    envs = set(agentgym.list_envs())
    for argv in examples(name):
        args = parse(argv)
        assert args.command == name
        assert args.func is SUBCOMMANDS[name].run
        for env in (getattr(args, "env", None) or "").split(","):
            assert not env or env in envs, f"{shlex.join(argv)!r}: unknown env {env!r}"
        config = getattr(args, "config", None)
        assert not config or (ROOT / config).is_file(), f"{config} does not exist"


@pytest.mark.parametrize("argv", [
    ["collect", "--env", "maze", "--tasks", "0:10", "-o", "d", "--no-such-flag"],
    ["train", "--max-turn", "4"],  # an abbreviation of --max-turns: argparse takes it
    ["play"],  # a missing positional
])
def test_checker_rejects_bad_examples(argv):
    with pytest.raises(pytest.fail.Exception):
        parse(argv)
