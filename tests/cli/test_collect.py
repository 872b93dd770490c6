"""``agentgym-rl collect`` as a user runs it: SIGKILLed at random moments and rerun, every
key ends up on disk exactly once; ``agentgym-rl export`` of the folder."""

import json
import os
import random
import re
import signal
import subprocess
import sys
import time

import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from agentgym.cli import build_parser, main
from agentgym.cli.collect import parse_tasks
from agentgym.collection import store

TASKS, SAMPLES = 3000, 2


def shards(out):
    return [f for f in os.listdir(out) if f.startswith("part-")] if os.path.isdir(out) else []


@pytest.mark.slow
def test_kill_9_at_random_moments_then_rerun_gives_every_key_exactly_once(tiny_model_dir,
                                                                         tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "agentgym.cli", "collect", "--env", "maze",
           "--tasks", f"0:{TASKS}", "--n-samples", str(SAMPLES), "--max-turns", "20",
           "--out", str(out), "--shard-size", "16", "--model", tiny_model_dir,
           "--max-concurrency", "32", "--no-progress"]
    rng = random.Random()
    delays = []
    for _ in range(3):
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        n0, t0 = len(shards(out)), time.monotonic()
        while len(shards(out)) <= n0 and p.poll() is None and time.monotonic() - t0 < 240:
            time.sleep(0.02)
        delays.append(rng.uniform(0.0, 0.5))
        time.sleep(delays[-1])
        assert p.poll() is None, f"the run ended before its kill: {p.stderr.read()!r}"
        p.send_signal(signal.SIGKILL)
        p.wait()
        p.stderr.close()
    partial = ds.dataset(str(out), format="parquet").count_rows()
    assert 0 < partial < TASKS * SAMPLES, delays
    (out / ".part-000777.parquet.1.tmp").write_bytes(b"half a shard")  # a crash's leftover
    done = subprocess.run(cmd + ["--json"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["run"]["complete"] and summary["session"]["episodes"] == \
        TASKS * SAMPLES - partial
    assert not (out / ".part-000777.parquet.1.tmp").exists()
    keys = []
    for f in store.shard_files(out):
        t = pq.read_table(f, columns=["task_index", "sample_index"])  # every shard readable
        keys += zip(t.column("task_index").to_pylist(), t.column("sample_index").to_pylist())
    assert len(keys) == len(set(keys)) == TASKS * SAMPLES, delays
    assert set(keys) == {(i, s) for i in range(TASKS) for s in range(SAMPLES)}
    manifest = json.loads((out / ".agentgym" / "manifest.json").read_text())
    assert manifest["complete"] and manifest["rows"] == TASKS * SAMPLES
    assert sorted(s["name"] for s in manifest["shards"]) == sorted(shards(out))


def test_task_specs():
    parser = build_parser()

    def tasks(*argv):
        return parse_tasks(parser.parse_args(["collect", "--env", "maze", "--out", "x", *argv]))

    assert tasks("--tasks", "0:544") == range(0, 544)
    assert tasks("--tasks", "10:20:5") == range(10, 20, 5)
    assert tasks("--tasks", "3,5,9") == [3, 5, 9]
    assert tasks("--task", "craft a stick", "--task", "x") == ["craft a stick", "x"]
    with pytest.raises(SystemExit):
        tasks("--tasks", "1:b")


def test_collect_then_export_from_the_command_line(tiny_model_dir, tmp_path, capsys):
    from agentgym.collection.schema import rows_to_trajectories
    from agentgym.data.exports import to_skyrl, to_trl, to_verl

    run_dir, tasks_file = tmp_path / "run", tmp_path / "tasks.txt"
    tasks_file.write_text("3\n7\n\n11\n")
    argv = ["collect", "--env", "textcraft", "--tasks-file", str(tasks_file), "--n-samples",
            "2", "--out", str(run_dir), "--model", tiny_model_dir, "--shard-size", "4",
            "--messages", "--no-progress", "--json"]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["run"]["rows"] == 6 and summary["run"]["success_rate"] == 1.0
    table = ds.dataset(str(run_dir), format="parquet").to_table().sort_by(
        [("task_index", "ascending"), ("sample_index", "ascending")])
    assert table.column("task_id").to_pylist() == [3, 3, 7, 7, 11, 11]
    msgs = table.column("messages").to_pylist()[0]
    assert [m["role"] for m in msgs][:2] == ["prompt", "assistant"]
    assert msgs[1]["content"].startswith("Action: ")
    # Mismatched rerun: a clear error, exit code 2.
    assert main([*argv[:2], "maze", *argv[3:]]) == 2
    assert "RunMismatchError" in capsys.readouterr().err
    trajs = sorted(rows_to_trajectories(table), key=lambda t: (t.group_id, t.sample_index))
    for to, convert in [("verl", lambda ts: [{**to_verl(t), "task_index": t.group_id}
                                             for t in ts]),
                        ("skyrl", lambda ts: [dict(zip(to_skyrl(ts), v))
                                              for v in zip(*to_skyrl(ts).values())]),
                        ("trl", lambda ts: [to_trl(t) for t in ts])]:
        dst = tmp_path / to
        assert main(["export", str(run_dir), "--to", to, "--out", str(dst)]) == 0
        assert json.loads(capsys.readouterr().out)["rows"] == 6
        got = ds.dataset(str(dst), format="parquet").to_table().to_pylist()
        expected = convert(trajs)
        assert sorted(got, key=str) == sorted(json.loads(json.dumps(expected)), key=str), to


def test_a_bounded_context_run_exports_one_row_per_reply(tiny_model_dir, tmp_path, capsys):
    """``collect --context-window 1`` then ``export --to verl``: a row per reply, its prompt
    the window the backend was sent (shorter than the record) and its response the reply."""
    from agentgym.collection.schema import rows_to_trajectories

    run_dir = tmp_path / "run"
    argv = ["collect", "--env", "maze", "--tasks", "3", "--out", str(run_dir), "--model",
            tiny_model_dir, "--context-window", "1", "--max-turns", "12", "--no-progress",
            "--json"]
    assert main(argv) == 0
    capsys.readouterr()
    trajs = sorted(rows_to_trajectories(ds.dataset(str(run_dir), format="parquet").to_table()),
                   key=lambda t: t.group_id)
    replies = sum(len(t.step_reply) for t in trajs)
    assert replies == sum(t.num_turns for t in trajs) > len(trajs)
    assert main(["export", str(run_dir), "--to", "verl", "--out", str(tmp_path / "v")]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == replies
    rows = ds.dataset(str(tmp_path / "v"), format="parquet").to_table().to_pylist()
    want = {(tuple(t.token_ids[:t.step_context[0]] + t.token_ids[c:r]),
             tuple(t.token_ids[r:e]))
            for t in trajs for c, r, e in zip(t.step_context, t.step_reply, t.step_end)}
    assert {(tuple(x["prompt_ids"]), tuple(x["response_ids"])) for x in rows} == want
    longest = max(len(t.token_ids) for t in trajs)
    assert max(len(x["prompt_ids"]) for x in rows) < longest


def test_ctrl_c_keeps_the_finished_rows_and_the_same_command_resumes(tmp_path):
    """SIGINT (Ctrl-C) with shards far larger than what finished: the finished rows are
    written, one line says how many and how to resume, exit 130; SIGTERM the same (143);
    the same command then completes the run, every key once."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "agentgym.cli", "collect", "--env", "maze", "--tasks", "0:300",
           "--out", str(out), "--max-concurrency", "4", "--max-turns", "20"]
    slow = ["--backend-kwarg", "latency_s=0.05"]  # not part of the run's identity
    env = {**os.environ, "AGENTGYM_PROGRESS_INTERVAL": "0.1"}
    kept = 0
    for sig, code in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
        p = subprocess.Popen(cmd + slow, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True, env=env)
        lines = []
        for line in p.stderr:  # the progress lines: wait until episodes have finished
            lines.append(line)
            done = re.match(r"collect: (\d+)/300", line)
            if done and int(done.group(1)) > kept:
                break
        time.sleep(0.3)
        p.send_signal(sig)
        lines += p.stderr.read().splitlines()
        p.stderr.close()
        assert p.wait(timeout=120) == code, lines
        assert "Traceback" not in "".join(lines)
        last = lines[-1]
        rows = int(re.search(r"(\d+) of 300 rows are on disk", last).group(1))
        assert rows == ds.dataset(str(out), format="parquet").count_rows() > kept, last
        assert "run the same command again to resume" in last
        assert not [f for f in os.listdir(out) if f.endswith(".tmp")]
        kept = rows
    done = subprocess.run(cmd + ["--no-progress", "--json"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["run"]["complete"] and summary["session"]["episodes"] == 300 - kept
    t = ds.dataset(str(out), format="parquet").to_table(columns=["task_index", "sample_index"])
    keys = list(zip(t.column("task_index").to_pylist(), t.column("sample_index").to_pylist()))
    assert sorted(keys) == [(i, 0) for i in range(300)]


def test_a_bad_env_kwarg_leaves_nothing_and_the_corrected_command_runs(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["collect", "--env", "maze", "--tasks", "0:3", "--out", str(out), "--no-progress",
            "--json"]
    assert main([*argv, "--env-kwarg", "sizee=4"]) == 2
    assert "sizee" in capsys.readouterr().err and not out.exists()
    assert main([*argv, "--env-kwarg", "size=4"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["run"]["complete"]


def test_a_context_cap_above_the_record_caps_default_is_taken(tmp_path, capsys):
    """``--max-total-tokens 2000000``: the record cap's default follows the cap the user
    set (no 'max_record_tokens must be at least max_total_tokens')."""
    assert main(["collect", "--env", "maze", "--tasks", "0:2", "--max-total-tokens",
                 "2000000", "--out", str(tmp_path / "r"), "--no-progress", "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["run"]["complete"]
