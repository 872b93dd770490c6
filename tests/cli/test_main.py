"""The agentgym-rl command line: list, play, make-tiny-model, serve-env argument wiring."""

import subprocess
import sys

import agentgym
from agentgym.cli import build_parser, main
from agentgym.cli.play import play


def test_list_prints_every_env(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for env_id in agentgym.list_envs():
        assert env_id in out


def test_play_maze_with_oracle_moves_reaches_goal():
    env = agentgym.make("maze")
    env.reset(seed=0, options={"task": 3})
    moves = []
    while True:
        a = env.unwrapped.oracle_action()
        moves.append(a)
        _, _, term, trunc, _ = env.step(a)
        if term or trunc:
            break
    typed = iter(moves)
    lines = []
    total = play("maze", task=3, seed=0, input_fn=lambda _: next(typed), print_fn=lines.append)
    assert total == 1.0
    assert any("episode over (terminated)" in line for line in lines)


def test_play_accepts_action_numbers_and_quits():
    lines = []
    answers = iter(["0", "q"])
    total = play("wordle", task=1, input_fn=lambda _: next(answers), print_fn=lines.append)
    assert total == 0.0
    assert any(line.startswith("actions: [0]") for line in lines)
    assert any(line.startswith("reward") for line in lines)


def test_parser_knows_every_subcommand():
    parser = build_parser()
    for argv in (["train", "--help"], ["eval", "--help"], ["serve-env", "--help"],
                 ["play", "--help"], ["make-tiny-model", "--help"]):
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


def test_eval_writes_json_and_markdown_per_env(tmp_path, tiny_model_dir, capsys):
    import json

    out = tmp_path / "ev"
    assert main(["eval", "--model", tiny_model_dir, "--env", "maze,wordle", "--tasks", "3",
                 "--max-turns", "2", "--max-new-tokens", "8", "-o", str(out)]) == 0
    report = json.loads((out / "eval.json").read_text())
    assert [r["env"] for r in report["results"]] == ["maze", "wordle"]
    for r in report["results"]:
        assert r["episodes"] == 3 and 0.0 <= r["success_rate"] <= 1.0
        assert r["env_kwargs"] == {"split": "test"} and r["tasks"] == [0, 2]  # held out
    table = (out / "eval.md").read_text().splitlines()
    assert table[0].startswith("| env |") and len(table) == 4
    assert "eval.md" in capsys.readouterr().out
