"""What the turn loop plays: an :class:`EpisodeRequest` becomes an :class:`Episode`, each
model reply a :class:`Turn`.

An :class:`Episode` holds what every episode has (its identity, its token record, its turn
counts, its stop reason). What one mechanism keeps per episode lives in ``Episode.state``
under the mechanism's name (:mod:`agentgym.engine.mechanisms`), so that adding a mechanism
never adds a field here.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple


@dataclass(slots=True, eq=False)
class Episode:
    key: int
    slot: int
    task: int | str
    seed: int
    group_id: int
    sample_index: int
    #: The episode's token record (the context the backend is sent, and the trajectory's
    #: token list): extended in place with exactly what the store appends.
    ids: list[int] = field(default_factory=list)
    prompt_len: int = 0
    #: Env turns played (a reply the env stepped).
    turns: int = 0
    #: Replies the env never saw (plan turns): ``turns + side_turns`` numbers each request.
    side_turns: int = 0
    stop_reason: str | None = None
    closed: bool = False
    error: str | None = None
    policy_version: int = 0
    t0: float = 0.0
    gen_s: float = 0.0
    #: Replies cut at ``max_new_tokens`` that stepped the env (``truncated_turn="step"``).
    cut_turns: int = 0
    #: Turns whose action the env refused as unreadable (driven envs per step; a native
    #: env's pool counts them itself and they are read when the episode closes).
    invalid_turns: int = 0
    #: The return the episode's success is judged on where it is not its reward (an
    #: episode that retried: its last attempt's return); None: its reward.
    judged_return: float | None = None
    #: Each mechanism's per-episode state, by mechanism name.
    state: dict[str, Any] = field(default_factory=dict)
    #: A seat of a game episode (self-play): its index, ``(episode_id, role, player)``
    #: (None: a single-agent episode) and its reward where it never moved (its record has
    #: no turn to hold it).
    seat: int = 0
    seat_info: tuple[int, str, str] | None = None
    reward_override: float | None = None

    @property
    def player(self) -> str | None:
        """Who plays this seat of a game episode (None: a single-agent episode)."""
        return None if self.seat_info is None else self.seat_info[2]


class Turn(NamedTuple):
    """One model reply on its way to the turn batch. ``TurnCodec.step_turn_batch`` and
    ``record_turn_batch`` read the first six fields by position."""

    #: The episode's trajectory-store key.
    key: int
    #: Its slot in the env driver.
    slot: int
    #: The generated token ids, as the backend returned them (never mutated).
    tokens: list[int]
    #: One behaviour logprob per token (or empty / None: all 0.0).
    logprobs: list[float] | None
    #: The model emitted the end-of-turn token itself.
    ended: bool
    #: The episode's token list, extended in place with what the turn appends.
    context: list[int]
    episode: Episode


#: ``Turn(...)`` without the Python-level ``__new__`` of a named tuple (once per turn).
new_turn = tuple.__new__


class EpisodeRequest(NamedTuple):
    """One episode to play: its task, its group and its sample index within the group.

    The env seed is ``seed`` when given, else derived from (``RolloutConfig.seed``,
    ``group_id``): the samples of a group share it (GRPO's group of the same task instance),
    and the same request always replays the same episode with a deterministic backend.
    """

    #: A task index of the env's task set, or an explicit task text.
    task: int | str
    group_id: int
    sample_index: int = 0
    seed: int | None = None


def episode_of_request(request_id: str) -> str:
    """The episode part of a request id the engine made (``{run}-{key}-{turn}-{attempt}``:
    ``{run}-{key}``, the same for every turn and retry of one episode); any other id as
    given."""
    parts = request_id.rsplit("-", 2)
    return parts[0] if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit() \
        else request_id


def group_requests(groups: Iterator[int], tasks: int | Sequence[int | str],
                   n_samples: int) -> list[EpisodeRequest]:
    """``tasks`` (an int ``n``: ``range(n)``) x ``n_samples`` requests, each task a fresh
    group id drawn from ``groups``."""
    task_list = list(range(tasks)) if isinstance(tasks, int) else list(tasks)
    ids = [next(groups) for _ in task_list]
    return [EpisodeRequest(task, g, s) for task, g in zip(task_list, ids)
            for s in range(n_samples)]
