"""Self-play through the rollout engine (:mod:`agentgym.engine.selfplay`): one episode of a
native game gives one token-exact trajectory per seat, each seat sees only its own side,
the seats of all episodes are generated concurrently, opponents are tagged and never
trained, and one seat's failure ends its episode for every seat while the batch goes on."""

import asyncio
import re

import numpy as np
import pytest

from agentgym.backends.base import BackendError
from agentgym.backends.scripted import ScriptedBackend
from agentgym.data.trajectories import RowInfo, pack, unpack
from agentgym.engine import RolloutEngine
from agentgym.engine.selfplay import seat_players

CARDS = ("Jack", "Queen", "King")
DEALS = [(0, 1), (0, 2), (1, 0), (1, 2), (2, 0), (2, 1)]  # kuhn_poker's, by task index


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


class RecordingBackend(ScriptedBackend):
    """A scripted policy that keeps each request's prompt and reply, and the most requests
    it had in flight at once."""

    def __init__(self, tokenizer, policy="oracle", fail_on=None, **kw):
        super().__init__(tokenizer, policy, **kw)
        self.sent: dict[str, list[tuple[list[int], list[int]]]] = {}
        self.in_flight = self.most_in_flight = 0
        self.fail_on = fail_on

    async def generate(self, prompt_ids, sampling, request_id=None, context=None):
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0)  # let every seat that is due submit before answering
            if self.fail_on is not None and self.fail_on(request_id):
                raise BackendError(f"injected failure on {request_id}")
            res = await super().generate(prompt_ids, sampling, request_id, context)
        finally:
            self.in_flight -= 1
        key = request_id.rsplit("-", 2)[0]
        self.sent.setdefault(key, []).append((list(prompt_ids), list(res.token_ids)))
        return res


@pytest.mark.parametrize("game", ["tictactoe", "kuhn_poker", "negotiation"])
def test_each_seat_is_a_token_exact_trajectory_of_what_it_was_sent(tokenizer, game):
    backend = RecordingBackend(tokenizer, "random", seed=3)
    eng = RolloutEngine(backend, tokenizer, max_turns=12, max_total_tokens=8192)
    batch = eng.collect_sync(6, game, n_samples=2)
    assert len(batch) == 6 * 2 * 2  # two seats per episode
    by_episode: dict[int, list] = {}
    for t in batch:
        by_episode.setdefault(t.episode_id, []).append(t)
        assert t.player == "policy" and t.role is not None
        sent = backend.sent[f"{eng.run_id}-{t.episode_id * 2 + t.seat}"]
        assert len(sent) == t.num_turns
        for prompt, reply in sent:  # each request is the record so far, the reply follows
            assert t.token_ids[:len(prompt)] == prompt
            assert t.token_ids[len(prompt):len(prompt) + len(reply)] == reply
            assert t.loss_mask[len(prompt):len(prompt) + len(reply)] == [1] * len(reply)
        assert sum(t.loss_mask) == sum(len(r) for _, r in sent)  # nothing else is trained
    for seats in by_episode.values():
        assert sorted(s.seat for s in seats) == [0, 1]
        assert len({(s.group_id, s.sample_index, s.task_id) for s in seats}) == 1
        assert {s.stop_reason for s in seats} == {"done"}


def test_a_kuhn_seat_never_sees_the_other_card(tokenizer):
    eng = RolloutEngine(RecordingBackend(tokenizer, "random", seed=1), tokenizer, max_turns=4)
    batch = eng.collect_sync(list(range(6)), "kuhn_poker", n_samples=4)
    for t in batch:
        own = CARDS[DEALS[t.task_id][t.seat]]
        after_rules = tokenizer.decode(t.token_ids).split("<|im_start|>user", 1)[1]
        assert f"Your card: the {own}." in after_rules
        for other in set(CARDS) - {own}:
            assert other not in after_rules, (t.seat, after_rules)


def test_the_seats_of_every_episode_are_generated_together(tokenizer):
    backend = RecordingBackend(tokenizer, "oracle")
    eng = RolloutEngine(backend, tokenizer, max_turns=9, max_concurrency=32)
    eng.collect_sync(32, "tictactoe")
    # one seat moves at a time in tic-tac-toe: every game's mover is in flight together
    assert backend.most_in_flight == 32


