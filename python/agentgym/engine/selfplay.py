"""Self-play: episodes of a multi-seat game, several agents in one episode.

An episode of a game (``agentgym._core.native_game_ids()``: ``tictactoe``, ``kuhn_poker``,
``negotiation``) has one trajectory per seat. Each seat's trajectory is its own
conversation: the seat's system prompt (the rules and its role), then its own observations
(its side of the game only: the game never puts another seat's private information in it)
and its replies, token-exact and append-only like a single-agent episode. The episode
coroutine asks the game which seats move, generates their replies concurrently (each with
its own player's backend), and steps the game once with all of their moves; the engine's
tick batchers put the resets, steps and solver queries of every game that reached the same
point in one Rust call (``_core.GamePool``, GIL released), and the backends batch the
generations of every seat to move across all episodes. So batches stay full whatever the
turn order. A suite's game (``openspiel:<game>``, ``textarena:<EnvId>``;
:mod:`agentgym.envs.suites`) plays the same way on a ``SuiteGamePool``, whose resets, steps
and solver queries are awaited on its worker thread, off the event loop.

Who plays a seat (``RolloutConfig.opponent``):

* ``"self"`` (default): the learning policy plays every seat;
* ``"solver"`` / ``"random"``: the learning policy plays one seat, ``group_id % seats`` (so
  the samples of a group play the same deal from the same seat), the game's reference
  strategy (a scripted backend answering from :meth:`GamePool.oracle_actions`) or a
  uniformly random legal move the others;
* the name of a backend in ``RolloutEngine.opponents`` (e.g. a frozen checkpoint), or
  ``"pool"``: one of those backends per episode, drawn from the episode's seed.

Only the learning policy's replies have loss mask 1; every seat's trajectory is kept,
tagged with ``episode_id`` (the same for every seat of the episode), ``seat``, ``role``,
``player`` and the ``policy_version`` its player served. A game ends with per-seat rewards:
each seat's reward lands on its last turn. A move the game refuses (unreadable or illegal)
ends the game as the game's README states (the mover -1, the others 0) and counts as an
``invalid_turns`` of the mover. A backend failure on any seat, a game that panics, a context
cap or horizon reached by a seat to move ends the episode for every seat with that stop
reason on each seat's row; the batch goes on.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec
import numpy as np

from agentgym.backends.base import Backend, BackendError, SamplingParams
from agentgym.backends.scripted import ScriptedBackend
from agentgym.engine.batching import TickBatcher
from agentgym.engine.episode import Episode
from agentgym.engine.play import SingleUnits
from agentgym.envs.registry import game_pool, is_native_game

__all__ = ["GameDriver", "OPPONENTS", "seat_players"]

#: The opponent kinds every game has; any other name is a backend of
#: ``RolloutEngine.opponents`` (``"pool"``: one of them per episode).
OPPONENTS = ("self", "solver", "random", "pool")

_SCRIPTED = {"solver": "oracle", "random": "random"}


def seat_players(opponent: str, group_id: int, seed: int, seats: int,
                 pool: list[str] | None = None) -> list[str]:
    """Who plays each seat of an episode of group ``group_id`` with env seed ``seed``:
    ``"policy"`` (the learning policy) or an opponent's name. ``"self"``: the policy every
    seat; otherwise the policy seat ``group_id % seats`` and the opponent the rest
    (``"pool"``: one of ``pool``, drawn from the seed)."""
    if opponent == "self":
        return ["policy"] * seats
    if opponent == "pool":
        if not pool:
            raise ValueError("opponent='pool' needs opponent backends (RolloutEngine.opponents)")
        opponent = sorted(pool)[zlib.crc32(f"pool:{seed}".encode()) % len(pool)]
    learner = group_id % seats
    return ["policy" if s == learner else opponent for s in range(seats)]


class GameDriver:
    """The engine's table for one game: its pool of ``capacity`` slots (a native game's
    ``_core.GamePool``; a suite game's ``SuiteGamePool``, or its ``ProcessGamePool`` in
    ``env_workers`` processes, whose calls run off the event loop: ``is_async``), the seats'
    roles and system prompts. ``core_pool`` is None (the
    single-agent turn path never runs on a game)."""

    core_pool = None

    def __init__(self, game_id: str, capacity: int, env_workers: int = 0, **kwargs):
        self.env_id = game_id
        if env_workers > 0 and not is_native_game(game_id):
            from agentgym.runtime.game_workers import ProcessGamePool

            self.pool = ProcessGamePool(game_id, capacity, env_workers, **kwargs)
        else:  # a native game steps in the Rust pool whatever ``env_workers``
            self.pool = game_pool(game_id, capacity, **kwargs)
        #: The pool's calls are awaited (``areset``, ``astep``, ``aoracle_actions``).
        self.is_async = bool(getattr(self.pool, "is_async", False))
        self.seats = self.pool.seats
        self.roles = list(self.pool.roles)
        self.seat_instructions = list(self.pool.instructions)
        self.instructions = self.seat_instructions[0]

    def finish(self, items: list[tuple[int, str]]) -> None:
        self.pool.finish(sorted({slot for slot, _ in items}))

    def close(self) -> None:
        close = getattr(self.pool, "close", None)
        if close is not None:
            close()


class _SeatView:
    """What a scripted opponent (``ScriptedBackend``) asks of its env, answered for one
    seat: the game's reference action and legal moves of that seat."""

    def __init__(self, play: GamePlay, seat: int):
        self.play, self.seat = play, seat

    async def oracle_action(self, slot: int) -> str | None:
        return await self.play.oracle_batcher.submit((slot, self.seat))

    async def valid_actions(self, slot: int) -> list[str]:
        pool = self.play.driver.pool
        if self.play.driver.is_async:
            return await pool.avalid_actions(slot, self.seat)
        return pool.valid_actions(slot, self.seat)


