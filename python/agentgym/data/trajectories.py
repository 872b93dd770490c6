"""The vocabulary of a batch of trajectories: stop reasons, the failure set, ``Trajectory``
(one finished episode, token-exact) and ``PackedBatch`` (many, laid end to end in flat numpy
arrays) with its packer ``pack``.

Stop reasons come from the Rust core (``agentgym._core.STOP_REASONS``): a reason's code in
``PackedBatch.stop_reason`` is its index there. The Rust ``TrajectoryStore.drain()`` returns
the packed layout as a dict; ``PackedBatch.from_dict`` reads it. Python-side trajectories
(``RolloutBatch.trajectories``) become the same layout through :func:`pack`. ``RowInfo``
holds what a trajectory has beyond the packed arrays (its task, env seed, error and timings),
so that a packed batch and its ``RowInfo`` together are the trajectories without per-token
Python lists.

Field for field a ``Trajectory`` maps onto verl's ``AgentLoopOutput`` (prompt_ids =
token_ids[:prompt_len], response_ids = token_ids[prompt_len:], response_mask =
loss_mask[prompt_len:], response_logprobs, num_turns, reward_score) and SkyRL's
``GeneratorOutput`` (prompt_token_ids, response_ids, rewards, loss_masks, stop_reasons,
rollout_logprobs); see ``agentgym.data.exports``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import Any

import msgspec
import numpy as np

from agentgym import _core
from agentgym.data.frames import Frame, RowImages

__all__ = [
    "FAILED_STOP_CODES",
    "PACKED_FIELDS",
    "FAILED_STOP_REASONS",
    "STEP_FIELDS",
    "STOP_CODES",
    "STOP_REASONS",
    "BatchFormatError",
    "PackedBatch",
    "RowInfo",
    "Trajectory",
    "pack",
    "solved",
    "success_of",
    "trajectories",
    "unpack",
    "version_array",
    "version_column",
    "version_runs",
]

#: Stop reason names in code order (the Rust core's ``StopReason`` discriminants).
STOP_REASONS: tuple[str, ...] = tuple(_core.STOP_REASONS)

#: A stop reason's code (its index in ``STOP_REASONS``), as held by ``PackedBatch.stop_reason``.
STOP_CODES: Mapping[str, int] = MappingProxyType({r: i for i, r in enumerate(STOP_REASONS)})

#: Stop reasons of failed episodes: they keep their tokens, their loss mask is zeroed and they
#: never contribute a learning signal.
FAILED_STOP_REASONS: frozenset[str] = frozenset(
    {"env_error", "backend_error", "timeout", "aborted"}
)

#: The codes of ``FAILED_STOP_REASONS``, ascending.
FAILED_STOP_CODES: tuple[int, ...] = tuple(sorted(STOP_CODES[r] for r in FAILED_STOP_REASONS))


#: The reward of a solved episode of an env that states no rule of its own: the env ended it
#: (``done``) with at least this reward (less float rounding). Each env's own rule is its
#: registry entry's (:func:`agentgym.envs.registry.success_rule`): a threshold of its own.
SUCCESS_REWARD = 1.0


def solved(done: Any, reward: Any, attempt_return: Any = None,
           threshold: float = SUCCESS_REWARD) -> Any:
    """The success rule over scalars or numpy arrays: ended by the env (``done``, a bool or
    bool array) with at least ``threshold`` reward (default :data:`SUCCESS_REWARD`; an
    env's rule: its :class:`~agentgym.envs.registry.SuccessRule`'s ``threshold``, also an
    array of one per row). An episode that retried (reflection) is judged on its last
    attempt's return, not on its discounted reward: ``attempt_return`` (None, or NaN in an
    array, where it did not retry)."""
    if isinstance(attempt_return, np.ndarray):
        reward = np.where(np.isnan(attempt_return), reward, attempt_return)
    elif attempt_return is not None:
        reward = attempt_return
    return done & (reward >= threshold - 1e-6)


def _threshold(env_id: str) -> float:
    """``env_id``'s success threshold (:data:`SUCCESS_REWARD` for an id the registry does
    not know)."""
    from agentgym.envs.registry import success_rule
    from agentgym.errors import UnknownEnvError

    try:
        return success_rule(env_id).threshold
    except UnknownEnvError:
        return SUCCESS_REWARD


def success_of(env_id: str | Sequence[str], done: Any, reward: Any,
               attempt_return: Any = None) -> np.ndarray:
    """Each episode's success under its env's rule (:func:`solved` with the threshold of
    :func:`agentgym.envs.registry.success_rule`), as a bool array: ``env_id`` one id or
    one per row; ``done``, ``reward`` and ``attempt_return`` per row (``attempt_return``
    None, or None/NaN entries, where an episode did not retry)."""
    done = np.asarray(done, dtype=bool)
    reward = np.asarray(reward, dtype=np.float64)
    if isinstance(env_id, str):
        threshold: Any = _threshold(env_id)
    else:
        known: dict[str, float] = {}
        threshold = np.array([known[e] if e in known else known.setdefault(e, _threshold(e))
                              for e in env_id], np.float64)
    attempt = None
    if attempt_return is not None:
        attempt = np.array([np.nan if a is None else a for a in attempt_return]
                           if not isinstance(attempt_return, np.ndarray) else attempt_return,
                           np.float64).reshape(reward.shape)
    return np.asarray(solved(done, reward, attempt, threshold), dtype=bool)


class BatchFormatError(ValueError):
    """A packed batch (or a trajectory being packed) has missing fields, wrong shapes,
    inconsistent offsets or an unknown stop reason."""


class Trajectory(msgspec.Struct, kw_only=True, gc=False):
    """A finished episode.

    ``token_ids`` is the whole conversation as the model saw it (the chat template applied
    once, then one segment per turn); ``loss_mask[i] == 1`` exactly where the model generated
    token ``i`` (its end-of-turn token included); ``logprobs[i]`` is the behaviour policy's
    log-probability of that token (0.0 elsewhere). ``turn_rewards[t]`` is the env's reward
    after turn ``t``; ``reward`` their sum. A failed episode (``stop_reason`` in
    ``FAILED_STOP_REASONS``) keeps its tokens but has an all-zero mask.

    A branched episode (``RolloutConfig.branch_at``: its group played as a tree) carries the
    fork: ``branch_parent`` the sample index of the group's sample that played the shared
    prefix (None: not branched), ``branch_turn`` the turns and ``branch_pos`` the tokens of
    that prefix. Every child's copy of the prefix has loss mask 0 (the parent's trajectory
    trains it once); the tokens, logprobs and turn rewards are the whole episode's.

    An episode played with a bounded context (``RolloutConfig.context_window``) carries one
    entry per model reply in ``step_context``, ``step_reply`` and ``step_end``: reply ``s``
    is ``token_ids[step_reply[s]:step_end[s]]`` and the backend generated it from
    ``token_ids[:step_context[0]] + token_ids[step_context[s]:step_reply[s]]`` (the first
    prompt, then the turns the window kept); see :meth:`PackedBatch.step_samples`. Empty:
    the whole record was every reply's context.

    A seat of a multi-seat game (self-play, :mod:`agentgym.engine.selfplay`) carries its
    ``seat`` index, its ``role``, the ``player`` that played it (``"policy"``: the learning
    policy, the only one with loss mask 1; else an opponent's name) and the ``episode_id``
    its seats share; a single-agent episode has seat 0 and the rest None.

    An episode with image observations (an env built with ``obs="image"`` or ``"both"``)
    carries each distinct frame it saw once in ``images`` and, per image placeholder span of
    ``token_ids`` in order, the index of the frame shown there in ``image_refs``
    (:mod:`agentgym.data.frames`); both are empty for a text-only episode.

    Instances are not tracked by the cyclic GC (msgspec ``gc=False``): a trajectory holds
    numbers, strings and lists of numbers, so it is never part of a reference cycle, and a
    rollout makes thousands whose token lists the collector would otherwise traverse again
    and again. (Don't store objects that refer back to the trajectory in its fields.)

    ``policy_version`` is the version of the weights the episode began under. An episode that
    spans a weight update (asynchronous training: a partial rollout) lists where the version
    changed: from token ``version_pos[k]`` on, its model tokens were generated by version
    ``version_at[k]`` (each reply by one version; the logprobs are that version's). Both
    empty: every model token is ``policy_version``'s (:meth:`token_versions`).
    """

    task_id: int | str
    env_id: str
    group_id: int
    sample_index: int
    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    prompt_len: int
    turn_rewards: list[float]
    reward: float
    num_turns: int
    stop_reason: str
    policy_version: int
    timings: dict[str, float] = msgspec.field(default_factory=dict)
    seed: int = 0
    error: str | None = None
    branch_parent: int | None = None
    branch_turn: int = 0
    branch_pos: int = 0
    step_context: list[int] = msgspec.field(default_factory=list)
    step_reply: list[int] = msgspec.field(default_factory=list)
    step_end: list[int] = msgspec.field(default_factory=list)
    version_pos: list[int] = msgspec.field(default_factory=list)
    version_at: list[int] = msgspec.field(default_factory=list)
    seat: int = 0
    role: str | None = None
    player: str | None = None
    episode_id: int | None = None
    images: list[Frame] = msgspec.field(default_factory=list)
    image_refs: list[int] = msgspec.field(default_factory=list)
    #: Solved, as the engine recorded it under the env's rule
    #: (:func:`agentgym.envs.registry.success_rule`: ended by the env with the rule's
    #: return; a retried episode judged on its last attempt's return). Left None, it is
    #: judged from the trajectory itself by that rule when the trajectory is made.
    success: bool | None = None

    def __post_init__(self) -> None:
        if self.success is None:
            self.success = bool(success_of(self.env_id, self.stop_reason == "done",
                                           self.reward, [self.timings.get("attempt_return")]))

    @property
    def response_length(self) -> int:
        """Number of model-generated tokens."""
        return sum(self.loss_mask)

    def token_versions(self) -> np.ndarray:
        """uint32[len(token_ids)]: the policy version of each token (a model token: the
        weights that generated it; the rest: the version in force when it was appended)."""
        return version_array(len(self.token_ids), self.policy_version, self.version_pos,
                             self.version_at)


def version_array(length: int, version: int, pos: Sequence[int], at: Sequence[int]
                  ) -> np.ndarray:
    """uint32[length]: ``version`` before ``pos[0]``, then ``at[k]`` from ``pos[k]`` on."""
    out = np.full(length, version, np.uint32)
    for p, v in zip(pos, at):
        out[p:] = v
    return out


def version_column(policy_version: np.ndarray, offsets: np.ndarray,
                   runs: Sequence[tuple[Sequence[int], Sequence[int]]] = ()) -> np.ndarray:
    """uint32[T], a packed batch's ``token_version``: each row's ``policy_version`` over its
    tokens, then from ``runs[b]`` (row ``b``'s ``(version_pos, version_at)``; none: every
    row one version) each later version from its position on."""
    out = np.repeat(np.asarray(policy_version, np.uint32), np.diff(offsets))
    for b, (pos, at) in enumerate(runs):
        for p, v in zip(pos, at):
            out[offsets[b] + p:offsets[b + 1]] = v
    return out


def version_runs(versions: np.ndarray, version: int) -> tuple[list[int], list[int]]:
    """The ``(version_pos, version_at)`` of a per-token version array whose first run is
    ``version`` (the inverse of :func:`version_array`)."""
    change = np.flatnonzero(np.diff(versions.astype(np.int64), prepend=version))
    return change.tolist(), versions[change].tolist()


#: The fields of a packed batch and their dtypes.
PACKED_FIELDS: dict[str, Any] = {
    "token_ids": np.uint32,
    "offsets": np.int64,
    "loss_mask": np.uint8,
    "logprobs": np.float32,
    "token_version": np.uint32,
    "rewards": np.float32,
    "turn_rewards": np.float32,
    "turn_offsets": np.int64,
    "num_turns": np.uint32,
    "stop_reason": np.uint8,
    "group_id": np.uint64,
    "sample_index": np.uint32,
    "policy_version": np.uint32,
    "prompt_len": np.uint32,
    "branch_parent": np.uint32,
    "branch_turn": np.uint32,
    "branch_pos": np.uint32,
    "step_offsets": np.int64,
    "step_context": np.uint32,
    "step_reply": np.uint32,
    "step_end": np.uint32,
    "seat": np.uint32,
}
#: The per-step fields (``RolloutConfig.context_window``); a mapping without any of them
#: (the trajectory store's drain) reads as a batch without steps.
STEP_FIELDS = ("step_context", "step_reply", "step_end")
_PER_TOKEN = ("token_ids", "loss_mask", "logprobs", "token_version")
_PER_TRAJECTORY = (
    "rewards", "num_turns", "stop_reason", "group_id", "sample_index", "policy_version",
    "prompt_len", "branch_parent", "branch_turn", "branch_pos", "seat",
)


@dataclass
class PackedBatch:
    """B trajectories packed end to end (the trajectory store's export format).

    Token-level (length T = total tokens): ``token_ids`` uint32, ``loss_mask`` uint8
    (1 = token generated by the model, 0 = prompt/observation, all 0 for a failed episode),
    ``logprobs`` float32 (behaviour-policy logprob at model tokens, 0 elsewhere),
    ``token_version`` uint32 (the policy version that generated each model token: see
    :meth:`Trajectory.token_versions`; a mapping without it, such as the store's drain, reads
    as each row's ``policy_version`` throughout). Trajectory
    ``b`` is ``token_ids[offsets[b]:offsets[b + 1]]`` (``offsets`` int64[B+1]).
    Per trajectory (length B): ``rewards`` float32, ``num_turns`` uint32, ``stop_reason``
    uint8 (a code into ``STOP_REASONS``), ``group_id`` uint64, ``sample_index`` uint32,
    ``policy_version`` uint32, ``prompt_len`` uint32 (tokens before the first model token),
    ``branch_parent``, ``branch_turn``, ``branch_pos`` uint32 (the fork of a branched group,
    see :class:`Trajectory`; unbranched: the row's own sample index, 0, 0, so that
    ``(group_id, branch_parent)`` is always the row's step group).
    Per turn: ``turn_rewards`` float32, trajectory ``b``'s turns are
    ``turn_rewards[turn_offsets[b]:turn_offsets[b + 1]]``.
    Per step (bounded contexts only, see :class:`Trajectory`): ``step_context``,
    ``step_reply``, ``step_end`` uint32, positions within the trajectory; trajectory ``b``'s
    steps are ``step_offsets[b]:step_offsets[b + 1]`` (none: its whole record was the
    context of every reply).
    Per trajectory too: ``seat`` uint32, the seat of a multi-seat game's row (0 for a
    single-agent episode; a mapping without it reads as all 0). Outcome advantages group by
    ``(group_id, seat)``.
    Per trajectory, not an array: ``images``, each row's :class:`~agentgym.data.frames.RowImages`
    (its frames and each image span's frame; None: a batch without image observations).
    Rows share the frame objects they came with: slicing, selecting and step samples never
    copy a frame.
    """

    token_ids: np.ndarray
    offsets: np.ndarray
    loss_mask: np.ndarray
    logprobs: np.ndarray
    token_version: np.ndarray
    rewards: np.ndarray
    turn_rewards: np.ndarray
    turn_offsets: np.ndarray
    num_turns: np.ndarray
    stop_reason: np.ndarray
    group_id: np.ndarray
    sample_index: np.ndarray
    policy_version: np.ndarray
    prompt_len: np.ndarray
    branch_parent: np.ndarray
    branch_turn: np.ndarray
    branch_pos: np.ndarray
    step_offsets: np.ndarray
    step_context: np.ndarray
    step_reply: np.ndarray
    step_end: np.ndarray
    seat: np.ndarray
    #: Each row's images (see above); not one of the layout's arrays (``fields`` of the
    #: class lists those only), set by the constructors that carry rows.
    images = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PackedBatch:
        """Build and validate from a mapping of the fields (e.g. ``TrajectoryStore.drain()``;
        entries that are not fields, such as the store's ``keys`` and ``task_id``, are not
        kept). Arrays already of the field's dtype are not copied. Without any step field,
        the batch has no steps."""
        values = {}
        if "step_offsets" not in d and not any(n in d for n in STEP_FIELDS):
            b = len(d["offsets"]) - 1 if "offsets" in d else 0
            d = {**d, "step_offsets": np.zeros(max(b, 0) + 1, np.int64),
                 **{n: np.zeros(0, np.uint32) for n in STEP_FIELDS}}
        if "token_version" not in d and "offsets" in d:  # every token its row's version
            d = {**d, "token_version": version_column(d["policy_version"],
                                                      np.asarray(d["offsets"]))}
        if "seat" not in d:  # the store's drain: single-agent rows, or seats added after
            d = {**d, "seat": np.zeros(max(len(d["offsets"]) - 1, 0) if "offsets" in d
                                       else 0, np.uint32)}
        for name, dtype in PACKED_FIELDS.items():
            if name not in d:
                raise BatchFormatError(f"packed batch is missing field {name!r}")
            arr = np.asarray(d[name])
            if arr.ndim != 1:
                raise BatchFormatError(f"field {name!r} must be 1-D, got shape {arr.shape}")
            values[name] = arr.astype(dtype, copy=False)
        batch = cls(**values)
        batch.images = d.get("images")
        batch.validate()
        return batch

    @classmethod
    def empty(cls) -> PackedBatch:
        """A batch of no trajectories."""
        return cls(**{
            name: np.zeros(1 if name.endswith("offsets") else 0, dtype)
            for name, dtype in PACKED_FIELDS.items()
        })

    @classmethod
    def concat(cls, batches: Sequence[PackedBatch]) -> PackedBatch:
        """One batch holding the trajectories of ``batches`` in order (copies)."""
        if not batches:
            return cls.empty()
        if len(batches) == 1:
            return batches[0]
        out: dict[str, np.ndarray] = {}
        for name in PACKED_FIELDS:
            parts = [getattr(b, name) for b in batches]
            if name.endswith("offsets"):
                shifted, base = [parts[0][:1]], 0
                for p in parts:
                    shifted.append(p[1:] + base)
                    base += int(p[-1])
                out[name] = np.concatenate(shifted)
            else:
                out[name] = np.concatenate(parts)
        if any(b.images is not None for b in batches):
            out["images"] = [im for b in batches for im in _row_images(b)]
        return cls.from_dict(out)

    def validate(self) -> None:
        """Check shapes, offsets and stop reason codes; raises :class:`BatchFormatError`."""
        t = self.token_ids.shape[0]
        b = self.offsets.shape[0] - 1
        if b < 0:
            raise BatchFormatError("offsets must have B + 1 >= 1 entries")
        for name in ("loss_mask", "logprobs", "token_version"):
            if getattr(self, name).shape[0] != t:
                raise BatchFormatError(
                    f"{name} has {getattr(self, name).shape[0]} entries, token_ids has {t}"
                )
        for name in _PER_TRAJECTORY:
            if getattr(self, name).shape[0] != b:
                raise BatchFormatError(
                    f"{name} has {getattr(self, name).shape[0]} entries, expected B = {b}"
                )
        for name in ("turn_offsets", "step_offsets"):
            if getattr(self, name).shape[0] != b + 1:
                raise BatchFormatError(f"{name} must have B + 1 = {b + 1} entries")
        _check_offsets("offsets", self.offsets, t)
        _check_offsets("turn_offsets", self.turn_offsets, self.turn_rewards.shape[0])
        s = self.step_context.shape[0]
        for name in STEP_FIELDS[1:]:
            if getattr(self, name).shape[0] != s:
                raise BatchFormatError(
                    f"{name} has {getattr(self, name).shape[0]} entries, step_context has {s}"
                )
        _check_offsets("step_offsets", self.step_offsets, s)
        if s:
            lens = np.repeat(self.lengths, np.diff(self.step_offsets))
            if np.any((self.step_context > self.step_reply) | (self.step_reply > self.step_end)
                      | (self.step_end > lens)):
                raise BatchFormatError("steps must satisfy step_context <= step_reply <= "
                                       "step_end <= the trajectory's length")
        if b and int(self.stop_reason.max()) >= len(STOP_REASONS):
            raise BatchFormatError(f"stop_reason codes must be < {len(STOP_REASONS)}")
        if self.images is not None and len(self.images) != b:
            raise BatchFormatError(f"images has {len(self.images)} rows, expected B = {b}")

    def __len__(self) -> int:
        return int(self.offsets.shape[0] - 1)

    @property
    def lengths(self) -> np.ndarray:
        """Token count of each trajectory, int64[B]."""
        return np.diff(self.offsets)

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.shape[0])

    @property
    def failed(self) -> np.ndarray:
        """bool[B]: the episode ended in failure (stop reason in ``FAILED_STOP_REASONS``)."""
        return np.isin(self.stop_reason, FAILED_STOP_CODES)

    def stop_reason_names(self) -> list[str]:
        """The stop reason of each trajectory by name."""
        return [STOP_REASONS[c] for c in self.stop_reason.tolist()]

    def trajectory_index(self) -> np.ndarray:
        """int64[T]: which trajectory each token belongs to."""
        return np.repeat(np.arange(len(self), dtype=np.int64), self.lengths)

    def rows(self, start: int, stop: int) -> PackedBatch:
        """Trajectories ``start ... stop - 1`` as a batch of views into this one's buffers
        (offsets rebased to 0; no copy of the token-level arrays)."""
        if not 0 <= start <= stop <= len(self):
            raise IndexError(f"rows {start}:{stop} of a batch of {len(self)}")
        if (start, stop) == (0, len(self)):
            return self
        out = {f.name: getattr(self, f.name)[start:stop] for f in fields(self)}
        t0, t1 = int(self.offsets[start]), int(self.offsets[stop])
        u0, u1 = int(self.turn_offsets[start]), int(self.turn_offsets[stop])
        s0, s1 = int(self.step_offsets[start]), int(self.step_offsets[stop])
        for name in _PER_TOKEN:
            out[name] = getattr(self, name)[t0:t1]
        out["turn_rewards"] = self.turn_rewards[u0:u1]
        for name in STEP_FIELDS:
            out[name] = getattr(self, name)[s0:s1]
        out["offsets"] = self.offsets[start:stop + 1] - t0
        out["turn_offsets"] = self.turn_offsets[start:stop + 1] - u0
        out["step_offsets"] = self.step_offsets[start:stop + 1] - s0
        return _imaged(PackedBatch(**out),
                       None if self.images is None else self.images[start:stop])

    def select(self, indices: Sequence[int] | np.ndarray) -> PackedBatch:
        """A new packed batch holding trajectories ``indices`` (in that order)."""
        idx = np.asarray(indices, dtype=np.int64)
        lengths = self.lengths[idx]
        tok_idx = _ranges(self.offsets[idx], lengths)
        tlen = np.diff(self.turn_offsets)[idx]
        turn_idx = _ranges(self.turn_offsets[idx], tlen)
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for name in _PER_TOKEN:
            out[name] = out[name][tok_idx]
        out["turn_rewards"] = self.turn_rewards[turn_idx]
        slen = np.diff(self.step_offsets)[idx]
        step_idx = _ranges(self.step_offsets[idx], slen)
        for name in STEP_FIELDS:
            out[name] = out[name][step_idx]
        out["offsets"] = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        out["turn_offsets"] = np.concatenate([[0], np.cumsum(tlen)]).astype(np.int64)
        out["step_offsets"] = np.concatenate([[0], np.cumsum(slen)]).astype(np.int64)
        for name in _PER_TRAJECTORY:
            out[name] = out[name][idx]
        return _imaged(PackedBatch(**out), None if self.images is None
                       else [self.images[i] for i in idx.tolist()])

    @property
    def has_steps(self) -> bool:
        """Some trajectory was played with a bounded context (it has steps)."""
        return bool(self.step_offsets[-1])

    def step_samples(self) -> tuple[PackedBatch, np.ndarray, np.ndarray]:
        """One sample per model reply of the trajectories with steps, each exactly what the
        backend was sent for that reply followed by the reply: ``token_ids[:H] +
        token_ids[step_context[s]:step_end[s]]`` (``H``: the trajectory's first
        ``step_context``), its loss mask and logprobs the trajectory's on the reply and 0
        elsewhere. A trajectory without steps is one sample as it is. Returns the samples
        (per-trajectory fields repeated from their trajectory, ``prompt_len`` the tokens
        before the reply; a step sample has no turns and no steps), the index of each sample
        token in this batch's token arrays (int64[T'], to gather any per-token array) and
        each sample's trajectory (int64[B']). A batch with images has no steps: bounded
        contexts are not played with image observations."""
        if self.images is not None and self.has_steps:
            raise BatchFormatError("a batch with images cannot have steps (context_window)")
        n_steps = np.diff(self.step_offsets)
        whole = np.flatnonzero(n_steps == 0)
        stepped = np.repeat(np.arange(len(self), dtype=np.int64), n_steps)
        base = self.offsets[:-1]
        # Each sample is three ranges of its trajectory (a whole row: one range and two
        # empty ones): the head, the window's earlier turns, the reply (trained).
        first = self.step_context[self.step_offsets[:-1][n_steps > 0]].astype(np.int64)
        head = np.repeat(first, n_steps[n_steps > 0])
        ctx = self.step_context.astype(np.int64)
        reply = self.step_reply.astype(np.int64)
        end = self.step_end.astype(np.int64)
        row = np.concatenate([whole, stepped])
        order = np.argsort(row, kind="stable")  # samples in trajectory order
        row = row[order]
        k, z = len(whole), np.zeros(len(whole), np.int64)
        starts = np.stack([np.concatenate([base[whole], base[stepped]]),
                           np.concatenate([z, base[stepped] + ctx]),
                           np.concatenate([z, base[stepped] + reply])], 1)[order]
        lens = np.stack([np.concatenate([self.lengths[whole], head]),
                         np.concatenate([z, reply - ctx]),
                         np.concatenate([z, end - reply])], 1)[order]
        source = _ranges(starts.ravel(), lens.ravel())
        is_whole = order < k
        flags = np.zeros((len(row), 3), np.uint8)
        flags[:, 2] = 1  # a step sample trains its reply
        flags[is_whole, 0] = 1  # a whole row its own mask
        trained = np.repeat(flags.ravel(), lens.ravel())
        sample_lens = lens.sum(1)
        out = {name: getattr(self, name)[row] for name in _PER_TRAJECTORY}
        out["prompt_len"] = np.where(is_whole, self.prompt_len[row],
                                     lens[:, 0] + lens[:, 1]).astype(np.uint32)
        tlen = np.where(is_whole, np.diff(self.turn_offsets)[row], 0)
        turn_idx = _ranges(self.turn_offsets[row], tlen)
        samples = PackedBatch(
            token_ids=self.token_ids[source],
            offsets=np.concatenate([[0], np.cumsum(sample_lens)]).astype(np.int64),
            loss_mask=self.loss_mask[source] * trained,
            logprobs=(self.logprobs[source] * trained).astype(np.float32, copy=False),
            token_version=self.token_version[source],
            turn_rewards=self.turn_rewards[turn_idx],
            turn_offsets=np.concatenate([[0], np.cumsum(tlen)]).astype(np.int64),
            step_offsets=np.zeros(len(row) + 1, np.int64),
            **{name: np.zeros(0, np.uint32) for name in STEP_FIELDS},
            **out,
        )
        return samples, source, row

    def with_rewards(self, rewards: np.ndarray) -> PackedBatch:
        """A shallow copy with replaced per-trajectory rewards (e.g. after reward shaping)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["rewards"] = np.asarray(rewards, dtype=np.float32).reshape(len(self))
        return _imaged(PackedBatch(**out), self.images)


@dataclass
class RowInfo:
    """The per-trajectory values of a :class:`PackedBatch` that are not numbers of the
    trajectory store: row ``i``'s env id, task (index or text), env seed, error message (None
    unless it failed), wall times and turn counts (its ``Trajectory.timings``: see
    :meth:`timings`)."""

    env_id: list[str]
    task_id: list[int | str]
    seed: list[int]
    error: list[str | None]
    #: ``timings["total_s"]``: the episode's wall time.
    time_total_s: list[float]
    #: ``timings["gen_s"]``: its time waiting for the backend.
    time_gen_s: list[float]
    #: ``timings["cut_turns"]``: replies cut at ``max_new_tokens`` that stepped the env.
    cut_turns: list[int]
    #: ``timings["invalid_turns"]``: turns whose action the env refused as unreadable.
    invalid_turns: list[int]
    #: ``timings["undo_turns"]``: accepted ``undo`` turns (``RolloutConfig.undo``).
    undo_turns: list[int]
    #: ``timings["attempts"]``: attempts the episode played (``RolloutConfig.reflection``;
    #: 1 without a retry).
    attempts: list[int]
    #: ``timings["plan_turns"]``: plan turns (``RolloutConfig.plan``; counted in
    #: ``num_turns``, never sent to the env).
    plan_turns: list[int]
    #: ``timings["attempt_return"]``: the last attempt's return of an episode that retried
    #: (``RolloutConfig.reflection``; None where it did not). Its success is judged on it.
    attempt_return: list[float | None]
    #: Per row of a multi-seat game: ``(episode_id, role, player)`` (None: a single-agent
    #: row; the whole field None: no game rows).
    seat_info: list[tuple[int, str, str] | None] | None = None
    #: ``Trajectory.success``: each row solved under its env's rule, as the engine recorded
    #: it (None for a row, or the whole field None: not recorded; judged by the rule from the
    #: row where needed, :meth:`successes`).
    success: list[bool | None] | None = None

    def __len__(self) -> int:
        return len(self.task_id)

    def successes(self, packed: PackedBatch) -> np.ndarray:
        """Each row's success (bool array): as recorded, else by its env's rule
        (:func:`success_of`) over ``packed``'s stop reasons and rewards (row ``i`` of both)
        and the row's last attempt's return."""
        recorded = self.success
        if recorded is not None and all(x is not None for x in recorded):
            return np.array(recorded, dtype=bool)
        judged = success_of(self.env_id, packed.stop_reason == STOP_CODES["done"],
                            packed.rewards, self.attempt_return)
        if recorded is not None:
            judged = np.array([j if r is None else r for r, j in zip(recorded, judged)], bool)
        return judged

    def timings(self, i: int) -> dict[str, float]:
        """Row ``i``'s ``Trajectory.timings``: ``total_s`` and ``gen_s``, and
        ``cut_turns`` / ``invalid_turns`` / ``undo_turns`` / ``plan_turns`` only where there
        were any, and ``attempts`` and ``attempt_return`` only where there was more than one
        attempt."""
        t = {"total_s": self.time_total_s[i], "gen_s": self.time_gen_s[i]}
        if self.cut_turns[i]:
            t["cut_turns"] = float(self.cut_turns[i])
        if self.invalid_turns[i]:
            t["invalid_turns"] = float(self.invalid_turns[i])
        if self.undo_turns[i]:
            t["undo_turns"] = float(self.undo_turns[i])
        if self.attempts[i] > 1:
            t["attempts"] = float(self.attempts[i])
        if self.plan_turns[i]:
            t["plan_turns"] = float(self.plan_turns[i])
        if self.attempt_return[i] is not None:
            t["attempt_return"] = float(self.attempt_return[i])
        return t

    @classmethod
    def of(cls, trajs: Sequence[Trajectory]) -> RowInfo:
        """The values of ``trajs``, in order."""
        return cls(env_id=[t.env_id for t in trajs], task_id=[t.task_id for t in trajs],
                   seed=[t.seed for t in trajs], error=[t.error for t in trajs],
                   time_total_s=[t.timings.get("total_s", 0.0) for t in trajs],
                   time_gen_s=[t.timings.get("gen_s", 0.0) for t in trajs],
                   cut_turns=[int(t.timings.get("cut_turns", 0)) for t in trajs],
                   invalid_turns=[int(t.timings.get("invalid_turns", 0)) for t in trajs],
                   undo_turns=[int(t.timings.get("undo_turns", 0)) for t in trajs],
                   attempts=[int(t.timings.get("attempts", 1)) for t in trajs],
                   plan_turns=[int(t.timings.get("plan_turns", 0)) for t in trajs],
                   attempt_return=[t.timings.get("attempt_return") for t in trajs],
                   seat_info=[None if t.role is None else (t.episode_id, t.role, t.player)
                              for t in trajs] if any(t.role is not None for t in trajs)
                   else None,
                   success=[t.success for t in trajs])

    @classmethod
    def concat(cls, infos: Sequence[RowInfo]) -> RowInfo:
        """The rows of ``infos`` in order."""
        if len(infos) == 1:
            return infos[0]
        return cls(**{f.name: [x for i in infos for x in _listed(i, f.name)]
                      for f in fields(cls)})._compact()

    def rows(self, start: int, stop: int) -> RowInfo:
        """Rows ``start ... stop - 1``."""
        if (start, stop) == (0, len(self)):
            return self
        return RowInfo(**{f.name: _listed(self, f.name)[start:stop]
                          for f in fields(self)})._compact()

    def select(self, indices: Sequence[int]) -> RowInfo:
        """Rows ``indices`` (in that order), as :meth:`PackedBatch.select`."""
        return RowInfo(**{f.name: [_listed(self, f.name)[i] for i in indices]
                          for f in fields(self)})._compact()

    def _compact(self) -> RowInfo:
        """``seat_info`` None where no row is a game's, ``success`` where none is recorded."""
        if self.seat_info is not None and all(x is None for x in self.seat_info):
            self.seat_info = None
        if self.success is not None and all(x is None for x in self.success):
            self.success = None
        return self


def _listed(info: RowInfo, name: str) -> list:
    """Field ``name`` of ``info`` as a list (``seat_info`` or ``success`` None: one None per
    row)."""
    value = getattr(info, name)
    return [None] * len(info) if value is None else value


def pack(trajs: Sequence[Trajectory]) -> PackedBatch:
    """Concatenate trajectories into one :class:`PackedBatch` (the layout the Rust store
    drains). Raises :class:`BatchFormatError` when a trajectory's ``loss_mask`` or
    ``logprobs`` differs in length from its ``token_ids`` or its stop reason is unknown."""
    n = len(trajs)
    lens = np.fromiter((len(t.token_ids) for t in trajs), np.int64, n)
    for name in ("loss_mask", "logprobs"):
        other = np.fromiter((len(getattr(t, name)) for t in trajs), np.int64, n)
        bad = np.flatnonzero(other != lens)
        if bad.size:
            i = int(bad[0])
            raise BatchFormatError(
                f"trajectory {i}: {name} has {other[i]} entries, token_ids has {lens[i]}"
            )
    try:
        codes = np.array([STOP_CODES[t.stop_reason] for t in trajs], np.uint8)
    except KeyError as e:
        raise BatchFormatError(
            f"unknown stop reason {e.args[0]!r}; expected one of {STOP_REASONS}"
        ) from None
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lens, out=offsets[1:])
    tlens = np.fromiter((len(t.turn_rewards) for t in trajs), np.int64, n)
    turn_offsets = np.zeros(n + 1, np.int64)
    np.cumsum(tlens, out=turn_offsets[1:])
    slens = np.fromiter((len(t.step_reply) for t in trajs), np.int64, n)
    step_offsets = np.zeros(n + 1, np.int64)
    np.cumsum(slens, out=step_offsets[1:])

    versions = np.array([t.policy_version for t in trajs], np.uint32)

    def cat(field: str, dtype: Any) -> np.ndarray:
        parts = [np.asarray(getattr(t, field), dtype) for t in trajs]
        return np.concatenate(parts) if parts else np.zeros(0, dtype)

    batch = PackedBatch(
        token_ids=cat("token_ids", np.uint32),
        offsets=offsets,
        loss_mask=cat("loss_mask", np.uint8),
        logprobs=cat("logprobs", np.float32),
        token_version=version_column(versions, offsets,
                                     [(t.version_pos, t.version_at) for t in trajs]),
        rewards=np.array([t.reward for t in trajs], np.float32),
        turn_rewards=cat("turn_rewards", np.float32),
        turn_offsets=turn_offsets,
        num_turns=np.array([t.num_turns for t in trajs], np.uint32),
        stop_reason=codes,
        group_id=np.array([t.group_id for t in trajs], np.uint64),
        sample_index=np.array([t.sample_index for t in trajs], np.uint32),
        policy_version=versions,
        prompt_len=np.array([t.prompt_len for t in trajs], np.uint32),
        branch_parent=np.array([t.sample_index if t.branch_parent is None else t.branch_parent
                                for t in trajs], np.uint32),
        branch_turn=np.array([t.branch_turn for t in trajs], np.uint32),
        branch_pos=np.array([t.branch_pos for t in trajs], np.uint32),
        step_offsets=step_offsets,
        step_context=cat("step_context", np.uint32),
        step_reply=cat("step_reply", np.uint32),
        step_end=cat("step_end", np.uint32),
        seat=np.array([t.seat for t in trajs], np.uint32),
    )
    if any(t.images for t in trajs):
        batch.images = [RowImages(t.images, t.image_refs) for t in trajs]
    batch.validate()
    return batch


def trajectories(rows: Sequence[_core.TrajectoryRow], info: RowInfo,
                 token_ids: Sequence[list[int]],
                 steps: Sequence[tuple[list[int], list[int], list[int]]] | None = None,
                 seats: Sequence[int] | None = None,
                 images: Sequence[RowImages] | None = None,
                 versions: Sequence[tuple[list[int], list[int]]] | None = None
                 ) -> list[Trajectory]:
    """The one place rows become :class:`Trajectory` objects: row ``i`` of the trajectory
    store's rows (``TrajectoryStore.drain_rows``, or :func:`agentgym._core.packed_rows` of
    a packed batch), of ``info``, of ``token_ids`` and of ``steps`` (its ``step_context``,
    ``step_reply`` and ``step_end``; None: no steps) is trajectory ``i``; ``seats`` holds
    each row's seat where ``info.seat_info`` tags game rows, ``images`` each row's images
    (None: no image observations), ``versions`` each row's ``(version_pos, version_at)``
    (None: every row one version)."""
    if not len(rows) == len(info) == len(token_ids):
        raise BatchFormatError(f"{len(rows)} rows, {len(info)} row infos and "
                               f"{len(token_ids)} token lists")
    names, timings = STOP_REASONS, info.timings
    if steps is None:  # fresh empty lists per row (a trajectory's lists are its own)
        steps = [([], [], []) for _ in rows]
    tags = info.seat_info
    success = info.success
    if success is None or None in success:  # judged here in one call, not once per row
        judged = success_of(info.env_id, [names[r.stop_reason] == "done" for r in rows],
                            [r.reward for r in rows], info.attempt_return).tolist()
        success = judged if success is None else \
            [j if s is None else s for s, j in zip(success, judged)]
    return [Trajectory(
        task_id=info.task_id[i], env_id=info.env_id[i], group_id=r.group_id,
        sample_index=r.sample_index, token_ids=token_ids[i], loss_mask=r.loss_mask,
        logprobs=r.logprobs, prompt_len=r.prompt_len, turn_rewards=r.turn_rewards,
        reward=r.reward, num_turns=r.num_turns, stop_reason=names[r.stop_reason],
        policy_version=r.policy_version, timings=timings(i), seed=info.seed[i],
        error=info.error[i], branch_parent=r.branch_parent if r.branch_pos else None,
        branch_turn=r.branch_turn, branch_pos=r.branch_pos, step_context=st[0],
        step_reply=st[1], step_end=st[2], **_seat_fields(seats, tags, i),
        **_image_fields(images, i), **_version_fields(versions, i), success=success[i])
        for i, (r, st) in enumerate(zip(rows, steps))]


def _version_fields(versions, i: int) -> dict:
    """Row ``i``'s version runs (none where the row is one version)."""
    if versions is None or not versions[i][0]:
        return {}
    return {"version_pos": list(versions[i][0]), "version_at": list(versions[i][1])}


def _image_fields(images: Sequence[RowImages] | None, i: int) -> dict:
    """Row ``i``'s image fields (none for a text-only row)."""
    if images is None or not images[i].refs:
        return {}
    return {"images": list(images[i].frames), "image_refs": list(images[i].refs)}


def _imaged(batch: PackedBatch, images: list[RowImages] | None) -> PackedBatch:
    """``batch`` with its rows' images set."""
    batch.images = images
    return batch


def _row_images(batch: PackedBatch) -> list[RowImages]:
    """Each row's images (an empty :class:`RowImages` per row of a batch without)."""
    if batch.images is not None:
        return batch.images
    return [RowImages([], []) for _ in range(len(batch))]


def _seat_fields(seats, tags, i: int) -> dict:
    """Row ``i``'s seat fields (none for a single-agent row)."""
    tag = tags[i] if tags is not None else None
    if tag is None:
        return {}
    return {"seat": int(seats[i]), "episode_id": tag[0], "role": tag[1], "player": tag[2]}


def unpack(packed: PackedBatch, info: RowInfo) -> list[Trajectory]:
    """The trajectories of a packed batch and its row info (row ``i`` of each): the inverse
    of :func:`pack` with :meth:`RowInfo.of`. Every +0.0 logprob or turn reward is one shared
    float object."""
    if len(info) != len(packed):
        raise BatchFormatError(f"packed batch has {len(packed)} rows, its row info {len(info)}")
    tokens, offsets = packed.token_ids.tolist(), packed.offsets.tolist()
    steps = None
    if packed.has_steps:
        so = packed.step_offsets.tolist()
        ctx, reply, end = (getattr(packed, n).tolist() for n in STEP_FIELDS)
        steps = [(ctx[so[b]:so[b + 1]], reply[so[b]:so[b + 1]], end[so[b]:so[b + 1]])
                 for b in range(len(packed))]
    versions = None
    if not np.array_equal(packed.token_version,
                          version_column(packed.policy_version, packed.offsets)):
        pv = packed.policy_version.tolist()
        versions = [version_runs(packed.token_version[offsets[b]:offsets[b + 1]], pv[b])
                    for b in range(len(packed))]
    return trajectories(_core.packed_rows(packed), info,
                        [tokens[offsets[b]:offsets[b + 1]] for b in range(len(packed))],
                        steps, packed.seat.tolist() if info.seat_info is not None else None,
                        packed.images, versions)


def _check_offsets(name: str, offsets: np.ndarray, total: int) -> None:
    if offsets.shape[0] and (offsets[0] != 0 or offsets[-1] != total):
        raise BatchFormatError(f"{name} must start at 0 and end at {total}")
    if np.any(np.diff(offsets) < 0):
        raise BatchFormatError(f"{name} must be non-decreasing")


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, s + n)`` for each (s, n), vectorised."""
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    reps = np.repeat(starts - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
    return np.arange(total, dtype=np.int64) + reps
