"""Every mistake a user can make on the command line is one line on stderr naming the flag or
key at fault, exit status 2, and no traceback (issue 47, "a researcher's first hour").

One table drives ``collect``, ``eval``, ``export``, ``play``, ``serve-env`` and
``make-tiny-model`` through the real entry point (:func:`agentgym.cli.main`, stderr
captured); two rows also go through ``python -m agentgym.cli`` in a subprocess. The scripted
backend and the tiny model keep every case fast: each is refused before any model loads."""

from __future__ import annotations

import subprocess
import sys

import pytest

from agentgym.cli import main

#: Placeholders in a case's argv: an existing file, a folder holding a small collected run,
#: a folder holding a run whose shard is corrupt, a folder holding an export, a new path.
FILE, RUN, BAD_RUN, EXPORTED, NEW = "<file>", "<run>", "<bad-run>", "<exported>", "<new>"

SCRIPTED = ["--backend", "scripted"]
COLLECT = ["collect", "--env", "maze", "--out", NEW]

#: (id, argv, what the one line must name)
CASES = [
    # an unknown env id, in every subcommand that takes one
    ("collect-unknown-env", ["collect", "--env", "nosuch", "--tasks", "0:2", "-o", NEW],
     "'nosuch'"),
    ("eval-unknown-env", ["eval", "--env", "nosuch", *SCRIPTED, "--tasks", "2", "-o", NEW],
     "'nosuch'"),
    ("eval-unknown-second-env", ["eval", "--env", "maze,nosuch", *SCRIPTED, "--tasks", "2",
                                 "-o", NEW], "'nosuch'"),
    ("play-unknown-env", ["play", "nosuch"], "'nosuch'"),
    ("serve-env-unknown-env", ["serve-env", "nosuch", "--port", "0"], "'nosuch'"),
    # a model path that does not exist
    ("collect-model-missing", [*COLLECT, "--tasks", "0:2", "--model", "/nonexistent/model"],
     "--model /nonexistent/model: no such file or folder"),
    ("eval-model-missing", ["eval", "--env", "maze", "--tasks", "2", "--model",
                            "/nonexistent/model", "-o", NEW],
     "--model /nonexistent/model: no such file or folder"),
    ("eval-scripted-model-missing", ["eval", *SCRIPTED, "--tasks", "2", "--model",
                                     "./typo/model", "-o", NEW], "--model ./typo/model"),
    ("eval-needs-a-model", ["eval", "--env", "maze", "--tasks", "2", "-o", NEW], "--model"),
    # task ranges that hold no task, or negative ones
    ("tasks-stop-before-start", [*COLLECT, "--tasks", "5:2"], "--tasks"),
    ("tasks-empty", [*COLLECT, "--tasks", "3:3"], "--tasks"),
    ("tasks-step-0", [*COLLECT, "--tasks", "0:10:0"], "--tasks"),
    ("tasks-negative-start", [*COLLECT, "--tasks=-5:3"], "--tasks"),
    ("tasks-negative-index", [*COLLECT, "--tasks=3,-1"], "--tasks"),
    ("tasks-not-numbers", [*COLLECT, "--tasks", "1:b"], "--tasks"),
    ("tasks-past-the-end", ["collect", "--env", "textcraft", "--tasks", "540:560", "-o", NEW],
     "--tasks 540:560"),
    ("tasks-file-missing", [*COLLECT, "--tasks-file", "/nonexistent/tasks.txt"],
     "--tasks-file"),
    # counts that must be positive
    ("collect-n-samples-0", [*COLLECT, "--tasks", "0:2", "--n-samples", "0"], "--n-samples"),
    ("collect-n-samples-negative", [*COLLECT, "--tasks", "0:2", "--n-samples", "-2"],
     "--n-samples"),
    ("eval-n-samples-0", ["eval", *SCRIPTED, "--tasks", "2", "--n-samples", "0", "-o", NEW],
     "--n-samples"),
    ("eval-tasks-0", ["eval", *SCRIPTED, "--tasks", "0", "-o", NEW], "--tasks"),
    ("eval-task-offset-negative", ["eval", *SCRIPTED, "--task-offset", "-1", "-o", NEW],
     "--task-offset"),
    ("eval-max-turns-0", ["eval", *SCRIPTED, "--max-turns", "0", "-o", NEW], "--max-turns"),
    ("collect-shard-size-0", [*COLLECT, "--tasks", "0:2", "--shard-size", "0"],
     "--shard-size"),
    ("collect-flush-every-0", [*COLLECT, "--tasks", "0:2", "--flush-every", "0"],
     "--flush-every"),
    ("collect-max-total-tokens-0", [*COLLECT, "--tasks", "0:2", "--max-total-tokens", "0"],
     "--max-total-tokens"),
    ("collect-top-p", [*COLLECT, "--tasks", "0:2", "--top-p", "1.5"], "--top-p"),
    ("collect-not-a-number", [*COLLECT, "--tasks", "0:2", "--max-turns", "many"],
     "--max-turns"),
    ("play-max-turns-0", ["play", "maze", "--max-turns", "0"], "--max-turns"),
    ("serve-env-port", ["serve-env", "maze", "--port", "70000"], "--port"),
    ("serve-env-max-envs-0", ["serve-env", "maze", "--max-envs", "0"], "--max-envs"),
    ("make-tiny-model-seed", ["make-tiny-model", NEW, "--seed", "-1"], "--seed"),
    # an output path that is an existing file
    ("collect-out-is-a-file", [*COLLECT[:-1], FILE, "--tasks", "0:2"], "--out"),
    ("eval-out-is-a-file", ["eval", *SCRIPTED, "--tasks", "2", "-o", FILE], "--output"),
    ("export-out-is-a-file", ["export", RUN, "--to", "verl", "--out", FILE], "--out"),
    ("make-tiny-model-dir-is-a-file", ["make-tiny-model", FILE], "dir"),
    ("eval-out-under-a-file", ["eval", *SCRIPTED, "--tasks", "2", "-o", FILE + "/ev"],
     "--output"),
    # env kwargs, backend arguments and settings checked before anything is written
    ("collect-bad-env-kwarg", [*COLLECT, "--tasks", "0:2", "--env-kwarg", "sizee=4"],
     "sizee"),
    ("collect-env-kwarg-form", [*COLLECT, "--tasks", "0:2", "--env-kwarg", "size"],
     "--env-kwarg"),
    ("eval-bad-env-kwarg", ["eval", *SCRIPTED, "--tasks", "2", "--env-kwarg", "sizee=4",
                            "-o", NEW], "sizee"),
    ("collect-bad-backend-kwarg", [*COLLECT, "--tasks", "0:2", "--backend-kwarg",
                                   "latency=1"], "latency"),
    ("collect-openai-needs-url", [*COLLECT, "--tasks", "0:2", "--backend", "openai"],
     "--base-url"),
    ("collect-branch-width-alone", [*COLLECT, "--tasks", "0:2", "--branch-width", "3"],
     "--branch-width"),
    ("collect-rollout-setting-refused", [*COLLECT, "--tasks", "0:2", "--branch-at", "2",
                                         "--branch-width", "1"], "--branch-width"),
    ("collect-unknown-flag", [*COLLECT, "--tasks", "0:2", "--colour"],
     "--colour"),
    ("play-task-out-of-range", ["play", "wordle", "--task", "999999"], "--task"),
    # run folders: another run, a corrupt shard, an export folder in use, a missing run
    ("collect-other-run-in-folder", ["collect", "--env", "textcraft", "--tasks", "0:2",
                                     "--out", RUN, "--no-progress"], "RunMismatchError"),
    ("collect-corrupt-shard", ["collect", "--env", "maze", "--tasks", "0:2", "--out",
                               BAD_RUN, "--no-progress"], "delete"),
    ("export-into-a-non-empty-folder", ["export", RUN, "--to", "verl", "--out", EXPORTED],
     "--overwrite"),
    ("export-into-the-run-folder", ["export", RUN, "--to", "verl", "--out", RUN,
                                    "--overwrite"], "--out"),
    ("export-run-missing", ["export", "/nonexistent/run", "--to", "verl", "--out", NEW],
     "RUN_DIR"),
]