def test_opponents_play_their_seats_and_are_never_trained(tokenizer):
    eng = RolloutEngine(ScriptedBackend(tokenizer, "random", seed=2), tokenizer, max_turns=9,
                        opponent="solver")
    batch = eng.collect_sync(8, "tictactoe", n_samples=2)
    for t in batch:
        learner = t.group_id % 2
        assert t.player == ("policy" if t.seat == learner else "solver")
        if t.player == "solver":
            assert sum(t.loss_mask) == 0 and not any(t.logprobs)
        else:
            assert sum(t.loss_mask) > 0
    # the solver never loses tic-tac-toe
    episodes: dict[int, dict[str, float]] = {}
    for t in batch:
        episodes.setdefault(t.episode_id, {})[t.player] = t.reward
    assert all(e["solver"] >= e["policy"] for e in episodes.values())
    assert any(e["solver"] > e["policy"] for e in episodes.values())


@pytest.mark.parametrize("reply_prefix", ["", "Action:"])
def test_the_scripted_opponents_moves_are_never_cut_by_the_models_budget(tokenizer,
                                                                           reply_prefix):
    # The policy's replies ("5" or " 5" after the prompt's "Action:", then the end of turn)
    # fit max_new_tokens; the solver's "Action: 5" and its end of turn (5 tokens) do not.
    # The solver still plays every move whole (continuing the reply prefix where there is
    # one): it never makes an illegal move and never loses.
    policy = ScriptedBackend(tokenizer, "random", seed=2,
                             template="Action: {action}" if reply_prefix else "{action}",
                             reply_prefix=reply_prefix)
    eng = RolloutEngine(policy, tokenizer, max_turns=9, opponent="solver",
                        reply_prefix=reply_prefix, max_new_tokens=3 if reply_prefix else 2)
    batch = eng.collect_sync(8, "tictactoe", n_samples=2)
    solver = [t for t in batch if t.player == "solver"]
    assert len(solver) == 16 and all(t.stop_reason == "done" for t in batch)
    assert sum(t.timings.get("invalid_turns", 0) for t in batch) == 0
    eot = re.escape(tokenizer.eos_token)
    for t in solver:  # every move whole: "Action: N" (the prefix, if any, in the prompt)
        text = tokenizer.decode(t.token_ids)
        assert len(re.findall(rf"assistant\nAction: \d{eot}", text)) == t.num_turns > 0
    episodes: dict[int, dict[str, float]] = {}
    for t in batch:
        episodes.setdefault(t.episode_id, {})[t.player] = t.reward
    assert all(e["solver"] >= e["policy"] for e in episodes.values())


def test_a_scripted_reply_continues_the_reply_prefix(tokenizer):
    be = ScriptedBackend(tokenizer, "oracle", template="Action: {action}",
                         reply_prefix="Action:")
    eng = RolloutEngine(be, tokenizer, max_turns=9, reply_prefix="Action:")
    batch = eng.collect_sync([0, 1, 5], "tictactoe")
    assert {t.reward for t in batch} == {0.0}  # the solver against itself draws
    for t in batch:
        text = tokenizer.decode(t.token_ids)
        assert "Action:Action" not in text and "Action: Action" not in text
        reply = t.token_ids[t.loss_mask.index(1):][:2]
        assert re.fullmatch(r" \d", tokenizer.decode(reply))


def test_solver_against_solver_draws_every_opening(tokenizer):
    eng = RolloutEngine(ScriptedBackend(tokenizer, "oracle"), tokenizer, max_turns=9)
    batch = eng.collect_sync([0, 1, 5], "tictactoe")
    assert {t.reward for t in batch} == {0.0}
    assert {t.stop_reason for t in batch} == {"done"}


