"""Batch metrics with the field's names (verl/TRL)."""

from __future__ import annotations

from collections import Counter

import numpy as np

from agentgym.data.trajectories import Trajectory


def batch_metrics(trajs: list[Trajectory], wall_s: float) -> dict[str, float]:
    if not trajs:
        return {"timing_s/gen": wall_s}
    rewards = np.array([t.reward for t in trajs], np.float64)
    turns = np.array([t.num_turns for t in trajs], np.float64)
    resp = np.array([t.response_length for t in trajs], np.float64)
    invalid = np.array([t.timings.get("invalid_turns", 0.0) for t in trajs], np.float64)
    plans = np.array([t.timings.get("plan_turns", 0.0) for t in trajs], np.float64)
    env_turns = float((turns - plans).sum())
    gen_tokens = float(sum(len(t.token_ids) - t.prompt_len for t in trajs))
    m = {
        "reward/mean": float(rewards.mean()),
        "reward/max": float(rewards.max()),
        "reward/min": float(rewards.min()),
        "success_rate": float(np.mean([t.success for t in trajs])),
        # solved on the first attempt (differs from success_rate only with reflection retries)
        "success_rate/first_attempt": float(np.mean(
            [t.success and "attempts" not in t.timings for t in trajs])),
        "num_turns/mean": float(turns.mean()),
        "num_turns/max": float(turns.max()),
        "response_length/mean": float(resp.mean()),
        # replies cut at max_new_tokens that still stepped the env, per episode
        "cut_turns/mean": float(np.mean([t.timings.get("cut_turns", 0.0) for t in trajs])),
        # turns whose action the env refused as unreadable, per episode and per turn played
        "invalid_turns/mean": float(invalid.mean()),
        "invalid_turns/share": float(invalid.sum() / env_turns) if env_turns else 0.0,
        # accepted undo turns per episode (RolloutConfig.undo)
        "undo_turns/mean": float(np.mean([t.timings.get("undo_turns", 0.0) for t in trajs])),
        # attempts per episode (RolloutConfig.reflection; 1 without a retry)
        "attempts/mean": float(np.mean([t.timings.get("attempts", 1.0) for t in trajs])),
        # plan turns per episode (RolloutConfig.plan)
        "plan_turns/mean": float(plans.mean()),
        "timing_s/gen": wall_s,
        "perf/tokens_per_s": float(resp.sum() / wall_s) if wall_s > 0 else 0.0,
        "perf/total_tokens_per_s": gen_tokens / wall_s if wall_s > 0 else 0.0,
        "perf/trajectories_per_s": len(trajs) / wall_s if wall_s > 0 else 0.0,
        "batch/size": float(len(trajs)),
    }
    for reason, count in Counter(t.stop_reason for t in trajs).items():
        m[f"stop_reason/{reason}"] = count / len(trajs)
    return m