@pytest.fixture(scope="module")
def places(tmp_path_factory):
    """The placeholders' paths: a file, a run of 2 maze episodes, a copy of it with a
    corrupt shard, and a folder holding its verl export."""
    import shutil

    from agentgym.collection.export import export_run

    root = tmp_path_factory.mktemp("errors")
    (root / "file").write_text("not a folder\n")
    run = root / "run"
    assert main(["collect", "--env", "maze", "--tasks", "0:2", "--out", str(run),
                 "--no-progress", "--json"]) == 0
    bad = root / "bad-run"
    shutil.copytree(run, bad)
    (bad / "part-000000.parquet").write_bytes(b"PAR1 torn")
    export_run(run, "verl", root / "exported")
    return {FILE: str(root / "file"), RUN: str(run), BAD_RUN: str(bad),
            EXPORTED: str(root / "exported")}


def _argv(argv: list[str], places: dict[str, str], tmp_path) -> list[str]:
    def one(a: str) -> str:
        if a == NEW:
            return str(tmp_path / "new")
        head, sep, tail = a.partition("/")
        return places.get(head, head) + sep + tail

    return [one(a) for a in argv]


def _check(command: str, code: int, err: str, names: str) -> None:
    lines = err.strip().splitlines()
    assert code == 2, err
    assert "Traceback" not in err, err
    assert len(lines) == 1, err
    assert lines[0].startswith(f"agentgym-rl {command}: error: "), lines[0]
    assert names in lines[0], lines[0]


@pytest.mark.parametrize("argv,names", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_mistake_is_one_line_naming_it(argv, names, places, tmp_path, capsys):
    argv = _argv(argv, places, tmp_path)
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's refusals exit from inside parse_args
        code = e.code
    _check(argv[0], code, capsys.readouterr().err, names)
    assert not (tmp_path / "new").exists(), "a refused command wrote its output"


@pytest.mark.parametrize("argv,names", [
    (["collect", "--env", "maze", "--tasks", "5:2", "-o", NEW], "--tasks"),
    (["collect", "--env", "maze", "--tasks", "0:2", "--model", "/nonexistent/model",
      "-o", NEW], "--model /nonexistent/model"),
])
def test_the_console_entry_point_prints_the_same_line(argv, names, tmp_path):
    argv = _argv(argv, {}, tmp_path)
    done = subprocess.run([sys.executable, "-m", "agentgym.cli", *argv], capture_output=True,
                          text=True, timeout=120)
    _check(argv[0], done.returncode, done.stderr, names)


def test_every_subcommands_help_shows_the_defaults():
    """``--help`` shows each option's default: ``(default: 1000)``."""
    from agentgym.cli import build_parser
    from tests.cli.test_help_examples import _subparsers

    subs = _subparsers(build_parser())

    def shown(name):
        return " ".join(subs[name].format_help().split())

    assert "rows per shard (at most: see --flush-every) (default: 1000)" in shown("collect")
    assert "(default: 30.0)" in shown("collect")  # --flush-every
    assert "(default: transformers)" in shown("eval")  # --backend
    assert "(default: 8000)" in shown("serve-env")  # --port
    assert "weights seed (default: 0)" in shown("make-tiny-model")
    for name in subs:
        text = shown(name)
        assert "(default: None)" not in text and "(default: False)" not in text, name
