"""Type stubs of ``agentgym._core``, the Rust extension (thin PyO3 bindings over
``agentgym-core``). Prefer the Python wrappers: ``agentgym.EnvPool``,
``agentgym.parse``; ``agentgym.data.trajectories.PackedBatch``
reads ``TrajectoryStore.drain()``."""

from collections.abc import Sequence
from typing import Literal, overload

import numpy as np
import numpy.typing as npt

__version__: str

#: Stop reason names in code order (``PackedBatch.stop_reason`` holds indices into this).
STOP_REASONS: tuple[str, ...]
#: Action formats accepted by ``parse_action``.
PARSE_FORMATS: tuple[str, ...]
DEFAULT_MAX_ACTION_CHARS: int

class AgentGymError(Exception):
    """Base class of agentgym errors."""

class UnknownEnvError(AgentGymError):
    """No environment is registered under this id."""

class EpisodeFinishedError(AgentGymError):
    """The episode has ended; reset it first."""

class EpisodeNotStartedError(AgentGymError):
    """The episode was never reset."""

class InvalidTaskError(AgentGymError):
    """The environment rejected the task."""

class EnvError(AgentGymError):
    """The environment failed."""

class TrajectoryError(AgentGymError):
    """Invalid trajectory operation."""

class SnapshotUnsupportedError(AgentGymError):
    """The environment cannot snapshot its state (snapshot, restore, fork)."""

class UnknownSnapshotError(AgentGymError):
    """No live snapshot has this handle in this pool (never issued, or released)."""

class EnvPool:
    """Episodes of one native env, reset and stepped in batches (GIL released)."""

    def __init__(self, env_id: str, num_envs: int, kwargs_json: str = "{}") -> None: ...
    @overload
    def reset(
        self,
        ids: Sequence[int] | npt.NDArray[np.integer],
        tasks: Sequence[int | str],
        seeds: Sequence[int],
        max_turns: Sequence[int | None],
        errors: Literal["raise"] = "raise",
    ) -> list[str]: ...
    @overload
    def reset(
        self,
        ids: Sequence[int] | npt.NDArray[np.integer],
        tasks: Sequence[int | str],
        seeds: Sequence[int],
        max_turns: Sequence[int | None],
        errors: Literal["return"],
    ) -> tuple[list[str], list[tuple[int, Exception]]]: ...
    def step(
        self, ids: Sequence[int] | npt.NDArray[np.integer], actions: Sequence[str]
    ) -> tuple[
        list[str],
        npt.NDArray[np.float32],
        npt.NDArray[np.bool_],
        npt.NDArray[np.bool_],
    ]: ...
    def finish(self, ids: Sequence[int], reason: str) -> None: ...
    def frames(
        self, ids: Sequence[int] | npt.NDArray[np.integer]
    ) -> list[npt.NDArray[np.uint8] | EnvError | None]:
        """Each slot's current picture, drawn in one batch (GIL released): a ``(h, w, 3)``
        uint8 RGB array, None where the env draws none, or an ``EnvError`` instance
        (returned, not raised) where the env panicked or drew a malformed frame: that
        slot's running episode ends with ``env_error``. Bad or repeated ids and slots never
        reset raise before anything is drawn."""
    def frame_records(
        self, ids: Sequence[int] | npt.NDArray[np.integer]
    ) -> list[tuple[int, int, bytes, str] | EnvError | None]:
        """``frames`` as ``(height, width, rgb bytes, digest)`` rows, the digest
        (``frame_digest``) computed in the same call."""
    @property
    def frame_shape(self) -> tuple[int, int] | None:
        """``(height, width)`` of this pool's frames (fixed by its env kwargs); None when
        the env draws none (text mode)."""
    def valid_actions(self, slot: int) -> list[str]: ...
    def oracle_action(self, slot: int) -> str | None: ...
    def oracle_actions(self, ids: Sequence[int]) -> list[str | None]: ...
    def turns(self) -> npt.NDArray[np.uint32]: ...
    def stop_reasons(self, ids: Sequence[int] | None = None) -> list[str | None]: ...
    def invalid_turns(self, ids: Sequence[int]) -> list[int]: ...
    def undo_turns(self, ids: Sequence[int]) -> list[int]: ...
    def set_undo(self, max_undos: int | None, depth: int = 16) -> None:
        """Turn the ``undo`` action on from each slot's next reset (None: off); raises
        ``SnapshotUnsupportedError`` on an env that cannot snapshot."""
    @property
    def undo(self) -> tuple[int, int] | None: ...
    def running(self, ids: Sequence[int]) -> list[bool]: ...
    def set_max_turns(self, slot: int, max_turns: int | None) -> None: ...
    def episode(self, slot: int) -> tuple[int | str, int, int, int | None, str | None, float]: ...
    @property
    def env_id(self) -> str: ...
    @property
    def instructions(self) -> str: ...
    @property
    def num_tasks(self) -> int: ...
    def __len__(self) -> int: ...
    def snapshot(self, ids: Sequence[int]) -> list[int]:
        """Save each slot's state (a running episode each): one opaque handle per slot."""
    def restore(self, ids: Sequence[int], handles: Sequence[int]) -> None:
        """Put each slot back into the state saved under its handle (handles stay valid)."""
    def fork(self, src: int, targets: Sequence[int]) -> None:
        """Copy slot ``src``'s state into each of ``targets`` (slots without a running
        episode); then every slot steps on its own."""
    def release(self, handles: Sequence[int]) -> None: ...
    def snapshot_bytes(self, handles: Sequence[int]) -> list[int]: ...
    @property
    def snapshots_supported(self) -> bool: ...
    @property
    def num_snapshots(self) -> int: ...

