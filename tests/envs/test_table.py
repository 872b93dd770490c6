"""The zero-shot table's settings (``agentgym.envs.table``): every registered env's oracle
solves at least 0.95 of its held-out tasks within the row's horizon and context cap, played
through the rollout engine with ``ScriptedBackend`` (the table's oracle row) and the table
model's tokenizer (SmolLM2-135M-Instruct), so that the context cap is the engine's own."""

from __future__ import annotations

import pytest

import agentgym
from agentgym.backends.scripted import ScriptedBackend
from agentgym.engine import RolloutEngine
from agentgym.envs import table
from agentgym.envs.registry import default_horizon
from agentgym.envs.tasks import plan_tasks
from tests.helpers import SIMULATORS, env_param

#: the least share of held-out tasks the oracle must solve under the table's settings
SOLVED = 0.95


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    """SmolLM2-135M-Instruct's tokenizer and chat template, read from the GGUF file of the
    ``smollm2`` extra (the model folder is not needed)."""
    from agentgym.models import smollm2 as sm

    try:
        gguf = sm.gguf_path()
    except sm.SmolLM2UnavailableError as e:
        pytest.skip(str(e))
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=sm.GGUF_FILE)


async def play_oracle(env_id: str, row: table.TableRow, tokenizer, num_tasks: int, **overrides):
    """The table's oracle row for ``env_id``: its first ``num_tasks`` held-out tasks."""
    plan = plan_tasks(env_id, row.kwargs(), num_tasks)
    settings = {"max_turns": row.max_turns, "max_total_tokens": row.max_total_tokens}
    if row.max_concurrency is not None:
        settings["max_concurrency"] = row.max_concurrency
    settings.update(overrides)
    engine = RolloutEngine(ScriptedBackend(tokenizer, policy="oracle", seed=0), tokenizer,
                           progress=False, **settings)
    try:
        batch = await engine.collect(plan.eval_ids, env_id, env_kwargs=plan.eval_kwargs,
                                     temperature=0.0)
    finally:
        engine.close()
    return plan, batch.trajectories


def test_rows_name_registered_envs_and_valid_settings():
    envs = set(agentgym.list_envs())
    assert set(table.ROWS) <= envs, set(table.ROWS) - envs
    for env_id in envs:
        row = table.row(env_id)
        assert row.max_turns >= 1 and row.oracle_tasks >= 1
        assert 0 < row.max_total_tokens <= 8192  # SmolLM2-135M-Instruct's positions
        assert row.kwargs() == row.env_kwargs and row.kwargs() is not row.env_kwargs
        if env_id != "game2048":  # the table plays its target 64, not the default 256
            assert row.max_turns == default_horizon(env_id), env_id
    assert table.row("no-such-env") is table.DEFAULT


def _shipped() -> list[str]:
    """The env ids agentgym registers itself (other test modules add their own)."""
    from agentgym.envs.registry import spec

    return [e for e in agentgym.list_envs(kind=("native", "python"))
            if isinstance(spec(e).entry_point, str) and spec(e).entry_point.startswith("agentgym.")]


@pytest.mark.parametrize("env_id", [env_param(e) for e in _shipped()])
async def test_oracle_solves_held_out_tasks_within_the_table_settings(env_id,
                                                                      smollm2_tokenizer):
    if env_id in SIMULATORS:
        pytest.importorskip(SIMULATORS[env_id])
    row = table.row(env_id)
    plan, trajs = await play_oracle(env_id, row, smollm2_tokenizer, row.oracle_tasks)
    assert len(trajs) == len(plan.eval_ids) == row.oracle_tasks
    missed = [(t.task_id, t.stop_reason, t.num_turns, len(t.token_ids), round(t.reward, 3))
              for t in trajs if not t.success]
    assert all(len(t.token_ids) <= row.max_total_tokens for t in trajs)
    rate = 1 - len(missed) / len(trajs)
    assert rate >= SOLVED, f"{env_id}: oracle solved {rate:.2f}; missed {missed}"


async def test_a_cap_below_the_rows_cuts_the_oracle(smollm2_tokenizer):
    """The cap the test plays under is the engine's: at the rollout default of 2,048 tokens
    the 2048 oracle's games to 64 run out of context (which is why its row is 4,096)."""
    row = table.row("game2048")
    assert row.max_total_tokens > 2048
    _, trajs = await play_oracle("game2048", row, smollm2_tokenizer, 10, max_total_tokens=2048)
    assert sum(t.success for t in trajs) < SOLVED * len(trajs)
    assert {t.stop_reason for t in trajs if not t.success} == {"length"}