def test_seat_players_rotate_the_policy_seat_by_group():
    assert seat_players("self", 5, 0, 2) == ["policy", "policy"]
    assert seat_players("solver", 4, 0, 2) == ["policy", "solver"]
    assert seat_players("random", 5, 0, 2) == ["random", "policy"]
    picks = {seat_players("pool", 0, seed, 2, ["pool:v0", "pool:v3"])[1] for seed in range(40)}
    assert picks == {"pool:v0", "pool:v3"}
    with pytest.raises(ValueError, match="opponent backends"):
        seat_players("pool", 0, 0, 2, [])


def test_an_opponent_backend_plays_under_its_own_version(tokenizer):
    eng = RolloutEngine(ScriptedBackend(tokenizer, "random"), tokenizer, max_turns=4,
                        opponent="pool")
    old = ScriptedBackend(tokenizer, "oracle")
    old.policy_version = 7
    eng.opponents["pool:v7"] = old
    eng.backend.policy_version = 9
    batch = eng.collect_sync(6, "kuhn_poker")
    assert {(t.player, t.policy_version) for t in batch} == {("policy", 9), ("pool:v7", 7)}


def test_an_unreadable_move_ends_the_game_against_its_seat(tokenizer):
    class Babbler(ScriptedBackend):
        """Seat 1 writes no action at all."""

        async def generate(self, prompt_ids, sampling, request_id=None, context=None):
            if context[0].seat == 1:
                ids = self._encode("I am not sure.") + [self.end_of_turn_id]
                from agentgym.backends.base import GenerateResult

                return GenerateResult(token_ids=ids, logprobs=[0.0] * len(ids),
                                      finish_reason="stop", policy_version=0)
            return await super().generate(prompt_ids, sampling, request_id, context)

    eng = RolloutEngine(Babbler(tokenizer, "oracle"), tokenizer, max_turns=9)
    batch = eng.collect_sync(4, "tictactoe")
    for t in batch:
        assert t.stop_reason == "done"
        if t.seat == 1:
            assert (t.reward, t.num_turns, t.timings.get("invalid_turns")) == (-1.0, 1, 1.0)
        else:  # X moved once, or never where the opening gives O the first move
            assert t.reward == 0.0 and t.num_turns <= 1


def test_a_backend_failure_on_one_seat_ends_its_episode_for_every_seat(tokenizer):
    def fail(request_id):  # episode 2's second seat, on its first reply
        return request_id.rsplit("-", 3)[1:3] == [str(2 * 2 + 1), "0"]

    backend = RecordingBackend(tokenizer, "oracle", fail_on=fail)
    eng = RolloutEngine(backend, tokenizer, max_turns=9, backend_retries=1,
                        retry_backoff_s=0.0)
    eng.reseed(0, key_start=0)
    batch = eng.collect_sync(4, "tictactoe")
    failed = [t for t in batch if t.episode_id == 2]
    assert [t.stop_reason for t in failed] == ["backend_error", "backend_error"]
    assert all(sum(t.loss_mask) == 0 for t in failed)  # a failed row never trains
    assert {t.stop_reason for t in batch if t.episode_id != 2} == {"done"}


def test_a_game_that_panics_ends_its_episode_for_every_seat(tokenizer):
    class Panicker(ScriptedBackend):
        """Seat 1 of the episodes of group 1 makes the test game panic."""

        async def generate(self, prompt_ids, sampling, request_id=None, context=None):
            view, slot = context[0], context[1]
            if view.seat == 1 and self.panic_slot == slot:
                ids = self._encode("Action: panic") + [self.end_of_turn_id]
                from agentgym.backends.base import GenerateResult

                return GenerateResult(token_ids=ids, logprobs=[0.0] * len(ids),
                                      finish_reason="stop", policy_version=0)
            return await super().generate(prompt_ids, sampling, request_id, context)

    backend = Panicker(tokenizer, "oracle")
    backend.panic_slot = 1
    eng = RolloutEngine(backend, tokenizer, max_turns=4, max_concurrency=4)
    batch = eng.collect_sync(4, "_test_panic_game")
    by_slot_one = [t for t in batch if t.stop_reason == "env_error"]
    assert len(by_slot_one) == 2 and {t.seat for t in by_slot_one} == {0, 1}
    assert len({t.episode_id for t in by_slot_one}) == 1
    assert all("panic" in t.error and sum(t.loss_mask) == 0 for t in by_slot_one)
    rest = [t for t in batch if t.episode_id != by_slot_one[0].episode_id]
    assert len(rest) == 6 and {t.stop_reason for t in rest} == {"done"}
    assert {t.num_turns for t in rest} == {2}  # 4 moves, 2 per seat
    # the slot's game is rebuilt for its next episode
    backend.panic_slot = None
    again = eng.collect_sync(4, "_test_panic_game", max_concurrency=4)
    assert {t.stop_reason for t in again} == {"done"} and len(again) == 8


