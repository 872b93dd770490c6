"""Suite games in worker processes (``ProcessGamePool``, ``env_workers`` > 0 on a game):
the same games as in process, and a game that kills its process ends only its episode."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from agentgym.backends.scripted import ScriptedBackend
from agentgym.engine import RolloutEngine
from agentgym.envs import SuiteGame, registry
from agentgym.errors import EnvError
from agentgym.runtime.game_workers import ProcessGamePool

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]  # spawns worker processes

RELAY = "tests.runtime.test_game_workers:RelayGame"


class RelayGame(SuiteGame):
    """Two seats take turns saying "go"; after four moves the first seat wins (1, -1), and
    any other move is refused. Task 1's second move kills its process (a stand-in for a
    game library that segfaults), task 7's never returns (one that hangs)."""

    seats = 2
    roles = ("first", "second")
    instructions = ("Say go.", "Say go.")

    def reset(self, task, seed):
        self.task, self.moves, self.refused_by = task, 0, None

    def to_move(self):
        return [] if self.over() else [self.moves % 2]

    def observation(self, seat):
        return f"task {self.task} move {self.moves}"

    def over(self):
        return self.moves >= 4 or self.refused_by is not None

    def rewards(self):
        if self.refused_by is not None:
            return [-1.0 if s == self.refused_by else 0.0 for s in range(2)]
        return [1.0, -1.0] if self.moves >= 4 else [0.0, 0.0]

    def step(self, moves):
        if self.task == 1 and self.moves == 1:
            os._exit(3)
        if self.task == 7 and self.moves == 1:
            time.sleep(3600)
        if moves[0].strip().lower() != "go":
            self.refused_by = self.moves % 2
            return [True]
        self.moves += 1
        return [False]

    def valid_actions(self, seat):
        return ["go"]


@pytest.fixture(autouse=True)
def _forget_relay():
    """The id this module looks up is forgotten afterwards: other tests list the games."""
    yield
    registry._REGISTRY.pop(RELAY, None)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _engine(tokenizer, **kw) -> RolloutEngine:
    return RolloutEngine(ScriptedBackend(tokenizer, "random", seed=3), tokenizer,
                         max_total_tokens=16384, **kw)


def test_a_game_class_named_module_colon_class_is_a_game():
    assert registry.kind(RELAY) == "game" and registry.seats(RELAY) == 2
    assert registry.roles(RELAY) == ("first", "second")


async def test_kuhn_poker_in_worker_processes_plays_the_games_it_plays_in_process(tokenizer):
    """Same seeds, same random players: the same deals (chance from the seed), moves,
    observations and returns, with the legal moves asked of the workers."""
    pytest.importorskip("pyspiel")
    got = {}
    for workers in (0, 2):
        eng = _engine(tokenizer, max_turns=6, max_concurrency=4)
        try:
            batch = await eng.collect(6, "openspiel:kuhn_poker", env_workers=workers)
            pool = next(iter(eng._drivers.values()))[0].pool
            assert isinstance(pool, ProcessGamePool) == (workers > 0)
        finally:
            eng.close()
        got[workers] = [(t.task_id, t.seat, t.stop_reason, t.reward, list(t.token_ids))
                        for t in batch]
    assert {r[2] for r in got[0]} == {"done"} and len(got[0]) == 12
    assert got[2] == got[0]


async def test_a_game_that_kills_its_worker_ends_only_its_own_episode(tokenizer):
    eng = _engine(tokenizer, max_turns=8, max_concurrency=4)
    try:
        # tasks 0 and 1 share worker 0 (slots 0-1), tasks 2 and 3 worker 1
        batch = await asyncio.wait_for(eng.collect(4, RELAY, env_workers=2), timeout=120)
        driver = next(iter(eng._drivers.values()))[0]
        restarts = driver.pool.restarts
    finally:
        eng.close()
    by_task = {}
    for t in batch:
        by_task.setdefault(t.task_id, []).append(t)
    assert sorted(by_task) == [0, 1, 2, 3]
    crashed = by_task.pop(1)
    assert {t.stop_reason for t in crashed} == {"env_error"}
    assert any("worker process died (exit code 3)" in (t.error or "") for t in crashed)
    for seats in by_task.values():  # the others, its worker's neighbour included, finished
        assert [t.stop_reason for t in seats] == ["done", "done"]
        assert sorted(t.reward for t in seats) == [-1.0, 1.0]
    assert restarts >= 1


async def test_a_restarted_worker_replays_its_other_games_to_where_they_were():
    pool = ProcessGamePool(RELAY, 2, 1)
    assert pool.is_async and len(pool) == 2
    try:
        views = await pool.areset([0, 1], [0, 1], [5, 6])
        assert [v[1] for v in views] == [["task 0 move 0"], ["task 1 move 0"]]
        await pool.astep([0, 1], [["go"], ["go"]])
        assert (await pool.avalid_actions(0, 1)) == ["go"]
        crashed, = await pool.astep([1], [["go"]])  # task 1's second move kills the worker
        assert isinstance(crashed, EnvError) and "exit code 3" in str(crashed)
        survivor, = await pool.astep([0], [["go"]])  # slot 0 was replayed to move 1
        assert survivor[1] == ["task 0 move 2"] and pool.restarts == 1
        refused, = await pool.astep([0], [["stay"]])
        assert refused[2] and refused[3] == [-1.0, 0.0] and refused[4] == [True]
        over, = await pool.astep([0], [["go"]])
        assert "no running game" in str(over)
    finally:
        pool.close()


async def test_a_game_that_hangs_is_killed_and_only_its_episode_times_out():
    pool = ProcessGamePool(RELAY, 2, 1, timeout_s=2.0)
    try:
        await pool.areset([0, 1], [7, 0], [0, 0])
        await pool.astep([0, 1], [["go"], ["go"]])
        hung, other = await pool.astep([0, 1], [["go"], ["go"]])  # one worker, one queue
        assert isinstance(hung, TimeoutError) and "no result within 2 s" in str(hung)
        assert other[1] == ["task 0 move 2"] and pool.restarts == 1
    finally:
        pool.close()
