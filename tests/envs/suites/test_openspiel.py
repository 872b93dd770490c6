"""OpenSpiel through the adapter (``openspiel:<game>``): single-agent round trips, games
played seat by seat through the suite pool, each seat's privacy on a hidden-information
game, chance from the seed, snapshots, and engine runs end to end."""

from __future__ import annotations

import random
import re

import pyspiel
import pytest

from agentgym.envs import registry
from agentgym.envs.registry import game_pool, make
from agentgym.envs.suites.openspiel import OpenSpielGame

ONE_PLAYER = ["catch", "cliff_walking", "blackjack", "deep_sea"]
GAMES = ["tic_tac_toe", "kuhn_poker", "leduc_poker", "connect_four", "goofspiel(num_cards=4)",
         "liars_dice"]


def _random_play(env, rng: random.Random, cap: int = 500):
    total, done, steps = 0.0, False, 0
    while not done and steps < cap:
        actions = env.unwrapped.valid_actions()
        assert actions, "a running one-player game always has a legal action"
        _, reward, done, truncated, _ = env.step(rng.choice(actions))
        total += reward
        steps += 1
    return total, done


@pytest.mark.parametrize("game", ONE_PLAYER)
def test_a_one_player_game_is_a_single_agent_env_played_to_its_end(game):
    env_id = f"openspiel:{game}"
    assert registry.kind(env_id) == "python" and registry.seats(env_id) == 1
    assert registry.task_splits(env_id) == (("train", "test"), "test")
    g = pyspiel.load_game(game)
    env = make(env_id)
    for seed in range(3):
        obs, _ = env.reset(seed=seed, options={"task": seed})
        assert "Legal actions:" in obs
        total, done = _random_play(env, random.Random(seed))
        assert done
        assert g.min_utility() - 1e-6 <= total <= g.max_utility() + 1e-6


def test_an_illegal_action_of_an_env_is_refused_and_the_episode_goes_on():
    env = make("openspiel:catch")
    env.reset(seed=0, options={"task": 0})
    obs, reward, done, _, info = env.step("jump")
    assert info["invalid"] and not done and reward == 0.0 and "Legal actions" in obs
    _, _, done, _, info = env.step("stay")  # case and spacing do not matter
    assert not info.get("invalid") and not done


def test_the_oracle_solves_catch():
    env = make("openspiel:catch")
    for task in range(3):
        env.reset(seed=0, options={"task": task})
        done, total = False, 0.0
        while not done:
            _, r, done, _, _ = env.step(env.unwrapped.oracle_action())
            total += r
        assert total == 1.0


def _play_pool(pool, slots, tasks, seeds, rng, max_steps=400):
    views = pool.reset(slots, tasks, seeds)
    finals = {}
    for _ in range(max_steps):
        live = [(s, v) for s, v in zip(slots, views) if not isinstance(v, BaseException)
                and not v[2]]
        for s, v in zip(slots, views):
            if not isinstance(v, BaseException) and v[2]:
                finals.setdefault(s, v[3])
        if not live:
            break
        moves = [[rng.choice(pool.valid_actions(s, seat)) for seat in v[0]] for s, v in live]
        stepped = pool.step([s for s, _ in live], moves)
        got = dict(zip([s for s, _ in live], stepped))
        views = [got.get(s, v) for s, v in zip(slots, views)]
    return finals


@pytest.mark.parametrize("game", GAMES)
def test_a_game_plays_to_its_end_with_rewards_in_range(game):
    env_id = f"openspiel:{game}"
    g = pyspiel.load_game(game)
    assert registry.kind(env_id) == "game" and registry.seats(env_id) == g.num_players()
    pool = game_pool(env_id, 4)
    finals = _play_pool(pool, [0, 1, 2, 3], [0, 1, 2, 3], [5, 5, 5, 5], random.Random(1))
    assert sorted(finals) == [0, 1, 2, 3]
    for rewards in finals.values():
        assert len(rewards) == g.num_players()
        assert all(g.min_utility() - 1e-6 <= r <= g.max_utility() + 1e-6 for r in rewards)
    pool.close()


def test_chance_comes_from_the_task_and_seed_and_the_held_out_split_deals_apart():
    def deal(task, seed, split="train"):
        game = OpenSpielGame("leduc_poker", split=split)
        game.reset(task, seed)
        return game._play.state.history()[:2]

    assert deal(3, 0) == deal(3, 99)  # the task is the deal
    assert len({tuple(deal(t, 0)) for t in range(20)}) > 5
    train = [tuple(deal(t, 0)) for t in range(30)]
    held_out = [tuple(deal(t, 0, "test")) for t in range(30)]
    assert train != held_out
    game = OpenSpielGame("leduc_poker")
    game.reset(None, 7)
    again = OpenSpielGame("leduc_poker")
    again.reset(None, 7)
    assert game._play.state.history() == again._play.state.history()


