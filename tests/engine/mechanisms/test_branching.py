"""Branched groups (``RolloutConfig.branch_at``): a group played as trees that fork the env
mid-episode, through the native pool and the Python driver. The pool's ``fork`` is tested
in ``tests/test_pool_snapshots.py`` and the store's in ``rust/core/src/trajectory/tests.rs``;
the advantages of a tree in ``tests/learner/test_advantages.py``."""

import asyncio

import msgspec
import pytest

import agentgym
from agentgym import _core
from agentgym.backends.scripted import ScriptedBackend
from agentgym.engine import RolloutEngine
from agentgym.engine.config import RolloutConfig
from agentgym.errors import SnapshotUnsupportedError
from tests.helpers import LineEnv, mask_runs


class Line(LineEnv):
    """``LineEnv`` whose move to cell ``p`` earns ``0.25 * p`` and whose goal is cell 9:
    rewards depend on the state, so a continuation played from a wrong state shows in
    them."""

    goal = 9

    def step_reward(self, pos: int) -> float:
        return 0.25 * pos


class SnapshotFailsLate(Line):
    """``Line`` whose ``snapshot()`` raises once the episode has begun."""

    def snapshot(self):
        if getattr(self, "pos", 0) > 0 or getattr(self, "stays", 0):
            raise RuntimeError("this state cannot be copied")
        return super().snapshot()

    def step(self, action):
        self.stays = getattr(self, "stays", 0) + 1
        return super().step(action)


agentgym.register("test/branch_line", Line, override=True)
agentgym.register("test/branch_line_snapshot_fails", SnapshotFailsLate, override=True)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _actions(tokenizer, traj, start: int = 0) -> list[str]:
    """The actions of the replies from token ``start`` on (both masks: a child's prefix has
    mask 0), read as the engine parses them."""
    runs = [(a, z) for m, a, z in mask_runs(traj.loss_mask) if m and a >= start]
    return [_core.parse_action(tokenizer.decode(traj.token_ids[a:z])) for a, z in runs]


def _replay(env_id, env_kwargs, traj, actions):
    """``actions`` played in a fresh env with the trajectory's task and seed: the rewards
    and whether it ended."""
    env = agentgym.make(env_id, **env_kwargs)
    env.reset(seed=traj.seed, options={"task": traj.task_id})
    rewards, ended = [], False
    for a in actions:
        _, r, term, trunc, _ = env.step(a)
        rewards.append(float(r))
        ended = term
        if term:
            break
    env.close()
    return rewards, ended


@pytest.mark.parametrize("env_id, env_kwargs", [("maze", {"shaping": 0.5}),
                                                ("test/branch_line", {})])
def test_a_tree_forks_the_env_and_each_child_continues_from_its_state(tokenizer, env_id,
                                                                       env_kwargs):
    eng = RolloutEngine(ScriptedBackend(tokenizer, policy="random"), tokenizer,
                        max_turns=8, max_total_tokens=8192, n_samples=4, branch_at=3,
                        branch_width=2, max_concurrency=4)
    batch = eng.collect_sync(4, env_id, env_kwargs=env_kwargs)
    assert len(batch) == 16
    forked = 0
    by_group: dict[int, list] = {}
    for t in batch:
        by_group.setdefault(t.group_id, []).append(t)
    for group in by_group.values():
        assert [t.sample_index for t in group] == [0, 1, 2, 3]
        for root, child in (group[0:2], group[2:4]):
            if child.branch_parent is None:  # the root ended before turn 3
                assert root.branch_parent is None and root.num_turns < 3, \
                    (root.stop_reason, child.stop_reason, child.error)
                continue
            forked += 1
            pos = root.branch_pos
            assert root.branch_parent == child.branch_parent == root.sample_index
            assert root.branch_turn == child.branch_turn == 3 and child.branch_pos == pos
            # The shared prefix: the same tokens, trained once (the child's copy masked).
            assert child.token_ids[:pos] == root.token_ids[:pos]
            assert not any(child.loss_mask[:pos]) and sum(root.loss_mask[:pos]) > 0
            assert child.prompt_len >= pos and child.turn_rewards[:3] == root.turn_rewards[:3]
            # The child went on from the forked state: replaying its whole path in a fresh
            # env gives the rewards it was given.
            path = _actions(tokenizer, root)[:3] + _actions(tokenizer, child, pos)
            rewards, ended = _replay(env_id, env_kwargs, child, path)
            assert rewards == pytest.approx(child.turn_rewards)
            assert ended == (child.stop_reason == "done")
            assert len(child.turn_rewards) == child.num_turns
    assert forked >= 4
    eng.close()


