"""TextArena environments as envs and games: ``textarena:<EnvId>``.

``<EnvId>`` is an id of TextArena's registry (``textarena:TicTacToe-v0``,
``textarena:Sudoku-v0-easy``); ``textarena:<EnvId>@N`` plays it with ``N`` players where the
env takes several counts (default: the fewest it takes). The player counts are the ones
TextArena's registration file labels each group of ids with (``# Poker [2-15 Players]``). A
one-player env is a single-agent env (:class:`TextArenaEnv`), a multi-player one a
multi-seat game (:class:`TextArenaGame`, played by self-play).

What maps onto what:

* the system prompt: the env's id, the seat, and TextArena's move format (a move in square
  brackets; a reply without brackets is bracketed, as TextArena's ``ActionFormattingWrapper``
  does); the game's own rules come as the first turn text (TextArena's prompt message);
* a seat's turn text: the messages TextArena queued for that player since its last move
  (``state.observations[player]``: its own side only, which is TextArena's privacy rule),
  each tagged with its sender;
* ``valid_actions``: the bracketed moves of the last line of the turn text that lists
  "available" or "valid" moves, where the env writes one ([] otherwise: free text);
* the reward: TextArena's final per-player reward (``env.close()``), on the last turn;
* tasks: task ``i`` of split ``train`` is ``reset(seed=i)``; split ``test`` (held out)
  seeds from ``2**32 + i``. Without a task, the episode seed;
* invalid moves: TextArena's own rule (an error allowance, then the mover loses);
* snapshots: unsupported (a TextArena env may hold open resources), so the engine refuses
  undo, reflection retries and branched groups before any episode starts;
* no scripted solver: the random legal player picks among ``valid_actions``.

TextArena's envs draw from Python's global ``random``: every call runs under one lock with
the episode's own RNG state swapped in, so concurrent episodes stay deterministic from
their seeds.
"""

from __future__ import annotations

import functools
import inspect
import random
import re
import threading
from typing import Any

import textarena as ta
from textarena.envs.registration import ENV_REGISTRY

from agentgym.envs.base import BaseEnv, action_line
from agentgym.envs.suites import HELD_OUT_BASE, SPLITS, SuiteEntry, chance_seed, check_split
from agentgym.envs.suites._game import SuiteGame
from agentgym.errors import EnvError, UnknownEnvError

__all__ = ["TextArenaEnv", "TextArenaGame", "entries", "player_counts", "spec"]

DEFAULT_HORIZON = 100
_LOCK = threading.RLock()
_HEADER = re.compile(r"^#\s*(?:#\s*)?\S.*?[\[(]\s*(\d+)(?:\s*-\s*(\d+))?\s*Players?\s*[\])]",
                     re.IGNORECASE)
_ID = re.compile(r"""\bid\s*=\s*["']([^"']+)["']""")
_POINT = re.compile(r"""entry_point\s*=\s*["']([^"':]+)""")
_MOVES_LINE = re.compile(r"(available|valid)[^\n]*(moves?|actions?)", re.IGNORECASE)
_BRACKETED = re.compile(r"\[[^\[\]\n]{1,80}\]")


@functools.lru_cache(maxsize=1)
def _labels() -> dict[str, tuple[int, int]]:
    """Each registered base id's ``(fewest, most)`` players, read from the headers of
    TextArena's registration file. A header labels one env family: the ids registered after
    it from the same env module; an id of another module (a header without a count came
    between) gets no label."""
    import textarena.envs as envs

    out: dict[str, tuple[int, int]] = {}
    current: tuple[int, int] | None = None
    family: str | None = None
    for line in inspect.getsource(envs).splitlines():
        text = line.strip()
        if text.startswith("#"):
            m = _HEADER.match(text)
            if m:
                lo = int(m.group(1))
                current, family = (lo, int(m.group(2) or lo)), None
            continue
        m = _ID.search(text)
        if m is None or current is None:
            continue
        point = _POINT.search(text)
        module = point.group(1) if point else None
        if family is None:
            family = module
        if module != family:
            current = None
            continue
        out[m.group(1)] = current
    return out


def player_counts(name: str) -> tuple[int, int] | None:
    """``(fewest, most)`` players of TextArena id ``name`` (its variants share their base
    id's label); None where TextArena labels none."""
    labels = _labels()
    best = max((b for b in labels if name == b or name.startswith(b + "-")), key=len,
               default=None)
    return labels[best] if best is not None else None


