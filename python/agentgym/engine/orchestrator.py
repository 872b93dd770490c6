"""``RolloutEngine``: environments + an inference backend -> token-exact trajectories.

One coroutine per episode (reset, generate, parse, step, append, repeat), at most
``max_concurrency`` live at once, a finished episode's slot refilled at once: there is no
barrier between episodes or turns. Per event-loop tick the work of all episodes that reached
the same point is batched. A turn's token bookkeeping is one Rust call
(:class:`agentgym._core.TurnCodec`, GIL released) for every kind of env: decode the replies,
parse the actions, tokenize the templated observations (``tokenizers`` crate, same
``tokenizer.json``), append everything to the ``TrajectoryStore``; Python gets back only the
tokens to append to each context. A native env is stepped inside that call; any other env
is stepped by its driver (:mod:`agentgym.engine.drivers`) between ``TurnCodec.actions`` and
``TurnCodec.record_turn_batch``.

Failures are data: a backend error (after bounded retries with fresh request ids), an env
exception, a timeout or cancellation ends only that episode with stop reason
``backend_error``/``env_error``/``timeout``/``aborted`` and a zeroed loss mask.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import itertools
import logging
import time
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import msgspec
import numpy as np

from agentgym import _core
from agentgym.backends.base import Backend, BackendError, SamplingParams
from agentgym.data.frames import EpisodeFrames, Frame, FrameError, RowImages, frame_of
from agentgym.data.trajectories import (
    STOP_REASONS,
    PackedBatch,
    RowInfo,
    Trajectory,
    pack,
    solved,
    trajectories,
)
from agentgym.engine.batching import TickBatcher
from agentgym.engine.chat import ChatFormatter
from agentgym.engine.config import RolloutConfig
from agentgym.engine.drivers import EnvDriver, make_driver
from agentgym.engine.drivers.base import StepOutcome
from agentgym.engine.metrics import batch_metrics
from agentgym.engine.planning import ACT_PROMPT, PLAN_PREFIX, plan_due
from agentgym.engine.reflection import final_reward, note, retries
from agentgym.engine.selfplay import GameDriver, GamePlay, is_game
from agentgym.engine.undo import undo_rules
from agentgym.pool import episode_seed, episode_seeds
from agentgym.progress import progress_bar

log = logging.getLogger(__name__)


@dataclass(slots=True, eq=False)
class _Episode:
    key: int
    slot: int
    task: int | str
    seed: int
    group_id: int
    sample_index: int
    ids: list[int] = field(default_factory=list)
    prompt_len: int = 0
    turns: int = 0
    stop_reason: str | None = None
    closed: bool = False
    error: str | None = None
    policy_version: int = 0
    t0: float = 0.0
    gen_s: float = 0.0
    #: Replies cut at ``max_new_tokens`` that stepped the env (``truncated_turn="step"``).
    cut_turns: int = 0
    #: Turns whose action the env refused as unreadable (driven envs; a native env's pool
    #: counts them itself and they are read when the episode closes).
    invalid_turns: int = 0
    #: Accepted ``undo`` turns (``RolloutConfig.undo``; counted like ``invalid_turns``).
    undo_turns: int = 0
    #: Attempts begun (``RolloutConfig.reflection``; 1 without a retry).
    attempts: int = 1
    #: The running attempt's return (driven envs under reflection; a native env's pool
    #: keeps it in the episode record).
    attempt_return: float = 0.0
    #: The observation after reset (reflection only): the note before a retry repeats it.
    start_obs: str | None = None
    #: The reward of the last turn (driven envs under ``reflection_restore="last"``).
    last_reward: float = 0.0
    #: Where each retry's first reply (its reflection) begins, in tokens (reflection only).
    reflection_starts: list[int] | None = None
    #: Branched groups: the turn after which this tree's root forks (0: it does not).
    fork_at: int = 0
    #: Plan turns played (``RolloutConfig.plan``; not env turns, not in ``turns``).
    plan_turns: int = 0
    #: ``turns`` at the last plan turn (-1: none yet).
    planned_at: int = -1
    #: The store's turn index of each plan turn (``plan_bonus`` only).
    plan_at: list[int] | None = None
    #: Bounded contexts (``RolloutConfig.context_window``): per reply, where its window
    #: resumes after the first prompt, where it begins and where it ends (None: off).
    step_context: list[int] | None = None
    step_reply: list[int] | None = None
    step_end: list[int] | None = None
    #: A seat of a game episode (self-play): its index, role, player, the episode's id
    #: (None: a single-agent episode) and its reward where it never moved (its record has
    #: no turn to hold it).
    seat: int = 0
    role: str | None = None
    player: str | None = None
    episode_id: int | None = None
    reward_override: float | None = None
    #: The pictures of an env with image observations, one per placeholder span of ``ids``
    #: (None: a text-only run).
    frames: EpisodeFrames | None = None


@dataclass(slots=True)
class _WorkerFailure:
    error: BaseException


@dataclass(slots=True)
class _FeedEnd:
    """An async request feed is exhausted after ``count`` requests."""

    count: int


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
    episode: _Episode


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


#: ``Turn(...)`` without the Python-level ``__new__`` of a named tuple (once per turn).
_new_turn = tuple.__new__


class EpisodeBatch(NamedTuple):
    """The episodes that ended in one tick, as :meth:`RolloutEngine.stream_batches` yields
    them: their rows packed (the trajectory store's buffers), the rest of each row, and the
    same episodes as :class:`Trajectory` objects unless the stream was asked for rows only
    (then None). Row ``i`` of each is episode ``i``."""

    packed: PackedBatch
    info: RowInfo
    trajectories: list[Trajectory] | None


@dataclass(repr=False)
class RolloutBatch:
    """Trajectories of one ``collect`` in request order (group, then sample), plus metrics."""

    trajectories: list[Trajectory]
    metrics: dict[str, float]

    def __repr__(self) -> str:  # the default would print every token of every trajectory
        m = self.metrics
        return (f"RolloutBatch({len(self.trajectories)} trajectories, "
                f"reward/mean={m.get('reward/mean', float('nan')):.3f}, "
                f"success_rate={m.get('success_rate', float('nan')):.3f})")

    def __len__(self) -> int:
        return len(self.trajectories)

    def __iter__(self):
        return iter(self.trajectories)

    def packed(self) -> PackedBatch:
        """The batch as one :class:`~agentgym.data.trajectories.PackedBatch` (flat numpy arrays
        with offsets, in request order)."""
        return pack(self.trajectories)


class _Run:
    """One ``stream`` call: driver, trajectory store and the per-tick batchers."""

    def __init__(self, engine: RolloutEngine, driver: EnvDriver, cfg: RolloutConfig):
        self.engine = engine
        self.cfg = cfg
        self.driver = driver
        self.fmt = engine.formatter
        self.store = _core.TrajectoryStore()
        #: Set by ``stream_batches``: called with each tick's :class:`EpisodeBatch` instead
        #: of returning the trajectories one by one; ``batch_trajectories`` False: rows only.
        self.batch_sink = None
        self.batch_trajectories = True
        self.system = cfg.system_prompt if cfg.system_prompt is not None else driver.instructions
        self.needs_context = engine.backend.needs_context
        #: Rust decode, parse, tokenize and store appends: the turn's one bookkeeping path.
        self.codec = self.fmt.codec(cfg.action_format, cfg.reply_prefix)
        #: The conversation head before the first user turn (None: the template does not
        #: split there, and each first prompt is rendered whole).
        self.head = self.fmt.system_ids(self.system)
        loop = asyncio.get_running_loop()  # a run lives inside one ``stream`` call
        self.pool = driver.core_pool
        self.undo = cfg.undo
        #: Reflection retries (``_play_reflect``): decided once per episode, not per turn.
        self.reflect = cfg.reflection > 0
        #: Bounded contexts: replies see the first prompt and the last ``window`` replies;
        #: the record's cap is then ``max_record_tokens``.
        self.window = cfg.context_window
        self.record_cap = cfg.max_record_tokens if self.window else cfg.max_total_tokens
        #: Retries back to the failing turn: each slot's state is kept before its step.
        self.keep_last = self.reflect and cfg.reflection_restore == "last"
        #: Branched groups: each tree root's unstarted siblings, until it forks or ends,
        #: and the tasks of the children it forked into.
        self.siblings: dict[int, list[_Episode]] = {}
        self.children: dict[int, list[asyncio.Future]] = {}
        #: Planning: the plan turn's opening tokens, the note after it, its budget.
        self.plan = cfg.plan
        if self.plan:
            prefix = cfg.plan_prefix if cfg.plan_prefix is not None else PLAN_PREFIX
            self.plan_ids = self.fmt.fast.encode(prefix, add_special_tokens=False).ids
            self.act_ids = self.codec.observation_ids([ACT_PROMPT])[0]
        #: Self-play: the game episodes' part of the run (None: a single-agent env).
        self.games = GamePlay(self, driver) if isinstance(driver, GameDriver) else None
        #: Image observations: each observation's picture becomes the model's placeholder
        #: markup before its text, and travels to the backend beside the tokens.
        self.vision = _vision_of(engine, driver, cfg)
        if self.pool is not None and self.vision is None:  # the env steps inside the codec's call
            self.turn_batcher = TickBatcher(self._turn_batch_native, loop=loop)
        else:
            self.turn_batcher = TickBatcher(self._turn_batch_driven, is_async=True, loop=loop)
        self.begin_batcher = TickBatcher(self._begin_batch, is_async=True, loop=loop)
        self.close_batcher = TickBatcher(self._close_batch, loop=loop)
        self.sampling = SamplingParams(
            max_new_tokens=cfg.max_new_tokens,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            top_k=cfg.top_k,
            stop_token_ids=[self.fmt.end_of_turn_id],
        )
        if self.plan and cfg.plan_max_tokens is not None:
            self.plan_sampling = msgspec.structs.replace(self.sampling,
                                                         max_new_tokens=cfg.plan_max_tokens)
        else:
            self.plan_sampling = self.sampling

    # -- batched work, once per event-loop tick -------------------------------------------
    async def _begin_batch(self, eps: list[_Episode]) -> list[list[int] | Exception | None]:
        """Reset the tick's new episodes in one driver call; their first prompts (the cached
        head plus each observation as a user turn) go to the store and come back as the
        episodes' context lists. An episode whose reset failed (refused task, env build
        error, crash) gets its exception, raised in its own coroutine only; episodes closed
        while waiting (a timeout or cancellation) are skipped and get None."""
        live = [e for e in eps if not e.closed]
        if not live:
            return [None] * len(eps)
        max_turns = self.cfg.max_turns
        obs = await self.driver.reset_many([(e.slot, e.task, e.seed, max_turns) for e in live])
        ok = [k for k, (e, o) in enumerate(zip(live, obs))
              if not e.closed and not isinstance(o, BaseException)]
        out: list = [None] * len(live)
        for k, o in enumerate(obs):
            if isinstance(o, BaseException):
                out[k] = o
        if self.vision is not None and ok:
            for e in live:
                e.frames = EpisodeFrames()
            shown = await self._frames([live[k] for k in ok], [obs[k] for k in ok])
            for k, got in zip(ok, shown):
                if isinstance(got, BaseException):
                    out[k] = got
                else:  # the first prompt holds the observation whole
                    obs[k], frame = got
                    if frame is not None:
                        live[k].frames.add(frame)
            ok = [k for k in ok if not isinstance(out[k], BaseException)]
        if self.reflect and ok:  # each episode's start, kept for its retries
            failed = await self.driver.save_starts([live[k].slot for k in ok])
            for k, err in zip(ok, failed):
                if err is None:
                    live[k].start_obs = obs[k]
                else:
                    out[k] = err
            ok = [k for k, err in zip(ok, failed) if err is None]
        if ok and self.head is not None:
            prompts = self.codec.prompts(self.store, [live[k].key for k in ok], self.head,
                                         [obs[k] for k in ok])
        else:
            prompts = [self.fmt.initial_prompt(self.system, obs[k], self.cfg.reply_prefix)
                       for k in ok]
            for k, ids in zip(ok, prompts):
                self.store.append(live[k].key, np.array(ids, np.uint32), False)
        for k, ids in zip(ok, prompts):
            out[k] = ids
        if len(live) == len(eps):
            return out
        got = dict(zip(map(id, live), out))
        return [got.get(id(e)) for e in eps]

    async def _frames(self, eps: list[_Episode], texts: list[str]
                      ) -> list[tuple[str, Frame | None] | FrameError]:
        """The observations ``texts`` of ``eps`` with their pictures: per episode, the text
        with the picture's placeholder markup before it, and the picture (None where the env
        showed none), or a :class:`~agentgym.data.frames.FrameError` where the env gave a
        malformed picture or failed to draw one."""
        pictures = await self.driver.frames([e.slot for e in eps])
        out: list = []
        observation = self.vision.observation
        for text, picture in zip(texts, pictures):
            if picture is None:  # nothing to show this time
                out.append((text, None))
                continue
            try:
                if isinstance(picture, BaseException):
                    raise FrameError(f"the env could not draw its picture: {picture}")
                frame = frame_of(picture)
            except FrameError as err:
                out.append(err)
                continue
            out.append((observation(text, frame.height, frame.width), frame))
        return out

    async def _step_frames(self, turns: list[Turn], outs: list[StepOutcome]
                           ) -> tuple[list[StepOutcome], list[Frame | None]]:
        """The step outcomes of ``turns`` with their pictures (see :meth:`_frames`) and
        each turn's picture; a malformed picture ends its episode with ``env_error``."""
        frames: list[Frame | None] = [None] * len(outs)
        shown = [k for k, o in enumerate(outs) if o.stop_reason is None]
        if not shown:  # an ending step's observation is not stored: no picture to draw
            return outs, frames
        got = await self._frames([turns[k].episode for k in shown],
                                 [outs[k].observation for k in shown])
        outs = list(outs)
        for k, g in zip(shown, got):
            o = outs[k]
            if isinstance(g, BaseException):
                outs[k] = StepOutcome.env_error(g, o.reward)
            else:  # a running episode's outcome is the driver's fresh object: set in place
                o.observation = g[0]
                frames[k] = g[1]
        return outs, frames

    def _apply(self, turns: list[Turn], stopped, errors) -> None:
        """The stop reasons and env errors a turn call returned, onto the episodes."""
        for i, code in stopped:
            turns[i].episode.stop_reason = STOP_REASONS[code]
        for i, message in errors:
            turns[i].episode.error = message

    def _turn_batch_native(self, turns: list[Turn]) -> list[bool]:
        """One Rust call for the tick's turns of a native env: decode and parse each reply,
        step the envs, append reply, reward and templated observation to the store and the
        same tokens to each episode's context list."""
        live = [t for t in turns if not t.episode.closed]
        if live:
            if self.keep_last:
                self.driver.save_lasts([t.slot for t in live])
            self._apply(live, *self.codec.step_turn_batch(
                self.pool, self.store, live, self.record_cap))
        if len(live) == len(turns):
            return [True] * len(turns)
        return [not t.episode.closed for t in turns]

    async def _turn_batch_driven(self, turns: list[Turn]) -> list[bool]:
        """The tick's turns of an env its driver steps: the actions parsed in Rust, one
        ``step_many`` call, then the same bookkeeping call as a native turn."""
        live = [t for t in turns if not t.episode.closed]
        if live:
            actions = self.codec.actions([t.tokens for t in live])
            if self.keep_last:
                self.driver.save_lasts([t.slot for t in live])
            outs = await self.driver.step_many([(t.slot, a) for t, a in zip(live, actions)])
            if any(t.episode.closed for t in live):  # closed while the env was stepping
                pairs = [(t, o) for t, o in zip(live, outs) if not t.episode.closed]
                live, outs = [t for t, _ in pairs], [o for _, o in pairs]
            frames = None
            if live and self.vision is not None:
                outs, frames = await self._step_frames(live, outs)
            if live:
                for t, o in zip(live, outs):
                    t.episode.invalid_turns += o.invalid
                if self.undo:
                    for t, o in zip(live, outs):
                        t.episode.undo_turns += o.undo
                if self.reflect:
                    for t, o in zip(live, outs):
                        t.episode.attempt_return += o.reward
                        t.episode.last_reward = o.reward
                self._apply(live, *self.codec.record_turn_batch(
                    self.store, live, outs, self.record_cap))
                if frames is not None:  # stored with the observation: the episode goes on
                    for t, frame in zip(live, frames):
                        if frame is not None and t.episode.stop_reason is None:
                            t.episode.frames.add(frame)
        return [not t.episode.closed for t in turns]

    def _close_batch(self, eps: list[_Episode]) -> list[Trajectory | None]:
        """End the tick's finished episodes in the driver and the store, and drain their
        rows: as trajectories (returned, one per episode), or handed to ``batch_sink`` as
        one :class:`EpisodeBatch` (then each episode gets None here)."""
        if self.pool is not None:  # a native env's pool counted its refused actions
            played = [e for e in eps if e.turns]
            if played:
                counts = self.pool.invalid_turns([e.slot for e in played])
                for e, n in zip(played, counts):  # += : earlier attempts' counts (reflection)
                    e.invalid_turns += n
                if self.undo:
                    for e, n in zip(played, self.pool.undo_turns([e.slot for e in played])):
                        e.undo_turns += n
        overrides = self._reflection_rewards(eps) if self.reflect else None
        if self.games is not None:
            overrides = _seat_rewards(eps)
        if self.cfg.plan_bonus:
            self._plan_bonus(eps, overrides)
        self.driver.finish([(e.slot, e.stop_reason) for e in eps])
        keys = np.fromiter((e.key for e in eps), np.uint64, len(eps))
        self.store.finish_batch(keys, [e.stop_reason for e in eps], overrides)
        sink, packed, trajs = self.batch_sink, None, None
        if sink is None:
            rows = self.store.drain_rows()
        elif self.batch_trajectories:
            rows, packed = self.store.drain_rows_packed()
        else:
            rows, packed = None, self.store.drain()
        # The store drains in finish order: its row i is eps[i].
        drained = packed["keys"] if packed is not None else \
            np.fromiter((r.key for r in rows), np.uint64, len(rows))
        if not np.array_equal(drained, keys):
            raise RuntimeError("the trajectory store drained rows of other episodes")
        now = time.perf_counter()
        info = RowInfo(env_id=[self.driver.env_id] * len(eps), task_id=[e.task for e in eps],
                       seed=[e.seed for e in eps], error=[e.error for e in eps],
                       time_total_s=[now - e.t0 for e in eps],
                       time_gen_s=[e.gen_s for e in eps],
                       cut_turns=[e.cut_turns for e in eps],
                       invalid_turns=[e.invalid_turns for e in eps],
                       undo_turns=[e.undo_turns for e in eps],
                       attempts=[e.attempts for e in eps],
                       plan_turns=[e.plan_turns for e in eps],
                       attempt_return=[e.attempt_return if e.attempts > 1 else None
                                       for e in eps],
                       seat_info=[(e.episode_id, e.role, e.player) for e in eps]
                       if self.games is not None else None)
        seats = [e.seat for e in eps] if self.games is not None else None
        images = [_row_images(e) for e in eps] if self.vision is not None else None
        if rows is not None:
            # the token lists are the episodes' contexts (equal to the stored tokens: the
            # engine appends to both)
            trajs = trajectories(rows, info, [e.ids for e in eps],
                                 [_steps(e) for e in eps] if self.window else None, seats,
                                 images)
        if sink is None:
            return trajs
        if self.window:
            packed.update(_step_arrays(eps))
        if seats is not None:
            packed["seat"] = np.array(seats, np.uint32)
        if images is not None:
            packed["images"] = images
        sink(EpisodeBatch(PackedBatch.from_dict(packed), info, trajs))
        return trajs if trajs is not None else [None] * len(eps)

    def _reflection_rewards(self, eps: list[_Episode]) -> np.ndarray | None:
        """The rewards of the closing episodes that retried (NaN: the store's own sum) and
        their start snapshots released; with ``reflection_credit="reflection"``, an episode
        solved on a retry keeps its loss mask on its reflections only."""
        self.driver.drop_saved([e.slot for e in eps])
        retried = [k for k, e in enumerate(eps) if e.attempts > 1]
        if not retried:
            return None
        out = np.full(len(eps), np.nan, np.float32)
        discount = self.cfg.reflection_discount
        credit_reflections = self.cfg.reflection_credit == "reflection"
        for k in retried:
            e = eps[k]
            ret = e.attempt_return = self._attempt_return(e)
            out[k] = final_reward(ret, e.attempts, discount)
            if credit_reflections and solved(e.stop_reason == "done", ret):
                self.store.credit_only(e.key, e.reflection_starts)
        return out

    def _plan_bonus(self, eps: list[_Episode], overrides: np.ndarray | None) -> None:
        """``plan_bonus`` onto each plan turn of the closing episodes that are solved (by
        the one success rule: on their turn rewards' sum, or where they retried on their
        last attempt's return); a retried episode's entry in ``overrides`` gets the bonuses
        too."""
        bonus, store = self.cfg.plan_bonus, self.store
        for k, e in enumerate(eps):
            if not e.plan_at or e.stop_reason != "done":
                continue
            own = overrides is None or np.isnan(overrides[k])
            if not solved(True, store.reward(e.key) if own else e.attempt_return):
                continue
            for turn in e.plan_at:
                store.add_reward(e.key, turn, bonus)
            if not own:
                overrides[k] += bonus * len(e.plan_at)

    def _attempt_return(self, ep: _Episode) -> float:
        """The return of ``ep``'s running (or just ended) attempt."""
        if self.pool is not None:  # the pool's episode record restarts with each attempt
            return float(self.pool.episode(ep.slot)[5])
        return ep.attempt_return

    # -- one episode ----------------------------------------------------------------------
    async def _generate(self, ep: _Episode, sampling: SamplingParams, start: int = 0,
                        last: BackendError | None = None, prompt: list[int] | None = None,
                        backend: Backend | None = None, context: tuple | None = None):
        """One reply to ``prompt`` (default: the episode's record) from ``backend`` (default:
        the engine's; ``context``: what it gets where it ``needs_context``, default the
        episode's); a ``BackendError`` is retried (fresh request id, exponential backoff) up
        to ``backend_retries`` times, then raised. ``start``/``last``: attempts already made
        by the caller and the error of the last one."""
        prompt = ep.ids if prompt is None else prompt
        backend = self.engine.backend if backend is None else backend
        needs_context = backend.needs_context
        cfg = self.cfg
        for attempt in range(start, cfg.backend_retries + 1):
            if attempt:
                await asyncio.sleep(cfg.retry_backoff_s * (2 ** (attempt - 1)))
            rid = f"{self.engine.run_id}-{ep.key}-{ep.turns + ep.plan_turns}-{attempt}"
            try:
                kw = {} if ep.frames is None else {"images": ep.frames.arrays}
                if needs_context:
                    coro = backend.generate(prompt, sampling, request_id=rid,
                                            context=self._context(ep) if context is None
                                            else context, **kw)
                else:
                    coro = backend.generate(prompt, sampling, request_id=rid, **kw)
                if cfg.turn_timeout_s is not None:
                    return await asyncio.wait_for(coro, cfg.turn_timeout_s)
                return await coro
            except BackendError as e:
                last = e
                log.debug("backend error on %s (attempt %d): %s", rid, attempt, e)
        raise last  # type: ignore[misc]

    def _window(self, ep: _Episode) -> tuple[list[int], int]:
        """The context of ``ep``'s next reply under ``context_window``: the first prompt and
        the record from the ``k``-th last reply on (the whole record while it holds fewer
        replies), and where that window resumes."""
        starts, head = ep.step_reply, ep.prompt_len
        if len(starts) < self.window:
            return ep.ids, head
        resume = starts[-self.window]
        return ep.ids[:head] + ep.ids[resume:], resume

    def _add_step(self, ep: _Episode, resume: int, start: int, end: int) -> None:
        """Record a stored reply's step (``context_window``)."""
        ep.step_context.append(resume)
        ep.step_reply.append(start)
        ep.step_end.append(end)

    def _context(self, ep: _Episode) -> tuple:
        """What a ``needs_context`` backend gets of an episode: ``(driver, slot, env seed,
        sample index)``."""
        return (self.driver, ep.slot, ep.seed, ep.sample_index)

    async def _play(self, ep: _Episode) -> None:
        ep.ids = await self.begin_batcher.submit(ep)
        ep.prompt_len = len(ep.ids)
        if self.window:
            ep.step_context, ep.step_reply, ep.step_end = [], [], []
        await self._attempt(ep)

    async def _play_reflect(self, ep: _Episode) -> None:
        """``_play`` with reflection retries: after an attempt the env ended unsolved or
        the horizon ended, while attempts remain, the env goes back to the episode's start
        (with ``reflection_restore="last"``, an attempt the env ended goes back to before its
        last turn), the note (mask 0) is appended and the next attempt plays on in the same
        trajectory. No retry when the note and a reply would not fit the context."""
        await self._play(ep)
        cfg, cap = self.cfg, self.cfg.max_total_tokens
        while ep.attempts <= cfg.reflection and not ep.closed:
            ret = self._attempt_return(ep)
            if not retries(ep.stop_reason, ret):
                return
            back = (self.keep_last and ep.stop_reason == "done"
                    and self.driver.has_last(ep.slot))
            text = note(cfg.reflection_prompt, ep.attempts, cfg.reflection - ep.attempts,
                        ep.stop_reason, ret, "" if back else ep.start_obs or "", back=back)
            ids = self.codec.observation_ids([text])[0]
            if len(self._window(ep)[0] if self.window else ep.ids) + len(ids) >= cap:
                return
            pool = self.pool
            if pool is not None:  # the pool's counters go back with the slot's record
                counts = (pool.invalid_turns([ep.slot])[0],
                          pool.undo_turns([ep.slot])[0] if self.undo else 0)
            if back:
                await self.driver.restore_last(ep.slot)
                ep.attempt_return -= ep.last_reward
            else:
                await self.driver.restart(ep.slot)
                ep.attempt_return = 0.0
            if pool is not None:
                ep.invalid_turns += counts[0] - pool.invalid_turns([ep.slot])[0]
                if self.undo:
                    ep.undo_turns += counts[1] - pool.undo_turns([ep.slot])[0]
            if ep.closed:
                return
            self.store.append(ep.key, np.array(ids, np.uint32), False)
            ep.ids.extend(ids)
            if ep.reflection_starts is None:
                ep.reflection_starts = []
            ep.reflection_starts.append(len(ep.ids))
            ep.attempts += 1
            ep.stop_reason = None
            await self._attempt(ep)

    async def _attempt(self, ep: _Episode) -> None:
        """Turns until the episode (or, with reflection, the attempt) stops."""
        cfg = self.cfg
        # Hot loop (once per turn): attribute lookups hoisted. Without a turn timeout the
        # first attempt calls the backend directly (no wrapper coroutine per turn).
        cap, sampling0, eot = cfg.max_total_tokens, self.sampling, self.fmt.end_of_turn_id
        generate, submit, clock = self._generate, self.turn_batcher.submit, time.perf_counter
        new_turn, store = _new_turn, self.store
        direct = self.engine.backend.generate if cfg.turn_timeout_s is None else None
        if ep.frames is not None:  # the images beside the tokens: through ``_generate``
            direct = None
        context = self._context(ep) if self.needs_context else None
        key, slot, ids, run_id = ep.key, ep.slot, ep.ids, self.engine.run_id
        step_cut = cfg.truncated_turn == "step"
        plan, replan = self.plan, cfg.replan_every
        window, prompt, resume = self.window, ids, 0
        while ep.stop_reason is None:
            if plan and plan_due(ep.turns, ep.planned_at, replan):
                await self._plan(ep)
                if ep.stop_reason is not None:
                    break
            if window:
                prompt, resume = self._window(ep)
            budget = cap - len(prompt)
            if budget <= 0:
                ep.stop_reason = "length"
                break
            sampling = sampling0
            if budget < sampling.max_new_tokens:
                sampling = msgspec.structs.replace(sampling, max_new_tokens=budget)
            t0 = clock()
            try:
                if direct is None:
                    res = await generate(ep, sampling, prompt=prompt)
                elif context is None:
                    res = await direct(prompt, sampling,
                                       request_id=f"{run_id}-{key}-{ep.turns + ep.plan_turns}-0")
                else:
                    res = await direct(prompt, sampling,
                                       request_id=f"{run_id}-{key}-{ep.turns + ep.plan_turns}-0",
                                       context=context)
            except BackendError as e:
                if direct is None:
                    raise
                log.debug("backend error on episode %d turn %d: %s", key, ep.turns, e)
                res = await generate(ep, sampling, start=1, last=e, prompt=prompt)
            ep.gen_s += clock() - t0
            toks = res.token_ids  # never mutated: stored and appended to the context as is
            ended = bool(toks) and toks[-1] == eot
            start = len(ids)
            if res.finish_reason == "length" and not ended:
                if step_cut and sampling is sampling0 and toks:
                    # Cut at max_new_tokens: the codec closes the reply (end-of-turn, mask 0)
                    # and the env steps with what was written.
                    ep.cut_turns += 1
                else:  # the context cap (or truncated_turn="end"): keep the tokens, end
                    store.append(key, np.array(toks, np.uint32), True,
                                 np.array(res.logprobs, np.float32) if res.logprobs else None)
                    ids.extend(toks)
                    if window:
                        self._add_step(ep, resume, start, len(ids))
                    ep.stop_reason = "length"
                    break
            if not await submit(new_turn(Turn, (key, slot, toks, res.logprobs, ended, ids, ep))):
                break  # closed meanwhile (timeout/abort)
            if window:  # the codec closed a reply without its end-of-turn token with one
                self._add_step(ep, resume, start, start + len(toks) + (not ended))
            ep.turns += 1
            if ep.fork_at and ep.stop_reason is None and self._forks_now(ep, res.logprobs):
                await self._fork(ep)

    async def _plan(self, ep: _Episode) -> None:
        """One plan turn of ``ep``: the plan prefix (mask 0), the model's plan (mask 1,
        closed with a masked end-of-turn token when cut at ``plan_max_tokens``), a turn
        reward of 0 and the note asking for the action (mask 0). The env is not stepped. An
        episode whose context cannot hold the prefix, a reply token and the note ends with
        ``length``."""
        ep.planned_at = ep.turns
        ids, cap, eot = ep.ids, self.cfg.max_total_tokens, self.fmt.end_of_turn_id
        prompt, resume = self._window(ep) if self.window else (ids, 0)
        budget = cap - len(prompt) - len(self.plan_ids) - len(self.act_ids) - 1
        if budget <= 0:
            ep.stop_reason = "length"
            return
        store, key = self.store, ep.key
        store.append(key, np.array(self.plan_ids, np.uint32), False)
        ids.extend(self.plan_ids)
        if prompt is not ids:
            prompt.extend(self.plan_ids)
        sampling = self.plan_sampling
        if budget < sampling.max_new_tokens:
            sampling = msgspec.structs.replace(sampling, max_new_tokens=budget)
        t0 = time.perf_counter()
        res = await self._generate(ep, sampling, prompt=prompt)
        start = len(ids)
        ep.gen_s += time.perf_counter() - t0
        toks = res.token_ids
        store.append(key, np.array(toks, np.uint32), True,
                     np.array(res.logprobs, np.float32) if res.logprobs else None)
        ids.extend(toks)
        if not (toks and toks[-1] == eot):  # cut at the plan's budget: close it
            store.append(key, np.array([eot], np.uint32), False)
            ids.append(eot)
        if self.window:
            self._add_step(ep, resume, start, len(ids))
        if self.cfg.plan_bonus:
            if ep.plan_at is None:
                ep.plan_at = []
            ep.plan_at.append(store.num_turns(key))
        store.add_turn(key, 0.0)
        store.append(key, np.array(self.act_ids, np.uint32), False)
        ids.extend(self.act_ids)
        ep.plan_turns += 1

    # -- branched groups ------------------------------------------------------------------
    def _forks_now(self, ep: _Episode, logprobs) -> bool:
        """Whether tree root ``ep`` forks after the turn just played: at ``fork_at`` turns,
        or earlier where the reply's mean surprisal reaches ``branch_entropy``."""
        if ep.turns >= ep.fork_at:
            return True
        limit = self.cfg.branch_entropy
        return limit is not None and bool(logprobs) and -sum(logprobs) / len(logprobs) >= limit

    async def _fork(self, root: _Episode) -> None:
        """Fork running tree root ``root`` into its siblings' slots: the driver copies the
        env, the store copies the trajectory so far (the copies' loss mask 0), and each
        sibling plays on from there as its own coroutine. A fork the driver refuses ends
        those siblings with ``env_error``; the root plays on."""
        root.fork_at = 0
        kids = self.siblings.pop(root.key, [])
        if not kids:
            return
        try:
            await self.driver.fork(root.slot, [c.slot for c in kids])
        except Exception as e:  # e.g. a Python env whose snapshot() raised
            log.warning("episode %d could not fork: %r", root.key, e)
            failure = f"fork failed: {type(e).__name__}: {e}"
            self.children[root.key] = [asyncio.ensure_future(
                self.run_episode(c, play=_failing(failure))) for c in kids]
            return
        self.store.fork(root.key, [c.key for c in kids], [c.sample_index for c in kids])
        for c in kids:
            c.ids = list(root.ids)
            c.prompt_len, c.turns, c.cut_turns = root.prompt_len, root.turns, root.cut_turns
            c.plan_turns, c.planned_at = root.plan_turns, root.planned_at
            c.plan_at = None if root.plan_at is None else list(root.plan_at)
            if self.window:
                c.step_context, c.step_reply, c.step_end = (
                    list(root.step_context), list(root.step_reply), list(root.step_end))
            c.t0, c.gen_s, c.policy_version = root.t0, root.gen_s, root.policy_version
            if self.pool is None:  # a native pool copied these with the episode record
                c.invalid_turns, c.undo_turns = root.invalid_turns, root.undo_turns
        self.children[root.key] = [asyncio.ensure_future(
            self.run_episode(c, play=self._attempt, begun=True)) for c in kids]

    async def run_tree(self, eps: list[_Episode], slots: Sequence[int]) -> list[Trajectory]:
        """Play one tree of a branched group (``eps[0]`` its root, the rest its siblings,
        ``slots`` theirs): the root until it forks, then every child concurrently; where the
        root ended before forking, its siblings play from the start."""
        for e, slot in zip(eps, slots):
            e.slot = slot
        root, rest = eps[0], eps[1:]
        if rest:
            root.fork_at = self.cfg.branch_at
            self.siblings[root.key] = rest
        try:
            first = await self.run_episode(root)
            tasks = self.children.pop(root.key, None)
            if tasks is None:  # no fork: the siblings are independent samples
                unforked = self.siblings.pop(root.key, [])
                tasks = [asyncio.ensure_future(self.run_episode(c)) for c in unforked]
            return [first, *await asyncio.gather(*tasks)]
        finally:
            self.siblings.pop(root.key, None)
            for t in self.children.pop(root.key, ()):
                t.cancel()

    async def run_episode(self, ep: _Episode, play=None, begun: bool = False) -> Trajectory:
        """Play ``ep`` to its end (``play``: the coroutine function that plays it, default
        the episode from its reset) and close it. ``begun``: its store record, start time
        and policy version exist already (a forked child)."""
        if not begun:
            ep.t0 = time.perf_counter()
            ep.policy_version = self.engine.backend.policy_version  # the version it began under
            # the store's row carries it too (the packed rows of ``stream_batches``)
            self.store.begin(ep.key, ep.group_id, ep.sample_index, ep.policy_version, ep.key)
        if play is None:
            play = self._play_reflect if self.reflect else self._play
        try:
            if self.cfg.episode_timeout_s is not None:
                await asyncio.wait_for(play(ep), self.cfg.episode_timeout_s)
            else:
                await play(ep)
        except (asyncio.TimeoutError, TimeoutError):
            ep.stop_reason, ep.error = "timeout", "episode or turn timed out"
        except asyncio.CancelledError:
            ep.stop_reason = "aborted"
            self._close_now(ep)
            raise
        except BackendError as e:
            ep.stop_reason, ep.error = "backend_error", str(e)
        except Exception as e:  # an env or engine fault ends only this episode
            log.warning("episode %d failed: %r", ep.key, e)
            ep.stop_reason, ep.error = "env_error", f"{type(e).__name__}: {e}"
        if ep.stop_reason is None:
            ep.stop_reason = "aborted"
        ep.closed = True
        return await self.close_batcher.submit(ep)

    def _close_now(self, ep: _Episode) -> None:
        ep.closed = True
        self.driver.finish([(ep.slot, ep.stop_reason or "aborted")])
        if self.reflect:
            self.driver.drop_saved([ep.slot])
        if self.store.is_live(ep.key):
            self.store.discard(ep.key)


