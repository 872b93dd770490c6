"""OpenSpiel (``open_spiel``'s ``pyspiel``) games as envs and games: ``openspiel:<game>``.

``<game>`` is what ``pyspiel.load_game`` takes, parameters included
(``openspiel:leduc_poker``, ``openspiel:goofspiel(num_cards=4)``). A one-player game is a
single-agent env (:class:`OpenSpielEnv`), a game of two or more players a multi-seat game
(:class:`OpenSpielGame`, played by self-play).

What maps onto what:

* the system prompt: the game's long name, the seat's player number and the reply format;
* a seat's turn text: ``observation_string(player)`` where the game provides it, else
  ``information_state_string(player)`` (OpenSpiel's own per-player views: a seat never reads
  another seat's private cards), then the legal actions, written with
  ``action_to_string``; a game that provides neither and hides information is refused;
* ``valid_actions``: the legal actions' strings; a reply is matched to them ignoring case and
  spacing (or read as an action id when no string matches); an illegal or unreadable move of
  a game ends it with -1 for the mover and 0 for the others, a single-agent env answers it
  with an "invalid" observation and goes on (``illegal_move="lose"``: it ends the game at the
  game's lowest return, as a game's refused move does, so replying illegally is never a way
  to put off a loss until the horizon);
* the reward: the change of ``returns()`` (a game's seats get their final returns);
* chance nodes: drawn with the episode's own RNG, seeded by the task index within its split
  (the deal) or, without a task, by the episode seed: the same task and seed play the same
  deals; split ``train`` draws from seeds ``i``, split ``test`` (held out) from
  ``2**32 + i``;
* snapshots: ``state.clone()`` with the RNG state;
* the scripted player (``--policy oracle``, opponent ``solver``): OpenSpiel's MCTS bot
  (random-rollout evaluator, seeded) on a perfect-information game, the uniform random
  legal move where information is hidden (a search over the true state would read hidden
  cards).
"""

from __future__ import annotations

import functools
import random
import re
from typing import Any

import pyspiel

from agentgym.envs.base import BaseEnv, action_line
from agentgym.envs.suites import HELD_OUT_BASE, SPLITS, SuiteEntry, chance_seed, check_split
from agentgym.envs.suites._game import SuiteGame, refused_rewards
from agentgym.errors import EnvError, UnknownEnvError

__all__ = ["OpenSpielEnv", "OpenSpielGame", "entries", "spec"]

#: The turns a seat may take by default, at most.
MAX_HORIZON = 200
_MCTS_SIMULATIONS = 1000


@functools.lru_cache(maxsize=256)
def load(game: str) -> pyspiel.Game:
    """The loaded game ``game`` (cached: a game object is immutable and shared)."""
    return pyspiel.load_game(game)


def _short_name(game: str) -> str:
    return game.split("(", 1)[0]


def _checked(env_id: str, game: str) -> pyspiel.Game:
    """The game, or :class:`UnknownEnvError` saying why it cannot be played here."""
    if _short_name(game) not in {t.short_name for t in pyspiel.registered_games()}:
        raise UnknownEnvError(f"env id {env_id!r}: OpenSpiel has no game "
                              f"{_short_name(game)!r} (agentgym-rl list --suite openspiel)")
    try:
        g = load(game)
    except Exception as e:  # pyspiel's SpielError: a bad parameter
        why = " ".join(str(e).split())
        raise UnknownEnvError(f"env id {env_id!r}: pyspiel.load_game({game!r}) failed: "
                              f"{why}") from None
    t = g.get_type()
    if t.dynamics == pyspiel.GameType.Dynamics.MEAN_FIELD:
        raise UnknownEnvError(f"env id {env_id!r}: a mean-field game has no seats to play")
    if not (t.provides_observation_string or t.provides_information_state_string) and \
            t.information != pyspiel.GameType.Information.PERFECT_INFORMATION:
        raise UnknownEnvError(f"env id {env_id!r}: the game gives no per-player observation "
                              "string, and its state hides information")
    return g


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text.strip().strip("`'\"").strip()).lower()


