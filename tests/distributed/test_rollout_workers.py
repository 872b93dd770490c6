"""RayRolloutPool on a real local Ray cluster (2 CPUs, 127.0.0.1): every request once, the
engine's trajectories, load balancing, a killed worker's episodes re-run, weight sync, a
failing backend kept as data, a worker that cannot start, multi-seat games (a row per seat,
whole episodes), and the trainer on Ray workers."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("transformers")

from agentgym.distributed.rollout_workers import (  # noqa: E402
    RayRolloutPool,
    RolloutWorkerError,
    WorkerSpec,
)
from agentgym.engine import EpisodeRequest, RolloutEngine  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

#: Logical CPUs per test worker: several pools fit on the 2-CPU test cluster.
CPU = 0.25


@pytest.fixture(scope="module")
def ray_cluster():
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             _node_ip_address="127.0.0.1")
    yield
    ray.shutdown()


def scripted(model_dir, latency_s=0.0, **rollout):
    return WorkerSpec(model_dir, backend="scripted",
                      backend_kwargs={"policy": "oracle", "latency_s": latency_s},
                      rollout={"max_turns": 20, "max_concurrency": 8, **rollout}, num_cpus=CPU)


@pytest.fixture(scope="module")
def pool(ray_cluster, tiny_model_dir):
    p = RayRolloutPool(scripted(tiny_model_dir), num_workers=2, chunk_size=2)
    yield p
    p.close()


def play(pool_or_engine, reqs, on_item=None, env="maze", **kw):
    async def go():
        out = []
        async for t in pool_or_engine.stream_requests(reqs, env, **kw):
            out.append(t)
            if on_item is not None:
                on_item(len(out))
        return out

    return asyncio.run(go())


def play_killing(pool, reqs, worker, after, **kw):
    """``play`` with worker ``worker`` killed once ``after`` trajectories came back; the
    trajectories and the killed actor."""
    asyncio.run(pool.start())
    victim = pool.actor(worker)

    def kill(n):
        if n == after:
            ray.kill(victim)

    return play(pool, reqs, on_item=kill, **kw), victim


def keys(trajs):
    return sorted((t.task_id, t.group_id, t.sample_index) for t in trajs)


def expected(reqs):
    return sorted((r.task, r.group_id, r.sample_index) for r in reqs)


def test_pool_plays_every_request_once_as_the_engine_does(pool, tiny_model_dir):
    from transformers import AutoTokenizer

    from agentgym.backends.scripted import ScriptedBackend

    reqs = [EpisodeRequest(g % 7, g, s) for g in range(30) for s in range(2)]
    before = dict(pool.served)
    got = play(pool, reqs)
    assert keys(got) == expected(reqs) and len(got) == len(reqs)
    assert all(pool.served[w] > before.get(w, 0) for w in range(2))  # both workers played
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    engine = RolloutEngine(ScriptedBackend(tok, policy="oracle"), tok, max_turns=20)
    want = {(t.group_id, t.sample_index): t for t in play(engine, reqs)}
    for t in got:
        w = want[(t.group_id, t.sample_index)]
        assert (t.seed, t.token_ids, t.loss_mask, t.reward, t.stop_reason) == (
            w.seed, w.token_ids, w.loss_mask, w.reward, w.stop_reason)
        assert "rollout/retries" not in t.timings
    batch = asyncio.run(pool.collect(5, "maze", n_samples=3))
    assert [(t.group_id, t.sample_index) for t in batch] == sorted(
        (t.group_id, t.sample_index) for t in batch) and len(batch) == 15


def test_pool_plays_branched_groups_as_the_engine_does(pool, tiny_model_dir):
    """Trees of two samples (chunks of two requests, in group order, reach one worker
    whole): the same forks, prefixes and masks as the in-process engine."""
    from transformers import AutoTokenizer

    from agentgym.backends.scripted import ScriptedBackend

    reqs = [EpisodeRequest(g % 7, 1000 + g, s) for g in range(6) for s in range(4)]
    branching = {"branch_at": 2, "branch_width": 2}
    got = play(pool, reqs, **branching)
    assert keys(got) == expected(reqs)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    engine = RolloutEngine(ScriptedBackend(tok, policy="oracle"), tok, max_turns=20,
                           **branching)
    want = {(t.group_id, t.sample_index): t for t in play(engine, reqs)}
    forked = 0
    for t in got:
        w = want[(t.group_id, t.sample_index)]
        assert (t.branch_parent, t.branch_turn, t.branch_pos) == (
            w.branch_parent, w.branch_turn, w.branch_pos)
        assert (t.token_ids, t.loss_mask, t.reward) == (w.token_ids, w.loss_mask, w.reward)
        forked += t.branch_parent is not None and t.branch_parent != t.sample_index
    assert forked >= 6


def test_pool_plays_bounded_contexts_as_the_engine_does(pool, tiny_model_dir):
    """``context_window``: the workers' trajectories carry the in-process engine's steps."""
    from transformers import AutoTokenizer

    from agentgym.backends.scripted import ScriptedBackend

    reqs = [EpisodeRequest(g % 7, 2000 + g, 0) for g in range(8)]
    got = play(pool, reqs, context_window=1)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    engine = RolloutEngine(ScriptedBackend(tok, policy="oracle"), tok, max_turns=20,
                           context_window=1)
    want = {(t.group_id, t.sample_index): t for t in play(engine, reqs)}
    for t in got:
        w = want[(t.group_id, t.sample_index)]
        assert (t.step_context, t.step_reply, t.step_end) == (w.step_context, w.step_reply,
                                                              w.step_end)
        assert len(t.step_reply) == t.num_turns and t.token_ids == w.token_ids


def by_episode(trajs):
    eps: dict[int, list] = {}
    for t in trajs:
        eps.setdefault(t.episode_id, []).append(t)
    return eps


@pytest.mark.parametrize(("game", "opponent"), [("tictactoe", "random"),
                                                ("kuhn_poker", "self")])
def test_pool_plays_a_game_as_the_engine_does(pool, tiny_model_dir, game, opponent):
    """A game's request comes back as one row per seat, the seats of an episode together
    under one episode id no other episode of the run has (two workers), each row equal to
    the in-process engine's."""
    from transformers import AutoTokenizer

    from agentgym.backends.scripted import ScriptedBackend

    reqs = [EpisodeRequest(g % 6, 3 * 10**6 + g, s) for g in range(12) for s in range(2)]
    before = dict(pool.served)
    got = play(pool, reqs, env=game, opponent=opponent)
    assert len(got) == 2 * len(reqs)
    assert all(pool.served[w] > before.get(w, 0) for w in range(2))  # both workers played
    eps = by_episode(got)
    assert len(eps) == len(reqs)
    assert sorted((ts[0].group_id, ts[0].sample_index) for ts in eps.values()) == sorted(
        (r.group_id, r.sample_index) for r in reqs)
    assert all(sorted(t.seat for t in ts) == [0, 1] for ts in eps.values())
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    engine = RolloutEngine(ScriptedBackend(tok, policy="oracle"), tok, max_turns=20)
    want = {(t.group_id, t.sample_index, t.seat): t
            for t in play(engine, reqs, env=game, opponent=opponent)}
    for t in got:
        w = want[(t.group_id, t.sample_index, t.seat)]
        assert (t.token_ids, t.loss_mask, t.reward, t.stop_reason, t.role, t.player) == (
            w.token_ids, w.loss_mask, w.reward, w.stop_reason, w.role, w.player)
    batch = asyncio.run(pool.collect(3, game, n_samples=2, opponent=opponent))
    assert [(t.group_id, t.sample_index, t.seat) for t in batch] == sorted(
        (t.group_id, t.sample_index, t.seat) for t in batch) and len(batch) == 12


