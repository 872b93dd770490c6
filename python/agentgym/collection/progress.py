"""What a collection shows while it runs (a tqdm bar) and the summary at its end."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from agentgym.data.trajectories import (
    FAILED_STOP_CODES,
    FAILED_STOP_REASONS,
    STOP_REASONS,
    PackedBatch,
    RowInfo,
    Trajectory,
    success_of,
)
from agentgym.progress import progress_bar

__all__ = ["Progress", "format_summary", "run_summary"]


class Progress:
    """Counts of the episodes this process played; a tqdm bar (episodes done / total, episodes/s,
    generated tokens/s, success rate so far, failures by stop reason, ETA) when ``show``
    (None: when stderr is a terminal)."""

    def __init__(self, total: int, already: int, show: bool | None = None):
        self.total, self.already = total, already
        self.episodes = self.tokens = self.successes = 0
        self.failures: Counter[str] = Counter()
        self.t0 = time.perf_counter()
        self._last = 0.0
        self.bar = progress_bar(total, "collect", "ep", show=show, initial=already)

    def update(self, trajs: Sequence[Trajectory]) -> None:
        """Count finished ``trajs`` (a success: ``Trajectory.success``, the env's rule)."""
        failures = Counter(t.stop_reason for t in trajs if t.stop_reason in FAILED_STOP_REASONS)
        self._count(len(trajs), sum(sum(t.loss_mask) for t in trajs),
                    sum(1 for t in trajs if t.success), failures)

    def update_packed(self, packed: PackedBatch, info: RowInfo) -> None:
        """Count the finished trajectories of a packed batch and its row info (vectorised;
        a success: the row's recorded one, :meth:`RowInfo.successes`)."""
        codes = packed.stop_reason
        by_code = np.bincount(codes, minlength=len(STOP_REASONS))
        failures = {STOP_REASONS[c]: int(by_code[c]) for c in FAILED_STOP_CODES if by_code[c]}
        successes = int(info.successes(packed).sum())
        self._count(len(packed), int(packed.loss_mask.sum(dtype=np.int64)), successes,
                    failures)

    def _count(self, episodes: int, tokens: int, successes: int,
               failures: dict[str, int]) -> None:
        self.episodes += episodes
        self.tokens += tokens
        self.successes += successes
        self.failures.update(failures)
        if self.bar is not None:
            self.bar.update(episodes)
            now = time.perf_counter()
            if now - self._last > 0.5:
                self._last = now
                self.bar.set_postfix_str(self.postfix(), refresh=False)

    def postfix(self) -> str:
        wall = max(time.perf_counter() - self.t0, 1e-9)
        parts = [f"{self.tokens / wall:,.0f} tok/s",
                 f"success {self.successes / max(self.episodes, 1):.2f}"]
        if self.failures:
            parts.append("failed " + " ".join(f"{k}={v}" for k, v in
                                              sorted(self.failures.items())))
        return ", ".join(parts)

    def session(self) -> dict[str, Any]:
        wall = time.perf_counter() - self.t0
        return {"episodes": self.episodes, "wall_s": wall,
                "episodes_per_s": self.episodes / wall if wall > 0 else 0.0,
                "generated_tokens": self.tokens,
                "generated_tokens_per_s": self.tokens / wall if wall > 0 else 0.0,
                "failures": dict(self.failures)}

    def close(self) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(self.postfix(), refresh=False)
            self.bar.close()


#: The columns :func:`shard_stats` reads.
STATS_COLUMNS = ["env_id", "stop_reason", "reward", "attempt_return", "num_turns", "loss_mask"]


def shard_stats(t: pa.Table) -> dict[str, Any]:
    """Totals of one shard's rows (vectorised): rows, successes, reward and turn sums,
    model tokens, stop reason counts. A row's success is its ``success`` column where the
    shard has one, else its env's rule (``agentgym.envs.registry.success_rule``) over its
    stop reason, reward and last attempt's return."""
    if not t.num_rows:
        return {"rows": 0, "successes": 0, "reward_sum": 0.0, "turns_sum": 0,
                "generated_tokens": 0, "stop_reasons": {}}
    stop = t.column("stop_reason")
    reward = t.column("reward").to_numpy().astype(np.float64)
    attempt = None
    if "attempt_return" in t.column_names:  # schema version 6 on
        attempt = t.column("attempt_return").to_numpy(zero_copy_only=False).astype(np.float64)
    done = pc.equal(stop, "done").to_numpy(zero_copy_only=False)
    counts = pc.value_counts(stop).to_pylist()
    if "success" in t.column_names:
        successes = int(pc.sum(t.column("success")).as_py() or 0)
    else:
        env_ids = t.column("env_id").to_pylist() if "env_id" in t.column_names else ""
        successes = int(success_of(env_ids, done, reward, attempt).sum())
    return {
        "rows": int(t.num_rows),
        "successes": successes,
        "reward_sum": float(reward.sum()),
        "turns_sum": int(t.column("num_turns").to_numpy().sum()),
        "generated_tokens": int(pc.sum(pc.list_flatten(t.column("loss_mask"))).as_py() or 0),
        "stop_reasons": {c["values"]: c["counts"] for c in sorted(
            counts, key=lambda c: c["values"])},
    }


def run_summary(stats: Iterable[dict[str, Any]], expected: int) -> dict[str, Any]:
    """The run's totals from its shards' :func:`shard_stats`."""
    rows = successes = tokens = turns = 0
    reward = 0.0
    stops: Counter[str] = Counter()
    for s in stats:
        rows += s["rows"]
        successes += s["successes"]
        reward += s["reward_sum"]
        turns += s["turns_sum"]
        tokens += s["generated_tokens"]
        stops.update(s["stop_reasons"])
    return {
        "rows": rows, "expected": expected, "complete": rows == expected,
        "success_rate": successes / rows if rows else 0.0,
        "reward_mean": reward / rows if rows else 0.0,
        "num_turns_mean": turns / rows if rows else 0.0,
        "generated_tokens": tokens,
        "stop_reasons": dict(sorted(stops.items())),
        "failed": int(sum(v for k, v in stops.items() if k in FAILED_STOP_REASONS)),
    }


def format_summary(summary: dict[str, Any]) -> str:
    """The summary as a two-column text table."""
    run, ses = summary["run"], summary["session"]
    rows = [
        ("folder", summary["out"]),
        ("rows / expected", f"{run['rows']:,} / {run['expected']:,}"
                            + ("" if run["complete"] else " (incomplete)")),
        ("success rate", f"{run['success_rate']:.3f}"),
        ("reward mean", f"{run['reward_mean']:.3f}"),
        ("turns mean", f"{run['num_turns_mean']:.2f}"),
        ("stop reasons", ", ".join(f"{k}={v:,}" for k, v in run["stop_reasons"].items())
                         or "-"),
        ("this process", f"{ses['episodes']:,} episodes in {ses['wall_s']:.1f} s"),
        ("episodes/s", f"{ses['episodes_per_s']:,.1f}"),
        ("generated tokens/s", f"{ses['generated_tokens_per_s']:,.0f}"),
        ("shards", f"{summary['shards']}"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
