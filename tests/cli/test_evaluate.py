"""``agentgym-rl eval``: per-env JSON and Markdown reports on the held-out split."""

from agentgym.cli import main


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


def test_eval_max_total_tokens_caps_the_context(tmp_path, tiny_model_dir):
    import json

    out = tmp_path / "ev"
    assert main(["eval", "--model", tiny_model_dir, "--env", "maze", "--tasks", "2",
                 "--max-turns", "20", "--max-new-tokens", "8", "--max-total-tokens", "200",
                 "-o", str(out)]) == 0
    (row,) = json.loads((out / "eval.json").read_text())["results"]
    assert row["metrics"]["stop_reason/length"] == 1.0  # the first observation fills 200