def test_a_killed_workers_games_come_back_whole_exactly_once(pool):
    reqs = [EpisodeRequest(g % 6, 4 * 10**6 + g, 0) for g in range(160)]
    deaths = pool.stats["worker_deaths"]
    got, _ = play_killing(pool, reqs, worker=1, after=6, env="tictactoe")
    assert pool.stats["worker_deaths"] == deaths + 1
    eps = by_episode(got)
    assert len(got) == 2 * len(reqs) and len(eps) == len(reqs)
    assert sorted(ts[0].group_id for ts in eps.values()) == [r.group_id for r in reqs]
    for ts in eps.values():
        assert sorted(t.seat for t in ts) == [0, 1]
        assert {t.stop_reason for t in ts} == {"done"} and all(t.token_ids for t in ts)
    assert any(t.timings.get("rollout/retries") for t in got)


def test_whole_episodes_are_held_until_every_seat_has_drained():
    from agentgym.data import RowInfo, Trajectory, pack
    from agentgym.distributed.rollout_workers import _WholeEpisodes

    def rows(*pairs):  # (episode id, seat)
        ts = [Trajectory(task_id=0, env_id="tictactoe", group_id=e, sample_index=0,
                         token_ids=[e, s], loss_mask=[0, 1], logprobs=[0.0, 0.0],
                         prompt_len=1, turn_rewards=[0.0], reward=0.0, num_turns=1,
                         stop_reason="done", policy_version=0, seat=s, role="XO"[s],
                         player="policy", episode_id=e) for e, s in pairs]
        return pack(ts), RowInfo.of(ts)

    held = _WholeEpisodes(2)
    whole = held.add(*rows((1, 0), (1, 1), (2, 0), (2, 1)))  # whole episodes pass straight
    assert whole[0].token_ids.tolist() == [1, 0, 1, 1, 2, 0, 2, 1]
    assert held.add(*rows((3, 0), (4, 0))) is None
    packed, info = held.add(*rows((5, 0), (4, 1), (5, 1)))
    assert [x[0] for x in info.seat_info] == [4, 4, 5, 5]  # each episode's rows together
    assert packed.seat.tolist() == [0, 1, 0, 1]
    packed, info = held.add(*rows((3, 1)))
    assert [x[0] for x in info.seat_info] == [3, 3] and not held.rows and not held.held


