"""Self-correction (``RolloutConfig.undo``): ``agentgym.engine.undo`` and the ``undo``
action through every driver and the engine. The Rust pool's own rules are tested in
``rust/core/src/pool/undo/tests.rs``."""

import pytest

import agentgym
from agentgym import _core
from agentgym.backends.base import GenerateResult
from agentgym.backends.scripted import ScriptedBackend
from agentgym.engine import RolloutEngine
from agentgym.engine.drivers import NativeDriver, ProcessDriver, PythonDriver, make_driver
from agentgym.engine.drivers.undo import UndoHistory, UndoRules
from agentgym.errors import SnapshotUnsupportedError
from tests.helpers import LineEnv, TaskEnv


class Walk(LineEnv):
    """``LineEnv``: ``right`` earns 0.5 (shaping), cell 6 is the goal."""


class NoSnapshots(TaskEnv):
    def step(self, action):
        return "ok", 0.0, False, {}


agentgym.register("test/walk", Walk, override=True)
agentgym.register("test/no_snapshots", NoSnapshots, override=True)


def test_the_texts_and_grammar_come_from_the_core():
    assert _core.parse_undo("Undo 3") == 3 and _core.parse_undo("undo") == 1
    assert _core.parse_undo("undo 0") is None and _core.parse_undo("move north") is None
    assert _core.undo_reply(2, "at 1") == "Undid the last 2 turn(s). at 1"
    assert "only 1 turn(s)" in _core.undo_refusal("too_many", asked=2, available=1)
    with pytest.raises(ValueError):
        _core.undo_refusal("nope")


def test_undo_history_restores_the_env_and_cancels_rewards():
    env = agentgym.make("test/walk")
    obs, _ = env.reset(seed=0)
    h = UndoHistory(UndoRules(max_undos=2, depth=8), obs)
    assert h.step(env, "right")[:2] == ("at 1", 0.5)
    assert h.step(env, "right")[:2] == ("at 2", 0.5)
    assert h.step(env, "undo") == ("Undid the last 1 turn(s). at 1", -0.5, False, False,
                                   {"undo": True})
    assert h.step(env, "right")[:2] == ("at 2", 0.5)  # the same action, the same result
    obs, r, *_ = h.step(env, "UNDO 2")
    assert (obs, r) == ("Undid the last 2 turn(s). at 0", -1.0)
    assert h.step(env, "right")[:2] == ("at 1", 0.5)
    # The cap, then too many turns: refused as invalid, nothing changes.
    refused = h.step(env, "undo")
    assert refused == (_core.undo_refusal("cap", max_undos=2), 0.0, False, False,
                       {"invalid": True})
    assert h.step(env, "right")[:2] == ("at 2", 0.5)


def test_undo_history_applies_the_horizon_and_keeps_depth_turns():
    env = agentgym.make("test/walk")
    obs, _ = env.reset(seed=0)
    h = UndoHistory(UndoRules(max_undos=5, depth=2), obs, max_turns=5)
    for _ in range(3):
        h.step(env, "right")
    assert h.step(env, "undo 3")[0] == _core.undo_refusal("too_many", asked=3, available=2)
    *_, term, trunc, _ = h.step(env, "undo 2")  # the fifth turn: the horizon
    assert (term, trunc) == (False, True) and not h.entries


async def _play(driver, actions):
    (obs,) = await driver.reset_many([(0, 0, 1, None)])
    outs = []
    for a in actions:
        (o,) = await driver.step_many([(0, a)])
        outs.append(o)
    return obs, outs


@pytest.mark.parametrize("kind", ["python", "process"])
async def test_driven_envs_answer_undo(kind):
    rules = UndoRules(max_undos=1, depth=4)
    driver = (PythonDriver("test/walk", 2, undo=rules) if kind == "python"
              else ProcessDriver("test/walk", 2, num_workers=1, undo=rules))
    try:
        _, outs = await _play(driver, ["right", "right", "undo", "right", "undo", "undo 9"])
        assert [(o.observation, o.reward) for o in outs[:4]] == [
            ("at 1", 0.5), ("at 2", 0.5), ("Undid the last 1 turn(s). at 1", -0.5),
            ("at 2", 0.5)]
        assert [o.undo for o in outs] == [False, False, True, False, False, False]
        assert [o.invalid for o in outs] == [False] * 4 + [True, True]
        assert outs[4].observation == _core.undo_refusal("cap", max_undos=1)
        assert outs[5].reward == 0.0 and outs[5].stop_reason is None
    finally:
        driver.close()