def _tree_key(ep: _Episode, width: int) -> tuple[int, int]:
    return ep.group_id, ep.sample_index // width


def _by_sample(tree: list[_Episode]) -> list[_Episode]:
    return sorted(tree, key=lambda e: e.sample_index)


class _TreeBuilder:
    """Trees of branched groups from episodes in any order: the samples ``k * width ...
    k * width + width - 1`` of one group, by sample index. A tree is handed out once its
    ``width`` samples have arrived; :meth:`rest` gives the incomplete ones (a feed that
    ended, or a request list that holds part of a tree)."""

    def __init__(self, width: int):
        self.width = width
        self.open: dict[tuple[int, int], list[_Episode]] = {}

    def add(self, ep: _Episode) -> list[_Episode] | None:
        key = _tree_key(ep, self.width)
        tree = self.open.setdefault(key, [])
        tree.append(ep)
        if len(tree) < self.width:
            return None
        del self.open[key]
        return _by_sample(tree)

    def rest(self) -> list[list[_Episode]]:
        out = [_by_sample(t) for t in self.open.values()]
        self.open.clear()
        return out


def _trees(eps: list[_Episode], width: int) -> list[list[_Episode]]:
    """``eps`` (a request list) as trees: the complete ones in the order they complete,
    then the incomplete ones."""
    builder = _TreeBuilder(width)
    return [t for ep in eps if (t := builder.add(ep)) is not None] + builder.rest()


