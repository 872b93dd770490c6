"""ScalingInter-RL horizon schedules: stage switching, adaptive advance, resume."""

import json

import numpy as np
import pytest

from agentgym.learner.horizon import (
    AdaptiveHorizonSchedule,
    HorizonSchedule,
    HorizonStage,
    presets,
)


@pytest.mark.parametrize(
    "family, rounds, every",
    [("textcraft", (10, 20, 30), 100), ("babyai", (6, 13, 20), 100),
     ("searchqa", (5, 8, 10), 100), ("sciworld", (10, 20, 30), 100),
     ("webarena", (8, 12, 15), 80)],
)
def test_presets_match_agentgym_rl(family, rounds, every):
    assert presets[family] == {"rounds": rounds, "steps_per_stage": every}
    s = HorizonSchedule.from_preset(family)
    assert s.max_turns(0) == rounds[0]
    assert s.max_turns(every - 1) == rounds[0]
    assert s.max_turns(every) == rounds[1]
    assert s.max_turns(2 * every - 1) == rounds[1]
    assert s.max_turns(2 * every) == rounds[2]
    assert s.max_turns(10**6) == rounds[2]
    assert s.stage_index(2 * every) == 2


def test_unknown_preset_and_bad_schedules():
    with pytest.raises(KeyError):
        HorizonSchedule.from_preset("minecraft")
    with pytest.raises(ValueError):
        HorizonSchedule([])
    with pytest.raises(ValueError):
        HorizonSchedule([5, 10])  # steps_per_stage missing
    with pytest.raises(ValueError):
        HorizonSchedule([5, 10], [0])
    with pytest.raises(ValueError):
        HorizonStage(0)
    with pytest.raises(ValueError):
        HorizonSchedule.fixed(5).max_turns(-1)


def test_fixed_is_one_stage():
    s = HorizonSchedule.fixed(15)
    assert s.num_stages == 1
    assert [s.max_turns(x) for x in (0, 1, 10_000)] == [15, 15, 15]
    assert s.metrics(3) == {"horizon/max_turns": 15.0, "horizon/stage": 0.0}


def test_per_stage_lengths_and_current_step():
    s = HorizonSchedule([4, 8, 16], [10, 30])
    assert s.boundaries == (10, 40)
    assert [s.max_turns(x) for x in (0, 9, 10, 39, 40)] == [4, 4, 8, 8, 16]
    assert s.max_turns() == 4
    assert not s.update(9)
    assert s.update(10)
    assert s.max_turns() == 8
    assert HorizonSchedule([4, 8, 16], [10, 30, 99]).boundaries == (10, 40)


def test_reward_shaping_per_stage():
    stages = [HorizonStage(5), HorizonStage(10, turn_penalty=0.01, reward_discount=0.9),
              HorizonStage(20)]
    s = HorizonSchedule(stages, 100)
    r, turns = np.array([1.0, 0.0]), np.array([3, 1])
    assert s.shape_rewards(r, turns, step=0).tolist() == [1.0, 0.0]
    shaped = s.shape_rewards(r, turns, step=150)
    assert shaped.tolist() == pytest.approx([0.81 - 0.03, -0.01])
    assert s.stage(150).shapes_rewards and not s.stage(250).shapes_rewards


def test_adaptive_advances_on_threshold():
    s = AdaptiveHorizonSchedule([5, 10, 20], window=3, success_threshold=0.8,
                                min_improvement=-1.0)
    changed = [s.update(step + 1, rate) for step, rate in enumerate([0.5, 0.9, 0.9, 0.9])]
    assert changed == [False, False, False, True]
    assert s.max_turns() == 10 and s.stage_starts == [0, 4]
    assert s.max_turns(3) == 5 and s.max_turns(4) == 10


def test_adaptive_advances_on_plateau_not_while_improving():
    s = AdaptiveHorizonSchedule([5, 10], window=2, min_improvement=0.05, success_threshold=None)
    for step, rate in enumerate([0.1, 0.2, 0.3, 0.4], start=1):  # improving by 0.2
        assert not s.update(step, rate)
    s2 = AdaptiveHorizonSchedule([5, 10], window=2, min_improvement=0.05, success_threshold=None)
    results = [s2.update(step, rate) for step, rate in enumerate([0.3, 0.3, 0.31, 0.3], 1)]
    assert results == [False, False, False, True]
    # last stage: never advances further
    for step in range(5, 20):
        assert not s2.update(step, 0.3)
    assert s2.stage_index() == 1


def test_adaptive_min_and_max_steps():
    s = AdaptiveHorizonSchedule([5, 10, 20], window=1, success_threshold=0.5,
                                min_steps_per_stage=3, max_steps_per_stage=None)
    assert [s.update(i, 1.0) for i in (1, 2, 3)] == [False, False, True]
    s = AdaptiveHorizonSchedule([5, 10], window=50, success_threshold=None,
                                max_steps_per_stage=4)
    assert [s.update(i, 0.0) for i in (1, 2, 3, 4)] == [False, False, False, True]
    with pytest.raises(ValueError):
        s.update(5, float("nan"))


def test_resume_round_trip_stepwise():
    s = HorizonSchedule.from_preset("webarena")
    s.update(123)
    state = json.loads(json.dumps(s.state_dict()))
    s2 = HorizonSchedule.from_preset("webarena")
    s2.load_state_dict(state)
    assert s2.current_step == 123 and s2.max_turns() == 12
    with pytest.raises(ValueError):
        HorizonSchedule.from_preset("babyai").load_state_dict(state)
    with pytest.raises(ValueError):
        AdaptiveHorizonSchedule([8, 12, 15]).load_state_dict(state)


def test_resume_round_trip_adaptive():
    rates = [0.2, 0.5, 0.9, 0.95, 0.4, 0.45]
    full = AdaptiveHorizonSchedule([5, 10, 20], window=2, success_threshold=0.9)
    for i, r in enumerate(rates, 1):
        full.update(i, r)
    half = AdaptiveHorizonSchedule([5, 10, 20], window=2, success_threshold=0.9)
    for i, r in enumerate(rates[:3], 1):
        half.update(i, r)
    resumed = AdaptiveHorizonSchedule([5, 10, 20], window=2, success_threshold=0.9)
    resumed.load_state_dict(json.loads(json.dumps(half.state_dict())))
    for i, r in enumerate(rates[3:], 4):
        resumed.update(i, r)
    assert resumed.state_dict() == full.state_dict()
    assert resumed.max_turns() == full.max_turns()