def test_a_streamed_feed_is_played_as_trees(tokenizer):
    eng = RolloutEngine(ScriptedBackend(tokenizer, policy="random"), tokenizer,
                        max_turns=6, max_total_tokens=8192, branch_at=2, branch_width=3,
                        max_concurrency=6)
    reqs = eng.requests(2, 3)

    async def feed():
        for r in reqs:
            await asyncio.sleep(0)
            yield r

    async def main():
        return [t async for t in eng.stream_requests(feed(), "test/branch_line")]

    trajs = sorted(asyncio.run(main()), key=lambda t: (t.group_id, t.sample_index))
    assert len(trajs) == 6
    for k in (0, 3):
        root, *kids = trajs[k:k + 3]
        assert root.branch_turn == 2
        assert all(c.branch_parent == root.sample_index for c in kids)
    eng.close()


class Unsure(ScriptedBackend):
    """The random policy, reporting a logprob of -3 a token on turn ``unsure`` of every
    episode and -0.1 elsewhere."""

    def __init__(self, tokenizer, unsure: int):
        super().__init__(tokenizer, policy="random")
        self.unsure = unsure

    async def generate(self, prompt_ids, sampling, request_id=None, context=None):
        res = await super().generate(prompt_ids, sampling, request_id, context)
        lp = -3.0 if int(request_id.rsplit("-", 2)[1]) == self.unsure else -0.1
        return msgspec.structs.replace(res, logprobs=[lp] * len(res.token_ids))


def test_a_tree_forks_early_after_a_turn_whose_surprisal_is_high(tokenizer):
    # turn index 1 (the second reply) is uncertain: the fork comes after 2 turns, not 5
    eng = RolloutEngine(Unsure(tokenizer, unsure=1), tokenizer, max_turns=8,
                        max_total_tokens=8192, n_samples=2, branch_at=5, branch_entropy=2.0)
    forked = [t for t in eng.collect_sync(4, "test/branch_line") if t.branch_parent is not None]
    assert forked and {t.branch_turn for t in forked} == {2}
    calm = RolloutEngine(Unsure(tokenizer, unsure=1), tokenizer, max_turns=8,
                         max_total_tokens=8192, n_samples=2, branch_at=5, branch_entropy=4.0)
    forked = [t for t in calm.collect_sync(4, "test/branch_line") if t.branch_parent is not None]
    assert forked and {t.branch_turn for t in forked} == {5}
    eng.close()
    calm.close()


def test_a_root_that_ends_before_the_fork_leaves_its_siblings_to_play_alone(tokenizer):
    plain = RolloutEngine(ScriptedBackend(tokenizer), tokenizer, max_turns=20, n_samples=2)
    base = plain.collect_sync(2, "test/branch_line")
    eng = RolloutEngine(ScriptedBackend(tokenizer), tokenizer, max_turns=20, n_samples=2,
                        branch_at=12, branch_width=2)
    batch = eng.collect_sync(2, "test/branch_line")
    # the oracle reaches the goal in 9 turns: no fork, every sample played from the start
    for ref, t in zip(base, batch):
        assert t.branch_parent is None and (t.branch_turn, t.branch_pos) == (0, 0)
        assert t.token_ids == ref.token_ids and t.loss_mask == ref.loss_mask
        assert t.success
    eng.close()
    plain.close()


def test_a_fork_the_env_refuses_ends_only_the_siblings(tokenizer):
    eng = RolloutEngine(ScriptedBackend(tokenizer), tokenizer, max_turns=20, n_samples=2,
                        branch_at=2, branch_width=2)
    root, child = eng.collect_sync(1, "test/branch_line_snapshot_fails")
    assert root.success and root.branch_parent is None
    assert child.stop_reason == "env_error" and "fork failed" in child.error
    assert "cannot be copied" in child.error and not any(child.loss_mask)
    eng.close()


@pytest.mark.parametrize("env_id, kwargs", [("test/no_snapshots", {}),
                                            ("test/branch_line", {"env_workers": 1})])
def test_branching_where_envs_cannot_fork_fails_before_any_episode(tokenizer, env_id, kwargs):
    from tests.engine.mechanisms.test_undo import NoSnapshots  # noqa: F401  (registers test/no_snapshots)

    backend = ScriptedBackend(tokenizer)
    eng = RolloutEngine(backend, tokenizer, branch_at=1, n_samples=2)
    with pytest.raises(SnapshotUnsupportedError, match="branched groups"):
        eng.collect_sync(2, env_id, **kwargs)
    assert backend.requests == 0


def test_branch_settings_are_checked():
    with pytest.raises(ValueError, match="branch_width"):
        RolloutConfig(branch_at=2, branch_width=1)
    with pytest.raises(ValueError, match="max_concurrency"):
        RolloutConfig(branch_at=2, branch_width=4, max_concurrency=2)
    with pytest.raises(ValueError, match="reflection"):
        RolloutConfig(branch_at=2, reflection=1)
    with pytest.raises(ValueError, match="branch_at"):
        RolloutConfig(branch_at=-1)
    RolloutConfig(branch_width=1)  # unused without branch_at