def _raw(name: str) -> Any:
    """The env of ``name`` without TextArena's observation wrappers."""
    env = ta.make(name)
    while isinstance(env, ta.Wrapper):
        env = env.env
    return env


def _parts(message: Any) -> tuple[int, str, Any]:
    """``(sender, text, type)`` of one queued message, whatever order an env put its fields
    in (a few TextArena envs pass them positionally in another order)."""
    fields = list(message) if isinstance(message, (tuple, list)) else [message]
    kind = next((f for f in fields if isinstance(f, ta.ObservationType)), None)
    sender = next((f for f in fields if isinstance(f, int) and not isinstance(f, bool)), -1)
    text = next((f for f in fields if isinstance(f, str)), "")
    return int(sender), text, kind


def _format(messages: list) -> str:
    """TextArena's messages for one player as turn text, each with its sender."""
    parts = []
    for message in messages:
        sender, text, kind = _parts(message)
        text = text.strip()
        if sender >= 0 and kind != ta.ObservationType.PROMPT:
            parts.append(f"[Player {sender}] {text}")
        else:
            parts.append(text)
    return "\n\n".join(p for p in parts if p)


def _moves(text: str) -> list[str]:
    """The bracketed moves of the last line that lists available or valid moves (a line
    about an invalid move lists none)."""
    lines = [ln for ln in text.splitlines()
             if _MOVES_LINE.search(ln) and "invalid" not in ln.lower()]
    for line in reversed(lines):
        found = list(dict.fromkeys(_BRACKETED.findall(line)))
        if found:
            return found
    return []


def _bracketed(action: str) -> str:
    action = action.strip()
    return action if "[" in action else f"[{action}]"


class _Table:
    """One TextArena env with its own RNG state (swapped into ``random`` per call)."""

    def __init__(self, name: str, players: int, split: str):
        check_split(split)
        if name not in ENV_REGISTRY:
            raise ValueError(f"env_id: TextArena has no env {name!r}")
        self.name, self.players, self.split = name, int(players), split
        self.env: Any = None
        self.rng_state: Any = None
        self.done = False
        self.final: list[float] = [0.0] * self.players
        self.invalid: dict[int, bool] = {}

    def call(self, fn, *args):
        with _LOCK:
            outer = random.getstate()
            if self.rng_state is not None:
                random.setstate(self.rng_state)
            try:
                return fn(*args)
            finally:
                self.rng_state = random.getstate()
                random.setstate(outer)

    def start(self, task: int | str | None, seed: int) -> None:
        seed = chance_seed(self.name, self.split, task, seed)
        self.rng_state = None
        self.done = False
        self.final = [0.0] * self.players
        self.invalid = {}

        def begin():
            random.seed(seed)
            self.env = _raw(self.name)
            self.env.reset(num_players=self.players, seed=int(seed))
        self.call(begin)

    def observe(self) -> tuple[int, str]:
        pid, messages = self.call(self.env.get_observation)
        return int(pid), _format(messages)

    def act(self, action: str) -> None:
        done, _ = self.call(self.env.step, _bracketed(action))
        if done:
            rewards, info = self.call(self.env.close)
            rewards = rewards or {}
            self.final = [float(rewards.get(p, 0.0)) for p in range(self.players)]
            self.invalid = {p: bool((info or {}).get(p, {}).get("invalid_move"))
                            for p in range(self.players)}
            self.done = True

    def current(self) -> int:
        return int(self.env.state.current_player_id)


def _instructions(name: str, player: int | None, players: int) -> str:
    who = f" You are Player {player} of {players}." if player is not None else ""
    return (f"You are playing TextArena's {name}.{who} The game's own rules come in your "
            "first message; then each turn you see what happened since your last move. "
            "Write your move in square brackets, as the game asks (for example [4])."
            + action_line("[your move]"))


class TextArenaEnv(BaseEnv):
    """A one-player TextArena env as a text env (see the module docs)."""

    splits = SPLITS
    held_out_split = "test"
    num_tasks = None
    tasks_doc = ("unbounded: task i is reset(seed=i) of split 'train'; split 'test' seeds "
                 f"from {HELD_OUT_BASE} + i")

    def __init__(self, env_id: str, split: str = "train"):
        self._t = _Table(env_id, 1, split)
        self.split = split
        self.instructions = _instructions(env_id, None, 1)
        self._last = ""

    def reset(self, task: int | str | None = None, seed: int | None = None) -> str:
        self._t.start(task, 0 if seed is None else seed)
        _, self._last = self._t.observe()
        return self._last

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        t = self._t
        t.act(action)
        if t.done:
            messages = t.env.state.observations.get(0, []) if t.env.state else []
            text = _format(messages)
            reason = t.env.state.game_info.get(0, {}).get("reason", "")
            self._last = "\n\n".join(x for x in (text, f"The game is over. {reason}".strip())
                                     if x)
            return self._last, t.final[0], True, {"invalid": t.invalid.get(0, False)}
        _, self._last = t.observe()
        return self._last, 0.0, False, {}

    def valid_actions(self) -> list[str]:
        return [] if self._t.done else _moves(self._last)


