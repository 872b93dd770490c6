"""bench/peer_trl_rollout.py on one tiny configuration: TRL's own environment_factory tool
loop really plays several tool calls per episode, both arms play the planned episodes, and
the counts agree with each other."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("trl", reason="trl is not installed: the TRL peer bench needs it")

from bench import peer_trl_rollout as bench  # noqa: E402


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.filterwarnings("ignore")
def test_peer_trl_rollout_tiny(tmp_path):
    out = tmp_path / "peer.json"
    res = bench.main(["--tasks", "2", "--num-generations", "2", "--max-turns", "3",
                      "--max-new-tokens", "96", "--repeats", "1", "--warmup-steps", "150",
                      "--warmup-batch", "4", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(res))
    episodes = 4
    for arm in ("trl", "agentgym"):
        (run,) = res["runs"][arm]
        assert run["episodes"] == episodes
        assert run["wall_s"] > 0 and run["generated_tokens"] > 0
        assert run["generations"] >= episodes
        assert run["env_steps"] <= episodes * 3
        # one row per reply in the observed generation batches
        assert run["generation_batches"] >= 1
        assert round(run["batch_rows_mean"] * run["generation_batches"]) == run["generations"]
        assert 0.0 <= run["under_half_batch_time_share"] <= 1.0
        assert len(run["batch_decode_steps"]) == run["generation_batches"]
        assert all(1 <= k <= 96 for k in run["batch_decode_steps"])
    trl = res["runs"]["trl"][0]
    # TRL's loop continued the episodes through parsed tool calls: more than one call an
    # episode on average would need a longer format warm-up than this test's 150 steps (the
    # sampled calls are [1, 3, 1, 0] with this build's tiny model, before and after issue 51)
    assert trl["tool_calls"] >= episodes
    assert sum(trl["tool_calls_per_episode"]) == trl["env_steps"] <= trl["tool_calls"]
    assert max(trl["tool_calls_per_episode"]) >= 2
    # one generation per tool round plus the first reply
    assert episodes <= trl["generations"] <= trl["env_steps"] + episodes + (trl["tool_calls"]
                                                                           - trl["env_steps"])
    ag = res["runs"]["agentgym"][0]
    assert ag["env_steps"] == ag["generations"]
    assert set(res["ratios_agentgym_over_trl_median"]) == {
        "trajectories_per_s", "turns_per_s", "env_steps_per_s", "generated_tokens_per_s"}
