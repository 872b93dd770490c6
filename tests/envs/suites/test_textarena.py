"""TextArena through the adapter (``textarena:<EnvId>``): one-player envs and multi-player
games played to their end with rewards in range, each seat's own observations, play
determined by the seed, snapshots refused before any episode starts, and a TextArena env
that raises ending only its own episodes."""

from __future__ import annotations

import random
import re

import pytest
import textarena as ta
from textarena.envs.registration import ENV_REGISTRY

from agentgym.backends.scripted import ScriptedBackend
from agentgym.engine import RolloutEngine
from agentgym.engine.drivers import make_driver
from agentgym.envs import registry
from agentgym.envs.registry import game_pool, make
from agentgym.envs.suites.textarena import TextArenaGame, player_counts
from agentgym.errors import SnapshotUnsupportedError, UnknownEnvError


def test_player_counts_come_from_textarenas_labels():
    assert player_counts("TicTacToe-v0") == (2, 2)
    assert player_counts("TicTacToe-v0-raw") == (2, 2)
    assert player_counts("GuessTheNumber-v0-hardcore") == (1, 1)
    assert player_counts("Poker-v0")[0] == 2
    assert registry.kind("textarena:TicTacToe-v0") == "game"
    assert registry.kind("textarena:GuessTheNumber-v0") == "python"
    assert registry.seats("textarena:Poker-v0@3") == 3
    with pytest.raises(UnknownEnvError, match="takes 2-2 players"):
        registry.spec("textarena:TicTacToe-v0@3")


@pytest.mark.parametrize("name", ["GuessTheNumber-v0", "TowerOfHanoi-v0", "Minesweeper-v0"])
def test_a_one_player_env_plays_to_its_end(name):
    env = make(f"textarena:{name}", max_turns=60)
    for seed in range(2):
        obs, _ = env.reset(seed=seed, options={"task": seed})
        assert obs
        rng, done, truncated, total = random.Random(seed), False, False, 0.0
        while not (done or truncated):
            moves = env.unwrapped.valid_actions() or [f"[{rng.randint(0, 20)}]"]
            _, reward, done, truncated, _ = env.step(rng.choice(moves))
            total += reward
        assert -1.0 <= total <= 1.0


@pytest.mark.parametrize("env_id", ["textarena:TicTacToe-v0", "textarena:Othello-v0",
                                    "textarena:KuhnPoker-v0"])
def test_a_game_plays_to_its_end_with_listed_moves(env_id):
    pool = game_pool(env_id, 2)
    rng = random.Random(0)
    views = pool.reset([0, 1], [0, 1], [0, 0])
    for _ in range(300):
        live = [(s, v) for s, v in zip([0, 1], views) if not v[2]]
        if not live:
            break
        moves = []
        for s, v in live:
            legal = pool.valid_actions(s, v[0][0])
            assert legal, v[1][0]
            moves.append([rng.choice(legal)])
        got = dict(zip([s for s, _ in live], pool.step([s for s, _ in live], moves)))
        views = [got.get(s, v) for s, v in zip([0, 1], views)]
    for v in views:
        assert v[2] and all(-1.0 <= r <= 1.0 for r in v[3])


def test_a_kuhn_seat_reads_only_its_own_card():
    """Each round's deal line a seat reads names its own card, never the other's (the cards
    differ: the deck is dealt without replacement)."""
    deal = re.compile(r"Starting round (\d+) .*?Your card is: '(\w)'")
    names = {0: "J", 1: "Q", 2: "K"}
    read = 0
    for task in range(8):
        game = TextArenaGame("KuhnPoker-v0", 2)
        game.reset(task, 0)
        state = game._t.env.state
        dealt = {state.game_state["current_round"]: dict(state.game_state["player_cards"])}
        rng = random.Random(task)
        while not game.over():
            (seat,) = game.to_move()
            for rnd, card in deal.findall(game.observation(seat)):
                cards = dealt[int(rnd)]
                assert card == names[cards[seat]] != names[cards[1 - seat]]
                read += 1
            game.step([rng.choice(game.valid_actions(seat))])
            dealt.setdefault(state.game_state["current_round"],
                             dict(state.game_state["player_cards"]))
    assert read >= 16


def test_the_same_task_plays_the_same_game():
    def play(task):
        game = TextArenaGame("KuhnPoker-v0", 2)
        game.reset(task, 0)
        rng, texts = random.Random(1), []
        while not game.over():
            (seat,) = game.to_move()
            texts.append(game.observation(seat))
            game.step([rng.choice(game.valid_actions(seat))])
        return texts, game.rewards()

    assert play(3) == play(3)
    assert len({str(play(t)) for t in range(8)}) > 1


def test_snapshots_are_refused_before_any_episode(tokenizer):
    assert registry.snapshots("textarena:GuessTheNumber-v0") is False
    with pytest.raises(SnapshotUnsupportedError):
        make_driver("textarena:GuessTheNumber-v0", 2, restarts=True)
    backend = ScriptedBackend(tokenizer, "random")
    eng = RolloutEngine(backend, tokenizer, reflection=1)
    with pytest.raises(SnapshotUnsupportedError, match="reflection"):
        eng.collect_sync(2, "textarena:GuessTheNumber-v0")
    assert backend.requests == 0  # refused before any episode started


def test_an_engine_run_of_a_textarena_game(engine):
    batch = engine("random", seed=3, max_turns=12).collect_sync(4, "textarena:TicTacToe-v0")
    assert len(batch) == 8
    assert {t.stop_reason for t in batch} == {"done"}
    by_episode: dict[int, list[float]] = {}
    for t in batch:
        by_episode.setdefault(t.episode_id, []).append(t.reward)
    assert all(sorted(r) in ([-1.0, 1.0], [0.0, 0.0]) for r in by_episode.values())


class _Flaky(ta.Env):
    """A two-player TextArena env whose step raises on odd seeds."""

    def reset(self, num_players, seed=None):
        self.state = ta.TwoPlayerState(num_players=num_players, seed=seed)
        self.state.reset(game_state={"seed": seed},
                         player_prompt_function=lambda player_id, game_state:
                         f"Player {player_id}: say [go].")
        self.state.add_observation("Your move: [go]", ta.ObservationType.GAME_BOARD)

    def step(self, action):
        if self.state.game_state["seed"] % 2:
            raise RuntimeError("the third-party env broke")
        self.state.add_observation(action, ta.ObservationType.PLAYER_ACTION,
                                   from_id=self.state.current_player_id)
        if self.state.turn >= 3:
            self.state.set_winner(player_id=0, reason="done")
        return self.state.step()


def test_a_failing_textarena_env_ends_only_its_own_episodes(engine):
    if "AgentgymFlaky-v0" not in ENV_REGISTRY:
        ta.envs.registration.register(id="AgentgymFlaky-v0", entry_point=_Flaky)
    batch = engine("random", max_turns=6).collect_sync(
        list(range(6)), "textarena:AgentgymFlaky-v0@2")
    assert len(batch) == 12
    for t in batch:
        if t.task_id % 2:  # task i is reset(seed=i)
            assert t.stop_reason == "env_error" and "broke" in (t.error or "")
        else:
            assert t.stop_reason == "done"
