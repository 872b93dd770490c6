"""Self-play: episodes of a native multi-seat game, several agents in one episode.

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
turn order.

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
import json
import time
import zlib
from dataclasses import dataclass

import msgspec
import numpy as np

from agentgym import _core
from agentgym.backends.base import Backend, SamplingParams

__all__ = ["GameDriver", "OPPONENTS", "is_game", "seat_players"]

#: The opponent kinds every game has; any other name is a backend of
#: ``RolloutEngine.opponents`` (``"pool"``: one of them per episode).
OPPONENTS = ("self", "solver", "random", "pool")

_SCRIPTED = {"solver": "oracle", "random": "random"}


def is_game(env_id: str) -> bool:
    """``env_id`` is a native multi-seat game."""
    return env_id in _core.native_game_ids()


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
    """The engine's table for one game: a ``_core.GamePool`` of ``capacity`` slots, the
    seats' roles and system prompts. ``core_pool`` is None (the single-agent turn path never
    runs on a game)."""

    core_pool = None

    def __init__(self, game_id: str, capacity: int, **kwargs):
        self.env_id = game_id
        self.pool = _core.GamePool(game_id, capacity, json.dumps(kwargs))
        self.seats = self.pool.seats
        self.roles = list(self.pool.roles)
        self.seat_instructions = list(self.pool.instructions)
        self.instructions = self.seat_instructions[0]

    def finish(self, items: list[tuple[int, str]]) -> None:
        self.pool.finish(sorted({slot for slot, _ in items}))

    def close(self) -> None:
        return None


class _SeatView:
    """What a scripted opponent (``ScriptedBackend``) asks of its env, answered for one
    seat: the game's reference action and legal moves of that seat."""

    def __init__(self, play: GamePlay, seat: int):
        self.play, self.seat = play, seat

    async def oracle_action(self, slot: int) -> str | None:
        return await self.play.oracle_batcher.submit((slot, self.seat))

    async def valid_actions(self, slot: int) -> list[str]:
        return self.play.driver.pool.valid_actions(slot, self.seat)


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
    """The self-play part of one engine run (``_Run``): plays game episodes, one coroutine
    each, on the run's store, formatter, codec and close batcher."""

    def __init__(self, run, driver: GameDriver):
        from agentgym.backends.scripted import ScriptedBackend
        from agentgym.engine.batching import TickBatcher

        self.run, self.driver = run, driver
        cfg = run.cfg
        self.seats, self.roles = driver.seats, driver.roles
        systems = [cfg.system_prompt if cfg.system_prompt is not None else s
                   for s in driver.seat_instructions]
        self.systems = systems
        self.heads = [run.fmt.system_ids(s) for s in systems]
        loop = asyncio.get_running_loop()
        pool = driver.pool
        self.reset_batcher = TickBatcher(
            lambda eps: pool.reset([e.slot for e in eps], [e.task for e in eps],
                                   [e.seed for e in eps]), loop=loop)
        self.step_batcher = TickBatcher(
            lambda rows: pool.step([r[0] for r in rows], [r[1] for r in rows]), loop=loop)
        self.oracle_batcher = TickBatcher(
            lambda rows: pool.oracle_actions([r[0] for r in rows], [r[1] for r in rows]),
            loop=loop)
        self.views = [_SeatView(self, s) for s in range(self.seats)]
        engine = run.engine
        self.backends: dict[str, Backend] = {"policy": engine.backend, **engine.opponents}
        for name, policy in _SCRIPTED.items():
            if name not in self.backends:
                self.backends[name] = ScriptedBackend(run.fmt.tokenizer, policy,
                                                      seed=cfg.seed)
        opponent = cfg.opponent
        if opponent not in OPPONENTS and opponent not in engine.opponents:
            raise ValueError(f"unknown opponent {opponent!r}: one of {OPPONENTS} or a backend "
                             f"of RolloutEngine.opponents ({sorted(engine.opponents)})")
        self.opponent = opponent

    # -- one episode ----------------------------------------------------------------------
    def seat_episodes(self, ep) -> list:
        """``ep`` (the request's episode) and one episode per further seat, each with its
        own store key (``ep.key * seats + seat``), begun in the store."""
        from agentgym.engine.orchestrator import _Episode

        players = seat_players(self.opponent, ep.group_id, ep.seed, self.seats,
                               list(self.run.engine.opponents))
        out, base = [], ep.key
        for seat in range(self.seats):
            sp = ep if seat == 0 else _Episode(0, ep.slot, ep.task, ep.seed, ep.group_id,
                                               ep.sample_index)
            sp.key = base * self.seats + seat
            sp.seat, sp.role, sp.player, sp.episode_id = seat, self.roles[seat], \
                players[seat], base
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
                run._close_now(sp)
            raise
        except Exception as e:  # a backend or game failure ends the episode for every seat
            from agentgym.backends.base import BackendError

            reason = "backend_error" if isinstance(e, BackendError) else "env_error"
            _end(seats, reason, f"{type(e).__name__}: {e}" if reason == "env_error" else str(e))
        for sp in seats:
            sp.closed = True
        return await asyncio.gather(*[run.close_batcher.submit(sp) for sp in seats])

    async def _play(self, seats: list) -> None:
        run, cfg = self.run, self.run.cfg
        first = seats[0]
        view = await self.reset_batcher.submit(first)
        max_turns = cfg.max_turns
        while True:
            to_move, observations, over, rewards, refused = view
            if over:
                break
            movers = [seats[s] for s in to_move]
            self._observe(movers, observations)
            for sp in movers:
                if max_turns is not None and sp.turns >= max_turns:
                    raise GameOver("horizon")
                if len(sp.ids) >= cfg.max_total_tokens:
                    raise GameOver("length")
            replies = await asyncio.gather(*[self._reply(sp) for sp in movers],
                                           return_exceptions=True)
            for r in replies:
                if isinstance(r, BaseException):
                    raise r
            for sp, r in zip(movers, replies):
                self._record(sp, r)
            if any(r.ends for r in replies):  # cut by the context cap: the episode ends
                raise GameOver("length")
            moves = run.codec.actions([r.tokens for r in replies])
            view = await self.step_batcher.submit((first.slot, moves))
            for sp, bad in zip(movers, view[4]):
                sp.invalid_turns += bad
        for sp, reward in zip(seats, rewards):
            sp.stop_reason = "done"
            if sp.turns:
                run.store.add_reward(sp.key, sp.turns - 1, float(reward))
            elif reward:
                sp.reward_override = float(reward)

    def _observe(self, movers: list, observations: list[str]) -> None:
        """Each mover's observation onto its context: a first prompt (its head and the
        observation) or a templated user turn, stored with mask 0."""
        run = self.run
        fresh, later = [], []
        for sp, obs in zip(movers, observations):
            (later if sp.ids else fresh).append((sp, obs))
        for sp, obs in fresh:
            head = self.heads[sp.seat]
            if head is not None:
                sp.ids = run.codec.prompts(run.store, [sp.key], head, [obs])[0]
            else:
                sp.ids = run.fmt.initial_prompt(self.systems[sp.seat], obs,
                                                run.cfg.reply_prefix)
                run.store.append(sp.key, np.array(sp.ids, np.uint32), False)
            sp.prompt_len = len(sp.ids)
        if later:
            ids = run.codec.observation_ids([o for _, o in later])
            for (sp, _), obs_ids in zip(later, ids):
                run.store.append(sp.key, np.array(obs_ids, np.uint32), False)
                sp.ids.extend(obs_ids)

    async def _reply(self, sp) -> _Reply:
        """One reply of seat ``sp`` from its player's backend, within the context cap."""
        run, cfg = self.run, self.run.cfg
        sampling: SamplingParams = run.sampling
        budget = cfg.max_total_tokens - len(sp.ids)
        if budget < sampling.max_new_tokens:
            sampling = msgspec.structs.replace(sampling, max_new_tokens=budget)
        backend = self.backends[sp.player]
        context = (self.views[sp.seat], sp.slot, sp.seed, sp.sample_index)
        t0 = time.perf_counter()
        res = await run._generate(sp, sampling, prompt=sp.ids, backend=backend,
                                  context=context)
        sp.gen_s += time.perf_counter() - t0
        toks = res.token_ids
        ended = bool(toks) and toks[-1] == run.fmt.end_of_turn_id
        cut = res.finish_reason == "length" and not ended
        ends = cut and (sampling is not run.sampling or cfg.truncated_turn == "end" or not toks)
        return _Reply(toks, res.logprobs if sp.player == "policy" else None, ended,
                      cut and not ends, ends)

    def _record(self, sp, r: _Reply) -> None:
        """Seat ``sp``'s reply onto its record: the tokens (mask 1 where the learning policy
        wrote them), a closing end-of-turn token (mask 0) where the reply was cut, a turn
        with reward 0 (the game's rewards land on each seat's last turn at the end)."""
        store = self.run.store
        learn = sp.player == "policy"
        store.append(sp.key, np.array(r.tokens, np.uint32), learn,
                     np.array(r.logprobs, np.float32) if learn and r.logprobs else None)
        sp.ids.extend(r.tokens)
        if not r.ended and not r.ends:
            eot = self.run.fmt.end_of_turn_id
            store.append(sp.key, np.array([eot], np.uint32), False)
            sp.ids.append(eot)
        sp.cut_turns += r.cut
        store.add_turn(sp.key, 0.0)
        sp.turns += 1


def _end(seats: list, reason: str, error: str | None) -> None:
    for sp in seats:
        sp.stop_reason, sp.error = reason, error