def test_worker_messages_carry_every_trajectory_field_exactly():
    """What a worker sends is what the driver yields: every field of a model's trajectory
    (logprobs on the model tokens), of a scripted one (all logprobs 0.0), of a failed one
    (an error, a string task id) and of one with image observations comes back equal, in
    order, with its request index. The worker sends them packed, as its engine drains them."""
    from agentgym.data.frames import frame_of
    from agentgym.data.trajectories import RowInfo, Trajectory, pack, unpack
    from agentgym.distributed.rollout_workers import _decode_rows, _encode

    def traj(k, **kw):
        base = dict(task_id=k, env_id="maze", group_id=10 + k, sample_index=k % 2,
                    token_ids=[5, 900, 70000, 3, 1], loss_mask=[0, 0, 1, 1, 0],
                    logprobs=[0.0, 0.0, -0.25, -(2.0 ** -30), 0.0], prompt_len=2,
                    turn_rewards=[0.0, 0.5], reward=0.5, num_turns=2, stop_reason="done",
                    policy_version=3, timings={"total_s": 0.125, "gen_s": 0.0625}, seed=k)
        return Trajectory(**{**base, **kw})

    sent = [(4, traj(0)), (0, traj(1, logprobs=[0.0] * 5)),
            (7, traj(2, task_id="t-2", stop_reason="backend_error", loss_mask=[0] * 5,
                     logprobs=[0.0, -0.5, 0.0, 0.0, -2.0], error="boom",
                     timings={"total_s": 0.5, "gen_s": 0.0})),
            (1, traj(3, token_ids=[], loss_mask=[], logprobs=[], turn_rewards=[])),
            (9, traj(4, step_context=[2, 2], step_reply=[2, 3], step_end=[3, 4])),
            (3, traj(5, images=[frame_of(np.full((28, 28, 3), 9, np.uint8)),
                                frame_of(np.full((28, 56, 3), 200, np.uint8))],
                     image_refs=[1, 0, 1]))]
    trajs = [t for _, t in sent]
    index, packed, info = _decode_rows(_encode([i for i, _ in sent], pack(trajs),
                                               RowInfo.of(trajs)))
    assert index == [i for i, _ in sent]
    assert info == RowInfo.of(trajs)
    got = unpack(packed, info)
    for g, (_, w) in zip(got, sent, strict=True):
        assert g == w
        assert type(g.loss_mask) is list and type(g.logprobs) is list


