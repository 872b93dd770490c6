"""``bench/peer_envpool.py`` on a tiny configuration: EnvPool's own ``CartPole-v1`` and the
pool's ``_bench_cartpole`` play the same pushes at each batch size, and the report carries
every engine's rate and the ratios."""

from __future__ import annotations

import numpy as np
import pytest

import agentgym
from bench import peer_envpool as peer

pytest.importorskip("envpool", reason="envpool (the peers extra) is not installed")


def test_tiny_run_reports_every_engine_and_ratio():
    report = peer.measure([1, 8], [1], steps=400, repeats=1)
    assert report["peer"].startswith("envpool ")
    assert [(r["threads"], r["num_envs"]) for r in report["rows"]] == [(1, 1), (1, 8)]
    for row in report["rows"]:
        for engine in peer.ENGINES:
            assert row[f"{engine}_steps_per_s"] > 0
            # 400 transitions of random pushes: CartPole falls within about 10-40 steps.
            assert row[f"{engine}_episodes_ended"] > 0
        # one round: the ratio is that round's pair
        assert row["ratio_pool_text"] == pytest.approx(
            row["pool_text_steps_per_s"] / row["envpool_steps_per_s"], rel=0.01)
    blocks = report["comparisons"]
    assert [(b["num_envs"], b["numerator"]) for b in blocks] == [
        (1, "pool_text"), (1, "pool_no_text"), (8, "pool_text"), (8, "pool_no_text")]
    for b in blocks:
        assert b["denominator"] == "envpool" and len(b["ratio"]["pairs"]) == 1
        assert set(b) >= {"arms", "tie", "load_before", "load_after", "cores", "pinning"}


# EnvPool builds its observation space from float64 bounds; Gymnasium warns on the cast.
@pytest.mark.filterwarnings("ignore:.*precision lowered by casting to float32:UserWarning")
def test_bench_cartpole_matches_envpool_dynamics_from_the_same_state():
    # From EnvPool's start state, the same pushes give the same trajectory as its CartPole-v1
    # (float32 there, four decimals here): the bench compares engines, not different envs.
    import envpool

    agentgym._core._register_test_envs()
    env = envpool.make("CartPole-v1", env_type="gymnasium", num_envs=1, seed=3)
    start, _ = env.reset()
    pushes = [1, 0, 0, 1, 1, 1, 0, 0]
    theirs = [env.step(np.array([a], dtype=np.int32))[0][0] for a in pushes]
    pool = agentgym.EnvPool("_bench_cartpole", 1, max_turns=500)
    pool.reset(tasks=[" ".join(repr(float(v)) for v in start[0])], seeds=[0])
    ours = []
    for a in pushes:
        (obs,), _, terminated, _ = pool.step([0], [str(a)])
        ours.append([float(part.split("=")[1]) for part in obs.split()])
        assert not terminated[0]
    assert np.allclose(np.array(ours), np.array(theirs), atol=2e-4)


def test_text_flag_skips_the_observation():
    agentgym._core._register_test_envs()
    text = agentgym.EnvPool("_bench_cartpole", 2, max_turns=500)
    bare = agentgym.EnvPool("_bench_cartpole", 2, max_turns=500, text=False)
    assert all(o.startswith("x=") for o in text.reset())
    assert bare.reset() == ["", ""]
    obs, rewards, terminated, _ = bare.step([0, 1], ["left", "jump"])
    assert obs == ["", ""] and rewards.tolist() == [1.0, 0.0] and not terminated.any()
    assert bare.invalid_turns([0, 1]) == [0, 1]