class TextArenaGame(SuiteGame):
    """A TextArena env of two or more players, one seat per player (see the module
    docs)."""

    def __init__(self, env_id: str, players: int = 2, split: str = "train"):
        self._t = _Table(env_id, players, split)
        self.seats = int(players)
        self.roles = tuple(f"Player {p}" for p in range(self.seats))
        self.instructions = tuple(_instructions(env_id, p, self.seats)
                                  for p in range(self.seats))
        self._text: dict[int, str] = {}

    def reset(self, task: int | None, seed: int) -> None:
        self._t.start(task, seed)
        self._text = {}
        self._observe()

    def _observe(self) -> None:
        if not self._t.done:
            pid, text = self._t.observe()
            self._text = {pid: text}

    def to_move(self) -> list[int]:
        return [] if self._t.done else [self._t.current()]

    def observation(self, seat: int) -> str:
        return self._text.get(seat, "")

    def over(self) -> bool:
        return self._t.done

    def rewards(self) -> list[float]:
        return list(self._t.final)

    def step(self, moves: list[str]) -> list[bool]:
        movers = self.to_move()
        if len(moves) != len(movers):
            raise EnvError(f"{self._t.name}: {len(movers)} seat(s) to move, got "
                           f"{len(moves)} move(s)")
        self._t.act(moves[0])
        self._observe()
        return [self._t.invalid.get(movers[0], False)] if self._t.done else [False]

    def valid_actions(self, seat: int) -> list[str]:
        return _moves(self._text.get(seat, ""))


# ------------------------------------------------------------------------------ registry
def _seats(env_id: str, local: str) -> tuple[str, int]:
    name, sep, count = local.rpartition("@")
    if not sep:
        name = local
    if name not in ENV_REGISTRY:
        raise UnknownEnvError(f"env id {env_id!r}: TextArena has no env {name!r} "
                              "(agentgym-rl list --suite textarena)")
    counts = player_counts(name)
    if sep:
        try:
            n = int(count)
        except ValueError:
            raise UnknownEnvError(f"env id {env_id!r}: '@{count}' must be a player count") \
                from None
        if n < 1 or (counts and not counts[0] <= n <= counts[1]):
            raise UnknownEnvError(f"env id {env_id!r}: {name} takes "
                                  f"{counts[0]}-{counts[1] if counts else n} players")
        return name, n
    if counts is None:
        raise UnknownEnvError(f"env id {env_id!r}: TextArena does not label {name}'s player "
                              f"count; name it as textarena:{name}@N")
    return name, counts[0]


def spec(env_id: str, local: str):
    """The registry's spec of ``textarena:<EnvId>[@N]``."""
    from agentgym.envs.registry import EnvSpec, SuccessRule

    name, n = _seats(env_id, local)
    if n == 1:
        return EnvSpec(env_id, TextArenaEnv, {"env_id": name},
                       f"TextArena {name} (one player)", "python",
                       default_horizon=DEFAULT_HORIZON,
                       success=SuccessRule(1.0, "TextArena's final reward is at least 1"),
                       snapshots=False, images=False)
    return EnvSpec(env_id, TextArenaGame, {"env_id": name, "players": n},
                   f"TextArena {name} ({n} players)", "game", seats=n,
                   default_horizon=DEFAULT_HORIZON,
                   success=SuccessRule(1.0, "the seat wins: TextArena's reward is at least 1"),
                   snapshots=False, images=False)


def entries() -> list[SuiteEntry]:
    """Every id in TextArena's registry (``-raw`` and wrapper variants included: the adapter
    drops the wrappers, so they play alike)."""
    out = []
    for name, es in ENV_REGISTRY.items():
        counts = player_counts(name)
        point = es.entry_point if isinstance(es.entry_point, str) else \
            f"{es.entry_point.__module__}:{es.entry_point.__qualname__}"
        kind = "python" if counts and counts[0] == 1 else "game"
        out.append(SuiteEntry(f"textarena:{name}", kind, counts[0] if counts else None,
                              point))
    return out
