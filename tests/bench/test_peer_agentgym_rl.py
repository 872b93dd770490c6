"""``bench/peer_agentgym_rl.py`` on a tiny configuration: AgentGym-RL's own rollout loop
(from the checkout in ``$AGENTGYM_RL_SRC``) and the engine play the same episodes on one
vLLM server. AgentGym-RL is not a package (its source is on GitHub only), so without a
checkout the run skips."""

from __future__ import annotations

import argparse
import os

import pytest

from bench import peer_agentgym_rl as peer

SRC = os.environ.get("AGENTGYM_RL_SRC")


def test_without_a_checkout_the_report_says_so(monkeypatch):
    monkeypatch.delenv("AGENTGYM_RL_SRC", raising=False)
    report = peer.measure(argparse.Namespace(
        src=None, episodes=4, concurrency=[2], max_turns=2, max_tokens=4, max_model_len=1024,
        repeats=1, model="tiny"))
    assert report["rows"] == [] and "AGENTGYM_RL_SRC" in report["skipped"]


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.skipif(not SRC, reason="no AgentGym-RL checkout: set AGENTGYM_RL_SRC "
                                    "(github.com/WooooDyy/AgentGym-RL with its submodule)")
def test_both_loops_play_the_same_episodes():
    report = peer.measure(argparse.Namespace(
        src=SRC, episodes=6, concurrency=[3], max_turns=3, max_tokens=4, max_model_len=2048,
        repeats=1, model="tiny"))
    (row,) = report["rows"]
    (ours,), (theirs,) = row["runs"]["engine"], row["runs"]["agentgym_rl"]
    assert ours["trajectories"] == theirs["trajectories"] == 6
    # The env ends each task at its own horizon and the random model never solves one, so
    # both loops play exactly the same turns.
    assert ours["turns"] == theirs["turns"]
    assert ours["stop_reasons"] == {"done": 6}
    assert theirs["generated_tokens"] > 0 and ours["generated_tokens"] > 0
    # the shim sent one request per turn, over its persistent session
    assert report["peer_client"] == "session" and theirs["shim_requests"] == theirs["turns"]
    (block,) = report["comparisons"]
    assert block["numerator"] == "engine" and block["denominator"] == "agentgym_rl"
    assert block["ratio"]["median"] == pytest.approx(
        ours["trajectories_per_s"] / theirs["trajectories_per_s"])
    assert block["arms"]["engine"]["runs"] == [ours["trajectories_per_s"]]
    assert set(block) >= {"tie", "load_before", "load_after", "cores", "pinning"}
    assert block["cores"]["server"] is not None
