"""``TrainerConfig``: every knob of a training run, loadable from YAML/TOML/dicts.

``method`` picks the algorithm: ``"ScalingInter-RL"`` (GRPO advantages and a staged horizon:
``horizon`` stages, or the AgentGym-RL preset of the env family), ``"GRPO"``, ``"RLOO"``,
``"REINFORCE++"`` (fixed horizon ``max_turns``) and ``"PPO"`` (GAE with a critic, fixed
horizon). ``learner`` holds :class:`~agentgym.learner.LearnerConfig` overrides
(``lr``, ``kl_coef``, ...), ``rollout`` extra :class:`~agentgym.engine.RolloutConfig`
overrides, ``backend_kwargs`` go to :func:`~agentgym.backends.make_backend`.
``self_play`` trains on a multi-seat game (:mod:`agentgym.learner.selfplay`: ``opponents``,
the role baseline, the opponent pool, evaluation against ``eval_opponents``). The rollout
fields (``max_turns``, ``temperature``, ``max_new_tokens``, ``max_total_tokens``,
``max_concurrency``, ``system_prompt``) default to :class:`~agentgym.engine.RolloutConfig`'s.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import tomllib

from agentgym.engine.config import RolloutConfig

__all__ = ["METHODS", "RunConfigError", "TrainerConfig", "load_config_file"]

#: method name -> default advantage estimator.
METHODS = {
    "scalinginter-rl": "grpo",
    "grpo": "grpo",
    "rloo": "rloo",
    "reinforce++": "reinforce_pp",
    "ppo": "gae",
}


class RunConfigError(ValueError):
    """A run the trainer refuses once it sees the machine or the checkpoint (a plan that
    does not fit, a checkpoint of another strategy); the message names the setting."""


#: The rollout defaults are RolloutConfig's: the fields below that share a name with one of
#: its fields start from its default.
_ROLLOUT = RolloutConfig()


def canonical_method(method: str) -> str:
    key = method.strip().lower().replace("_", "-")
    aliases = {"scalinginter": "scalinginter-rl", "scaling-inter-rl": "scalinginter-rl",
               "reinforce-pp": "reinforce++", "reinforcepp": "reinforce++"}
    key = aliases.get(key, key)
    if key not in METHODS:
        raise ValueError(f"unknown method {method!r}; expected one of "
                         "ScalingInter-RL, GRPO, RLOO, REINFORCE++, PPO")
    return key


@dataclass
class TrainerConfig:
    """A training run (see the module docstring)."""

    # what to train
    model: str = "tiny"
    env: str = "maze"
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    eval_env_kwargs: dict[str, Any] | None = None  # None: env_kwargs; e.g. {"split": "test"}
    method: str = "ScalingInter-RL"
    # horizon
    horizon: list[int] | None = None  # ScalingInter-RL stages; None: env-family preset
    steps_per_stage: int | list[int] | None = None
    adaptive_horizon: bool = False  # advance stages on success plateaus instead of steps
    max_turns: int = _ROLLOUT.max_turns  # fixed horizon of the other methods
    eval_max_turns: int | None = None  # default: the last (largest) stage
    # data per step
    max_steps: int = 100
    tasks_per_step: int = 8
    n_samples: int = 8  # the GRPO group size (a rollout alone defaults to 1)
    num_train_tasks: int | None = None
    temperature: float = _ROLLOUT.temperature
    max_new_tokens: int = _ROLLOUT.max_new_tokens
    max_total_tokens: int = _ROLLOUT.max_total_tokens
    max_concurrency: int = _ROLLOUT.max_concurrency
    system_prompt: str | None = _ROLLOUT.system_prompt
    rollout: dict[str, Any] = field(default_factory=dict)
    # learner
    learner: dict[str, Any] = field(default_factory=dict)
    use_ref_model: bool = True  # frozen reference for the KL loss (when kl_coef > 0)
    # subtracted from the score of an episode cut mid-turn (stop_reason "length": the model
    # never ended its turn), so breaking the output format is worse than a plain failure
    format_penalty: float = 0.0
    # stop with TrainingAbortedError after this many consecutive steps in which at least
    # abort_failure_rate of the episodes failed (env/backend error, timeout); 0: never
    abort_after_failed_steps: int = 3
    abort_failure_rate: float = 1.0
    # DAPO's dynamic sampling (verl: algorithm.filter_groups): drop groups whose samples
    # all scored alike (zero GRPO advantage) and draw fresh ones, at most max_draws draws
    # of tasks_per_step tasks a step; true means {max_draws: 3}
    filter_groups: bool | dict[str, Any] = False
    async_rollouts: bool = False  # overlap rollout k+1 with update k
    max_staleness: int = 1
    staleness_mode: str = "drop"
    # backend / devices
    backend: str = "transformers"
    backend_kwargs: dict[str, Any] = field(default_factory=dict)
    device: str | None = None
    bf16: bool = False
    # the learner's layout under torchrun (agentgym.distributed.parallel.ParallelConfig):
    # strategy ddp | fsdp | hsdp, replicate, activation_checkpointing, param_dtype,
    # reduce_dtype, reshard_after_forward
    parallel: dict[str, Any] = field(default_factory=dict)
    # LoRA adapters instead of full fine-tuning (agentgym.learner.lora.LoraSettings: r,
    # alpha, dropout, target_modules); None trains every weight
    lora: dict[str, Any] | None = None
    # rollouts on Ray workers (agentgym.distributed): 0 = the in-process engine; else that
    # many workers on the cluster at ray_address (None: a local cluster), each with the
    # backend above and max_concurrency episodes in flight; rollout_worker: WorkerSpec
    # resources (num_cpus, num_gpus, torch_threads) and pool options (chunk_size,
    # max_restarts, max_request_retries, weights_dir)
    num_rollout_workers: int = 0
    ray_address: str | None = None
    rollout_worker: dict[str, Any] = field(default_factory=dict)
    torch_threads: int | None = None  # torch intra-op threads (1 is fastest on busy CPUs)
    # evaluation
    eval_every: int = 10
    eval_tasks: int = 64
    eval_temperature: float = 0.0
    eval_at_start: bool = True
    # model == "tiny": architecture overrides (TinyModelConfig fields) and the format
    # warm-up on random-policy transcripts (WarmupConfig fields; None skips it)
    tiny_model: dict[str, Any] = field(default_factory=dict)
    warmup: dict[str, Any] | None = field(default_factory=dict)
    # output
    output_dir: str | None = None
    save_every: int = 50
    keep_checkpoints: int = 2
    # trackers beside metrics.jsonl/.csv: TensorBoard events (tensorboard/), and Weights &
    # Biases (the wandb extra): true, or wandb.init keyword arguments (project, name, tags,
    # mode, settings, ...); offline unless WANDB_MODE or mode says otherwise, under wandb/
    tensorboard: bool = True
    wandb: bool | dict[str, Any] = False
    plot: bool = True
    progress: bool | None = None
    seed: int = 0
    resume: str | None = None
    # self-play on a multi-seat game (agentgym.learner.selfplay): who the policy plays
    # (self | solver | random | pool), SPIRAL's role baseline for adv_estimator "rae" (the
    # default here), the opponent pool (a snapshot every opponent_pool_every steps, the
    # last opponent_pool_size kept) and the fixed opponents of evaluation
    self_play: bool = False
    opponents: str = "self"
    role_baseline: bool = True
    role_baseline_decay: float = 0.95
    opponent_pool_size: int = 4
    opponent_pool_every: int = 10
    eval_opponents: list[str] = field(default_factory=lambda: ["random", "solver"])

    def __post_init__(self) -> None:
        self.method_key = canonical_method(self.method)
        from agentgym import _core

        game = self.env in _core.native_game_ids()
        if game and not self.self_play:
            raise ValueError(f"{self.env} is a multi-seat game: train it with self_play=True "
                             "(agentgym-rl train --self-play)")
        if self.self_play:
            from agentgym.learner.selfplay import OPPONENT_KINDS

            if not game:
                raise ValueError(f"self_play needs a multi-seat game, not {self.env!r}; the "
                                 f"games: {', '.join(_core.native_game_ids())}")
            if self.opponents not in OPPONENT_KINDS:
                raise ValueError(f"opponents must be one of {OPPONENT_KINDS}, got "
                                 f"{self.opponents!r}")
            bad = [o for o in self.eval_opponents if o not in ("solver", "random")]
            if bad or not self.eval_opponents:
                raise ValueError(f"eval_opponents take solver and random, got "
                                 f"{self.eval_opponents!r}")
            if self.num_rollout_workers and self.opponents == "pool":
                raise ValueError("opponents='pool' runs in process: its past policies are "
                                 "backends of the in-process engine (num_rollout_workers "
                                 "must be 0); self, solver and random play on Ray workers")
        if self.max_steps < 0 or self.tasks_per_step < 1 or self.n_samples < 1:
            raise ValueError("max_steps >= 0, tasks_per_step >= 1 and n_samples >= 1 required")
        if self.eval_every < 0 or self.eval_tasks < 0:
            raise ValueError("eval_every and eval_tasks must be >= 0")
        if self.num_rollout_workers < 0:
            raise ValueError("num_rollout_workers must be >= 0")
        if not isinstance(self.wandb, bool | dict):
            raise ValueError(f"wandb takes true/false or wandb.init options, got {self.wandb!r}")
        fg = self.filter_groups
        if not isinstance(fg, bool) and not (
                isinstance(fg, dict) and set(fg) <= {"max_draws"}
                and int(fg.get("max_draws", 3)) >= 1):
            raise ValueError(f"filter_groups takes true/false or {{max_draws: N >= 1}}, got {fg!r}")
        from agentgym.distributed.parallel import ParallelConfig

        self.parallel_config = ParallelConfig.from_dict(self.parallel)
        if self.lora is not None:
            from agentgym.learner.lora import LoraSettings

            LoraSettings.from_dict(self.lora)  # refuses an unknown or bad key, named
        if self.backend not in ("transformers", "vllm", "openai"):
            raise ValueError(f"backend must be transformers, vllm or openai, got {self.backend!r}")

    @property
    def max_draws(self) -> int:
        """Dynamic sampling's most draws per step (``filter_groups``), 0 when it is off."""
        fg = self.filter_groups
        if not fg:
            return 0
        return int(fg.get("max_draws", 3)) if isinstance(fg, dict) else 3

    @property
    def adv_estimator(self) -> str:
        """The learner's estimator: ``learner["adv_estimator"]``, else ``rae`` under
        self-play, else the method's."""
        default = "rae" if self.self_play else METHODS[self.method_key]
        return self.learner.get("adv_estimator", default)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainerConfig:
        """Build from a dict; unknown keys raise ValueError naming them."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"unknown TrainerConfig keys: {unknown}; known: {sorted(names)}")
        return cls(**d)

    def replace(self, **overrides: Any) -> TrainerConfig:
        return TrainerConfig.from_dict({**self.to_dict(), **overrides})


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML (``.yaml``/``.yml``) or TOML (``.toml``) config file into a dict. A
    ``[train]``/``train:`` table, when present, is the config; otherwise the whole file."""
    p = Path(path)
    text = p.read_text(encoding="utf-8")
    if p.suffix == ".toml":
        data = tomllib.loads(text)
    elif p.suffix in (".yaml", ".yml"):
        import yaml

        data = yaml.safe_load(text) or {}
    else:
        raise ValueError(f"config file must be .yaml, .yml or .toml, got {p.name}")
    if not isinstance(data, dict):
        raise ValueError(f"{p}: expected a mapping at the top level")
    return dict(data.get("train", data))
