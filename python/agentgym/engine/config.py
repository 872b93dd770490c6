"""Rollout configuration."""

from __future__ import annotations

import msgspec


class RolloutConfig(msgspec.Struct, kw_only=True):
    """Knobs of :class:`~agentgym.engine.RolloutEngine` (all overridable per ``collect``).

    ``max_turns`` is the horizon (ScalingInter-RL moves it); ``max_new_tokens`` caps one
    turn (an episode whose turn hits it ends with ``length``); ``max_total_tokens`` caps the
    whole context (``length`` as well). ``max_concurrency`` episodes are live at once; a
    finished one is replaced immediately.
    """

    max_turns: int | None = 10
    max_new_tokens: int = 128
    max_total_tokens: int = 2048
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    n_samples: int = 1
    max_concurrency: int = 256
    action_format: str = "auto"
    system_prompt: str | None = None
    backend_retries: int = 2
    retry_backoff_s: float = 0.05
    turn_timeout_s: float | None = None
    episode_timeout_s: float | None = None
    seed: int = 0
    progress: bool | None = None
    success_threshold: float = 1.0
    #: Python envs and simulators: 0 = a thread pool in this process, N > 0 = N worker
    #: processes (``ProcessEnvPool``). Native envs always step in the Rust pool.
    env_workers: int = 0
    #: Python envs on the thread pool: a tick's resets/steps run inline on the event loop
    #: when their measured cost is below this many seconds in total (0 = always the pool).
    inline_env_budget_s: float = 0.002
    #: Generation-0 threshold of Python's cyclic GC while rollouts run (0 = leave it alone).
    gc_threshold: int = 20000