class GameOver(Exception):
    """An episode ends for every seat with ``reason`` (a stop reason)."""

    def __init__(self, reason: str, error: str | None = None):
        super().__init__(error or reason)
        self.reason, self.error = reason, error


@dataclass(slots=True)
class _Reply:
    tokens: list[int]
    logprobs: list[float] | None
    #: The model wrote its end-of-turn token.
    ended: bool
    #: Cut at ``max_new_tokens`` (closed with an end-of-turn token, the game steps).
    cut: bool
    #: Cut by the context cap (or ``truncated_turn="end"``): the episode ends.
    ends: bool


class GamePlay:
    """The play strategy of a game's run (:class:`~agentgym.engine.turn_loop.TurnLoop`):
    plays game episodes, one coroutine each (a unit: one request, one slot, a trajectory per
    seat), through the loop's store, formatter, codec, ``generate`` and close batcher."""

    width = 1

    def __init__(self, run, driver: GameDriver):
        self.run, self.driver = run, driver
        self.per_request = driver.seats
        cfg = run.cfg
        self.seats, self.roles = driver.seats, driver.roles
        systems = [cfg.system_prompt if cfg.system_prompt is not None else s
                   for s in driver.seat_instructions]
        self.systems = systems
        self.heads = [run.fmt.system_ids(s) for s in systems]
        loop = asyncio.get_running_loop()
        pool = driver.pool
        self.eot = run.fmt.end_of_turn_id
        if driver.is_async:  # a suite's game: its pool works off the event loop
            self.reset_batcher = TickBatcher(self._areset_batch, is_async=True, loop=loop)
            self.turn_batcher = TickBatcher(self._aturn_batch, is_async=True, loop=loop)
            self.oracle_batcher = TickBatcher(
                lambda rows: pool.aoracle_actions([r[0] for r in rows], [r[1] for r in rows]),
                is_async=True, loop=loop)
        else:
            self.reset_batcher = TickBatcher(self._reset_batch, loop=loop)
            self.turn_batcher = TickBatcher(self._turn_batch, loop=loop)
            self.oracle_batcher = TickBatcher(
                lambda rows: pool.oracle_actions([r[0] for r in rows], [r[1] for r in rows]),
                loop=loop)
        self.views = [_SeatView(self, s) for s in range(self.seats)]
        engine = run.engine
        self.backends: dict[str, Backend] = {"policy": engine.backend, **engine.opponents}
        #: the built-in scripted players: not models, so not held to ``max_new_tokens``
        self.scripted: set[str] = set()
        for name, policy in _SCRIPTED.items():
            if name not in self.backends:
                self.scripted.add(name)
                self.backends[name] = ScriptedBackend(run.fmt.tokenizer, policy,
                                                      seed=cfg.seed,
                                                      reply_prefix=cfg.reply_prefix)
        opponent = cfg.opponent
        if opponent not in OPPONENTS and opponent not in engine.opponents:
            raise ValueError(f"unknown opponent {opponent!r}: one of {OPPONENTS} or a backend "
                             f"of RolloutEngine.opponents ({sorted(engine.opponents)})")
        self.opponent = opponent

    # -- the strategy's side --------------------------------------------------------------
    def units(self, eps: list[Episode]) -> list[Episode]:
        return eps

    def builder(self) -> SingleUnits:
        return SingleUnits()

    async def play(self, ep: Episode, slots: Sequence[int]) -> list:
        ep.slot = slots[0]
        return await self.run_game(ep, time.perf_counter())

    # -- one episode ----------------------------------------------------------------------
    def seat_episodes(self, ep) -> list:
        """``ep`` (the request's episode) and one episode per further seat, each with its
        own store key (``ep.key * seats + seat``), begun in the store."""
        players = seat_players(self.opponent, ep.group_id, ep.seed, self.seats,
                               list(self.run.engine.opponents))
        out, base = [], ep.key
        for seat in range(self.seats):
            sp = ep if seat == 0 else Episode(0, ep.slot, ep.task, ep.seed, ep.group_id,
                                              ep.sample_index, max_turns=ep.max_turns)
            sp.key = base * self.seats + seat
            sp.seat, sp.seat_info = seat, (base, self.roles[seat], players[seat])
            sp.policy_version = self.backends[players[seat]].policy_version
            self.run.store.begin(sp.key, sp.group_id, sp.sample_index, sp.policy_version,
                                 sp.key)
            out.append(sp)
        return out

    async def run_game(self, ep, t0: float) -> list:
        """Play game episode ``ep`` to its end and close every seat's trajectory (in seat
        order)."""
        run = self.run
        seats = self.seat_episodes(ep)
        for sp in seats:
            sp.t0 = t0
        try:
            if run.cfg.episode_timeout_s is not None:
                await asyncio.wait_for(self._play(seats), run.cfg.episode_timeout_s)
            else:
                await self._play(seats)
        except GameOver as e:
            _end(seats, e.reason, e.error)
        except (asyncio.TimeoutError, TimeoutError):
            _end(seats, "timeout", "episode or turn timed out")
        except asyncio.CancelledError:
            _end(seats, "aborted", None)
            for sp in seats:
                run.close_now(sp)
            raise
        except Exception as e:  # a backend or game failure ends the episode for every seat
            reason = "backend_error" if isinstance(e, BackendError) else "env_error"
            _end(seats, reason, f"{type(e).__name__}: {e}" if reason == "env_error" else str(e))
        for sp in seats:
            sp.closed = True
        return await asyncio.gather(*[run.close_batcher.submit(sp) for sp in seats])

    async def _play(self, seats: list) -> None:
        """The episode's moves: each round the movers (their observations already on their
        records) reply concurrently, and one turn batch records the replies, steps the game
        and appends the next movers' observations."""
        cfg = self.run.cfg
        view = await self.reset_batcher.submit(seats)
        max_turns, cap = cfg.max_turns, cfg.max_total_tokens
        if seats[0].max_turns is not None:  # the request's own horizon
            max_turns = seats[0].max_turns
        while True:
            to_move, _, over, rewards, _ = view
            if over:
                break
            movers = [seats[s] for s in to_move]
            for sp in movers:
                if max_turns is not None and sp.turns >= max_turns:
                    raise GameOver("horizon")
                if len(sp.ids) >= cap:
                    raise GameOver("length")
            if len(movers) == 1:  # turn-taking games: no task per reply
                replies = [await self._reply(movers[0])]
            else:  # simultaneous moves: generated together
                replies = await asyncio.gather(*[self._reply(sp) for sp in movers],
                                               return_exceptions=True)
                for r in replies:
                    if isinstance(r, BaseException):
                        raise r
            view = await self.turn_batcher.submit((seats, movers, replies))
        for sp, reward in zip(seats, rewards):
            sp.stop_reason = "done"
            if sp.turns:
                self.run.store.add_reward(sp.key, sp.turns - 1, float(reward))
            elif reward:
                sp.reward_override = float(reward)

    # -- batched work, once per event-loop tick -------------------------------------------
    def _reset_batch(self, games: list[list]) -> list:
        """Start the tick's new games in one pool call and put the first movers' prompts on
        their records; per game its view, or the exception that kept it from starting."""
        live = [g for g in games if not g[0].closed]
        views = self.driver.pool.reset([g[0].slot for g in live], [g[0].task for g in live],
                                       [g[0].seed for g in live]) if live else []
        return self._reset_done(games, live, views)

    async def _areset_batch(self, games: list[list]) -> list:
        """:meth:`_reset_batch` with a pool whose reset is awaited (a suite's game)."""
        live = [g for g in games if not g[0].closed]
        views = await self.driver.pool.areset(
            [g[0].slot for g in live], [g[0].task for g in live],
            [g[0].seed for g in live]) if live else []
        live_now = [g for g in live if not g[0].closed]  # cancelled while the pool worked
        views = [v for g, v in zip(live, views) if not g[0].closed]
        return self._reset_done(games, live_now, views)

    def _reset_done(self, games: list[list], live: list[list], views: list) -> list:
        self._observe(live, views)
        got = dict(zip(map(id, live), views))
        return [got.get(id(g)) for g in games]

    def _turn_batch(self, items: list[tuple[list, list, list]]) -> list:
        """The tick's moves of every game: the replies onto their seats' records (mask 1
        where the policy wrote them; a reply cut at ``max_new_tokens`` closed with a masked
        end-of-turn token; a turn of reward 0 each), their actions parsed in one call, the
        games stepped in one pool call, and the next movers' observations appended. Per game
        its view after the step, or :class:`GameOver` where a reply met the context cap (None
        for a game closed meanwhile, by a cancellation)."""
        out, stepped = self._turn_record(items)
        if stepped:
            slots, moves = self._moves(stepped)
            self._stepped(stepped, self.driver.pool.step(slots, moves), out)
        return [out.get(id(it)) for it in items]

    async def _aturn_batch(self, items: list[tuple[list, list, list]]) -> list:
        """:meth:`_turn_batch` with a pool whose step is awaited (a suite's game)."""
        out, stepped = self._turn_record(items)
        if stepped:
            slots, moves = self._moves(stepped)
            views = await self.driver.pool.astep(slots, moves)
            self._stepped(stepped, views, out)
        return [out.get(id(it)) for it in items]

    def _turn_record(self, items: list[tuple[list, list, list]]) -> tuple[dict, list]:
        """The replies of the tick's live games onto their records; the games whose reply
        met the context cap (:class:`GameOver`) and the games to step."""
        live = [it for it in items if not it[0][0].closed]
        movers = [sp for _, ms, _ in live for sp in ms]
        replies = [r for _, _, rs in live for r in rs]
        if movers:
            self._record(movers, replies)
        out: dict[int, object] = {}
        stepped = []
        for it in live:
            if any(r.ends for r in it[2]):
                out[id(it)] = GameOver("length")
            else:
                stepped.append(it)
        return out, stepped

    def _moves(self, stepped: list) -> tuple[list[int], list[list[str]]]:
        """The slots of the games to step and their moves, parsed in one codec call."""
        actions = self.run.codec.actions([r.tokens for it in stepped for r in it[2]])
        moves, k = [], 0
        for it in stepped:
            moves.append(actions[k:k + len(it[2])])
            k += len(it[2])
        return [it[0][0].slot for it in stepped], moves

    def _stepped(self, stepped: list, views: list, out: dict) -> None:
        """The step's refused moves counted and the next movers' observations appended."""
        for it, view in zip(stepped, views):
            if not isinstance(view, BaseException):
                for sp, bad in zip(it[1], view[4]):
                    sp.invalid_turns += bad
        self._observe([it[0] for it in stepped], views)
        out.update(zip(map(id, stepped), views))

    def _record(self, movers: list, replies: list[_Reply]) -> None:
        """The replies onto their seats' records, in a few store calls for the tick."""
        store, eot = self.run.store, self.eot
        # only the policy's replies carry logprobs (``_reply`` drops an opponent's)
        _append(store, movers, [r.tokens for r in replies],
                [sp.player == "policy" for sp in movers], [r.logprobs for r in replies])
        closing = [k for k, r in enumerate(replies) if not r.ended and not r.ends]
        if closing:  # cut at max_new_tokens: a masked end-of-turn token closes the reply
            _append(store, [movers[k] for k in closing], [[eot]] * len(closing),
                    [False] * len(closing))
        store.add_turns(np.fromiter((sp.key for sp in movers), np.uint64, len(movers)),
                        np.zeros(len(movers), np.float32))
        closed = set(closing)
        for k, (sp, r) in enumerate(zip(movers, replies)):
            sp.ids.extend(r.tokens)
            if k in closed:
                sp.ids.append(eot)
            sp.cut_turns += r.cut
            sp.turns += 1

    def _observe(self, games: list[list], views: list) -> None:
        """Each running game's movers' observations onto their records (mask 0): a first
        prompt (the seat's head and the observation, per seat in one codec call) or a
        templated user turn (all in one codec call and one store call)."""
        run = self.run
        fresh: dict[int, list] = {}
        later = []
        for seats, view in zip(games, views):
            if isinstance(view, BaseException) or view[2]:
                continue
            for s, obs in zip(view[0], view[1]):
                sp = seats[s]
                if sp.ids:
                    later.append((sp, obs))
                else:
                    fresh.setdefault(s, []).append((sp, obs))
        for seat, rows in fresh.items():
            head = self.heads[seat]
            if head is not None:
                prompts = run.codec.prompts(run.store, [sp.key for sp, _ in rows], head,
                                            [o for _, o in rows])
            else:
                prompts = [run.fmt.initial_prompt(self.systems[seat], o, run.cfg.reply_prefix)
                           for _, o in rows]
                for (sp, _), ids in zip(rows, prompts):
                    run.store.append(sp.key, np.array(ids, np.uint32), False)
            for (sp, _), ids in zip(rows, prompts):
                sp.ids = ids
                sp.prompt_len = len(ids)
        if later:
            ids = run.codec.observation_ids([o for _, o in later])
            _append(run.store, [sp for sp, _ in later], ids, [False] * len(later))
            for (sp, _), obs_ids in zip(later, ids):
                sp.ids.extend(obs_ids)

    async def _reply(self, sp) -> _Reply:
        """One reply of seat ``sp`` from its player's backend, within the context cap (and,
        for a model, ``max_new_tokens``; a built-in scripted player's move is never cut
        short of the context cap)."""
        run, cfg = self.run, self.run.cfg
        sampling: SamplingParams = run.sampling
        budget = cfg.max_total_tokens - len(sp.ids)
        if budget < sampling.max_new_tokens or sp.player in self.scripted:
            sampling = msgspec.structs.replace(sampling, max_new_tokens=budget)
        backend = self.backends[sp.player]
        context = (self.views[sp.seat], sp.slot, sp.seed, sp.sample_index)
        t0 = time.perf_counter()
        if cfg.turn_timeout_s is None:  # the first try straight to the backend
            rid = f"{run.engine.run_id}-{sp.key}-{sp.turns}-0"
            try:
                res = await (backend.generate(sp.ids, sampling, request_id=rid, context=context)
                             if backend.needs_context else
                             backend.generate(sp.ids, sampling, request_id=rid))
            except BackendError as e:
                res = await run.generate(sp, sampling, start=1, last=e, prompt=sp.ids,
                                         backend=backend, context=context)
        else:
            res = await run.generate(sp, sampling, prompt=sp.ids, backend=backend,
                                     context=context)
        sp.gen_s += time.perf_counter() - t0
        sp.replied(res.policy_version)  # the reply starts where the record ends
        toks = res.token_ids
        ended = bool(toks) and toks[-1] == run.fmt.end_of_turn_id
        cut = res.finish_reason == "length" and not ended
        ends = cut and (sampling is not run.sampling or cfg.truncated_turn == "end" or not toks)
        return _Reply(toks, res.logprobs if sp.player == "policy" else None, ended,
                      cut and not ends, ends)


def _append(store, eps: list, segments: list[list[int]], is_model: list[bool],
            logprobs: list[list[float] | None] | None = None) -> None:
    """``segments[i]`` onto the record of ``eps[i]`` in one store call (mask 1 where
    ``is_model[i]``; ``logprobs[i]``, where given, its behaviour logprobs, else 0)."""
    offsets = np.zeros(len(eps) + 1, np.int64)
    np.cumsum([len(x) for x in segments], out=offsets[1:])
    total = int(offsets[-1])
    lps = None
    if logprobs is not None and any(logprobs):
        lps = np.zeros(total, np.float32)
        for k, lp in enumerate(logprobs):
            if lp:
                lps[offsets[k]:offsets[k + 1]] = lp
    store.append_batch(np.fromiter((e.key for e in eps), np.uint64, len(eps)),
                       np.fromiter(itertools.chain.from_iterable(segments), np.uint32, total),
                       offsets, np.array(is_model, bool), lps)


def _end(seats: list, reason: str, error: str | None) -> None:
    for sp in seats:
        sp.stop_reason, sp.error = reason, error