def frame_digest(height: int, width: int, rgb: bytes) -> str:
    """The content id of a ``height`` x ``width`` RGB frame: BLAKE3 of the bytes and the
    sizes (u32 little-endian), 16 bytes as hex; ``ValueError`` unless ``rgb`` holds
    ``height * width * 3 > 0`` bytes."""

def native_env_ids() -> list[str]:
    """Registered native env ids: the shipped envs, plus the test-only ones once
    ``_register_test_envs`` has run."""

def _register_test_envs() -> list[str]:
    """For tests only: registers the test-only native envs (``_test_panic``, which fails on
    demand) in this process; idempotent. Returns their ids."""

def native_env_description(env_id: str) -> str: ...
def native_env_tasks(env_id: str) -> tuple[list[str], str | None, str]: ...
def parse_undo(action: str) -> int | None:
    """``n`` when the action is ``undo`` (1) or ``undo N`` (N >= 1), else None."""
def undo_reply(n: int, observation: str) -> str: ...
def undo_refusal(reason: str, *, asked: int = 0, available: int = 0,
                 max_undos: int = 0) -> str: ...

class TrajectoryStore:
    """Token-exact trajectories of live episodes, keyed by a ``u64``; ``drain()`` packs the
    finished ones (``agentgym.data.trajectories.PackedBatch.from_dict`` reads it).
    Array arguments must already have the exact dtype shown."""

    def __init__(self) -> None: ...
    def begin(
        self,
        key: int,
        group_id: int = 0,
        sample_index: int = 0,
        policy_version: int = 0,
        task_id: int = 0,
    ) -> None: ...
    def begin_batch(
        self,
        keys: npt.NDArray[np.uint64],
        group_ids: npt.NDArray[np.uint64],
        sample_indices: npt.NDArray[np.uint32],
        policy_versions: npt.NDArray[np.uint32],
        task_ids: npt.NDArray[np.uint64],
    ) -> None: ...
    def append(
        self,
        key: int,
        tokens: npt.NDArray[np.uint32],
        is_model: bool,
        logprobs: npt.NDArray[np.float32] | None = None,
    ) -> None: ...
    def append_batch(
        self,
        keys: npt.NDArray[np.uint64],
        flat_tokens: npt.NDArray[np.uint32],
        offsets: npt.NDArray[np.int64],
        is_model: npt.NDArray[np.bool_],
        flat_logprobs: npt.NDArray[np.float32] | None = None,
    ) -> None: ...
    def add_turn(self, key: int, reward: float) -> None: ...
    def add_turns(self, keys: npt.NDArray[np.uint64], rewards: npt.NDArray[np.float32]) -> None: ...
    def finish(self, key: int, stop_reason: str, reward_override: float | None = None) -> None: ...
    def finish_batch(
        self,
        keys: npt.NDArray[np.uint64],
        stop_reasons: str | Sequence[str],
        reward_overrides: npt.NDArray[np.float32] | None = None,
    ) -> None: ...
    def fork(self, src: int, keys: Sequence[int], sample_indices: Sequence[int]) -> None:
        """Fork live episode ``src`` into new live episodes ``keys``: each starts with its
        tokens, logprobs and turn rewards so far, that prefix's loss mask 0."""
    def credit_only(self, key: int, starts: Sequence[int]) -> None:
        """Keep the loss mask of live episode ``key`` only on the model-token runs that
        begin at token positions ``starts``."""
    def discard(self, key: int) -> None: ...
    def finish_all(self, stop_reason: str) -> int: ...
    def drain(self, max: int | None = None) -> dict[str, np.ndarray]: ...
    def drain_rows(self, max: int | None = None) -> list[TrajectoryRow]:
        """One ``TrajectoryRow`` per finished trajectory (no token ids)."""
    def drain_rows_packed(
        self, max: int | None = None
    ) -> tuple[list[TrajectoryRow], dict[str, np.ndarray]]:
        """``(drain_rows(), drain())`` of the same trajectories, in the same order."""
    def is_live(self, key: int) -> bool: ...
    def __contains__(self, key: int) -> bool: ...
    def num_tokens(self, key: int) -> int: ...
    def num_turns(self, key: int) -> int: ...
    @property
    def num_live(self) -> int: ...
    @property
    def num_completed(self) -> int: ...
    def heap_bytes(self) -> int: ...
    @staticmethod
    def idle_bytes_per_episode() -> int: ...

