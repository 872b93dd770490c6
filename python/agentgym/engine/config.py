"""Rollout configuration, and the typed config tree's building blocks.

:class:`RolloutConfig` holds the rollout engine's knobs. :class:`ConfigSection` is the base
of every typed section of a training config (``rollout``, ``learner``, ``warmup``,
``parallel``, ``lora``, ...: :class:`~agentgym.learner.train_config.TrainerConfig`): a
msgspec ``Struct`` that refuses unknown fields, with a read-only mapping view
(``section["key"]``, ``dict(section)``) for code written against the dict sections of old.
:func:`convert` builds a section (or the whole tree) from plain data and turns every refusal
into one :class:`~agentgym.errors.ConfigError` line naming the key by its full path (an
unknown key with the nearest valid name, a wrong type with the expected one).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from types import UnionType as _UnionType
from typing import Any, ClassVar, Union, get_args, get_origin

import msgspec

from agentgym.errors import ConfigError

__all__ = ["DEFAULT_RECORD_TOKENS", "ConfigError", "ConfigSection", "RolloutConfig", "convert",
           "field_path_exists"]

#: What a reply cut at ``max_new_tokens`` does (``RolloutConfig.truncated_turn``).
TRUNCATED_TURN_RULES = ("step", "end")

#: Which replies an episode solved on a reflection retry trains on
#: (``RolloutConfig.reflection_credit``).
REFLECTION_CREDIT = ("all", "reflection")

#: Where a reflection retry puts the env back (``RolloutConfig.reflection_restore``).
REFLECTION_RESTORE = ("start", "last")

#: ``RolloutConfig.max_record_tokens`` where neither it nor a larger context cap is set.
DEFAULT_RECORD_TOKENS = 1 << 20


class ConfigSection(msgspec.Struct, kw_only=True, forbid_unknown_fields=True,
                    repr_omit_defaults=True):
    """Base of the typed config sections: keyword-only, unknown fields refused, and a
    read-only mapping view over the fields that are set (a field left ``msgspec.UNSET`` in
    an overrides section is not a key)."""

    def keys(self) -> list[str]:
        return [k for k in self.__struct_fields__ if getattr(self, k) is not msgspec.UNSET]

    def __getitem__(self, key: str) -> Any:
        if key not in self.__struct_fields__ or getattr(self, key) is msgspec.UNSET:
            raise KeyError(key)
        return getattr(self, key)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key in self.keys()

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default

    def items(self) -> list[tuple[str, Any]]:
        return [(k, getattr(self, k)) for k in self.keys()]

    def __iter__(self):
        return iter(self.keys())

    def __len__(self) -> int:  # an overrides section with nothing set is empty (falsy)
        return len(self.keys())

    def __eq__(self, other: object) -> bool:
        """A section equals another of its type with the same fields, and a mapping that
        loads as it (``parallel == {"strategy": "fsdp"}``)."""
        if isinstance(other, Mapping):
            try:
                return type(self).from_dict(other) == self
            except ConfigError:
                return False
        return super().__eq__(other)

    __hash__ = None  # mutable, as a dict

    def to_dict(self) -> dict[str, Any]:
        """The fields that are set, as plain Python data (tuples as lists)."""
        return msgspec.to_builtins(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | ConfigSection | None, *,
                  path: str | None = None):
        """Build from a mapping (None: the defaults; an instance: itself). A refused key or
        value is a :class:`~agentgym.errors.ConfigError` naming it by ``path`` (default: the
        section's own name, :attr:`config_path`)."""
        if isinstance(d, cls):
            return d
        return convert(dict(d or {}), cls, path=cls.config_path if path is None else path)

    #: The section's name in a training config (the prefix of its keys in messages).
    config_path: ClassVar[str] = ""


def _struct_in(tp: Any) -> type[msgspec.Struct] | None:
    """The Struct type ``tp`` is, or the one Struct of the union ``tp`` (else None)."""
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return tp
    if get_origin(tp) in (Union, _UnionType):
        found = [t for t in get_args(tp) if isinstance(t, type) and issubclass(t, msgspec.Struct)]
        return found[0] if len(found) == 1 else None
    return None


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def _check_keys(data: Any, tp: Any, path: str) -> None:
    """Refuse the first key of ``data`` that names no field of the Struct ``tp`` stands for
    (recursively through the sections), with its full path and the nearest valid name."""
    st = _struct_in(tp)
    if st is None or not isinstance(data, Mapping):
        return
    fields = {f.encode_name: f for f in msgspec.structs.fields(st)}
    for key, value in data.items():
        if key not in fields:
            raise ConfigError(unknown_key_message(st, key, path))
        _check_keys(value, fields[key].type, _join(path, key))


def unknown_key_message(st: type, key: Any, path: str) -> str:
    """``unknown key rollout.max_turnz (did you mean rollout.max_turns?)``: the nearest valid
    names by :mod:`difflib`, or a pointer to where the key lives (``Struct.config_hint``)."""
    names = [f.encode_name for f in msgspec.structs.fields(st)]
    where = getattr(st, "config_hint", None)
    moved = where(str(key)) if where is not None else None
    if moved:
        return f"unknown key {_join(path, key)} (did you mean {moved}?)"
    close = difflib.get_close_matches(str(key), names, n=1, cutoff=0.6)
    if close:
        return (f"unknown key {_join(path, key)} (did you mean "
                f"{_join(path, close[0])}?)")
    return f"unknown key {_join(path, key)} (expected one of: {', '.join(names)})"


_AT = re.compile(r"^(?P<msg>.*?)(?: - at `\$(?P<loc>[^`]*)`)?$", re.S)
_EXPECTED = re.compile(r"^Expected `(?P<want>[^`]+)`, got `(?P<got>[^`]+)`")
_WORDS = {"object": "a mapping", "array": "a list", "str": "a string", "int": "an integer",
          "float": "a number", "bool": "true or false", "null": "null"}


def _lookup(data: Any, loc: str) -> Any:
    """The value at msgspec's location ``.a.b[1]`` of ``data`` (``...`` when not found)."""
    value = data
    for name, index in re.findall(r"\.([^.\[]+)|\[(\d+)\]", loc):
        try:
            value = value[name] if name else value[int(index)]
        except (KeyError, IndexError, TypeError):
            return ...
    return value


def _explain(error: msgspec.ValidationError, data: Any, path: str) -> str:
    m = _AT.match(" ".join(str(error).split()))
    msg, loc = m.group("msg"), m.group("loc") or ""
    where = _join(path, re.sub(r"^\.", "", loc)) if loc else path
    exp = _EXPECTED.match(msg)
    if exp:
        want = " or ".join(_WORDS.get(w.strip(), w.strip()) for w in exp["want"].split("|"))
        got = exp["got"]
        value = _lookup(data, loc)
        shown = "" if value is ... else f" {value!r}"
        got = {**_WORDS, "bool": "a boolean"}.get(got, got)
        return f"{where or 'config'}: expected {want}, got {got}{shown}"
    if msg.startswith("Object missing required field"):
        return f"{where or 'config'}: {msg[0].lower()}{msg[1:]}"
    if not where or msg.startswith(where) or f"{where}." in msg:
        return msg
    return f"{where}: {msg}"


def convert(data: Any, tp: Any, *, path: str = "") -> Any:
    """``data`` (plain mappings, lists and values; sections may already be instances)
    converted to ``tp``. Every refusal is one :class:`~agentgym.errors.ConfigError` line:
    an unknown key (its full path under ``path`` and the nearest valid name), a wrong type
    (the path, the expected type and the value given) or a value a section's own checks
    refuse. Numbers written as strings (YAML reads ``1e-6`` as one) are read as numbers."""
    _check_keys(data, tp, path)
    try:
        return msgspec.convert(data, tp, strict=False)
    except msgspec.ValidationError as e:
        raise ConfigError(_explain(e, data, path)) from None


def field_path_exists(tp: Any, path: str) -> bool:
    """Whether the dotted ``path`` (``rollout.max_turns``) names a field of the Struct
    ``tp``, through its sections."""
    for part in path.split("."):
        st = _struct_in(tp)
        if st is None:
            return False
        fields = {f.encode_name: f for f in msgspec.structs.fields(st)}
        if part not in fields:
            return False
        tp = fields[part].type
    return True


class RolloutConfig(ConfigSection):
    """Knobs of :class:`~agentgym.engine.RolloutEngine` (all overridable per ``collect``).

    ``max_turns`` is the horizon (ScalingInter-RL moves it); ``max_new_tokens`` caps one
    turn; ``max_total_tokens`` caps the whole context (an episode that reaches it ends with
    ``length``). ``truncated_turn`` decides what a reply cut at ``max_new_tokens`` does:
    ``"step"`` (default, as AgentGym-RL and verl's agent loop do) closes the reply with an
    end-of-turn token (mask 0) and steps the env with what was written, so a malformed
    action gets the env's own "invalid action" feedback and the episode goes on;
    ``"end"`` ends the episode there with ``length``. A reply cut by the context cap
    always ends with ``length``. ``reply_prefix`` opens every assistant turn (after the
    chat template's header) as prompt tokens, e.g. ``"Action: move"``: the model's reply
    continues it, only the reply is trained on and parsed. ``max_concurrency`` episodes
    are live at once; a finished one is replaced immediately.

    ``undo`` (off by default) lets the model reply ``Action: undo`` or ``Action: undo N``
    on envs that snapshot: the env goes back to its state before the last ``N`` turns not
    undone already, the undo turn's reward cancels theirs, at most ``max_undos`` accepted
    undos per episode and ``undo_depth`` turns back (docs/mechanisms.md). An env that cannot
    snapshot raises ``SnapshotUnsupportedError`` before any episode starts.

    ``reflection`` (0, off, by default) allows that many extra attempts: an attempt the env
    ended unsolved, or the horizon ended, puts the env back at the episode's start, appends
    the note ``reflection_prompt`` (a user turn; default
    :data:`~agentgym.engine.mechanisms.reflection.REFLECTION_PROMPT`) and the model's next reply is
    its reflection and the new attempt's first action. The episode's reward is the last
    attempt's return times ``reflection_discount ** (attempts - 1)``; the horizon counts the
    turns of each attempt (docs/mechanisms.md). ``reflection_credit="reflection"`` (R³'s
    rule) trains an episode solved on a retry on its reflections alone (the first reply of
    each retry); ``"all"`` (default) on every reply. An env that cannot snapshot raises
    ``SnapshotUnsupportedError`` before any episode starts.

    ``branch_at`` (0, off, by default) plays each group as trees: the samples of a group go
    in runs of ``branch_width`` (sample indices ``k * width ... k * width + width - 1``);
    the first of a run plays alone until it has played ``branch_at`` turns (or, with
    ``branch_entropy``, until the first turn whose reply's mean surprisal reaches it), then
    the env is forked into the others' slots and each continues from that state with its
    own sampling. A child's copy of the shared prefix has loss mask 0 (trained once,
    through its parent); trajectories carry ``branch_parent``, ``branch_turn`` and
    ``branch_pos``. An episode that ends before the fork leaves its siblings to play from
    the start. At most ``max_concurrency // branch_width`` trees run at once
    (docs/mechanisms.md). An env that cannot snapshot raises ``SnapshotUnsupportedError``
    before any episode starts.

    ``plan`` (off by default) adds plan turns: before the first action, and after every
    ``replan_every`` env turns when that is > 0, the assistant turn opens with
    ``plan_prefix`` (default :data:`~agentgym.engine.mechanisms.planning.PLAN_PREFIX`,
    prompt tokens),
    the model writes a plan (policy tokens, at most ``plan_max_tokens``, reward 0, or
    ``plan_bonus`` once the episode is solved) that the env never sees, and a user turn asks
    for the next action. Horizons count env turns, not
    plan turns (docs/mechanisms.md). Not with ``reply_prefix`` (it would open the plan).

    ``context_window`` (None, the whole record, by default) bounds what the model sees: each
    reply is generated from the episode's first prompt (system prompt and first
    observation) and its last ``context_window`` replies with what followed each, so
    ``max_total_tokens`` caps that window and a reply, while the trajectory still records
    every token once (ended with ``length`` at ``max_record_tokens``). Each reply is then a
    step whose context is a slice of the record (``Trajectory.step_context``); the learner
    trains one sample per step (docs/mechanisms.md).

    ``valid_action_decoding`` (off by default): on an env that lists its legal actions,
    each reply is one of them, chosen by the probability the model gives each action's reply
    text (TWOSOME, GLAM); the chosen tokens and their logprobs are the sample, trained as any
    other reply. It needs a backend that scores choices (transformers, vllm); a turn where
    the env lists nothing is generated freely (docs/mechanisms.md). Not with ``plan``.

    ``opponent`` decides who plays the seats of a multi-seat game (self-play,
    :mod:`agentgym.engine.selfplay`): ``"self"`` (default) the learning policy every seat;
    ``"solver"`` or ``"random"`` the game's reference strategy or a random legal move every
    seat but the policy's (seat ``group_id % seats``); the name of a backend in
    ``RolloutEngine.opponents``, or ``"pool"`` (one of them per episode). Single-agent envs
    ignore it.
    """

    max_turns: int | None = 10
    max_new_tokens: int = 128
    truncated_turn: str = "step"
    max_total_tokens: int = 2048
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    n_samples: int = 1
    max_concurrency: int = 256
    action_format: str = "auto"
    system_prompt: str | None = None
    reply_prefix: str = ""
    backend_retries: int = 2
    retry_backoff_s: float = 0.05
    turn_timeout_s: float | None = None
    episode_timeout_s: float | None = None
    seed: int = 0
    progress: bool | None = None
    #: Python envs and simulators: 0 = a thread pool in this process, N > 0 = N worker
    #: processes (``ProcessEnvPool``). Native envs always step in the Rust pool.
    env_workers: int = 0
    #: Python envs on the thread pool: a tick's resets/steps run inline on the event loop
    #: when their measured cost is below this many seconds in total (0 = always the pool).
    inline_env_budget_s: float = 0.002
    #: Generation-0 threshold of Python's cyclic GC while rollouts run (0 = leave it alone).
    gc_threshold: int = 20000
    #: Self-correction: ``undo`` / ``undo N`` actions restore the env (docs/mechanisms.md).
    undo: bool = False
    #: Accepted undos per episode (``undo`` only); further ones are refused as invalid.
    max_undos: int = 3
    #: Turns kept per episode for undoing (``undo`` only): the most one ``undo N`` reaches.
    undo_depth: int = 16
    #: Reflection retries: extra attempts after an unsolved one (0 = off; docs/mechanisms.md).
    reflection: int = 0
    #: The reward of an episode of ``k`` attempts: its last attempt's return times this
    #: ``** (k - 1)``.
    reflection_discount: float = 0.9
    #: The note before a retry (``str.format`` fields ``attempt``, ``attempts_left``,
    #: ``outcome``, ``observation``); None:
    #: ``agentgym.engine.mechanisms.reflection.REFLECTION_PROMPT``.
    reflection_prompt: str | None = None
    #: Which replies an episode solved on a retry trains on: ``"all"``, or ``"reflection"``
    #: (the first reply of each retry, as R³ does).
    reflection_credit: str = "all"
    #: Where a retry starts: ``"start"`` (the episode's start) or ``"last"`` (an attempt
    #: the env ended goes back to before its last turn; one the horizon ended to the start).
    reflection_restore: str = "start"
    #: Branched groups: fork each tree after this many turns (0 = off; docs/mechanisms.md).
    branch_at: int = 0
    #: Samples per tree: the one that plays the prefix and ``branch_width - 1`` forks.
    branch_width: int = 2
    #: Fork at the first turn before ``branch_at`` whose reply's mean surprisal (minus its
    #: mean token logprob, nats) is at least this (None: always at ``branch_at``).
    branch_entropy: float | None = None
    #: Planning: a plan turn before the first action (docs/mechanisms.md).
    plan: bool = False
    #: Another plan turn after every this many env turns (0: only the first).
    replan_every: int = 0
    #: Opens a plan turn's reply; None: ``agentgym.engine.mechanisms.planning.PLAN_PREFIX``.
    plan_prefix: str | None = None
    #: Tokens a plan may take (None: ``max_new_tokens``).
    plan_max_tokens: int | None = None
    #: The reward of each plan turn of a solved episode (RLVMR's planning reward; 0: none).
    plan_bonus: float = 0.0
    #: Bounded context: the first prompt and the last this many replies (None: the whole
    #: record; docs/mechanisms.md).
    context_window: int | None = None
    #: With ``context_window``: the most tokens one trajectory records (``length`` there).
    #: None (the default) follows ``max_total_tokens``: :data:`DEFAULT_RECORD_TOKENS`, or
    #: ``max_total_tokens`` where that is larger; it is resolved to a number once
    #: ``context_window`` is set. A number below ``max_total_tokens`` is refused.
    max_record_tokens: int | None = None
    #: Who plays a game's other seats: self | solver | random | pool | an opponent backend.
    opponent: str = "self"
    #: The reply is one of the env's listed actions, chosen by the model's probability of
    #: each (docs/mechanisms.md).
    valid_action_decoding: bool = False

    config_path: ClassVar[str] = "rollout"

    def __post_init__(self) -> None:
        try:
            self._check()
        except ValueError as e:
            if isinstance(e, ConfigError):
                raise
            raise ConfigError(str(e)) from None

    def _check(self) -> None:
        if self.truncated_turn not in TRUNCATED_TURN_RULES:
            raise ValueError(f"truncated_turn must be one of {TRUNCATED_TURN_RULES}, "
                             f"got {self.truncated_turn!r}")
        if self.max_undos < 0:
            raise ValueError(f"max_undos must be >= 0, got {self.max_undos}")
        if self.undo_depth < 1:
            raise ValueError(f"undo_depth must be >= 1, got {self.undo_depth}")
        if self.reflection < 0:
            raise ValueError(f"reflection must be >= 0, got {self.reflection}")
        if not 0.0 <= self.reflection_discount <= 1.0:
            raise ValueError(f"reflection_discount must be in [0, 1], got "
                             f"{self.reflection_discount}")
        if self.reflection_credit not in REFLECTION_CREDIT:
            raise ValueError(f"reflection_credit must be one of {REFLECTION_CREDIT}, got "
                             f"{self.reflection_credit!r}")
        if self.reflection_restore not in REFLECTION_RESTORE:
            raise ValueError(f"reflection_restore must be one of {REFLECTION_RESTORE}, got "
                             f"{self.reflection_restore!r}")
        if self.branch_at < 0:
            raise ValueError(f"branch_at must be >= 0, got {self.branch_at}")
        if self.branch_at:
            if self.branch_width < 2:
                raise ValueError(f"branch_width must be >= 2, got {self.branch_width}")
            if self.max_concurrency < self.branch_width:
                raise ValueError(f"max_concurrency ({self.max_concurrency}) must be at least "
                                 f"branch_width ({self.branch_width}): one tree at a time")
            if self.reflection:
                raise ValueError("branch_at and reflection do not combine: a reflection "
                                 "retry restarts the episode a fork shares")
        if self.replan_every < 0:
            raise ValueError(f"replan_every must be >= 0, got {self.replan_every}")
        if self.plan_max_tokens is not None and self.plan_max_tokens < 1:
            raise ValueError(f"plan_max_tokens must be >= 1, got {self.plan_max_tokens}")
        if self.plan_bonus < 0:
            raise ValueError(f"plan_bonus must be >= 0, got {self.plan_bonus}")
        if self.plan and self.valid_action_decoding:
            raise ValueError("plan and valid_action_decoding do not combine: a plan turn is "
                             "free text, not one of the env's actions")
        if self.plan and self.reply_prefix:
            raise ValueError("plan and reply_prefix do not combine: the reply prefix would "
                             "open the plan turn's reply")
        if self.context_window is not None and self.context_window < 1:
            raise ValueError(f"context_window must be >= 1 (None: the whole record), got "
                             f"{self.context_window}")
        record = self.max_record_tokens
        if record == DEFAULT_RECORD_TOKENS and self.max_total_tokens > record:
            record = None  # the default resolved before: it follows the context cap still
        if record is not None and record < self.max_total_tokens:
            raise ValueError(f"max_record_tokens ({record}) must be at least "
                             f"max_total_tokens ({self.max_total_tokens})")
        if record is None and self.context_window is not None:
            record = max(DEFAULT_RECORD_TOKENS, self.max_total_tokens)
        self.max_record_tokens = record
        if self.reflection_prompt is not None:
            from agentgym.engine.mechanisms.reflection import check_prompt

            check_prompt(self.reflection_prompt)