class _Play:
    """One episode's OpenSpiel state and its chance RNG, shared by the env and the game."""

    def __init__(self, game: str, split: str):
        check_split(split)
        self.name, self.split = game, split
        self.game = load(game)
        self.type = self.game.get_type()
        self.state: Any = None
        self.rng = random.Random(0)
        self.bot_seed = 0

    def start(self, task: int | str | None, seed: int) -> None:
        chance = chance_seed(self.name, self.split, task, seed)
        self.rng = random.Random(chance)
        self.bot_seed = chance % (2**31)
        self.state = self.game.new_initial_state()
        self.resolve_chance()

    def resolve_chance(self) -> None:
        state = self.state
        while state.is_chance_node():
            outcomes, probs = zip(*state.chance_outcomes())
            state.apply_action(self.rng.choices(outcomes, probs)[0])

    def movers(self) -> list[int]:
        state = self.state
        if state.is_terminal():
            return []
        if state.is_simultaneous_node():
            return [p for p in range(self.game.num_players()) if state.legal_actions(p)]
        return [state.current_player()]

    def legal(self, player: int) -> list[tuple[int, str]]:
        state = self.state
        return [(a, state.action_to_string(player, a)) for a in state.legal_actions(player)]

    def read(self, player: int, text: str) -> int | None:
        """The legal action ``text`` names for ``player`` (None: none)."""
        legal = self.legal(player)
        want = _norm(text)
        for action, name in legal:
            if _norm(name) == want:
                return action
        if want.lstrip("-").isdigit() and int(want) in {a for a, _ in legal}:
            return int(want)
        return None

    def view(self, player: int) -> str:
        state, t = self.state, self.type
        if t.provides_observation_string:
            return state.observation_string(player)
        if t.provides_information_state_string:
            return state.information_state_string(player)
        return str(state)

    def turn_text(self, player: int) -> str:
        legal = ", ".join(name for _, name in self.legal(player))
        return f"{self.view(player).rstrip()}\nLegal actions: {legal}"

    def oracle(self, player: int) -> str | None:
        legal = self.legal(player)
        if not legal:
            return None
        perfect = self.type.information == pyspiel.GameType.Information.PERFECT_INFORMATION
        if perfect and not self.state.is_simultaneous_node():
            bot = pyspiel.MCTSBot(self.game, pyspiel.RandomRolloutEvaluator(1, self.bot_seed),
                                  2.0, _MCTS_SIMULATIONS, 1000, True, self.bot_seed, False)
            action = bot.step(self.state)
            return self.state.action_to_string(player, action)
        rng = random.Random(f"{self.bot_seed}:{self.state.history_str()}:{player}")
        return rng.choice(legal)[1]

    def copy(self) -> tuple:
        return self.state.clone(), self.rng.getstate()

    def put_back(self, saved: tuple) -> None:
        state, rng = saved
        self.state = state.clone()
        self.rng.setstate(rng)


def _instructions(play: _Play, player: int | None) -> str:
    g, t = play.game, play.type
    who = (f" You are player {player} of {g.num_players()}." if player is not None else "")
    hidden = ("" if t.information == pyspiel.GameType.Information.PERFECT_INFORMATION else
              " You see only your own side of the game: what the others hold stays hidden.")
    return (f"You are playing {t.long_name} (OpenSpiel's {play.name}).{who}{hidden}\n"
            "Each turn you see the game from your side, then the legal actions. Choose one "
            "legal action, written exactly as listed." + action_line("<one legal action>"))


class OpenSpielEnv(BaseEnv):
    """A one-player OpenSpiel game as a text env (see the module docs)."""

    splits = SPLITS
    held_out_split = "test"
    num_tasks = None
    tasks_doc = ("unbounded: task i seeds the chance outcomes (deals) of its split; split "
                 f"'test' draws them from seeds {HELD_OUT_BASE} + i")

    def __init__(self, game: str, split: str = "train", illegal_move: str = "retry"):
        self._play = _Play(game, split)
        if self._play.game.num_players() != 1:
            raise ValueError(f"game: {game!r} has {self._play.game.num_players()} players; "
                             "play it as a multi-seat game (openspiel:<game>)")
        if illegal_move not in ("retry", "lose"):
            raise ValueError(f"illegal_move must be 'retry' or 'lose', got {illegal_move!r}")
        self.split, self.illegal_move = split, illegal_move
        self._lost = False
        self.instructions = _instructions(self._play, None)
        self._returns = 0.0

    def reset(self, task: int | str | None = None, seed: int | None = None) -> str:
        self._play.start(task, 0 if seed is None else seed)
        self._returns = float(self._play.state.returns()[0])
        self._lost = False
        return self._text()

    def _over(self) -> bool:
        return self._lost or self._play.state.is_terminal()

    def _text(self) -> str:
        if self._over():
            return (f"{self._play.view(0).rstrip()}\nThe game is over. Your return: "
                    f"{self._returns:g}")
        return self._play.turn_text(0)

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        play = self._play
        chosen = play.read(0, action)
        if chosen is None:
            legal = ", ".join(name for _, name in play.legal(0))
            if self.illegal_move == "lose":  # the game ends at its lowest return
                worst = float(play.game.min_utility())
                reward, self._returns, self._lost = worst - self._returns, worst, True
                return (f"Illegal action {action.strip()!r} (legal: {legal}): you lose. "
                        f"Your return: {worst:g}", reward, True, {"invalid": True})
            return (f"Invalid action {action.strip()!r}. Legal actions: {legal}", 0.0, False,
                    {"invalid": True})
        play.state.apply_action(chosen)
        play.resolve_chance()
        total = float(play.state.returns()[0])
        reward, self._returns = total - self._returns, total
        return self._text(), reward, bool(play.state.is_terminal()), {}

    def valid_actions(self) -> list[str]:
        if self._play.state is None or self._over():
            return []
        return [name for _, name in self._play.legal(0)]

    def oracle_action(self) -> str | None:
        if self._play.state is None or self._over():
            return None
        return self._play.oracle(0)

    def snapshot(self) -> Any:
        """``state.clone()``, the chance RNG's state, the return so far and whether an
        illegal move lost the game."""
        return self._play.copy(), self._returns, self._lost

    def restore(self, state: Any) -> None:
        saved, self._returns, self._lost = state
        self._play.put_back(saved)