def test_a_faster_worker_takes_more_requests(ray_cluster, tiny_model_dir):
    """Worker 1 plays 16 episodes at once, worker 0 one, every reply taking 5 ms on both:
    handed out in chunks as results come back, worker 1 ends up with more of the requests (a
    static split gives each half)."""
    specs = [scripted(tiny_model_dir, latency_s=0.005, max_concurrency=1),
             scripted(tiny_model_dir, latency_s=0.005, max_concurrency=16)]
    p = RayRolloutPool(specs, chunk_size=2)
    try:
        reqs = [EpisodeRequest(g, g) for g in range(200)]
        got = play(p, reqs)
        assert keys(got) == expected(reqs)
        assert p.served[0] + p.served[1] == 200
        assert p.served[1] > p.served[0], dict(p.served)
    finally:
        p.close()


def test_pool_streams_packed_rows_as_the_engine_does(pool):
    """``stream_batches`` on the pool: each request's row exactly once, one batch per worker
    message, the same rows as the pool's trajectories (``trajectories=False``: no
    Trajectory objects; ``True``: the batch's trajectories are its rows unpacked)."""
    from agentgym.data import PackedBatch, RowInfo, unpack

    reqs = [EpisodeRequest(g % 5, 3 * 10**6 + g, s) for g in range(40) for s in range(2)]

    def stream(**kw):
        async def go():
            return [b async for b in pool.stream_batches(reqs, "maze", **kw)]

        return asyncio.run(go())

    rows_only = stream(trajectories=False)
    assert len(rows_only) > 1 and all(b.trajectories is None for b in rows_only)
    packed = PackedBatch.concat([b.packed for b in rows_only])
    info = RowInfo.concat([b.info for b in rows_only])
    got = unpack(packed, info)
    assert keys(got) == expected(reqs) and len(got) == len(reqs)
    want = {(t.group_id, t.sample_index): t for t in play(pool, reqs)}
    for t in got:
        w = want[(t.group_id, t.sample_index)]
        assert (t.task_id, t.seed, t.token_ids, t.loss_mask, t.turn_rewards, t.stop_reason) == (
            w.task_id, w.seed, w.token_ids, w.loss_mask, w.turn_rewards, w.stop_reason)
    for b in stream(trajectories=True):
        assert b.trajectories == unpack(b.packed, b.info)


def test_a_row_delivered_twice_reaches_the_caller_once(pool):
    """A re-run request whose first worker's message still arrives: the second copy of its
    row is dropped from the batch (and counted), the other rows of that batch go on."""
    from agentgym.data import RowInfo, pack
    from agentgym.distributed.rollout_workers import _PoolRun
    from agentgym.engine.orchestrator import EpisodeBatch

    reqs = [tuple(EpisodeRequest(k, k, 0)) for k in range(4)]
    trajs = {k: _PoolRun(pool, reqs, "maze", {}, {})._gave_up(k)[0] for k in range(4)}
    for k, t in trajs.items():
        t.stop_reason, t.token_ids, t.loss_mask, t.logprobs = "done", [k + 1], [1], [-0.5]
    run = _PoolRun(pool, reqs, "maze", {}, {}, batches=True, trajectories=False)
    dropped = pool.stats["duplicates_dropped"]

    def deliver(index):
        ts = [trajs[i] for i in index]
        run._deliver(index, pack(ts), RowInfo.of(ts), worker=0)

    deliver([0, 1, 2])
    deliver([2, 3])
    deliver([1])
    out = [run.out.get_nowait() for _ in range(run.out.qsize())]
    assert all(isinstance(b, EpisodeBatch) for b in out) and len(out) == 2
    assert [b.packed.token_ids.tolist() for b in out] == [[1, 2, 3], [4]]
    assert out[1].info.task_id == [3] and run.left == 0
    assert pool.stats["duplicates_dropped"] == dropped + 2


