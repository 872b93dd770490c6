"""``bench/harness.py``: the statistics (known inputs -> known medians and ranges), the
interleaving order, the tie flag, the core split, pinning this process, and a comparison
run end to end on two trivial arms."""

from __future__ import annotations

import argparse
import asyncio
import json
import os

import pytest

from bench import harness as h


def test_spread_is_median_and_range():
    assert h.spread([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0,
                                         "runs": [3.0, 1.0, 2.0]}
    assert h.spread([4, 1, 3, 2])["median"] == 2.5  # even count: mean of the middle two
    with pytest.raises(ValueError):
        h.spread([])


def test_ratio_is_the_median_of_per_pair_ratios_not_of_medians():
    a = [10.0, 20.0, 30.0, 40.0, 50.0]
    b = [5.0, 20.0, 10.0, 80.0, 25.0]
    r = h.ratio_stats(a, b)
    assert r["pairs"] == [2.0, 1.0, 3.0, 0.5, 2.0]
    assert r["median"] == 2.0 and r["min"] == 0.5 and r["max"] == 3.0
    assert r["tie"] is True  # 0.5 .. 3.0 includes 1.0
    # the ratio of the medians would be 30 / 20 = 1.5: not what is reported
    assert h.statistics.median(a) / h.statistics.median(b) == 1.5


def test_tie_is_flagged_exactly_when_the_range_includes_one():
    assert h.ratio_stats([2, 3, 4], [1, 1, 1])["tie"] is False  # 2..4
    assert h.ratio_stats([1, 3], [1, 1])["tie"] is True  # min is exactly 1.0
    assert h.ratio_stats([0.9, 1.1], [1, 1])["tie"] is True
    assert h.ratio_stats([0.5, 0.8], [1, 1])["tie"] is False  # the peer wins, clearly


def test_summarize_gives_the_block_shape():
    s = h.summarize({"engine": [4.0, 6.0, 5.0], "peer": [2.0, 2.0, 2.5]}, "engine", "peer")
    assert s["numerator"] == "engine" and s["denominator"] == "peer"
    assert s["ratio"] == {"median": 2.0, "min": 2.0, "max": 3.0, "pairs": [2.0, 3.0, 2.0]}
    assert s["arms"]["engine"] == {"median": 5.0, "min": 4.0, "max": 6.0,
                                   "runs": [4.0, 6.0, 5.0]}
    assert s["arms"]["peer"]["median"] == 2.0 and s["tie"] is False


def test_unpaired_or_zero_runs_are_refused():
    with pytest.raises(ValueError):
        h.ratio_stats([1.0, 2.0], [1.0])
    with pytest.raises(ZeroDivisionError):
        h.ratio_stats([1.0], [0.0])


def test_interleaving_alternates_two_arms_and_rotates_three():
    assert [h.round_order(["A", "B"], r) for r in range(4)] == [
        ["A", "B"], ["B", "A"], ["A", "B"], ["B", "A"]]
    assert [h.round_order(["A", "B", "C"], r) for r in range(3)] == [
        ["A", "B", "C"], ["B", "C", "A"], ["C", "A", "B"]]
    plan = h.schedule(["A", "B"], 3)
    assert plan == [("warmup", -1, "A"), ("warmup", -1, "B"),
                    ("run", 0, "A"), ("run", 0, "B"), ("run", 1, "B"), ("run", 1, "A"),
                    ("run", 2, "A"), ("run", 2, "B")]
    assert h.schedule(["A", "B"], 1, warmup=False) == [("run", 0, "A"), ("run", 0, "B")]
    with pytest.raises(ValueError):
        h.schedule(["A"], 3)
    with pytest.raises(ValueError):
        h.schedule(["A", "B"], 0)


def test_format_and_consistency():
    block = {"ratio": {"median": 2.312, "min": 1.951, "max": 2.6}, "tie": False}
    assert h.fmt_ratio(block) == "2.31x (1.95-2.60x)"
    assert h.fmt_ratio({"ratio": {"median": 1.02, "min": 0.9, "max": 1.2},
                        "tie": True}) == "1.02x (0.90-1.20x), a tie"
    a = {"ratio": {"median": 2.0, "min": 1.8, "max": 2.4}}
    b = {"ratio": {"median": 2.2, "min": 1.9, "max": 2.5}}
    c = {"ratio": {"median": 2.9, "min": 2.5, "max": 3.1}}
    assert h.consistent(a, b) and h.consistent(b, a)
    assert not h.consistent(a, c)


def test_core_lists():
    assert h.parse_cores("0") == [0]
    assert h.parse_cores("3,0-1") == [0, 1, 3]
    assert h.parse_cores(None) is None and h.parse_cores("") is None
    assert h.cores_text([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    with pytest.raises(ValueError):
        h.parse_cores("3-1")


def test_core_split_defaults():
    two = h.plan_cores(allowed=[0, 1])
    assert two.server == [0] and two.client == [1] and not two.shared
    big = h.plan_cores(allowed=list(range(16)))
    assert big.client == [15] and big.server == list(range(15))
    one = h.plan_cores(allowed=[0])
    assert one.server == [0] and one.client == [0] and one.shared
    asked = h.plan_cores("0-3", "4-5", allowed=list(range(8)))
    assert asked.server == [0, 1, 2, 3] and asked.client == [4, 5]
    only_client = h.plan_cores(None, "2", allowed=[0, 1, 2, 3])
    assert only_client.server == [0, 1, 3]
    no_server = h.plan_cores(with_server=False, allowed=[0, 1])
    assert no_server.server is None and no_server.client == [0, 1]
    with pytest.raises(ValueError):
        h.plan_cores("7", allowed=[0, 1])


def test_server_env_binds_vllms_openmp_threads():
    hs = h.Harness(h.plan_cores(allowed=[0, 1]))
    assert hs.server_env() == {"VLLM_CPU_OMP_THREADS_BIND": "0"}
    assert h.Harness(h.plan_cores(allowed=[0, 1], pin=False)).server_env() == {}
    assert h.Harness(h.plan_cores(with_server=False, allowed=[0, 1])).server_env() == {}


def test_pin_self_moves_every_thread_and_restores():
    import threading

    before = os.sched_getaffinity(0)
    core = max(before)
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        assert h.pin_self([core]) >= 2  # this thread and the other
        for tid in h.threads_of(os.getpid()):
            assert os.sched_getaffinity(tid) == {core}
    finally:
        stop.set()
        t.join()
        h.pin_self(sorted(before))
    assert os.sched_getaffinity(0) == before


def test_cpu_meter_counts_this_process():
    m = h.CpuMeter()
    into: dict = {}
    with m.measure(into):
        sum(i * i for i in range(200_000))
    assert set(into) == {"cpu_s", "cpu_wall_s"} and into["cpu_s"]["client"] >= 0.0


def _args(**kw):
    ap = argparse.ArgumentParser()
    h.add_arguments(ap)
    return ap.parse_args([f"--{k.replace('_', '-')}={v}" if v is not True else
                          f"--{k.replace('_', '-')}" for k, v in kw.items()])


def test_flags_and_their_command_line():
    args = _args(repeats=3, client_cores="1", no_pin=True)
    assert args.repeats == 3 and args.client_cores == "1" and args.no_pin
    assert h.harness_argv(args) == ["--repeats", "3", "--client-cores", "1", "--no-pin"]
    assert _args().repeats == h.DEFAULT_REPEATS == 5


def test_compare_runs_interleaved_with_a_warmup_and_reports_the_block():
    calls = []
    values = {"engine": iter([4.0, 6.0, 5.0]), "peer": iter([2.0, 2.0, 2.5])}

    def arm(name):
        def run():
            calls.append(name)
            if len(calls) <= 2:  # the warm-ups
                return {"x": -1.0}
            return {"x": next(values[name]), "tokens": 10.0}
        return run

    hs = h.Harness(h.plan_cores(allowed=sorted(os.sched_getaffinity(0)), pin=False),
                   repeats=3, log=lambda s: None)
    block, rows = hs.compare("demo", {"engine": arm("engine"), "peer": arm("peer")},
                             metric="x", numerator="engine", denominator="peer",
                             other_metrics=["tokens"])
    assert calls == ["engine", "peer", "engine", "peer", "peer", "engine", "engine", "peer"]
    assert block["order"] == [["engine", "peer"], ["peer", "engine"], ["engine", "peer"]]
    assert block["ratio"]["pairs"] == [2.0, 3.0, 2.0] and block["ratio"]["median"] == 2.0
    assert block["arms"]["engine"]["runs"] == [4.0, 6.0, 5.0]
    assert block["tie"] is False and block["repeats"] == 3
    assert block["other_ratios"]["tokens"]["median"] == 1.0
    for key in ("load_before", "load_after", "cores", "pinning"):
        assert key in block
    assert block["cores"]["cpu_count"] == os.cpu_count()
    assert block["pinning"]["pinned"] is False
    assert all("cpu_s" in r for r in rows["engine"])
    json.dumps(block)  # JSON as it is


def test_acompare_awaits_coroutine_arms():
    async def fast():
        return {"x": 2.0}

    async def slow():
        return {"x": 1.0}

    hs = h.Harness(h.plan_cores(allowed=sorted(os.sched_getaffinity(0)), pin=False),
                   repeats=2, log=lambda s: None)
    block, _ = asyncio.run(hs.acompare("a", {"fast": fast, "slow": slow}, metric="x",
                                       numerator="fast", denominator="slow"))
    assert block["ratio"]["pairs"] == [2.0, 2.0] and not block["tie"]


def test_write_json_atomic(tmp_path):
    p = tmp_path / "sub" / "r.json"
    h.write_json_atomic(p, {"a": 1})
    assert json.loads(p.read_text()) == {"a": 1}
    assert [x.name for x in p.parent.iterdir()] == ["r.json"]  # no temporary left