class OpenSpielGame(SuiteGame):
    """An OpenSpiel game of two or more players, one seat per player (see the module
    docs)."""

    snapshots = True

    def __init__(self, game: str, split: str = "train"):
        self._play = _Play(game, split)
        n = self._play.game.num_players()
        if n < 2:
            raise ValueError(f"game: {game!r} has one player; play it as an env")
        self.seats = n
        self.roles = tuple(f"player {p}" for p in range(n))
        self.instructions = tuple(_instructions(self._play, p) for p in range(n))
        self._final: list[float] | None = None

    def reset(self, task: int | None, seed: int) -> None:
        self._play.start(task, seed)
        self._final = None

    def to_move(self) -> list[int]:
        return [] if self._final is not None else self._play.movers()

    def observation(self, seat: int) -> str:
        return self._play.turn_text(seat)

    def over(self) -> bool:
        return self._final is not None or bool(self._play.state.is_terminal())

    def rewards(self) -> list[float]:
        if self._final is not None:
            return list(self._final)
        return [float(r) for r in self._play.state.returns()]

    def step(self, moves: list[str]) -> list[bool]:
        play = self._play
        movers = play.movers()
        if len(moves) != len(movers):
            raise EnvError(f"{play.name}: {len(movers)} seat(s) to move, got "
                           f"{len(moves)} move(s)")
        chosen = [play.read(p, m) for p, m in zip(movers, moves)]
        refused = [c is None for c in chosen]
        if any(refused):
            self._final = refused_rewards(self.seats, movers[refused.index(True)])
            return refused
        if play.state.is_simultaneous_node():
            joint = [0] * self.seats
            for p, c in zip(movers, chosen):
                joint[p] = c
            play.state.apply_actions(joint)
        else:
            play.state.apply_action(chosen[0])
        play.resolve_chance()
        return refused

    def valid_actions(self, seat: int) -> list[str]:
        return [name for _, name in self._play.legal(seat)]

    def oracle_action(self, seat: int) -> str | None:
        return self._play.oracle(seat)

    def snapshot(self) -> Any:
        """``state.clone()``, the chance RNG's state and a refusal's final rewards."""
        return self._play.copy(), None if self._final is None else list(self._final)

    def restore(self, state: Any) -> None:
        saved, final = state
        self._play.put_back(saved)
        self._final = None if final is None else list(final)


# ------------------------------------------------------------------------------ registry
def spec(env_id: str, game: str):
    """The registry's spec of ``openspiel:<game>``."""
    from agentgym.envs.registry import EnvSpec, SuccessRule

    g = _checked(env_id, game)
    t = g.get_type()
    n = g.num_players()
    horizon = max(1, min(int(g.max_game_length()), MAX_HORIZON))
    best = float(g.max_utility())
    if n == 1:
        return EnvSpec(
            env_id, OpenSpielEnv, {"game": game},
            f"{t.long_name} (OpenSpiel, one player)", "python", default_horizon=horizon,
            success=SuccessRule(best, f"the game's best return, {best:g}, is reached"),
            snapshots=True, images=False)
    win = min(1.0, best)
    perfect = t.information == pyspiel.GameType.Information.PERFECT_INFORMATION
    return EnvSpec(
        env_id, OpenSpielGame, {"game": game},
        f"{t.long_name} (OpenSpiel, {n} players, {'perfect' if perfect else 'hidden'} "
        "information)", "game", seats=n, default_horizon=horizon,
        success=SuccessRule(win, f"the seat ends with a return of at least {win:g}"),
        snapshots=True, images=False)


def entries() -> list[SuiteEntry]:
    """Every game OpenSpiel registers that has seats to play (mean-field games excepted)."""
    out = []
    for t in pyspiel.registered_games():
        if t.dynamics == pyspiel.GameType.Dynamics.MEAN_FIELD:
            continue
        single = t.max_num_players == 1
        seats = 1 if single else (t.min_num_players if t.min_num_players == t.max_num_players
                                  else None)
        source = f"pyspiel.load_game({t.short_name!r})" + (
            "" if t.default_loadable else " (needs parameters: openspiel:NAME(key=value))")
        out.append(SuiteEntry(f"openspiel:{t.short_name}", "python" if single else "game",
                              seats, source))
    return out