def _vision_of(engine: RolloutEngine, driver, cfg: RolloutConfig):
    """The engine's :class:`~agentgym.models.vision.VisionSpec` where the env shows
    pictures (None for a text-only env); a clear error where the model cannot see them or a
    mechanism cannot carry them yet."""
    if not getattr(driver, "has_frames", False):
        return None
    if engine.vision is None:
        raise ValueError(f"{driver.env_id} observes images (obs='image' or 'both') but the "
                         f"engine's model has no image input: use a vision-language model "
                         f"(for example --model tiny-vl)")
    on = [name for name, value in (("context_window", cfg.context_window),
                                   ("reflection", cfg.reflection),
                                   ("branch_at", cfg.branch_at)) if value]
    if on:
        raise ValueError(f"{', '.join(on)} cannot be played with image observations yet "
                         f"({driver.env_id} was built with obs='image' or 'both')")
    return engine.vision


def _row_images(ep: _Episode) -> RowImages:
    """``ep``'s images as a packed row's (empty where it showed none)."""
    if ep.frames is None:
        return RowImages([], [])
    return RowImages(ep.frames.frames, ep.frames.refs)


def _steps(ep: _Episode) -> tuple[list[int], list[int], list[int]]:
    """``ep``'s steps (``context_window``; none where it never began)."""
    if ep.step_reply is None:
        return [], [], []
    return ep.step_context, ep.step_reply, ep.step_end


