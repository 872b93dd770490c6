"""``bench/ratios.py``: the table from a ratios.json (median (min-max), "a tie" where the
range includes 1.0x, skipped benches said so), the agreement check between two runs, the
selection flags, and one real bench (EnvPool's, the fastest) run through it end to end."""

from __future__ import annotations

import json

import pytest

from bench import ratios


def _block(name, median, lo, hi, num="engine", den="peer"):
    return {"name": name, "numerator": num, "denominator": den,
            "ratio": {"median": median, "min": lo, "max": hi, "pairs": [lo, median, hi]},
            "tie": lo <= 1.0 <= hi, "load_before": [0.5, 0, 0], "load_after": [1.2, 0, 0],
            "pinning": {"pinned": True}}


REPORT = {"benches": {
    "agentgym_rl": {"status": "ok", "peer": "AgentGym-RL", "model": "tiny",
                    "comparisons": [_block("32 in flight", 1.9, 1.7, 2.2),
                                    _block("64 in flight", 1.1, 0.9, 1.4)]},
    "verl": {"status": "skipped", "peer": "verl", "model": "tiny",
             "reason": ".venv-verl/bin/python is missing"},
}}


def test_table_has_one_row_per_comparison_and_never_more_than_the_median():
    text = ratios.table(REPORT)
    lines = text.strip().splitlines()
    assert len(lines) == 2 + 3  # header, rule, two comparisons, one skipped bench
    assert "1.90x (1.70-2.20x) |" in lines[2] and "a tie" not in lines[2]
    assert "1.10x (0.90-1.40x), a tie" in lines[3]
    assert "not measured" in lines[4] and "skipped" in lines[4]
    for r in ratios.rows(REPORT):
        if r["ratio"] is not None:  # the row's leading figure is its median
            assert r["ratio"].startswith(f"{r['median']:.2f}x")
    assert "| 3 | 1.2 |" in lines[2]  # rounds, the larger load average


def test_check_wants_each_median_inside_the_others_range():
    other = json.loads(json.dumps(REPORT))
    ok, lines = ratios.check(REPORT, other)
    assert ok and all(line.startswith("agree") for line in lines)
    moved = json.loads(json.dumps(REPORT))
    moved["benches"]["agentgym_rl"]["comparisons"][0] = _block("32 in flight", 2.9, 2.5,
                                                                3.1)
    ok, lines = ratios.check(REPORT, moved)
    assert not ok and any(line.startswith("DISAGREE") and "32 in flight" in line
                          for line in lines)


def _args(*argv):
    ap_args = ["--out", "/nonexistent/ratios.json", *argv]
    import argparse

    from bench.harness import add_arguments

    ap = argparse.ArgumentParser()
    for flag, kw in (("--set", {"default": "all"}), ("--only", {"nargs": "+"}),
                     ("--skip", {"nargs": "+", "default": []}),
                     ("--include-engine", {"action": "store_true"}), ("--out", {})):
        ap.add_argument(flag, **kw)
    add_arguments(ap)
    return ap.parse_args(ap_args)


def test_selection():
    names = [s.name for s in ratios.selected(_args())]
    assert "vllm_e2e" not in names and names[0] == "envpool"
    assert {"agentgym_rl", "verl", "skyrl", "trl_rollout", "trl_learner", "spiral"} <= set(names)
    tiny = [s.name for s in ratios.selected(_args("--set", "tiny"))]
    assert "envpool" in tiny and not any(n.endswith("_smollm2") for n in tiny)
    assert [s.name for s in ratios.selected(_args("--only", "vllm_e2e"))] == ["vllm_e2e"]
    assert "verl" not in [s.name for s in ratios.selected(_args("--skip", "verl"))]
    with pytest.raises(SystemExit):
        ratios.selected(_args("--only", "nope"))


def test_every_spec_names_a_bench_and_fills_its_fields():
    for spec in ratios.SPECS:
        assert (ratios.ROOT / "bench" / spec.script).is_file()
        fields = {a[1:-1] for a in spec.argv + spec.smoke if a.startswith("{")}
        needed = {"agentgym_rl_src"} if "agentgym_rl_src" in spec.needs else set()
        if "spiral" in spec.needs:
            needed |= {"spiral_src", "spiral_textarena"}
        if "smollm2_dir" in spec.needs:
            needed.add("smollm2_dir")
        assert fields <= needed, spec.name


def test_envpool_through_ratios_end_to_end(tmp_path):
    pytest.importorskip("envpool", reason="envpool (the peers extra) is not installed")
    out = tmp_path / "ratios.json"
    report = ratios.main(["--smoke", "--only", "envpool", "--out", str(out),
                          "--log-dir", str(tmp_path / "logs")])
    saved = json.loads(out.read_text())
    assert saved["benches"]["envpool"]["status"] == "ok"
    assert saved["harness"]["repeats"] == 1 and saved["harness"]["smoke"]
    blocks = saved["benches"]["envpool"]["comparisons"]
    assert len(blocks) == 4 and all(b["denominator"] == "envpool" for b in blocks)
    assert (tmp_path / "peer_envpool.json").exists()  # the bench's own file, beside it
    assert report["benches"]["envpool"]["status"] == "ok"
    text = ratios.table(saved)
    assert text.count("\n") == 2 + 4
