"""The row schema: trajectories -> Arrow table -> trajectories is lossless, the decoded
``messages`` follow the loss mask, JSONL carries the same values."""

import json

import pyarrow as pa
import pytest

from agentgym.collection.schema import (
    FIELDS,
    SCHEMA,
    rows_to_trajectories,
    to_jsonl,
    to_table,
    trajectories_table,
)
from agentgym.data.trajectories import BatchFormatError, RowInfo, pack
from tests.helpers import make_trajectory


def trajectories():
    a = make_trajectory([5, 6, 7, 8, 9, 10], [0, 0, 1, 1, 0, 1], task_id=4, group_id=4,
                        sample_index=1, logprobs=[0, 0, -0.5, -0.25, 0, -1.0],
                        turn_rewards=[0.0, 1.0], reward=1.0, seed=123,
                        timings={"total_s": 0.75, "gen_s": 0.5, "undo_turns": 2.0,
                                 "attempts": 3.0},
                        policy_version=2, step_context=[2, 2], step_reply=[2, 5],
                        step_end=[4, 6])  # played with a bounded context: two steps
    b = make_trajectory([5, 6, 11], [0, 0, 0], task_id="craft a stick", group_id=0,
                        stop_reason="env_error", error="boom",
                        timings={"total_s": 0.125, "gen_s": 0.0})
    # a forked child of a branched group, with a plan turn: its copy of the prefix masked
    c = make_trajectory([5, 6, 7, 8, 12], [0, 0, 0, 0, 1], task_id=4, group_id=4,
                        sample_index=2, turn_rewards=[0.0, 0.5], reward=0.5,
                        timings={"total_s": 0.5, "gen_s": 0.25, "plan_turns": 1.0},
                        branch_parent=1, branch_turn=1, branch_pos=4)
    return [a, b, c]


def test_table_round_trips_every_trajectory_field():
    trajs = trajectories()
    table = trajectories_table(trajs, run_id="r1", max_turns=7, env_kwargs={"size": 3})
    assert table.schema == SCHEMA and [f.name for f in table.schema] == [n for n, _, _ in FIELDS]
    assert rows_to_trajectories(table) == trajs
    row = table.slice(1, 1).to_pylist()[0]
    assert (row["task_id"], row["task_text"], row["task_index"]) == (None, "craft a stick", 0)
    assert row["env_kwargs"] == '{"size": 3}' and row["max_turns"] == 7
    assert row["messages"] is None
    lines = to_jsonl(table).splitlines()
    assert [json.loads(x) for x in lines] == table.to_pylist()


def test_a_table_of_schema_version_2_reads_without_undo_turns():
    table = trajectories_table(trajectories(), run_id="r1", max_turns=7, env_kwargs={})
    assert table.column("undo_turns").to_pylist() == [2, 0, 0]
    old = table.drop_columns(["undo_turns"])  # the rows before undo (schema version 2)
    a, _, _ = rows_to_trajectories(old)
    assert "undo_turns" not in a.timings and a.token_ids == trajectories()[0].token_ids


def test_a_table_of_schema_version_3_reads_with_one_attempt():
    table = trajectories_table(trajectories(), run_id="r1", max_turns=7, env_kwargs={})
    assert table.column("attempts").to_pylist() == [3, 1, 1]
    a, b, _ = rows_to_trajectories(table.drop_columns(["attempts"]))
    assert "attempts" not in a.timings and "attempts" not in b.timings


def test_a_table_of_schema_version_4_reads_unbranched_without_plans():
    table = trajectories_table(trajectories(), run_id="r1", max_turns=7, env_kwargs={})
    assert table.column("branch_parent").to_pylist() == [1, 0, 1]
    assert table.column("plan_turns").to_pylist() == [0, 0, 1]
    old = table.drop_columns(["plan_turns", "branch_parent", "branch_turn", "branch_pos"])
    *_, c = rows_to_trajectories(old)
    assert (c.branch_parent, c.branch_turn, c.branch_pos) == (None, 0, 0)
    assert "plan_turns" not in c.timings and c.loss_mask == trajectories()[2].loss_mask


def test_a_table_of_schema_version_5_reads_without_steps():
    table = trajectories_table(trajectories(), run_id="r1", max_turns=7, env_kwargs={})
    assert table.column("step_reply").to_pylist() == [[2, 5], [], []]
    a, _, _ = rows_to_trajectories(table.drop_columns(["step_context", "step_reply",
                                                       "step_end"]))
    assert (a.step_context, a.step_reply, a.step_end) == ([], [], [])
    assert a.token_ids == trajectories()[0].token_ids


def test_messages_are_the_mask_segments_decoded(tokenizer):
    ids = tokenizer.encode("hello world", add_special_tokens=False)
    reply = tokenizer.encode("Action: go", add_special_tokens=False)
    obs = tokenizer.encode("you see a door", add_special_tokens=False)
    t = make_trajectory(ids + reply + obs + reply,
                        [0] * len(ids) + [1] * len(reply) + [0] * len(obs) + [1] * len(reply))
    table = trajectories_table([t], run_id="r", max_turns=None, env_kwargs={},
                               tokenizer=tokenizer)
    msgs = table.column("messages").to_pylist()[0]
    assert msgs == [{"role": "prompt", "content": tokenizer.decode(ids)},
                    {"role": "assistant", "content": tokenizer.decode(reply)},
                    {"role": "observation", "content": tokenizer.decode(obs)},
                    {"role": "assistant", "content": tokenizer.decode(reply)}]
    assert table.column("messages").type == pa.list_(
        pa.struct([("role", pa.string()), ("content", pa.string())]))


def test_a_packed_batch_and_its_row_info_are_the_trajectories_rows():
    trajs = trajectories()[1::-1] + trajectories()[:2]
    kw = dict(run_id="r1", max_turns=7, env_kwargs={})
    packed, info = pack(trajs), RowInfo.of(trajs)
    table = to_table(packed, info, **kw)
    assert table.schema == SCHEMA
    assert rows_to_trajectories(table) == trajs
    assert table.column("task_index").to_pylist() == [0, 4, 4, 0]  # the group ids
    # rows of a batch and its info, concatenated again, give the same table
    halves = [(packed.rows(0, 1), info.rows(0, 1)), (packed.rows(1, 4), info.rows(1, 4))]
    again = to_table(type(packed).concat([p for p, _ in halves]),
                     RowInfo.concat([i for _, i in halves]), **kw)
    assert again.equals(table)
    with pytest.raises(BatchFormatError, match="4 rows, its row info 3"):
        to_table(packed, RowInfo.of(trajs[:3]), **kw)
    bad = trajectories()[:2]
    bad[0].stop_reason = "gone"
    with pytest.raises(BatchFormatError, match="unknown stop reason 'gone'"):
        trajectories_table(bad, **kw)