def _step_arrays(eps: list[_Episode]) -> dict[str, np.ndarray]:
    """The step fields of a packed batch of ``eps`` (``context_window``)."""
    steps = [_steps(e) for e in eps]
    offsets = np.zeros(len(eps) + 1, np.int64)
    np.cumsum([len(s[1]) for s in steps], out=offsets[1:])
    flat = [np.fromiter(itertools.chain.from_iterable(s[i] for s in steps), np.uint32,
                        int(offsets[-1])) for i in range(3)]
    return {"step_offsets": offsets, "step_context": flat[0], "step_reply": flat[1],
            "step_end": flat[2]}


def _seat_rewards(eps: list[_Episode]) -> np.ndarray | None:
    """The rewards of the closing game seats that never moved (NaN: the store's own sum;
    None: every seat moved)."""
    if all(e.reward_override is None for e in eps):
        return None
    return np.array([np.nan if e.reward_override is None else e.reward_override
                     for e in eps], np.float32)


def _failing(message: str):
    """A ``play`` for :meth:`_Run.run_episode` that fails at once: the episode ends with
    ``env_error`` and ``message``."""

    async def play(ep: _Episode) -> None:
        raise RuntimeError(message)

    return play


class RolloutEngine:
    """Collects multi-turn trajectories from env ``env_id`` with ``backend``: the in-process
    :class:`~agentgym.engine.runner.Runner`.

    ``tokenizer`` is a Hugging Face tokenizer with a chat template (its ``eos_token`` ends a
    turn unless ``end_of_turn`` is given). ``own_backend``: :meth:`aclose` closes the
    backend too (a backend passed in is otherwise left open). Keyword arguments override
    :class:`RolloutConfig`.
    """

    def __init__(self, backend: Backend, tokenizer, config: RolloutConfig | None = None,
                 end_of_turn: str | None = None, *, own_backend: bool = False,
                 vision=None, **overrides):
        if not isinstance(backend, Backend):
            missing = [m for m in ("generate", "abort", "update_weights", "close",
                                   "policy_version", "needs_context") if not hasattr(backend, m)]
            raise TypeError(f"{type(backend).__name__} is not an inference backend: it lacks "
                            f"{', '.join(missing)} (see agentgym.backends.Backend)")
        self.backend = backend
        self.own_backend = own_backend
        self.tokenizer = tokenizer
        self.formatter = ChatFormatter(tokenizer, end_of_turn=end_of_turn)
        #: How the model sees a picture (:class:`~agentgym.models.vision.VisionSpec`; None:
        #: a text-only model). Needed only for envs built with image observations.
        self.vision = vision
        self.config = msgspec.structs.replace(config or RolloutConfig(), **overrides)
        self.run_id = f"r{int(time.time() * 1000) % 10**9}"
        self._groups = itertools.count()
        self._keys = itertools.count()
        self._drivers: dict[tuple, tuple[object, asyncio.Lock]] = {}
        #: Opponent backends of game episodes by name (``RolloutConfig.opponent``: one of
        #: them, or ``"pool"``: one per episode); the engine never closes them.
        self.opponents: dict[str, Backend] = {}

    @property
    def policy_version(self) -> int:
        """The version of the weights the backend serves."""
        return self.backend.policy_version

    @policy_version.setter
    def policy_version(self, value: int) -> None:
        self.backend.policy_version = int(value)

    def reseed(self, group_start: int, key_start: int | None = None,
               run_id: str | None = None, sampling_seed: int | None = None) -> None:
        """Restart the group-id (hence episode-seed) and episode-key counters, the
        request-id prefix and, where the backend has ``reseed(seed)``, its sampling seed, so
        that a resumed training run replays the rollouts of an uninterrupted one."""
        self._groups = itertools.count(group_start)
        self._keys = itertools.count(group_start * 1024 if key_start is None else key_start)
        if run_id is not None:
            self.run_id = run_id
        if sampling_seed is not None:
            reseed = getattr(self.backend, "reseed", None)
            if reseed is not None:
                reseed(sampling_seed)

    async def update_weights(self, weights, version: int | None = None) -> int:
        """Load ``weights`` (a state dict or a path) into the backend, which then serves
        them as ``version`` (default: its version + 1); returns that version."""
        await self.backend.update_weights(weights)
        if version is not None:
            self.backend.policy_version = int(version)
        return self.backend.policy_version

    def _driver(self, env_id: str, cfg: RolloutConfig, env_kwargs: dict):
        if is_game(env_id):
            return self._game_driver(env_id, cfg, env_kwargs)
        undo = undo_rules(cfg)
        restarts, forks = cfg.reflection > 0, cfg.branch_at > 0
        lasts = restarts and cfg.reflection_restore == "last"
        key = (env_id, cfg.max_concurrency, cfg.env_workers, cfg.inline_env_budget_s,
               repr(sorted(env_kwargs.items())), undo, restarts, forks, lasts)
        if key not in self._drivers:
            # with undo rules, reflection retries or branched groups, an env that cannot
            # snapshot raises SnapshotUnsupportedError here, before any episode starts
            driver = make_driver(env_id, cfg.max_concurrency, cfg.env_workers,
                                 cfg.inline_env_budget_s, undo=undo, restarts=restarts,
                                 forks=forks, lasts=lasts, **env_kwargs)
            self._drivers[key] = (driver, asyncio.Lock())
        return self._drivers[key]

    def _game_driver(self, game_id: str, cfg: RolloutConfig, env_kwargs: dict):
        """The table of game ``game_id``; the single-agent mechanisms are refused."""
        on = [name for name, value in (
            ("undo", cfg.undo), ("reflection", cfg.reflection), ("branch_at", cfg.branch_at),
            ("plan", cfg.plan), ("context_window", cfg.context_window),
            ("env_workers", cfg.env_workers)) if value]
        if on:
            raise ValueError(f"{game_id} is a multi-seat game: {', '.join(on)} apply to "
                             f"single-agent episodes only")
        key = (game_id, cfg.max_concurrency, repr(sorted(env_kwargs.items())))
        if key not in self._drivers:
            self._drivers[key] = (GameDriver(game_id, cfg.max_concurrency, **env_kwargs),
                                  asyncio.Lock())
        return self._drivers[key]

    def requests(self, tasks: int | Sequence[int | str],
                 n_samples: int | None = None) -> list[EpisodeRequest]:
        """``tasks`` x ``n_samples`` requests, each task a fresh group (the engine's group
        counter advances, so consecutive calls play new episodes)."""
        return group_requests(self._groups, tasks,
                              self.config.n_samples if n_samples is None else n_samples)

    def _episodes(self, requests: Iterable[EpisodeRequest],
                  cfg: RolloutConfig) -> list[_Episode]:
        reqs = [r if isinstance(r, EpisodeRequest) else EpisodeRequest(*r) for r in requests]
        if len(reqs) < 16:  # a streamed request: scalar ints beat numpy's per-call cost
            derived = [episode_seed(cfg.seed, int(r.group_id), 0) for r in reqs]
        else:
            groups = np.array([r.group_id for r in reqs], np.uint64)
            derived = episode_seeds(cfg.seed, groups,
                                    np.zeros(len(groups), np.uint64)).tolist()
        return [
            _Episode(next(self._keys), -1, r.task, int(r.seed) if r.seed is not None else seed,
                     int(r.group_id), int(r.sample_index))
            for r, seed in zip(reqs, derived)
        ]

    async def stream(self, tasks: int | Sequence[int | str], env_id: str, *,
                     env_kwargs: dict | None = None, **overrides) -> AsyncIterator[Trajectory]:
        """Yield each trajectory as soon as its episode ends (completion order).

        ``tasks``: task indices or explicit task texts (an int ``n`` means ``range(n)``);
        each is played ``n_samples`` times with the same seed and a shared ``group_id``.
        """
        n = overrides.get("n_samples", self.config.n_samples)
        async for t in self.stream_requests(self.requests(tasks, n), env_id,
                                            env_kwargs=env_kwargs, **overrides):
            yield t

    async def stream_requests(self, requests: Iterable[EpisodeRequest]
                              | AsyncIterable[EpisodeRequest], env_id: str, *,
                              env_kwargs: dict | None = None,
                              **overrides) -> AsyncIterator[Trajectory]:
        """Play exactly ``requests`` (each an :class:`EpisodeRequest`) and yield each
        trajectory as soon as its episode ends (completion order). The trajectory carries the
        request's task, ``group_id`` and ``sample_index``; ``n_samples`` is not used.

        ``requests`` may be an async iterable: each request then joins the running stream as
        it arrives (a free slot takes it at once), and the stream ends when the iterable is
        exhausted and every episode has ended."""
        async for t in self._stream(requests, env_id, env_kwargs, overrides, batches=False):
            yield t

    async def stream_batches(self, requests: Iterable[EpisodeRequest]
                             | AsyncIterable[EpisodeRequest], env_id: str, *,
                             env_kwargs: dict | None = None, trajectories: bool = True,
                             **overrides) -> AsyncIterator[EpisodeBatch]:
        """``stream_requests``, one :class:`EpisodeBatch` per group of episodes that ended
        together: their rows as a :class:`~agentgym.data.PackedBatch` (the trajectory
        store's packed buffers) with their :class:`~agentgym.data.RowInfo`, for consumers
        that write arrays. ``trajectories=False`` leaves out the :class:`Trajectory` objects
        (``EpisodeBatch.trajectories`` is None) and their per-token Python lists."""
        async for b in self._stream(requests, env_id, env_kwargs, overrides, batches=True,
                                    trajectories=trajectories):
            yield b

    async def _stream(self, requests, env_id: str, env_kwargs: dict | None, overrides: dict,
                      batches: bool, trajectories: bool = True) -> AsyncIterator:
        cfg = msgspec.structs.replace(self.config, **overrides)
        driver, lock = self._driver(env_id, cfg, dict(env_kwargs or {}))
        async with lock, _gc_tuned(cfg.gc_threshold):
            run = _Run(self, driver, cfg)
            #: trajectories per request: one per seat of a game
            per = driver.seats if run.games is not None else 1
            done: asyncio.Queue = asyncio.Queue()
            if batches:
                run.batch_sink = done.put_nowait
                run.batch_trajectories = trajectories
            feeder = None
            # Branched groups: a unit of work is one tree (``width`` samples, ``width``
            # slots per worker), else one episode.
            width = cfg.branch_width if cfg.branch_at else 1
            if isinstance(requests, AsyncIterable):
                total = None  # known once the feed is exhausted
                capacity = max(1, cfg.max_concurrency // width)
                arrived: asyncio.Queue = asyncio.Queue()

                async def feed() -> None:
                    n = 0
                    trees = _TreeBuilder(width) if width > 1 else None
                    try:
                        async for r in requests:
                            ep = self._episodes([r], cfg)[0]
                            n += 1
                            if trees is None:
                                arrived.put_nowait(ep)
                            elif (tree := trees.add(ep)) is not None:
                                arrived.put_nowait(tree)
                    except asyncio.CancelledError:
                        raise
                    except BaseException as e:  # the caller's feed failed: surface it
                        done.put_nowait(_WorkerFailure(e))
                    for tree in trees.rest() if trees is not None else ():
                        arrived.put_nowait(tree)
                    for _ in range(capacity):
                        arrived.put_nowait(None)
                    done.put_nowait(_FeedEnd(n * per))

                async def next_episode():
                    return await arrived.get()

                feeder = asyncio.ensure_future(feed())
            else:
                # Popped, not iterated: a finished episode (its context is the trajectory's
                # token list) is freed once its trajectory is, however long the stream.
                eps = self._episodes(requests, cfg)
                total = len(eps) * per
                queue = collections.deque(eps if width == 1 else _trees(eps, width))
                capacity = max(1, min(cfg.max_concurrency // width, len(queue)))

                async def next_episode():
                    return queue.popleft() if queue else None

            async def worker(w: int) -> None:
                try:
                    if width > 1:
                        slots = range(w * width, (w + 1) * width)
                        while (tree := await next_episode()) is not None:
                            trajs = await run.run_tree(tree, slots)
                            if not batches:
                                for traj in trajs:
                                    done.put_nowait(traj)
                        return
                    if run.games is not None:
                        while (ep := await next_episode()) is not None:
                            ep.slot = w
                            trajs = await run.games.run_game(ep, time.perf_counter())
                            if not batches:
                                for traj in trajs:
                                    done.put_nowait(traj)
                        return
                    while (ep := await next_episode()) is not None:
                        ep.slot = w
                        traj = await run.run_episode(ep)
                        if not batches:  # else the close batch queued it with its tick
                            done.put_nowait(traj)
                except asyncio.CancelledError:
                    raise
                except BaseException as e:  # an engine bug: surface it, don't hang
                    done.put_nowait(_WorkerFailure(e))

            workers = [asyncio.ensure_future(worker(s)) for s in range(capacity)]
            bar = _progress(cfg, total)
            try:
                yielded = 0
                while total is None or yielded < total:
                    item = await done.get()
                    if isinstance(item, _FeedEnd):
                        total = item.count
                        continue
                    if isinstance(item, _WorkerFailure):
                        raise item.error
                    count = len(item.packed) if batches else 1
                    if bar is not None:
                        bar.update(count)
                    yielded += count
                    yield item
            finally:
                if feeder is not None:
                    feeder.cancel()
                    workers.append(feeder)
                for w in workers:
                    w.cancel()
                await asyncio.gather(*workers, return_exceptions=True)
                # Env steps of episodes that ended meanwhile (worker-process calls hold
                # their slot until they return) do not outlive the run.
                await run.turn_batcher.cancel_running()
                if bar is not None:
                    bar.close()

    async def collect(self, tasks: int | Sequence[int | str], env_id: str, *,
                      env_kwargs: dict | None = None, **overrides) -> RolloutBatch:
        """All trajectories of ``tasks`` x ``n_samples``, ordered by (group, sample)."""
        t0 = time.perf_counter()
        gen0 = overrides.get("gc_threshold", self.config.gc_threshold)
        async with _gc_tuned(gen0):  # also while the batch is assembled (many new objects)
            trajs = [t async for t in self.stream(tasks, env_id, env_kwargs=env_kwargs,
                                                  **overrides)]
            trajs.sort(key=lambda t: (t.group_id, t.sample_index, t.seat))
            wall = time.perf_counter() - t0
            return RolloutBatch(trajs, batch_metrics(trajs, wall))

    def collect_sync(self, tasks, env_id: str, **kwargs) -> RolloutBatch:
        """``collect`` for synchronous callers (runs its own event loop, uvloop if present)."""
        from agentgym.engine.loop import run

        return run(self.collect(tasks, env_id, **kwargs))

    def close(self) -> None:
        """Close the env drivers (the backend stays open)."""
        for driver, _ in self._drivers.values():
            driver.close()
        self._drivers.clear()

    async def aclose(self) -> None:
        """Close the env drivers and, when the engine owns it, the backend."""
        self.close()
        if self.own_backend:
            await self.backend.close()


_gc_users = 0
_gc_saved: tuple[int, int, int] | None = None


@contextlib.asynccontextmanager
async def _gc_tuned(gen0: int):
    """Raise the cyclic GC's generation-0 threshold while rollouts run.

    A rollout allocates many short-lived containers per turn (results, token lists, futures);
    with CPython's default threshold (700) the collector runs every few ticks and scans
    every live episode's state. Raising it for the run is about 1.6x more engine throughput
    at 4,096 episodes; the previous thresholds are restored when the last run ends.
    ``gen0 <= 0`` leaves the GC alone.
    """
    global _gc_users, _gc_saved
    if gen0 <= 0:
        yield
        return
    if _gc_users == 0:
        _gc_saved = gc.get_threshold()
        gc.set_threshold(max(gen0, _gc_saved[0]), max(100, _gc_saved[1]), _gc_saved[2])
    _gc_users += 1
    try:
        yield
    finally:
        _gc_users -= 1
        if _gc_users == 0 and _gc_saved is not None:
            gc.set_threshold(*_gc_saved)


def _progress(cfg: RolloutConfig, total: int):
    return progress_bar(total, "rollout", "ep", show=cfg.progress, leave=False)
