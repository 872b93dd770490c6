"""The learner's self-play parts: role-conditioned advantages and per-seat groups checked by
hand, the role baseline's EMA and checkpoint, game outcomes, OpenSkill ratings, and a
self-play training run against an opponent pool that resumes with its pool, baselines and
ratings."""

import json

import numpy as np
import pytest

from agentgym.data.trajectories import Trajectory, pack
from agentgym.learner.advantages import RoleBaseline, compute_advantages
from agentgym.learner.selfplay import SelfPlay, outcomes
from agentgym.learner.train_config import TrainerConfig


def _row(reward, seat, group=0, sample=0, episode=0, player="policy", stop="done"):
    return Trajectory(task_id=0, env_id="tictactoe", group_id=group, sample_index=sample,
                      token_ids=[1, 2, 3], loss_mask=[0, 1, 1], logprobs=[0.0] * 3,
                      prompt_len=1, turn_rewards=[reward], reward=reward, num_turns=1,
                      stop_reason=stop, policy_version=0, seat=seat,
                      role="XO"[seat], player=player, episode_id=episode)


def test_rae_subtracts_each_rows_role_baseline():
    rows = [_row(1.0, 0), _row(-1.0, 1), _row(0.0, 0, episode=1), _row(0.0, 1, episode=1),
            _row(1.0, 0, episode=2, stop="env_error")]
    pb = pack(rows)
    base = np.array([0.25, -0.5, 0.25, -0.5, 0.25], np.float32)
    res = compute_advantages(pb, "rae", role_baseline=base)
    # r - b_role, 0 for the failed row; every model token gets its row's value
    assert res.seq_advantages.tolist() == pytest.approx([0.75, -0.5, -0.25, 0.5, 0.0])
    assert np.allclose(res.advantages.reshape(5, 3)[:, 1:],
                       np.repeat([[0.75], [-0.5], [-0.25], [0.5], [0.0]], 2, axis=1))
    assert res.advantages.reshape(5, 3)[:, 0].tolist() == [0.0] * 5
    plain = compute_advantages(pb, "rae")  # no baseline: REINFORCE on the returns
    assert plain.seq_advantages.tolist() == pytest.approx([1.0, -1.0, 0.0, 0.0, 0.0])


def test_outcome_groups_split_by_seat():
    # one deal (group 0) played twice: each seat's two samples form their own group
    rows = [_row(1.0, 0, sample=0), _row(-1.0, 1, sample=0),
            _row(0.0, 0, sample=1, episode=1), _row(0.0, 1, sample=1, episode=1)]
    res = compute_advantages(pack(rows), "grpo", norm_by_std=False)
    assert res.seq_advantages.tolist() == pytest.approx([0.5, -0.5, -0.5, 0.5])
    # the same rows without seats would be one group of four
    single = [Trajectory(**{**{f: getattr(r, f) for f in r.__struct_fields__}, "seat": 0})
              for r in rows]
    flat = compute_advantages(pack(single), "grpo", norm_by_std=False)
    assert flat.seq_advantages.tolist() == pytest.approx([1.0, -1.0, 0.0, 0.0])


def test_role_baseline_is_an_ema_per_role_and_round_trips():
    b = RoleBaseline(0.5)
    b.update(["t:X", "t:O", "t:X"], np.array([1.0, -1.0, 0.0]), np.array([True, True, True]))
    assert b.values == pytest.approx({"t:X": 0.25, "t:O": -0.5})
    b.update(["t:X", "t:O"], np.array([1.0, 5.0]), np.array([True, False]))  # O: no valid row
    assert b.values == pytest.approx({"t:X": 0.625, "t:O": -0.5})
    assert b.of(["t:O", "t:X", "t:new"]).tolist() == pytest.approx([-0.5, 0.625, 0.0])
    c = RoleBaseline()
    c.load_state_dict(json.loads(json.dumps(b.state_dict())))
    assert (c.decay, c.values) == (b.decay, b.values)
    with pytest.raises(ValueError, match="decay"):
        RoleBaseline(1.0)