def test_killed_worker_requests_rerun_exactly_once(pool):
    reqs = [EpisodeRequest(g % 11, g, s) for g in range(120) for s in range(2)]
    deaths = pool.stats["worker_deaths"]
    retried0 = pool.stats["requests_retried"]
    got, victim = play_killing(pool, reqs, worker=0, after=5)
    assert keys(got) == expected(reqs) and len(got) == len(reqs)  # each exactly once
    assert pool.stats["worker_deaths"] == deaths + 1
    retried = pool.stats["requests_retried"] - retried0
    assert retried > 0
    marked = [t for t in got if t.timings.get("rollout/retries")]
    assert len(marked) == retried and all(t.timings["rollout/retries"] == 1 for t in marked)
    assert all(t.stop_reason in ("done", "horizon") and t.token_ids for t in marked)  # whole
    assert pool.num_alive == 2 and pool.actor(0) is not victim  # restarted
    again = play(pool, [EpisodeRequest(1, 10**6 + k) for k in range(40)])
    assert len(again) == 40


def test_weights_and_policy_version_reach_every_worker(pool):
    torch = pytest.importorskip("torch")
    v = asyncio.run(pool.update_weights({"w": torch.zeros(3)}, version=7))
    assert v == pool.policy_version == 7
    assert ray.get([pool.actor(i).policy_version.remote() for i in range(2)]) == [7, 7]
    served = dict(pool.served)
    got = play(pool, [EpisodeRequest(k, 2 * 10**6 + k) for k in range(40)])
    assert {t.policy_version for t in got} == {7}
    assert all(pool.served[w] > served.get(w, 0) for w in range(2))
    assert asyncio.run(pool.update_weights({"w": torch.ones(3)})) == 8


def test_backend_failure_in_a_worker_stays_episode_data(ray_cluster, tiny_model_dir):
    """A worker whose backend cannot reach its server: every episode ends backend_error,
    the batch is whole, the worker lives on."""
    from agentgym.backends.openai_backend import free_port

    spec = WorkerSpec(tiny_model_dir, backend="openai",
                      backend_kwargs={"base_url": f"http://127.0.0.1:{free_port()}",
                                      "max_retries": 0, "connect_timeout_s": 1.0},
                      rollout={"backend_retries": 0, "max_turns": 3}, num_cpus=CPU)
    p = RayRolloutPool(spec, num_workers=1)
    try:
        got = play(p, [EpisodeRequest(k, k) for k in range(6)])
        assert len(got) == 6 and {t.stop_reason for t in got} == {"backend_error"}
        assert all(t.error for t in got) and p.num_alive == 1
        assert p.stats["worker_deaths"] == 0
    finally:
        p.close()


def test_worker_that_cannot_start_is_a_named_error(ray_cluster, tmp_path):
    p = RayRolloutPool(WorkerSpec(str(tmp_path / "missing"), backend="scripted",
                                  num_cpus=CPU), num_workers=1)
    try:
        with pytest.raises(RolloutWorkerError, match="rollout worker 0 failed to start"):
            play(p, [EpisodeRequest(0, 0)])
    finally:
        p.close()


