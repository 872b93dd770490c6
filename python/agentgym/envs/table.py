"""The settings under which the zero-shot table plays each env: one definition, read by
``bench/zero_shot.py`` (the table) and by ``tests/envs/test_table.py`` (the oracle solves at
least 0.95 of the held-out tasks under them).

A :class:`TableRow` is an env's horizon (``max_turns``: the env's
:func:`~agentgym.envs.registry.default_horizon`, the registry's one answer), the env kwargs
its held-out tasks are planned under (``plan_tasks(env_id, row.env_kwargs, n)``: the env's
test split where it has one, else its last or unbounded held-out indices) and the context cap
(``max_total_tokens`` of :class:`~agentgym.engine.config.RolloutConfig`). The table's model is
SmolLM2-135M-Instruct (8,192 positions); its tokenizer counts the context. Envs without a
row of their own get :data:`DEFAULT`'s settings: the rollout default of 2,048 tokens.

Each row's ``note`` says what was measured (the oracle, ``ScriptedBackend`` through the
rollout engine, SmolLM2's tokenizer) and why the row is what it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from agentgym.envs.registry import DEFAULT_HORIZON, default_horizon
from agentgym.errors import UnknownEnvError

__all__ = ["DEFAULT", "ROWS", "TableRow", "row"]


@dataclass(frozen=True)
class TableRow:
    """How the table plays one env (see the module docstring)."""

    #: the horizon (None: the env's ``default_horizon``, which :func:`row` fills in; a row
    #: whose env kwargs change what the oracle needs states its own)
    max_turns: int | None = None
    #: kwargs of ``agentgym.make``; ``plan_tasks`` adds the held-out split where there is one
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    max_total_tokens: int = 2048
    #: held-out tasks the oracle test plays (ScienceWorld: what fits in about a CI minute)
    oracle_tasks: int = 20
    #: episodes played at once (None: the rollout default); ScienceWorld runs a JVM for each
    max_concurrency: int | None = None
    note: str = ""

    def kwargs(self) -> dict[str, Any]:
        """A fresh copy of ``env_kwargs``."""
        return dict(self.env_kwargs)


DEFAULT = TableRow(
    max_turns=DEFAULT_HORIZON,
    note="the oracle needs at most 12 turns and 1,756 tokens on the first 20 held-out tasks of "
         "every env that has no row of its own (20 turns: the registry's default horizon)")

_SCIWORLD = dict(
    env_kwargs={"step_limit": 1000}, max_total_tokens=8192,
    max_concurrency=1,
    note="the first test tasks are boil, melt and freeze: ScienceWorld's gold paths run 51-186 "
         "actions (they change a little between loads), up to 369 simulator moves (a wait "
         "counts several), so step_limit 1000 (ScienceWorld's default of 100 cuts most of "
         "them) and 200 turns; an episode needs up to 6,367 tokens. One JVM plays them in "
         "turn (about 1.5 s a task once it runs).")

#: The rows that differ from :data:`DEFAULT` (their horizons, 64 turns for ``babyai``, 40 for
#: ``maze`` and ``textcraft``, 200 for ScienceWorld, are the registry's ``default_horizon``;
#: ``game2048`` plays target 64 in 64 turns; the notes say why).
ROWS: dict[str, TableRow] = {
    "babyai": TableRow(
        env_kwargs={"reward": "binary"}, max_total_tokens=8192,
        note="the held-out tasks are levels 20-39 at seed 9999; minigrid's success reward "
             "1 - 0.9 * steps/max_steps is below 1 (BabyAI's success rule counts it all the "
             "same); the table plays reward 'binary', as its first measurements did, so "
             "that its reward/mean is the success rate. The oracle (BabyAIBot through macro "
             "actions) needs 2-47 turns and up to 6,985 tokens (the action list is most of "
             "an observation); over the last 200 tasks (5 seeds of the 40 levels) it solves "
             "193 of them."),
    "game2048": TableRow(
        max_turns=64, env_kwargs={"difficulty": "easy"}, max_total_tokens=4096,
        note="a 4x4 board is about 55 tokens a turn: the expectimax oracle makes 256 in ~150 "
             "moves, far past 2,048 tokens (every episode ended 'length' near move 27). "
             "Target 64 (difficulty easy) takes it 34-56 moves and up to 3,472 tokens on the "
             "20 held-out tasks (SmolLM2; 4,060 with the tiny model's tokenizer); 197 of the "
             "first 200 within 64 moves."),
    "maze": TableRow(
        note="the BFS oracle's path is up to 28 moves on the first 20 test mazes (32 over "
             "the first 200): 20 turns cut one of the table's first five (task 2, 21 moves); "
             "at 40 turns all 200 are solved within 1,535 tokens."),
    "textcraft": TableRow(
        note="the held-out tasks are the last (deepest) goals: the oracle needs up to 27 "
             "turns and 1,538 tokens on the last 20 (20 turns cut one of the table's last "
             "five, task 543: 27 turns); 199 of the last 200 within 40 turns."),
    "sciworld": TableRow(oracle_tasks=20, **_SCIWORLD),
    "sciworld-agentgym": TableRow(oracle_tasks=10, **_SCIWORLD),
}


def row(env_id: str) -> TableRow:
    """The table's settings for ``env_id``: its row (:data:`DEFAULT` where it has none)
    with the env's registered ``default_horizon`` (:data:`DEFAULT` itself for an id the
    registry does not know)."""
    try:
        horizon = default_horizon(env_id)
    except UnknownEnvError:
        return DEFAULT
    base = ROWS.get(env_id, DEFAULT)
    return replace(base, max_turns=horizon if env_id not in ROWS or base.max_turns is None
                   else base.max_turns)