def parse_action(text: str, format: str = "auto", max_chars: int = 4096) -> str | None: ...
def parse_actions(
    texts: Sequence[str], format: str = "auto", max_chars: int = 4096
) -> list[str | None]: ...

class TurnCodec:
    """One rollout turn of many episodes in one call (see ``rust/core/src/turn.rs``): decode
    each reply (special tokens dropped), parse its action, step the native env (or take a
    driver's step results), append reply, reward and the templated observation tokens to the
    trajectory store. Tokenization uses the same ``tokenizer.json`` as the Python side
    (``backend_tokenizer.to_str()``)."""

    def __init__(
        self,
        tokenizer_json: str,
        obs_prefix: str,
        obs_suffix: str,
        end_of_turn: int,
        action_format: str = "auto",
        max_action_chars: int = 4096,
    ) -> None: ...
    @property
    def end_of_turn(self) -> int: ...
    @property
    def action_format(self) -> str: ...
    @property
    def cached(self) -> int:
        """Observations whose token ids are memoised."""
    @property
    def cache_bytes(self) -> int:
        """Bytes the observation cache holds (texts, token ids, per-entry overhead)."""
    @property
    def cache_max_bytes(self) -> int:
        """The observation cache's bound in bytes (default 64 MiB; settable)."""
    @cache_max_bytes.setter
    def cache_max_bytes(self, value: int) -> None: ...
    def set_action_format(self, action_format: str, max_action_chars: int = 4096) -> None: ...
    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...
    def actions(self, replies: list[list[int]]) -> list[str]: ...
    def observation_ids(self, observations: list[str]) -> list[list[int]]: ...
    def step_turn_batch(
        self,
        pool: EnvPool,
        store: TrajectoryStore,
        turns: list[tuple],
        max_total_tokens: int,
    ) -> tuple[list[tuple[int, int]], list[tuple[int, str]]]:
        """Step the native env in ``pool`` and record the turn. ``turns``: ``Turn`` records
        (tuples ``(key, slot, tokens, logprobs | None, ended, context, ...)``); each
        ``context`` list is extended in place with the tokens stored this turn. Returns
        ``(stopped, errors)``: ``(i, STOP_REASONS index)`` and ``(i, message)`` rows."""
    def record_turn_batch(
        self,
        store: TrajectoryStore,
        turns: list[tuple],
        outcomes: list[object],
        max_total_tokens: int,
    ) -> tuple[list[tuple[int, int]], list[tuple[int, str]]]:
        """Record a turn whose env a driver stepped: ``outcomes[i]`` (a ``StepOutcome``, read
        by its ``observation``, ``reward``, ``stop_reason`` and ``error`` attributes) is what
        the env did with ``turns[i]``'s action. Same bookkeeping and result as
        ``step_turn_batch``."""
    def prompts(
        self,
        store: TrajectoryStore,
        keys: list[int],
        head: list[int],
        observations: list[str],
    ) -> list[list[int]]:
        """``head`` + each observation as a templated user turn: appended to the store as
        episode ``keys[i]``'s prompt and returned as GC-untracked lists."""


class TrajectoryRow:
    """One finished trajectory without its token ids: ``loss_mask`` a list of 0/1,
    ``logprobs`` and ``turn_rewards`` lists of floats (every +0.0 one shared object),
    ``stop_reason`` an index into ``STOP_REASONS``; the lists are GC-untracked."""

    @property
    def key(self) -> int: ...
    @property
    def group_id(self) -> int: ...
    @property
    def sample_index(self) -> int: ...
    @property
    def policy_version(self) -> int: ...
    @property
    def prompt_len(self) -> int: ...
    @property
    def loss_mask(self) -> list[int]: ...
    @property
    def logprobs(self) -> list[float]: ...
    @property
    def turn_rewards(self) -> list[float]: ...
    @property
    def reward(self) -> float: ...
    @property
    def num_turns(self) -> int: ...
    @property
    def stop_reason(self) -> int: ...
    @property
    def branch_parent(self) -> int: ...
    @property
    def branch_turn(self) -> int: ...
    @property
    def branch_pos(self) -> int: ...


def packed_rows(batch: object) -> list[TrajectoryRow]:
    """The rows of a ``PackedBatch`` as ``TrajectoryRow`` s (row ``i``'s key is ``i``); a
    ``ValueError`` names the first inconsistent column."""