def test_trainer_takes_rollouts_from_ray_workers_and_syncs_weights(
        ray_cluster, tiny_model_dir, tmp_path, monkeypatch):
    """Two GRPO steps with a transformers worker: each step's trajectories carry the
    learner's current version, and after the first update the worker's behaviour logprobs
    equal the learner's own (the new weights reached it: the PPO ratio starts at 1)."""
    import agentgym.learner as learner
    from agentgym.learner.trainer import Trainer, TrainerConfig

    seen = []
    real = learner.policy_update

    def spy(model, optimizer, pb, *a, **kw):
        out = real(model, optimizer, pb, *a, **kw)
        seen.append((pb.policy_version.tolist(), kw.get("current_version"), out))
        return out

    monkeypatch.setattr(learner, "policy_update", spy)
    cfg = TrainerConfig(model=tiny_model_dir, env="maze", method="GRPO", max_turns=2,
                        max_steps=2, tasks_per_step=2, n_samples=2, max_new_tokens=8,
                        eval_every=0, save_every=0, warmup=None,
                        output_dir=str(tmp_path / "run"), progress=False, tensorboard=False,
                        torch_threads=1,
                        learner={"lr": 3e-2, "use_kl_loss": False, "entropy_coeff": 0.5},
                        num_rollout_workers=1, rollout_worker={"num_cpus": CPU})
    trainer = Trainer(cfg)
    trainer.train()
    assert [r["policy_version"] for r in trainer.history] == [1, 2]
    assert [(v, c) for v, c, _ in seen] == [([0] * 4, 0), ([1] * 4, 1)]
    assert seen[0][2]["actor/grad_norm"] > 0  # the first update moved the weights
    assert abs(seen[1][2]["actor/ppo_kl"]) < 1e-4  # workers sampled with the synced weights


def test_self_play_trains_on_ray_workers(ray_cluster, tiny_model_dir, tmp_path):
    """A self-play step and its evaluation with the games played on a Ray worker: both
    seats' rows of every game reach the learner, tagged, and the held-out games are
    scored per opponent."""
    from agentgym.learner.trainer import Trainer, TrainerConfig

    cfg = TrainerConfig(model=tiny_model_dir, env="tictactoe", self_play=True, method="GRPO",
                        max_turns=5, max_steps=1, tasks_per_step=2, n_samples=2,
                        max_new_tokens=8, eval_every=1, eval_tasks=2, warmup=None,
                        output_dir=str(tmp_path / "run"), progress=False, tensorboard=False,
                        torch_threads=1, num_rollout_workers=1,
                        rollout_worker={"num_cpus": CPU})
    trainer = Trainer(cfg)
    trainer.train()
    (row,) = trainer.history
    # 2 openings x 2 samples, the policy in both seats: 8 rows, each a game of the policy's
    assert row["batch/size"] == 8 and row["selfplay/games"] == 8
    assert row["selfplay/seat0/games"] == row["selfplay/seat1/games"] == 4
    evals = [r for r in trainer.eval_history if r["step"] == 1]
    assert evals and evals[-1]["vs_random/games"] == evals[-1]["vs_solver/games"] == 4


def train_and_read_workers(trainer, workers: int):
    """Run ``trainer`` to its end; each Ray worker's policy version and backend weights."""
    from agentgym.engine.loop import run

    async def go():
        try:
            await trainer.train_async()
            pool = trainer.runner
            versions = ray.get([pool.actor(i).policy_version.remote()
                                for i in range(workers)])
            weights = ray.get([pool.actor(i).__ray_call__.remote(
                lambda w: {k: v.cpu() for k, v in w.backend.model.state_dict().items()})
                for i in range(workers)])
            return versions, weights
        finally:
            await trainer.aclose()

    return run(go())


