"""What a collection shows: the bar's counters (success so far, failures by stop reason) and
the summary built from per-shard stats."""

from agentgym.collection.progress import Progress, format_summary, run_summary, shard_stats
from agentgym.collection.schema import trajectories_table
from agentgym.data.trajectories import RowInfo, pack
from tests.helpers import make_trajectory


def trajs():
    return [make_trajectory([1, 2, 3], [0, 1, 1], reward=1.0),
            make_trajectory([1, 2], [0, 1], reward=0.5, stop_reason="horizon"),
            make_trajectory([1, 2], [0, 0], stop_reason="env_error", error="x"),
            make_trajectory([1], [0], stop_reason="timeout")]


def test_bar_counts_success_and_failures_by_stop_reason():
    p = Progress(total=10, already=2, show=False)
    ts = trajs()
    p.update(ts[:1])
    p.update(ts[1:])
    text = p.postfix()
    assert "success 0.25" in text and "failed env_error=1 timeout=1" in text
    s = p.session()
    assert (s["episodes"], s["generated_tokens"], s["failures"]) == \
        (4, 3, {"env_error": 1, "timeout": 1})
    p.update_packed(pack(ts), RowInfo.of(ts))  # the same counts from the packed rows
    assert "success 0.25" in p.postfix() and "failed env_error=2 timeout=2" in p.postfix()
    s = p.session()
    assert (s["episodes"], s["generated_tokens"], s["failures"]) == \
        (8, 6, {"env_error": 2, "timeout": 2})
    assert p.successes == 2


def test_summary_sums_the_shard_stats():
    t = trajectories_table(trajs(), run_id="r", max_turns=2, env_kwargs={})
    stats = [shard_stats(t.slice(0, 3)), shard_stats(t.slice(3))]
    run = run_summary(stats, expected=6)
    assert run == {"rows": 4, "expected": 6, "complete": False, "success_rate": 0.25,
                   "reward_mean": 1.5 / 4, "num_turns_mean": 0.5, "generated_tokens": 3,
                   "stop_reasons": {"done": 1, "env_error": 1, "horizon": 1, "timeout": 1},
                   "failed": 2}
    text = format_summary({"out": "d", "run": run, "shards": 2,
                           "session": Progress(1, 0, show=False).session()})
    assert "4 / 6 (incomplete)" in text and "env_error=1" in text
