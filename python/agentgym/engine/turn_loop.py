"""``TurnLoop``: one ``stream`` call's turn loop: begin episodes, build each reply's
context, generate, record the turn through the Rust batch call, close episodes.

Per event-loop tick the work of every episode that reached the same point is one call: the
resets and first prompts (:meth:`TurnLoop._begin_batch`), the turns
(:meth:`TurnLoop._turn_batch_native`: decode, parse, step a native env and store, in one
Rust call; :meth:`TurnLoop._turn_batch_driven`: the actions parsed in Rust, one driver
``step_many``, then the same bookkeeping call), and the closes
(:meth:`TurnLoop._close_batch`: the rows drained from the trajectory store).

Mechanisms (:mod:`agentgym.engine.mechanisms`) change an episode only through the hooks
this loop calls at fixed points; the loop names none of them. Failures are data: a backend
error (after bounded retries with fresh request ids), an env exception, a timeout or a
cancellation ends only that episode with stop reason ``backend_error``/``env_error``/
``timeout``/``aborted``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

import msgspec
import numpy as np

from agentgym import _core
from agentgym.backends.base import Backend, BackendError, SamplingParams
from agentgym.data.trajectories import (
    STOP_REASONS,
    PackedBatch,
    RowInfo,
    Trajectory,
    solved,
    trajectories,
    version_column,
)
from agentgym.engine.batching import TickBatcher
from agentgym.engine.config import RolloutConfig
from agentgym.engine.episode import Episode, Turn, new_turn
from agentgym.engine.mechanisms import Mechanism, mechanisms_for, registered
from agentgym.engine.mechanisms.base import PoolCounter
from agentgym.engine.outputs import EpisodeBatch
from agentgym.engine.play import EpisodePlay, PlayStrategy
from agentgym.engine.selfplay import GameDriver, GamePlay
from agentgym.envs.registry import success_rule

if TYPE_CHECKING:
    from agentgym.engine.orchestrator import RolloutEngine

log = logging.getLogger(__name__)


def _add_invalid(ep: Episode, n: int) -> None:
    ep.invalid_turns += n


class TurnLoop:
    """One ``stream`` call: its driver, trajectory store, mechanisms and per-tick batchers."""

    def __init__(self, engine: RolloutEngine, driver, cfg: RolloutConfig):
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
        self.pool = driver.core_pool
        #: The return a ``done`` episode must reach to count as solved (the env's rule).
        self.success_threshold = success_rule(driver.env_id).threshold
        #: The token cap of an episode's record (a mechanism that bounds what the model sees
        #: may raise it above ``max_total_tokens``).
        self.record_cap = cfg.max_total_tokens
        self.sampling = SamplingParams(
            max_new_tokens=cfg.max_new_tokens,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            top_k=cfg.top_k,
            stop_token_ids=[self.fmt.end_of_turn_id],
        )
        #: The native pool's per-episode counts, read when an episode closes.
        self.pool_counters: list[PoolCounter] = []
        if self.pool is not None:
            self.pool_counters.append(PoolCounter(self.pool.invalid_turns, _add_invalid))
        self.mechanisms: list[Mechanism] = [cls(self) for cls in mechanisms_for(cfg, driver)]
        self._hooks()
        #: The env steps inside the codec's call unless a mechanism reads the outcomes.
        loop = asyncio.get_running_loop()  # a loop lives inside one ``stream`` call
        if self.pool is not None and not self.stepped:
            self.turn_batcher = TickBatcher(self._turn_batch_native, loop=loop)
        else:
            self.turn_batcher = TickBatcher(self._turn_batch_driven, is_async=True, loop=loop)
        self.begin_batcher = TickBatcher(self._begin_batch, is_async=True, loop=loop)
        self.close_batcher = TickBatcher(self._close_batch, loop=loop)
        self.strategy = self._strategy()

    def _hooks(self) -> None:
        """Each hook's implementations, in mechanism order (see ``mechanisms.base``)."""
        def of(name: str) -> list:
            return [h for m in self.mechanisms if (h := getattr(m, name)) is not None]

        self.begun, self.before_reply, self.before_step = (
            of("begun"), of("before_reply"), of("before_step"))
        self.stepped, self.recorded, self.after_turn = (
            of("stepped"), of("recorded"), of("after_turn"))
        self.forked, self.closing, self.row_hooks = of("forked"), of("closing"), of("row")
        self.trajectory_hooks, self.packed_hooks = of("trajectory_fields"), of("packed_fields")
        self.request_hooks, self.aborted = of("request_kwargs"), of("aborted")
        contexts = [m for m in self.mechanisms if m.context is not None]
        retries = of("retry")
        for what, found in (("the reply's context", contexts), ("retries", retries)):
            if len(found) > 1:
                raise ValueError(f"{what}: at most one mechanism per run decides it")
        self.windowed = contexts[0] if contexts else None
        self.retry = retries[0] if retries else None

    def _strategy(self) -> PlayStrategy:
        """How the run's units of work are played: a game's episodes, a mechanism's own
        units, or one episode per unit."""
        if isinstance(self.driver, GameDriver):
            return GamePlay(self, self.driver)
        for m in self.mechanisms:
            if (strategy := m.play_strategy()) is not None:
                return strategy
        return EpisodePlay(self)

    # -- what mechanisms ask of the loop --------------------------------------------------
    def context_of(self, ep: Episode) -> tuple[list[int], int]:
        """The tokens ``ep``'s next reply is generated from, and where its window resumes
        (0: the whole record)."""
        if self.windowed is None:
            return ep.ids, 0
        return self.windowed.context(ep)

    def stored_reply(self, ep: Episode, resume: int, start: int, end: int) -> None:
        """A reply of ``ep`` was stored at ``[start, end)`` of its record, generated from the
        context that resumes at ``resume``."""
        if self.windowed is not None:
            self.windowed.replied(ep, resume, start, end)

    def append(self, ep: Episode, ids: list[int], model: bool = False,
               logprobs: list[float] | None = None) -> None:
        """``ids`` onto ``ep``'s record and its store row (mask 1 where ``model``)."""
        self.store.append(ep.key, np.array(ids, np.uint32), model,
                          np.array(logprobs, np.float32) if logprobs else None)
        ep.ids.extend(ids)

    def limited(self, sampling: SamplingParams, budget: int) -> SamplingParams:
        """``sampling`` with at most ``budget`` new tokens."""
        if budget < sampling.max_new_tokens:
            return msgspec.structs.replace(sampling, max_new_tokens=budget)
        return sampling

    async def restart_env(self, ep: Episode, back: bool) -> None:
        """Put ``ep``'s env back to its start (``back``: to before its last step), keeping
        the counts its native pool record held."""
        before = [c.read([ep.slot])[0] for c in self.pool_counters]
        if back:
            await self.driver.restore_last(ep.slot)
        else:
            await self.driver.restart(ep.slot)
        for c, n in zip(self.pool_counters, before):
            c.add(ep, n - c.read([ep.slot])[0])

    # -- batched work, once per event-loop tick -------------------------------------------
    async def _begin_batch(self, eps: list[Episode]) -> list[list[int] | Exception | None]:
        """Reset the tick's new episodes in one driver call; their first prompts (the cached
        head plus each observation as a user turn) go to the store and come back as the
        episodes' context lists. An episode whose reset failed (refused task, env build
        error, crash) gets its exception, raised in its own coroutine only; episodes closed
        while waiting (a timeout or cancellation) are skipped and get None."""
        live = [e for e in eps if not e.closed]
        if not live:
            return [None] * len(eps)
        top = self.cfg.max_turns
        obs = await self.driver.reset_many([
            (e.slot, e.task, e.seed, top if e.max_turns is None else e.max_turns) for e in live])
        out: list = [o if isinstance(o, BaseException) else None for o in obs]
        ok = [k for k, (e, o) in enumerate(zip(live, obs))
              if not e.closed and not isinstance(o, BaseException)]
        for hook in self.begun:
            if not ok:
                break
            mine = [obs[k] for k in ok]
            failed = await hook([live[k] for k in ok], mine)
            for k, text, err in zip(ok, mine, failed):
                obs[k] = text
                if err is not None:
                    out[k] = err
            ok = [k for k in ok if out[k] is None]
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
            for hook in self.before_step:
                hook(live)
            self._apply(live, *self.codec.step_turn_batch(
                self.pool, self.store, live, self.record_cap))
            for hook in self.recorded:
                hook(live)
        if len(live) == len(turns):
            return [True] * len(turns)
        return [not t.episode.closed for t in turns]

    async def _turn_batch_driven(self, turns: list[Turn]) -> list[bool]:
        """The tick's turns of an env its driver steps: the actions parsed in Rust, one
        ``step_many`` call, then the same bookkeeping call as a native turn."""
        live = [t for t in turns if not t.episode.closed]
        if live:
            actions = self.codec.actions([t.tokens for t in live])
            for hook in self.before_step:
                hook(live)
            outs = await self.driver.step_many([(t.slot, a) for t, a in zip(live, actions)])
            if any(t.episode.closed for t in live):  # closed while the env was stepping
                pairs = [(t, o) for t, o in zip(live, outs) if not t.episode.closed]
                live, outs = [t for t, _ in pairs], [o for _, o in pairs]
            for hook in self.stepped:
                if live:
                    outs = await hook(live, outs)
            if live:
                for t, o in zip(live, outs):
                    t.episode.invalid_turns += o.invalid
                self._apply(live, *self.codec.record_turn_batch(
                    self.store, live, outs, self.record_cap))
                for hook in self.recorded:
                    hook(live)
        return [not t.episode.closed for t in turns]

    def _close_batch(self, eps: list[Episode]) -> list[Trajectory | None]:
        """End the tick's finished episodes in the driver and the store, and drain their
        rows: as trajectories (returned, one per episode), or handed to ``batch_sink`` as
        one :class:`EpisodeBatch` (then each episode gets None here)."""
        played = [e for e in eps if e.turns]
        if played and self.pool_counters:  # what the native pool counted per episode
            slots = [e.slot for e in played]
            for c in self.pool_counters:
                for e, n in zip(played, c.read(slots)):  # += : earlier attempts' counts
                    c.add(e, n)
        overrides = None
        if any(e.reward_override is not None for e in eps):  # game seats that never moved
            overrides = np.array([np.nan if e.reward_override is None else e.reward_override
                                  for e in eps], np.float32)
        for hook in self.closing:
            overrides = hook(eps, overrides)
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
        info = self._row_info(eps)
        # each episode's success by the env's rule (a retried one: its last attempt's return)
        rewards = packed["rewards"].tolist() if packed is not None else [r.reward for r in rows]
        thr = self.success_threshold
        info.success = [bool(solved(e.stop_reason == "done", r, a, thr))
                        for e, r, a in zip(eps, rewards, info.attempt_return)]
        games = info.seat_info is not None
        seats = [e.seat for e in eps] if games else None
        # episodes that spanned a weight update (partial rollouts) carry their versions
        spanned = any(e.version_at for e in eps)
        if rows is not None:
            # the token lists are the episodes' contexts (equal to the stored tokens: the
            # engine appends to both)
            extra: dict = {}
            for hook in self.trajectory_hooks:
                extra.update(hook(eps))
            if spanned:
                extra["versions"] = [(e.version_pos, e.version_at) for e in eps]
            trajs = trajectories(rows, info, [e.ids for e in eps], seats=seats, **extra)
        if sink is None:
            return trajs
        for hook in self.packed_hooks:
            packed.update(hook(eps))
        if spanned:
            packed["token_version"] = version_column(
                packed["policy_version"], packed["offsets"],
                [(e.version_pos, e.version_at) for e in eps])
        if seats is not None:
            packed["seat"] = np.array(seats, np.uint32)
        sink(EpisodeBatch(PackedBatch.from_dict(packed), info, trajs))
        return trajs if trajs is not None else [None] * len(eps)

    def _row_info(self, eps: list[Episode]) -> RowInfo:
        """The closing episodes' :class:`RowInfo` (the mechanisms' fields from their
        ``row`` hooks; each registered mechanism's defaults where it did not play)."""
        now, n = time.perf_counter(), len(eps)
        fields = {k: [v] * n for cls in registered() for k, v in cls.row_defaults.items()}
        for hook in self.row_hooks:
            fields.update(hook(eps))
        games = eps[0].seat_info is not None if eps else False
        return RowInfo(env_id=[self.driver.env_id] * n, task_id=[e.task for e in eps],
                       seed=[e.seed for e in eps], error=[e.error for e in eps],
                       time_total_s=[now - e.t0 for e in eps],
                       time_gen_s=[e.gen_s for e in eps],
                       cut_turns=[e.cut_turns for e in eps],
                       invalid_turns=[e.invalid_turns for e in eps],
                       seat_info=[e.seat_info for e in eps] if games else None, **fields)

    # -- one episode ----------------------------------------------------------------------
    async def generate(self, ep: Episode, sampling: SamplingParams, start: int = 0,
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
        kw: dict = {}
        for hook in self.request_hooks:
            kw.update(hook(ep))
        for attempt in range(start, cfg.backend_retries + 1):
            if attempt:
                await asyncio.sleep(cfg.retry_backoff_s * (2 ** (attempt - 1)))
            rid = f"{self.engine.run_id}-{ep.key}-{ep.turns + ep.side_turns}-{attempt}"
            try:
                if needs_context:
                    coro = backend.generate(prompt, sampling, request_id=rid,
                                            context=self.backend_context(ep) if context is None
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

    def backend_context(self, ep: Episode) -> tuple:
        """What a ``needs_context`` backend gets of an episode: ``(driver, slot, env seed,
        sample index)``."""
        return (self.driver, ep.slot, ep.seed, ep.sample_index)

    async def play(self, ep: Episode) -> None:
        """An episode from its reset: its first prompt, then attempts while a mechanism
        retries it."""
        ep.ids = await self.begin_batcher.submit(ep)
        ep.prompt_len = len(ep.ids)
        await self.attempt(ep)
        retry = self.retry
        while retry is not None and not ep.closed and await retry(ep):
            await self.attempt(ep)

    async def attempt(self, ep: Episode) -> None:
        """Turns until the episode (or its attempt) stops."""
        cfg = self.cfg
        # Hot loop (once per turn): attribute lookups hoisted. Without a turn timeout the
        # first attempt calls the backend directly (no wrapper coroutine per turn).
        cap, sampling0, eot = cfg.max_total_tokens, self.sampling, self.fmt.end_of_turn_id
        generate, submit, clock = self.generate, self.turn_batcher.submit, time.perf_counter
        direct = self.engine.backend.generate
        if cfg.turn_timeout_s is not None or self.request_hooks:
            direct = None  # through ``generate``: its timeout, or what travels beside tokens
        context = self.backend_context(ep) if self.needs_context else None
        key, slot, ids, run_id = ep.key, ep.slot, ep.ids, self.engine.run_id
        step_cut = cfg.truncated_turn == "step"
        before_reply, after_turn = self.before_reply, self.after_turn
        windowed, prompt, resume = self.windowed, ids, 0
        version = ep.version_at[-1] if ep.version_at else ep.policy_version
        while ep.stop_reason is None:
            if before_reply:
                for hook in before_reply:
                    await hook(ep)
                if ep.stop_reason is not None:
                    break
            if windowed is not None:
                prompt, resume = windowed.context(ep)
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
                                       request_id=f"{run_id}-{key}-{ep.turns + ep.side_turns}-0")
                else:
                    res = await direct(prompt, sampling,
                                       request_id=f"{run_id}-{key}-{ep.turns + ep.side_turns}-0",
                                       context=context)
            except BackendError as e:
                if direct is None:
                    raise
                log.debug("backend error on episode %d turn %d: %s", key, ep.turns, e)
                res = await generate(ep, sampling, start=1, last=e, prompt=prompt)
            ep.gen_s += clock() - t0
            if res.policy_version != version:  # a weight update since the last reply
                ep.replied(res.policy_version)
                version = res.policy_version
            toks = res.token_ids  # never mutated: stored and appended to the context as is
            ended = bool(toks) and toks[-1] == eot
            start = len(ids)
            if res.finish_reason == "length" and not ended:
                if step_cut and sampling is sampling0 and toks:
                    # Cut at max_new_tokens: the codec closes the reply (end-of-turn, mask 0)
                    # and the env steps with what was written.
                    ep.cut_turns += 1
                else:  # the context cap (or truncated_turn="end"): keep the tokens, end
                    self.append(ep, toks, True, res.logprobs)
                    if windowed is not None:
                        windowed.replied(ep, resume, start, len(ids))
                    ep.stop_reason = "length"
                    break
            if not await submit(new_turn(Turn, (key, slot, toks, res.logprobs, ended, ids, ep))):
                break  # closed meanwhile (timeout/abort)
            if windowed is not None:  # the codec closed a reply without its end-of-turn token
                windowed.replied(ep, resume, start, start + len(toks) + (not ended))
            ep.turns += 1
            if after_turn and ep.stop_reason is None:
                for hook in after_turn:
                    await hook(ep, res.logprobs)

    async def run_episode(self, ep: Episode, play=None, begun: bool = False) -> Trajectory:
        """Play ``ep`` to its end (``play``: the coroutine function that plays it, default
        :meth:`play`) and close it. ``begun``: its store record, start time and policy
        version exist already (a forked child)."""
        if not begun:
            ep.t0 = time.perf_counter()
            ep.policy_version = self.engine.backend.policy_version  # the version it began under
            # the store's row carries it too (the packed rows of ``stream_batches``)
            self.store.begin(ep.key, ep.group_id, ep.sample_index, ep.policy_version, ep.key)
        try:
            coro = (self.play if play is None else play)(ep)
            if self.cfg.episode_timeout_s is not None:
                await asyncio.wait_for(coro, self.cfg.episode_timeout_s)
            else:
                await coro
        except (asyncio.TimeoutError, TimeoutError):
            ep.stop_reason, ep.error = "timeout", "episode or turn timed out"
        except asyncio.CancelledError:
            ep.stop_reason = "aborted"
            self.close_now(ep)
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

    def close_now(self, ep: Episode) -> None:
        """End ``ep`` at once (a cancellation): its slot and its store row are released."""
        ep.closed = True
        self.driver.finish([(ep.slot, ep.stop_reason or "aborted")])
        for hook in self.aborted:
            hook(ep)
        if self.store.is_live(ep.key):
            self.store.discard(ep.key)