def test_simultaneous_seats_are_generated_together_and_stepped_once(tokenizer):
    backend = RecordingBackend(tokenizer, "oracle")
    eng = RolloutEngine(backend, tokenizer, max_turns=4, max_concurrency=8)
    batch = eng.collect_sync(8, "_test_panic_game", env_kwargs={"simultaneous": True})
    assert len(batch) == 16 and {t.stop_reason for t in batch} == {"done"}
    assert {t.num_turns for t in batch} == {2}  # 4 moves, both seats each round
    assert backend.most_in_flight == 16  # both seats of all 8 games at once
    for t in batch:  # each seat's record is still its own, token-exact
        sent = backend.sent[f"{eng.run_id}-{t.episode_id * 2 + t.seat}"]
        for prompt, _ in sent:
            assert t.token_ids[:len(prompt)] == prompt


def test_a_seat_that_times_out_ends_its_episode_for_every_seat(tokenizer):
    class Stuck(ScriptedBackend):
        """Seat 1 of the game in slot 2 never answers."""

        async def generate(self, prompt_ids, sampling, request_id=None, context=None):
            if context[0].seat == 1 and context[1] == 2:
                await asyncio.sleep(60)
            return await super().generate(prompt_ids, sampling, request_id, context)

    eng = RolloutEngine(Stuck(tokenizer, "oracle"), tokenizer, max_turns=9, max_concurrency=4,
                        episode_timeout_s=1.0)
    batch = eng.collect_sync(4, "tictactoe")
    stuck = [t for t in batch if t.stop_reason == "timeout"]
    assert len(stuck) == 2 and len({t.episode_id for t in stuck}) == 1
    assert all(sum(t.loss_mask) == 0 for t in stuck)
    assert {t.stop_reason for t in batch if t not in stuck} == {"done"}


def test_single_agent_mechanisms_are_refused_on_a_game(tokenizer):
    eng = RolloutEngine(ScriptedBackend(tokenizer), tokenizer)
    for kw in ({"undo": True}, {"reflection": 1}, {"context_window": 2}, {"plan": True}):
        with pytest.raises(ValueError, match="multi-seat game"):
            eng.collect_sync(1, "tictactoe", **kw)
    with pytest.raises(ValueError, match="unknown opponent"):
        eng.collect_sync(1, "tictactoe", opponent="nobody")


def test_packed_batches_carry_the_seats(tokenizer):
    eng = RolloutEngine(ScriptedBackend(tokenizer, "random"), tokenizer, max_turns=6,
                        opponent="random")

    async def go():
        return [b async for b in eng.stream_batches(eng.requests(6), "kuhn_poker")]

    batches = asyncio.run(go())
    trajs = [t for b in batches for t in b.trajectories]
    assert len(trajs) == 12
    for b in batches:
        assert b.packed.seat.tolist() == [t.seat for t in b.trajectories]
        assert unpack(b.packed, b.info) == b.trajectories
    packed = pack(trajs)
    assert np.array_equal(packed.seat, [t.seat for t in trajs])
    info = RowInfo.of(trajs)
    assert unpack(packed, info) == trajs
    # rows of single-agent and game batches concatenate; the single-agent rows stay untagged
    single = eng.collect_sync(2, "maze").trajectories
    mixed = RowInfo.concat([RowInfo.of(single), info])
    assert mixed.seat_info[:2] == [None, None] and mixed.seat_info[2] is not None
    assert RowInfo.of(single).seat_info is None