def test_outcomes_count_wins_draws_losses_and_failures_of_the_policy():
    rows = [_row(1.0, 0, episode=0), _row(-1.0, 1, episode=0, player="solver"),
            _row(0.0, 0, episode=1, player="solver"), _row(0.0, 1, episode=1),
            _row(-1.0, 0, episode=2), _row(1.0, 1, episode=2, player="solver"),
            _row(0.0, 0, episode=3, stop="backend_error"),
            _row(0.0, 1, episode=3, player="solver", stop="backend_error")]
    m = outcomes(rows, "vs/")
    assert (m["vs/win_rate"], m["vs/draw_rate"], m["vs/loss_rate"], m["vs/failed_rate"]) == \
        (0.25, 0.25, 0.25, 0.25)
    assert m["vs/games"] == 4.0 and m["vs/seat1/draw_rate"] == 1.0
    assert (m["vs/seat0/win_rate"], m["vs/seat0/games"]) == (pytest.approx(1 / 3), 3.0)
    # self-play: both seats are the policy's, each counted from its side
    both = outcomes([_row(1.0, 0), _row(-1.0, 1)])
    assert (both["win_rate"], both["loss_rate"], both["seat0/win_rate"]) == (0.5, 0.5, 1.0)


def test_ratings_follow_the_games():
    sp = SelfPlay("tictactoe", ["X", "O"], "pool")
    games = [[_row(1.0, 0, episode=i), _row(-1.0, 1, episode=i, player="pool:v0")]
             for i in range(5)]
    sp.rate([t for g in games for t in g])
    assert sp.ratings["policy"][0] > sp.ratings["pool:v0"][0]
    before = dict(sp.ratings)
    sp.rate([_row(1.0, 0), _row(-1.0, 1)])  # self-play rates nobody
    assert sp.ratings == before
    assert sp.metrics()["rating/policy"] > sp.metrics()["rating/pool:v0"]


def test_trainer_config_requires_self_play_for_a_game_and_a_game_for_self_play():
    with pytest.raises(ValueError, match="self_play=True"):
        TrainerConfig(env="tictactoe")
    with pytest.raises(ValueError, match="multi-seat game"):
        TrainerConfig(env="maze", self_play=True)
    with pytest.raises(ValueError, match="opponents"):
        TrainerConfig(env="tictactoe", self_play=True, opponents="everyone")
    with pytest.raises(ValueError, match="in process"):
        TrainerConfig(env="tictactoe", self_play=True, opponents="pool", num_rollout_workers=2)
    assert TrainerConfig(env="tictactoe", self_play=True, num_rollout_workers=2).opponents \
        == "self"
    assert TrainerConfig(env="kuhn_poker", self_play=True).adv_estimator == "rae"
    assert TrainerConfig(env="kuhn_poker", self_play=True,
                         learner={"adv_estimator": "grpo"}).adv_estimator == "grpo"


@pytest.mark.slow
def test_pool_self_play_trains_evaluates_and_resumes(tmp_path):
    from agentgym.learner.trainer import Trainer

    kw = dict(env="tictactoe", self_play=True, opponents="pool", tasks_per_step=4,
              n_samples=2, eval_every=2, eval_tasks=2, max_turns=5, max_new_tokens=8,
              max_total_tokens=1024, save_every=2, warmup=None, opponent_pool_every=1,
              opponent_pool_size=2, progress=False, tensorboard=False, plot=False,
              backend_kwargs={"max_batch_size": 16})
    out = tmp_path / "run"
    first = Trainer(output_dir=str(out), max_steps=2, **kw)
    first.train()
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if r["type"] == "eval"]
    assert [r["step"] for r in evals] == [0, 2]
    for r in evals:  # both opponents, both seats, every held-out opening from each seat
        for opp in ("random", "solver"):
            total = sum(r[f"vs_{opp}/{k}_rate"] for k in ("win", "draw", "loss", "failed"))
            assert total == pytest.approx(1.0) and r[f"vs_{opp}/games"] == 4.0
            assert r[f"vs_{opp}/seat0/games"] == r[f"vs_{opp}/seat1/games"] == 2.0
        assert r["success_rate"] == r["vs_random/win_rate"] + r["vs_random/draw_rate"]
    train = [r for r in rows if r["type"] == "train"]
    assert {"rating/policy", "rating/pool:v0", "role_baseline/X",
            "selfplay/win_rate"} <= set(train[-1])
    # the pool holds the last two snapshots (starting weights, then after each step)
    assert [name for name, _ in first.selfplay.pool] == ["pool:v1", "pool:v2"]
    state = first.selfplay.state_dict()

    resumed = Trainer(output_dir=str(out), max_steps=3, resume=str(out), **kw)
    resumed.train()
    assert resumed.step == 3
    assert [name for name, _ in resumed.selfplay.pool] == ["pool:v2", "pool:v3"]
    for name, sd in state["pool"][1:]:  # the kept snapshot's weights came back
        got = dict(resumed.selfplay.pool)[name]
        assert all(np.array_equal(sd[k].numpy(), got[k].numpy()) for k in sd)
    assert set(resumed.selfplay.ratings) >= set(state["ratings"])
