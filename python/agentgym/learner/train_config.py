"""``TrainerConfig``: every knob of a training run, one typed tree, loadable from YAML, TOML
or dicts.

The run's own fields sit at the top (``model``, ``env``, ``method``, the horizon schedule,
the batch, evaluation, output); every other component has its own typed section, and a
field lives in exactly one place:

==================  ======================================================================
``rollout``         :class:`~agentgym.engine.RolloutConfig`: the engine's knobs (the fixed
                    horizon ``max_turns``, ``temperature``, ``max_new_tokens``,
                    ``max_total_tokens``, ``max_concurrency``, ``system_prompt``,
                    ``reply_prefix``, ``opponent``, the mechanisms, ...). Its ``seed``,
                    ``n_samples`` and ``progress`` are the trainer's (the top-level fields).
``learner``         :data:`LearnerSection`: overrides of :class:`~agentgym.learner.
                    LearnerConfig` (``lr``, ``kl_coef``, ``bf16``, ``max_staleness``, ...;
                    a field not set takes the trainer's value: the method's estimator, the
                    run's seed, staleness 1 with ``async_rollouts`` or ``fully_async``,
                    else LearnerConfig's)
``warmup``          :class:`~agentgym.learner.warmup.WarmupConfig` (``null``: no warm-up)
``parallel``        :class:`~agentgym.distributed.parallel.ParallelConfig`
``lora``            :class:`~agentgym.learner.lora.LoraSettings` (``null``: every weight)
``rollout_worker``  :class:`RolloutWorkerSection`: Ray worker resources and pool options
``tiny_model``      :data:`TinyModelSection`: the tiny model's architecture overrides
``filter_groups``   ``true``, ``false`` or :class:`FilterGroups` (``{max_draws: N}``)
==================  ======================================================================

``env_kwargs``, ``eval_env_kwargs``, ``backend_kwargs`` and ``wandb`` options stay free
mappings (what they take depends on the env, backend or tracker).

Loading (:meth:`TrainerConfig.from_dict`, :func:`load_config`, and keyword arguments:
``TrainerConfig(env="maze", rollout={"max_turns": 4})``) refuses an unknown key at once, by
its full path and with the nearest valid name (``unknown key rollout.max_turnz (did you
mean rollout.max_turns?)``), and a wrong type by path and expected type (``max_steps:
expected an integer, got a string 'three'``): one :class:`~agentgym.errors.ConfigError`
line. The flat top-level spellings of the fields that moved into a section
(:data:`DEPRECATED_ALIASES`: ``max_turns``, ``temperature``, ``max_new_tokens``,
``max_total_tokens``, ``max_concurrency``, ``system_prompt``, ``opponents``, ``bf16``,
``max_staleness``, ``staleness_mode``) are still read, into their section, and read back as
attributes (``cfg.max_total_tokens`` is ``cfg.rollout.max_total_tokens``); a config that
sets a field both ways with two values is refused.

``method`` picks the algorithm: ``"ScalingInter-RL"`` (GRPO advantages and a staged horizon:
``horizon`` stages, or the AgentGym-RL preset of the env family), ``"GRPO"``, ``"RLOO"``,
``"REINFORCE++"`` (fixed horizon ``rollout.max_turns``) and ``"PPO"`` (GAE with a critic,
fixed horizon). ``self_play`` trains on a multi-seat game (:mod:`agentgym.learner.selfplay`:
``rollout.opponent``, the role baseline, the opponent pool, evaluation against
``eval_opponents``).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import msgspec
import tomllib

from agentgym.distributed.parallel import ParallelConfig
from agentgym.engine.config import (
    ConfigError,
    ConfigSection,
    RolloutConfig,
    convert,
    field_path_exists,
)
from agentgym.learner.lora import LoraSettings
from agentgym.learner.update import LearnerConfig
from agentgym.learner.warmup import WarmupConfig
from agentgym.models.tiny import TinyModelConfig

__all__ = [
    "CONFIGS_DIR",
    "DEPRECATED_ALIASES",
    "MAIN_JOB_FILE",
    "METHODS",
    "SECTIONS",
    "ConfigError",
    "FilterGroups",
    "LearnerSection",
    "RolloutWorkerSection",
    "RunConfigError",
    "TinyModelSection",
    "TrainerConfig",
    "find_config",
    "has_field",
    "load_config",
    "load_config_file",
]

#: The shipped configs (package data: ``agentgym/configs/``; the repository's ``configs/``
#: is this folder).
CONFIGS_DIR = Path(__file__).resolve().parents[1] / "configs"
#: What ``agentgym-rl train`` with no arguments runs.
MAIN_JOB_FILE = CONFIGS_DIR / "main_job.yaml"

#: method name -> default advantage estimator.
METHODS = {
    "scalinginter-rl": "grpo",
    "grpo": "grpo",
    "rloo": "rloo",
    "reinforce++": "reinforce_pp",
    "ppo": "gae",
}


class RunConfigError(ConfigError):
    """A run the trainer refuses once it sees the machine or the checkpoint (a plan that
    does not fit, a checkpoint of another strategy); the message names the setting."""


def canonical_method(method: str) -> str:
    key = method.strip().lower().replace("_", "-")
    aliases = {"scalinginter": "scalinginter-rl", "scaling-inter-rl": "scalinginter-rl",
               "reinforce-pp": "reinforce++", "reinforcepp": "reinforce++"}
    key = aliases.get(key, key)
    if key not in METHODS:
        raise ConfigError(f"unknown method {method!r}; expected one of "
                          "ScalingInter-RL, GRPO, RLOO, REINFORCE++, PPO")
    return key


def _overrides_section(name: str, source: type, path: str, doc: str) -> type[ConfigSection]:
    """A section of overrides of the dataclass ``source``: its fields with their types, each
    unset (``msgspec.UNSET``, not a key) unless given."""
    hints = typing.get_type_hints(source)
    fields = [(f.name, hints[f.name] | msgspec.UnsetType, msgspec.UNSET)
              for f in dataclasses.fields(source)]
    cls = msgspec.defstruct(name, fields, bases=(ConfigSection,), module=__name__,
                            kw_only=True, forbid_unknown_fields=True, repr_omit_defaults=True)
    cls.config_path = path
    cls.__doc__ = doc
    return cls


#: The ``learner`` section: :class:`~agentgym.learner.LearnerConfig`'s fields, each an
#: override of the value the trainer gives it (:meth:`TrainerConfig.learner_config`).
LearnerSection = _overrides_section(
    "LearnerSection", LearnerConfig, "learner",
    "Overrides of LearnerConfig's fields (the ``learner`` section); a field not set takes "
    "the trainer's value (TrainerConfig.learner_config).")

#: The ``tiny_model`` section: :class:`~agentgym.models.tiny.TinyModelConfig` overrides
#: (``model: tiny`` only).
TinyModelSection = _overrides_section(
    "TinyModelSection", TinyModelConfig, "tiny_model",
    "Overrides of the tiny model's architecture (TinyModelConfig fields; model: tiny).")


class RolloutWorkerSection(ConfigSection):
    """The ``rollout_worker`` section (``num_rollout_workers`` > 0): each Ray worker's
    resources (:class:`~agentgym.distributed.WorkerSpec`: ``num_cpus``, ``num_gpus``,
    ``torch_threads``, default the run's ``torch_threads``) and the pool's options
    (:class:`~agentgym.distributed.RayRolloutPool`: ``chunk_size``, ``max_restarts``,
    ``max_request_retries``, ``weights_dir``). A field not set takes their default."""

    config_path: ClassVar[str] = "rollout_worker"

    num_cpus: float | msgspec.UnsetType = msgspec.UNSET
    num_gpus: float | msgspec.UnsetType = msgspec.UNSET
    torch_threads: int | None | msgspec.UnsetType = msgspec.UNSET
    chunk_size: int | None | msgspec.UnsetType = msgspec.UNSET
    max_restarts: int | msgspec.UnsetType = msgspec.UNSET
    max_request_retries: int | msgspec.UnsetType = msgspec.UNSET
    weights_dir: str | None | msgspec.UnsetType = msgspec.UNSET

    #: The pool's options (the rest are the worker's resources).
    POOL: ClassVar[tuple[str, ...]] = ("chunk_size", "max_restarts", "max_request_retries",
                                       "weights_dir")


class FilterGroups(ConfigSection):
    """DAPO's dynamic sampling as a mapping: ``filter_groups: {max_draws: N}`` (``true`` is
    ``{max_draws: 3}``)."""

    config_path: ClassVar[str] = "filter_groups"

    max_draws: int = 3

    def __post_init__(self) -> None:
        if self.max_draws < 1:
            raise ConfigError(f"filter_groups.max_draws must be >= 1, got {self.max_draws}")


#: The typed sections of the tree (a mapping given for one of them in
#: :meth:`TrainerConfig.replace` is merged into it).
SECTIONS = ("rollout", "learner", "warmup", "parallel", "lora", "rollout_worker",
            "tiny_model", "filter_groups")

#: Deprecated flat spellings of fields that moved into a section: old top-level key ->
#: where it lives now. They are read into their section (and read back as attributes).
DEPRECATED_ALIASES = {
    "max_turns": "rollout.max_turns",
    "temperature": "rollout.temperature",
    "max_new_tokens": "rollout.max_new_tokens",
    "max_total_tokens": "rollout.max_total_tokens",
    "max_concurrency": "rollout.max_concurrency",
    "system_prompt": "rollout.system_prompt",
    "opponents": "rollout.opponent",
    "bf16": "learner.bf16",
    "max_staleness": "learner.max_staleness",
    "staleness_mode": "learner.staleness_mode",
}

#: RolloutConfig fields the trainer sets from its own (top-level) ones.
TRAINER_ROLLOUT_FIELDS = {"seed": 0, "n_samples": 1, "progress": None}


def _section_dict(value: Any) -> Any:
    """A section given as an instance, as a mapping of its set fields (shallow)."""
    if isinstance(value, msgspec.Struct):
        return {k: getattr(value, k) for k in value.__struct_fields__
                if getattr(value, k) is not msgspec.UNSET}
    return dict(value) if isinstance(value, Mapping) else value


def _nest(d: dict[str, Any], *, override: bool = False) -> dict[str, Any]:
    """``d`` with the deprecated flat spellings moved into their sections. Two different
    values for one field (flat and in the section) are refused, unless ``override`` (the
    flat one wins: :meth:`TrainerConfig.replace`)."""
    for old, new in DEPRECATED_ALIASES.items():
        if old not in d:
            continue
        value = d.pop(old)
        section, field = new.split(".")
        current = d.get(section)
        sec = {} if current is None else _section_dict(current)
        if not isinstance(sec, dict):
            raise ConfigError(f"{old} is {new} now, but {section} is not a mapping "
                              f"({current!r})")
        if not override and field in sec and sec[field] != value:
            raise ConfigError(f"{old} (the old spelling of {new}) and {new} are both set, "
                              f"to {value!r} and {sec[field]!r}: keep {new}")
        sec[field] = value
        d[section] = sec
    return d


def _alias(path: str, default: Any = msgspec.UNSET) -> property:
    """A read-only attribute for a deprecated flat spelling: the field at ``path``
    (``default`` where an overrides section leaves it unset)."""
    section, field = path.split(".")

    def get(self: TrainerConfig) -> Any:
        value = getattr(getattr(self, section), field)
        return default if value is msgspec.UNSET else value

    get.__doc__ = f"Deprecated spelling of ``{path}``."
    return property(get)


class _FromKeywords(msgspec.StructMeta):
    """``TrainerConfig(**kwargs)`` loads ``kwargs`` as :meth:`TrainerConfig.from_dict`
    does: deprecated spellings moved into their sections, every key and type checked."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if args:
            raise TypeError(f"{cls.__name__} takes keyword arguments only")
        return cls.from_dict(kwargs)


class TrainerConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True,
                    metaclass=_FromKeywords):
    """A training run (see the module docstring)."""

    # what to train
    model: str = "tiny"
    env: str = "maze"
    env_kwargs: dict[str, Any] = {}
    eval_env_kwargs: dict[str, Any] | None = None  # None: env_kwargs; e.g. {"split": "test"}
    method: str = "ScalingInter-RL"
    # horizon: ScalingInter-RL's stages (None: the env family's preset), their lengths, or
    # stages advanced on success plateaus; the other methods play rollout.max_turns
    horizon: list[int] | None = None
    steps_per_stage: int | list[int] | None = None
    adaptive_horizon: bool = False
    eval_max_turns: int | None = None  # default: the last (largest) stage
    # data per step
    max_steps: int = 100
    tasks_per_step: int = 8
    n_samples: int = 8  # the GRPO group size (a rollout alone defaults to 1)
    num_train_tasks: int | None = None
    # subtracted from the score of an episode cut mid-turn (stop_reason "length": the model
    # never ended its turn), so breaking the output format is worse than a plain failure
    format_penalty: float = 0.0
    # DAPO's dynamic sampling (verl: algorithm.filter_groups): drop groups whose samples
    # all scored alike (zero GRPO advantage) and draw fresh ones, at most max_draws draws
    # of tasks_per_step tasks a step; true means {max_draws: 3}
    filter_groups: bool | FilterGroups = False
    async_rollouts: bool = False  # overlap rollout k+1 with update k
    # fully asynchronous training (learner/async_rollout.py): one open stream of groups, a
    # step whenever tasks_per_step groups have finished, weights pushed while episodes are
    # in flight (partial rollouts), learner.max_staleness (default 1) the staleness bound;
    # the ratio is taken against recomputed proximal logprobs unless the learner says otherwise
    fully_async: bool = False
    # stop with TrainingAbortedError after this many consecutive steps in which at least
    # abort_failure_rate of the episodes failed (env/backend error, timeout); 0: never
    abort_after_failed_steps: int = 3
    abort_failure_rate: float = 1.0
    # the sections
    rollout: RolloutConfig = msgspec.field(default_factory=RolloutConfig)
    learner: LearnerSection = msgspec.field(default_factory=LearnerSection)
    use_ref_model: bool = True  # frozen reference for the KL loss (when kl_coef > 0)
    # model "tiny": the format warm-up on random-policy transcripts (None skips it) and the
    # architecture
    warmup: WarmupConfig | None = msgspec.field(default_factory=WarmupConfig)
    tiny_model: TinyModelSection = msgspec.field(default_factory=TinyModelSection)
    # LoRA adapters instead of full fine-tuning; None trains every weight
    lora: LoraSettings | None = None
    # the learner's layout under torchrun: strategy ddp | fsdp | hsdp, memory savers
    parallel: ParallelConfig = msgspec.field(default_factory=ParallelConfig)
    # backend / devices
    backend: str = "transformers"
    backend_kwargs: dict[str, Any] = {}
    device: str | None = None
    torch_threads: int | None = None  # torch intra-op threads (1 is fastest on busy CPUs)
    # rollouts on Ray workers (agentgym.distributed): 0 = the in-process engine; else that
    # many workers on the cluster at ray_address (None: a local cluster), each with the
    # backend above and rollout.max_concurrency episodes in flight
    num_rollout_workers: int = 0
    ray_address: str | None = None
    rollout_worker: RolloutWorkerSection = msgspec.field(default_factory=RolloutWorkerSection)
    # evaluation
    eval_every: int = 10
    eval_tasks: int = 64
    eval_temperature: float = 0.0
    eval_at_start: bool = True
    # self-play on a multi-seat game (agentgym.learner.selfplay): who the policy plays is
    # rollout.opponent (self | solver | random | pool), SPIRAL's role baseline for
    # adv_estimator "rae" (the default here), the opponent pool (a snapshot every
    # opponent_pool_every steps, the last opponent_pool_size kept) and the fixed opponents
    # of evaluation
    self_play: bool = False
    role_baseline: bool = True
    role_baseline_decay: float = 0.95
    opponent_pool_size: int = 4
    opponent_pool_every: int = 10
    eval_opponents: list[str] = msgspec.field(default_factory=lambda: ["random", "solver"])
    # output: the run folder (None: runs/<time>), checkpoints, trackers beside
    # metrics.jsonl/.csv (TensorBoard events; Weights & Biases: true, or wandb.init options,
    # offline unless WANDB_MODE or mode says otherwise), the plot, progress bars
    output_dir: str | None = None
    save_every: int = 50
    keep_checkpoints: int = 2
    tensorboard: bool = True
    wandb: bool | dict[str, Any] = False
    plot: bool = True
    progress: bool | None = None
    seed: int = 0
    resume: str | None = None  # a checkpoint, or a run folder (its latest checkpoint)

    # the deprecated flat spellings, read through to their sections
    max_turns = _alias("rollout.max_turns")
    temperature = _alias("rollout.temperature")
    max_new_tokens = _alias("rollout.max_new_tokens")
    max_total_tokens = _alias("rollout.max_total_tokens")
    max_concurrency = _alias("rollout.max_concurrency")
    system_prompt = _alias("rollout.system_prompt")
    opponents = _alias("rollout.opponent")
    bf16 = _alias("learner.bf16", False)
    max_staleness = _alias("learner.max_staleness", 1)
    staleness_mode = _alias("learner.staleness_mode", "drop")

    def __post_init__(self) -> None:
        canonical_method(self.method)
        from agentgym.envs.registry import list_envs

        games = list_envs(kind="game")
        game = self.env in games
        if game and not self.self_play:
            raise ConfigError(f"{self.env} is a multi-seat game: train it with self_play=True "
                              "(agentgym-rl train --self-play)")
        if self.self_play:
            from agentgym.learner.selfplay import OPPONENT_KINDS

            if not game:
                raise ConfigError(f"self_play needs a multi-seat game, not {self.env!r}; the "
                                  f"games: {', '.join(games)}")
            if self.rollout.opponent not in OPPONENT_KINDS:
                raise ConfigError(f"self-play opponents (rollout.opponent) must be one of "
                                  f"{OPPONENT_KINDS}, got {self.rollout.opponent!r}")
            bad = [o for o in self.eval_opponents if o not in ("solver", "random")]
            if bad or not self.eval_opponents:
                raise ConfigError(f"eval_opponents take solver and random, got "
                                  f"{self.eval_opponents!r}")
            if self.num_rollout_workers and self.rollout.opponent == "pool":
                raise ConfigError("rollout.opponent 'pool' runs in process: its past policies "
                                  "are backends of the in-process engine (num_rollout_workers "
                                  "must be 0); self, solver and random play on Ray workers")
        for name in ("tasks_per_step", "n_samples"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("max_steps", "eval_every", "eval_tasks", "num_rollout_workers",
                     "save_every"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name, default in TRAINER_ROLLOUT_FIELDS.items():
            if getattr(self.rollout, name) != default:
                raise ConfigError(f"rollout.{name} is the trainer's: set the top-level {name} "
                                  "instead")
        if self.fully_async:
            if self.async_rollouts:
                raise ConfigError("fully_async and async_rollouts are two asynchronous modes: "
                                  "set one")
            if self.backend == "openai":
                raise ConfigError("fully_async pushes weights to the backend: use backend "
                                  "transformers or vllm (an openai server owns its weights)")
            if self.learner.get("max_staleness", 1) is None:
                raise ConfigError("fully_async needs a staleness bound: learner.max_staleness "
                                  "must be a number of versions (>= 0), not null")
        if self.backend not in ("transformers", "vllm", "openai"):
            raise ConfigError(f"backend must be transformers, vllm or openai, got "
                              f"{self.backend!r}")
        try:
            self.learner_config()
        except ConfigError:
            raise
        except ValueError as e:  # LearnerConfig's own checks, against the method's estimator
            raise ConfigError(f"learner: {' '.join(str(e).split())}") from None

    # ------------------------------------------------------------------ derived values
    @classmethod
    def config_hint(cls, key: str) -> str | None:
        """Where a key that is not a top-level field lives (``lr`` -> ``learner.lr``)."""
        types = {f.name: f.type for f in msgspec.structs.fields(cls)}
        for section in ("rollout", "learner", "warmup", "parallel", "lora", "rollout_worker"):
            if field_path_exists(types[section], key):
                return f"{section}.{key}"
        return None

    @property
    def method_key(self) -> str:
        return canonical_method(self.method)

    @property
    def parallel_config(self) -> ParallelConfig:
        """The ``parallel`` section (its old name)."""
        return self.parallel

    @property
    def max_draws(self) -> int:
        """Dynamic sampling's most draws per step (``filter_groups``), 0 when it is off."""
        fg = self.filter_groups
        if isinstance(fg, FilterGroups):
            return fg.max_draws
        return 3 if fg else 0

    @property
    def adv_estimator(self) -> str:
        """The learner's estimator: ``learner.adv_estimator``, else ``rae`` under
        self-play, else the method's."""
        default = "rae" if self.self_play else METHODS[self.method_key]
        return self.learner.get("adv_estimator", default)

    def learner_config(self, pad_token_id: int = 0) -> LearnerConfig:
        """The run's :class:`~agentgym.learner.LearnerConfig`: the trainer's values (the
        method's estimator, logits at temperature 1, the run's seed, staleness 1 with
        ``async_rollouts``), overridden by the ``learner`` section."""
        lc: dict[str, Any] = {"adv_estimator": self.adv_estimator, "temperature": 1.0,
                              "pad_token_id": pad_token_id, "seed": self.seed}
        if self.async_rollouts:
            lc.update(max_staleness=1, staleness_mode="drop")
        if self.fully_async:  # stale tokens: the decoupled objective against the proximal
            lc.update(max_staleness=1, staleness_mode="drop", old_logprob_source="recompute")
        return LearnerConfig.from_dict({**lc, **self.learner.to_dict()})

    def rollout_settings(self) -> dict[str, Any]:
        """The ``rollout`` section as keyword arguments of
        :func:`~agentgym.engine.runner.open_runner` (the trainer adds its seed, group size
        and progress)."""
        out = msgspec.to_builtins(self.rollout)
        for name in TRAINER_ROLLOUT_FIELDS:
            out.pop(name, None)
        return out

    # ------------------------------------------------------------------ load / save
    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | TrainerConfig) -> TrainerConfig:
        """Build from a mapping (the tree; deprecated flat spellings are moved into their
        sections). An unknown key, a wrong type or a refused value is one
        :class:`~agentgym.errors.ConfigError` line naming it."""
        if isinstance(d, TrainerConfig):
            return d
        if not isinstance(d, Mapping):
            raise ConfigError(f"a training config is a mapping of keys, got "
                              f"{type(d).__name__}")
        return convert(_nest(dict(d)), cls)

    def replace(self, **overrides: Any) -> TrainerConfig:
        """A copy with ``overrides``: a mapping given for a section is merged into it (an
        instance, or None, replaces it); a deprecated flat spelling sets its section's
        field."""
        base = self.to_dict()
        for key, value in overrides.items():
            if key in DEPRECATED_ALIASES:
                continue
            old = base.get(key)
            if key in SECTIONS and isinstance(value, Mapping) and isinstance(old, dict):
                base[key] = {**old, **value}
            else:
                base[key] = value
        base.update({k: v for k, v in overrides.items() if k in DEPRECATED_ALIASES})
        return TrainerConfig.from_dict(_nest(base, override=True))

    def to_dict(self) -> dict[str, Any]:
        """The tree as plain mappings (sections as their set fields; the rollout section
        without the trainer's own fields), which :meth:`from_dict` reads back."""
        out: dict[str, Any] = {}
        for name in self.__struct_fields__:
            value = getattr(self, name)
            if isinstance(value, msgspec.Struct):
                value = msgspec.to_builtins(value)
            elif isinstance(value, dict):
                value = dict(value)
            elif isinstance(value, list):
                value = list(value)
            out[name] = value
        for name in TRAINER_ROLLOUT_FIELDS:
            out["rollout"].pop(name, None)
        return out

    def to_yaml(self) -> str:
        """The resolved config as readable YAML (what a run writes to ``config.yaml``;
        :func:`load_config` reads it back to the same config)."""
        import yaml

        class Dumper(yaml.SafeDumper):
            """Sections as blocks, a list of plain values on one line."""

        def short_list(dumper: yaml.SafeDumper, data: list) -> Any:
            flat = all(not isinstance(x, (list, dict)) for x in data)
            return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flat)

        Dumper.add_representer(list, short_list)
        data = msgspec.to_builtins(self.to_dict(), enc_hook=str)
        head = ("# The resolved config of this run: every field, defaults included.\n"
                "# agentgym-rl train --config config.yaml runs it again; --resume RUN "
                "continues it.\n")
        return head + yaml.dump(data, Dumper=Dumper, sort_keys=False, default_flow_style=False,
                                allow_unicode=True, width=100)