def test_async_rollouts_on_ray_workers_keep_the_staleness_bound(
        ray_cluster, tiny_model_dir, tmp_path, monkeypatch):
    """Async GRPO on 2 transformers Ray workers (``max_staleness=0``, one episode in flight
    per worker): each step's rollout runs during the previous update, so episodes that began
    before the weight push carry the old version. The learner trains on exactly the
    trajectories within the bound of its version and drops the rest; the versions on the
    trajectories advance with the pushes, and both workers end with the learner's weights."""
    import torch

    import agentgym.learner as learner
    from agentgym.learner.trainer import Trainer, TrainerConfig

    seen = []
    real = learner.policy_update

    def spy(model, optimizer, pb, *a, **kw):
        out = real(model, optimizer, pb, *a, **kw)
        seen.append((pb.policy_version.copy(), kw.get("current_version"), out))
        return out

    monkeypatch.setattr(learner, "policy_update", spy)
    steps, bound = 3, 0
    cfg = TrainerConfig(model=tiny_model_dir, env="maze", method="GRPO", max_turns=2,
                        max_steps=steps, tasks_per_step=2, n_samples=2, max_new_tokens=8,
                        max_concurrency=1, async_rollouts=True, max_staleness=bound,
                        eval_every=0, save_every=0, warmup=None,
                        output_dir=str(tmp_path / "run"), progress=False, tensorboard=False,
                        torch_threads=1,
                        learner={"lr": 3e-2, "use_kl_loss": False, "entropy_coeff": 0.5},
                        num_rollout_workers=2, rollout_worker={"num_cpus": CPU})
    trainer = Trainer(cfg)

    versions, weights = train_and_read_workers(trainer, 2)
    assert [r["policy_version"] for r in trainer.history] == [1, 2, 3]
    assert versions == [steps, steps]
    assert len(seen) == steps
    dropped = 0
    for k, (pv, current, out) in enumerate(seen):
        assert current == k and len(pv) == 4
        # step k's episodes began under the version of the previous step or, after the
        # push, under the current one
        assert set(pv.tolist()) <= ({0} if k == 0 else {k - 1, k})
        kept = int((pv >= current - bound).sum())
        assert out["learner/num_trained"] == kept
        assert out["learner/num_stale_dropped"] == len(pv) - kept
        dropped += len(pv) - kept
    assert seen[0][2]["learner/num_trained"] == 4 and seen[0][2]["actor/grad_norm"] > 0
    assert dropped > 0  # the bound was exercised: the overlap produced stale episodes
    assert max(int(pv.max()) for pv, _, _ in seen) >= steps - 2  # the versions advance
    want = trainer.model.state_dict()
    for w in weights:
        assert w.keys() == want.keys()
        assert all(torch.equal(w[k], want[k].cpu()) for k in want)


def test_pool_takes_requests_from_an_async_feed_as_they_arrive(pool):
    """An async feed: the second half of the requests is fed only after the first half's
    trajectories came back (the workers' streams stay open meanwhile); every request is
    played once, as the same requests given as a list are."""
    reqs = [EpisodeRequest(g % 5, 900 + g, s) for g in range(8) for s in range(2)]
    half = len(reqs) // 2
    first_back = asyncio.Event()

    async def feed():
        for r in reqs[:half]:
            yield r
        await first_back.wait()
        for r in reqs[half:]:
            yield r

    async def go():
        out = []
        async for t in pool.stream_requests(feed(), "maze"):
            out.append(t)
            if len(out) == half:
                first_back.set()
        return out

    got = asyncio.run(go())
    assert keys(got) == expected(reqs) and len(got) == len(reqs)
    # the first half came back before the second half was fed
    assert {(t.group_id, t.sample_index) for t in got[:half]} == {
        (r.group_id, r.sample_index) for r in reqs[:half]}
    want = {(t.group_id, t.sample_index): t for t in play(pool, reqs)}
    for t in got:
        w = want[(t.group_id, t.sample_index)]
        assert (t.token_ids, t.reward, t.stop_reason) == (w.token_ids, w.reward, w.stop_reason)