@pytest.mark.parametrize("game", ["leduc_poker", "kuhn_poker"])
def test_a_poker_seat_never_sees_the_other_private_card_before_showdown(game):
    private = re.compile(r"\[Private: (\d+)\]")
    for task in range(12):
        g = OpenSpielGame(game)
        g.reset(task, 0)
        cards = g._play.state.history()[:2]  # the first two chance outcomes: the hands
        rng = random.Random(task)
        seen = {0: [], 1: []}
        while not g.over():
            (mover,) = g.to_move()
            seen[mover].append(g.observation(mover))
            g.step([rng.choice(g.valid_actions(mover))])
        for seat, texts in seen.items():
            for text in texts:
                if game == "leduc_poker":
                    assert private.findall(text) == [str(cards[seat])], (seat, text)
                else:  # kuhn's information state: the seat's card first, then the bets
                    assert text.split("\n")[0].startswith(str(cards[seat])), (seat, text)


def test_a_leduc_seat_never_reads_the_other_card_in_its_engine_trajectory(engine, tokenizer):
    batch = engine("random", seed=2, max_turns=8).collect_sync(list(range(8)),
                                                               "openspiel:leduc_poker")
    by_episode: dict[int, dict[int, object]] = {}
    for t in batch:
        by_episode.setdefault(t.episode_id, {})[t.seat] = t
    assert len(by_episode) == 8
    for seats in by_episode.values():
        assert {t.stop_reason for t in seats.values()} == {"done"}
        cards = {}
        for seat, t in seats.items():
            text = tokenizer.decode(t.token_ids)
            found = set(re.findall(r"\[Private: (\d+)\]", text))
            assert len(found) == 1, text
            cards[seat] = found.pop()
            assert f"[Observer: {seat}]" in text and f"[Observer: {1 - seat}]" not in text
        rewards = [seats[s].reward for s in (0, 1)]
        assert rewards[0] == pytest.approx(-rewards[1])  # zero-sum


def test_snapshots_round_trip_for_envs_and_games():
    env = make("openspiel:2048")
    env.reset(seed=3, options={"task": 3})
    env.step(env.unwrapped.valid_actions()[0])
    saved = env.unwrapped.snapshot()
    rng = random.Random(0)
    first = [env.step(rng.choice(env.unwrapped.valid_actions()))[:3] for _ in range(5)]
    env.unwrapped.restore(saved)
    rng = random.Random(0)
    again = [env.step(rng.choice(env.unwrapped.valid_actions()))[:3] for _ in range(5)]
    assert first == again  # the chance RNG came back too

    pool = game_pool("openspiel:leduc_poker", 1)
    pool.reset([0], [4], [0])
    saved = pool.snapshot(0)
    before = pool.valid_actions(0, 0)
    view = pool.step([0], [[before[-1]]])[0]
    pool.restore(0, saved)
    assert pool.valid_actions(0, 0) == before
    assert pool.step([0], [[before[-1]]])[0] == view


def test_an_illegal_move_ends_the_game_with_minus_one_for_the_mover():
    pool = game_pool("openspiel:tic_tac_toe", 1)
    pool.reset([0], [0], [0])
    to_move, _, over, rewards, refused = pool.step([0], [["x(9,9)"]])[0]
    assert over and refused == [True] and rewards == [-1.0, 0.0] and to_move == []


def test_tic_tac_toe_by_the_mcts_oracle_through_the_engine_is_drawn(engine):
    batch = engine("oracle", max_turns=9).collect_sync(4, "openspiel:tic_tac_toe")
    trajectories = list(batch)
    assert len(trajectories) == 8
    assert {t.stop_reason for t in trajectories} == {"done"}
    assert {t.reward for t in trajectories} == {0.0}  # perfect play draws


def test_a_one_player_game_runs_through_the_engine_on_worker_processes(engine):
    batch = engine("oracle", max_turns=12, env_workers=2).collect_sync(4, "openspiel:catch")
    assert [t.stop_reason for t in batch] == ["done"] * 4
    assert [t.reward for t in batch] == [1.0] * 4


def test_an_illegal_move_loses_a_one_player_game_when_asked():
    env = make("openspiel:catch", illegal_move="lose")
    env.reset(seed=0, options={"task": 3})
    _, reward, done, _, info = env.step("STAY")
    assert not done and reward == 0.0
    obs, reward, done, _, info = env.step("jump")
    assert done and reward == -1.0 and info["invalid"] and "you lose" in obs
    assert env.unwrapped.valid_actions() == []
    retry = make("openspiel:catch")  # the default answers and goes on
    retry.reset(seed=0, options={"task": 3})
    _, reward, done, _, info = retry.step("jump")
    assert not done and reward == 0.0 and info["invalid"]
    with pytest.raises(ValueError, match="illegal_move"):
        make("openspiel:catch", illegal_move="maybe")