@pytest.mark.parametrize("kind", ["python", "process"])
async def test_an_undo_is_a_turn_toward_the_horizon(kind):
    rules = UndoRules(max_undos=5, depth=4)
    driver = (PythonDriver("test/walk", 1, undo=rules) if kind == "python"
              else ProcessDriver("test/walk", 1, num_workers=1, undo=rules))
    try:
        await driver.reset_many([(0, 0, 1, 3)])
        outs = [(await driver.step_many([(0, a)]))[0] for a in ("right", "undo", "right")]
        assert [o.stop_reason for o in outs] == [None, None, "horizon"]
        assert outs[2].truncated and outs[2].observation == "at 1"
    finally:
        driver.close()


async def test_without_undo_rules_undo_is_an_ordinary_action():
    driver = PythonDriver("test/walk", 1)
    try:
        _, (out,) = await _play(driver, ["undo"])
        assert out.observation == "invalid; at 0" and out.invalid and not out.undo
    finally:
        driver.close()


@pytest.mark.parametrize("env_id", ["test/no_snapshots", "_test_panic"])
def test_undo_on_an_env_that_cannot_snapshot_fails_at_setup(env_id):
    rules = UndoRules(3, 16)
    with pytest.raises(SnapshotUnsupportedError):
        make_driver(env_id, 2, undo=rules)
    if env_id == "test/no_snapshots":
        with pytest.raises(SnapshotUnsupportedError):
            make_driver(env_id, 2, env_workers=1, undo=rules)


def test_native_driver_sets_the_pool_rules():
    driver = NativeDriver("maze", 2, undo=UndoRules(2, 5))
    assert driver.core_pool.undo == (2, 5)
    assert NativeDriver("maze", 2).core_pool.undo is None


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


class UndoAtTurn(ScriptedBackend):
    """The env's oracle, except ``Action: undo`` at turn ``at`` of every episode."""

    def __init__(self, tokenizer, at: int):
        super().__init__(tokenizer)
        self.at = at

    async def generate(self, prompt_ids, sampling, request_id=None, context=None):
        turn = int(request_id.rsplit("-", 2)[1])
        if turn != self.at:
            return await super().generate(prompt_ids, sampling, request_id, context)
        ids = self._encode("Action: undo") + [self.end_of_turn_id]
        return GenerateResult(token_ids=ids, logprobs=[0.0] * len(ids), finish_reason="stop",
                              policy_version=self.policy_version)


@pytest.mark.parametrize("env_id, kwargs", [("maze", {"shaping": 0.5}),
                                            ("office", {}),
                                            ("test/walk", {}),
                                            ("test/walk", {"env_workers": 1})])
def test_engine_plays_undo_and_keeps_the_undone_turns(tokenizer, env_id, kwargs):
    env_kwargs = {"shaping": 0.5} if env_id == "maze" else None
    kwargs = {k: v for k, v in kwargs.items() if k != "shaping"}
    plain = RolloutEngine(ScriptedBackend(tokenizer), tokenizer, max_turns=40,
                          max_total_tokens=8192)
    base = plain.collect_sync(3, env_id, env_kwargs=env_kwargs, **kwargs)
    eng = RolloutEngine(UndoAtTurn(tokenizer, at=2), tokenizer, max_turns=40,
                        max_total_tokens=8192, undo=True)
    batch = eng.collect_sync(3, env_id, env_kwargs=env_kwargs, **kwargs)
    eot = eng.formatter.end_of_turn_id
    for ref, traj in zip(base, batch):
        assert traj.stop_reason == "done" and traj.success
        # The undone turn is replayed, and the undo is a turn of its own.
        assert traj.num_turns == ref.num_turns + 2
        assert traj.timings["undo_turns"] == 1.0 and "invalid_turns" not in traj.timings
        # Its reward cancels the undone turn's: the return is the surviving path's.
        assert traj.turn_rewards[2] == -traj.turn_rewards[1]
        assert traj.reward == pytest.approx(ref.reward)
        # Every reply, the undone one and the undo included, is a policy token run.
        mask = traj.loss_mask
        runs = sum(1 for i, m in enumerate(mask) if m and (i == 0 or not mask[i - 1]))
        assert runs == traj.num_turns
        text = tokenizer.decode(traj.token_ids)
        assert text.count("Action: undo") == 1
        assert "Undid the last 1 turn(s). " in text
        assert traj.token_ids.count(eot) >= traj.num_turns
    assert batch.metrics["undo_turns/mean"] == 1.0
    assert base.metrics["undo_turns/mean"] == 0.0
    eng.close()
    plain.close()


@pytest.mark.parametrize("env_id", ["_test_panic", "test/no_snapshots"])
def test_engine_refuses_undo_before_any_episode(tokenizer, env_id):
    backend = ScriptedBackend(tokenizer)
    eng = RolloutEngine(backend, tokenizer, undo=True)
    with pytest.raises(SnapshotUnsupportedError):
        eng.collect_sync(2, env_id)
    assert backend.requests == 0