def test_fully_async_training_on_ray_workers_keeps_the_bound(
        ray_cluster, tiny_model_dir, tmp_path, monkeypatch):
    """Fully asynchronous GRPO on 2 transformers Ray workers (``max_staleness=1``): the
    open stream feeds the workers, weights are pushed while episodes run, no trained token
    is more than one version behind the learner, and both workers end with the learner's
    weights and version."""
    import torch

    import agentgym.learner as learner
    from agentgym.learner.trainer import Trainer, TrainerConfig

    seen = []
    real = learner.policy_update

    def spy(model, optimizer, pb, *a, **kw):
        seen.append((pb.token_version.astype(np.int64), pb.loss_mask.astype(bool),
                     kw.get("current_version")))
        return real(model, optimizer, pb, *a, **kw)

    monkeypatch.setattr(learner, "policy_update", spy)
    steps = 3
    cfg = TrainerConfig(model=tiny_model_dir, env="maze", method="GRPO", max_turns=2,
                        max_steps=steps, tasks_per_step=2, n_samples=2, max_new_tokens=8,
                        max_concurrency=2, fully_async=True, eval_every=0, save_every=0,
                        warmup=None, output_dir=str(tmp_path / "run"), progress=False,
                        tensorboard=False, torch_threads=1,
                        learner={"lr": 3e-2, "use_kl_loss": False, "max_staleness": 1},
                        num_rollout_workers=2, rollout_worker={"num_cpus": CPU})
    trainer = Trainer(cfg)

    versions, weights = train_and_read_workers(trainer, 2)
    assert [r["policy_version"] for r in trainer.history] == [1, 2, 3]
    assert versions == [steps, steps] and len(seen) == steps
    for tv, mask, current in seen:
        lag = current - tv[mask]
        assert lag.size and lag.min() >= 0 and lag.max() <= 1
    want = trainer.model.state_dict()
    for w in weights:
        assert all(torch.equal(w[k], want[k].cpu()) for k in want)


@pytest.mark.parametrize(("env", "seats"), [("maze", 1), ("kuhn_poker", 2)])
def test_collect_on_ray_workers_writes_the_in_process_rows(ray_cluster, tiny_model_dir,
                                                           tmp_path, env, seats):
    """``agentgym-rl collect --ray --num-workers 2`` (on the running cluster) writes the rows
    the in-process collect writes: same episodes, same tokens (a game: a row per seat, an
    episode's seats in one shard)."""
    import glob

    import pyarrow.parquet as pq

    from agentgym.cli import main

    def rows(out):
        t, by_shard = [], {}
        for path in glob.glob(f"{out}/*.parquet"):
            shard = pq.read_table(path).to_pylist()
            t += shard
            for r in shard:
                by_shard.setdefault((r["group_id"], r["sample_index"]), set()).add(path)
        assert all(len(v) == 1 for v in by_shard.values())  # an episode in one shard
        return sorted((r["group_id"], r["sample_index"], r["seat"], r["task_id"], r["seed"],
                       r["token_ids"], r["reward"], r["stop_reason"]) for r in t)

    args = ["collect", "--env", env, "--tasks", "0:12", "--n-samples", "2", "--model",
            tiny_model_dir, "--max-turns", "6", "--no-progress", "--json", "--shard-size", "5"]
    assert main([*args, "-o", str(tmp_path / "ray"), "--ray", "--num-workers", "2",
                 "--worker-cpus", str(CPU)]) == 0
    assert main([*args, "-o", str(tmp_path / "local")]) == 0
    got = rows(tmp_path / "ray")
    assert len(got) == 24 * seats and got == rows(tmp_path / "local")


def test_reseed_reaches_the_workers_with_the_next_stream(pool):
    """``reseed`` restarts the group counter at once and sends the key start, request-id
    prefix and sampling seed to each worker's engine with the next stream, which plays
    every request as before."""
    pool.reseed(3, run_id="rs", sampling_seed=11)
    assert pool.seeding == (3 * 1024, "rs", 11)
    reqs = pool.requests(4, n_samples=2)
    assert sorted({r.group_id for r in reqs}) == [3, 4, 5, 6]
    got = play(pool, reqs)
    assert keys(got) == expected(reqs)
    assert all(t.stop_reason in ("done", "horizon") and t.error is None for t in got)