def has_field(path: str) -> bool:
    """Whether ``path`` (``max_steps``, ``rollout.max_turns``, ``learner.lr``) names a field
    of the tree."""
    return field_path_exists(TrainerConfig, path)


def find_config(name: str | Path) -> Path:
    """The config file ``name``: a path as given; else a shipped config (package data,
    :data:`CONFIGS_DIR`) of that name, ``.yaml`` added when it has no suffix, under the
    folder or its ``agentgym_rl/``; ``configs/x.yaml`` (the repository's spelling) also
    finds the shipped ``x.yaml`` outside the checkout. A ConfigError (one line, with the
    shipped names) when there is none."""
    p = Path(name).expanduser()
    if p.is_file():
        return p
    if p.exists():
        raise ConfigError(f"config {name}: is a folder, not a YAML or TOML file")
    rel = Path(*p.parts[1:]) if p.parts[:1] == ("configs",) else p
    names = [rel] if rel.suffix else [rel.with_name(rel.name + s)
                                      for s in (".yaml", ".yml", ".toml")]
    if not p.is_absolute():
        for root in (CONFIGS_DIR, CONFIGS_DIR / "agentgym_rl"):
            for n in names:
                if (root / n).is_file():
                    return root / n
    shipped = sorted(q.stem for q in CONFIGS_DIR.glob("*.*") if q.suffix in (".yaml", ".toml"))
    raise ConfigError(f"config {name}: no such file, and no shipped config of that name "
                      f"(shipped: {', '.join(shipped)})")


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML (``.yaml``/``.yml``) or TOML (``.toml``) config file into a dict (the raw
    mapping: :meth:`TrainerConfig.from_dict` checks it). A ``[train]``/``train:`` table,
    when present, is the config; otherwise the whole file. A file that cannot be read or
    parsed is a ConfigError naming it."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"config {p}: {e.strerror or e}") from None
    try:
        if p.suffix == ".toml":
            data = tomllib.loads(text)
        elif p.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text) or {}
        else:
            raise ConfigError(f"config {p.name}: must be .yaml, .yml or .toml")
    except ConfigError:
        raise
    except Exception as e:  # a YAML or TOML syntax error: its first line names the place
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"config {p}: not valid {p.suffix[1:].upper()}: "
                          f"{' '.join(str(e).split())[:300] or first}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config {p}: expected a mapping at the top level")
    return dict(data.get("train", data))


def load_config(source: str | Path | Mapping[str, Any], **overrides: Any) -> TrainerConfig:
    """A :class:`TrainerConfig` from a config file (a path, or a shipped config's name:
    :func:`find_config`) or a mapping, with ``overrides`` (:meth:`TrainerConfig.replace`)."""
    data = source if isinstance(source, Mapping) else load_config_file(find_config(source))
    cfg = TrainerConfig.from_dict(data)
    return cfg.replace(**overrides) if overrides else cfg
