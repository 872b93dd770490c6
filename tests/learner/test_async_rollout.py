"""Fully asynchronous training (``fully_async``): the staleness bound, partial rollouts, the
synchronous loop at bound 0, resume."""

from __future__ import annotations

import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import agentgym  # noqa: E402
from agentgym.envs import BaseEnv  # noqa: E402
from agentgym.learner.trainer import Trainer, TrainerConfig  # noqa: E402

pytestmark = pytest.mark.timeout(300)


class WalkEnv(BaseEnv):
    """Ends after a task-dependent number of turns (1-4: a long-tailed batch); reward 1 per
    'north'."""

    instructions = "Say a direction."
    num_tasks = 1000

    def reset(self, task=None, seed=None):
        self.left = 1 + int(task or 0) % 4
        return f"Task {task}. Go."

    def step(self, action):
        self.left -= 1
        return "Again.", float(action.strip().endswith("north")), self.left <= 0, {}

    def valid_actions(self):
        return ["move north", "move south"]


agentgym.register("_async_walk", WalkEnv, override=True)


def _scripted(model_dir, latency_s: float = 0.0):
    from transformers import AutoTokenizer

    from agentgym.backends.scripted import ScriptedBackend

    tok = AutoTokenizer.from_pretrained(model_dir)
    return ScriptedBackend(tok, policy="random", seed=0, latency_s=latency_s)


def _cfg(tmp_path, model_dir, name="run", **kw):
    base = dict(model=model_dir, env="_async_walk", method="GRPO", max_turns=4, max_steps=4,
                tasks_per_step=3, n_samples=2, max_new_tokens=8, eval_every=0, save_every=0,
                warmup=None, output_dir=str(tmp_path / name), progress=False,
                tensorboard=False, torch_threads=1, learner={"lr": 1e-3, "use_kl_loss": False})
    base.update(kw)
    return TrainerConfig.from_dict(base)


def _record_batches(trainer: Trainer, slow_s: float = 0.0) -> list[dict]:
    """Each update's packed batch and the backend's version when it trained."""
    seen: list[dict] = []
    real = trainer.update

    def update(batch, step):
        pb = batch.packed()
        seen.append({"pb": pb, "version": trainer.runner.policy_version, "step": step,
                     "groups": sorted({int(g) for g in pb.group_id})})
        if slow_s:
            time.sleep(slow_s)  # a learner slower than generation
        return real(batch, step)

    trainer.update = update
    return seen


def test_bound_zero_trains_the_batches_of_the_synchronous_loop(tmp_path, tiny_model_dir):
    """With one version in flight (``max_staleness`` 0) the asynchronous mode starts a step's
    groups only after the previous update's weights are live: the same tasks, groups, seeds
    and, with a deterministic backend, the same batches as the synchronous loop, each
    trained at lag 0."""
    runs = {}
    for mode in ("sync", "async"):
        extra = {"fully_async": True, "learner": {"lr": 1e-3, "use_kl_loss": False,
                                                  "max_staleness": 0}} if mode == "async" else {}
        trainer = Trainer(_cfg(tmp_path, tiny_model_dir, name=mode, **extra),
                          backend=_scripted(tiny_model_dir))
        runs[mode] = _record_batches(trainer)
        trainer.train()
    sync, asyn = runs["sync"], runs["async"]
    assert len(sync) == len(asyn) == 4
    for a, b in zip(sync, asyn):
        assert a["groups"] == b["groups"] == list(range(3 * a["step"], 3 * a["step"] + 3))
        for name in ("token_ids", "offsets", "loss_mask", "rewards", "group_id",
                     "sample_index", "num_turns", "policy_version", "token_version"):
            np.testing.assert_array_equal(getattr(a["pb"], name), getattr(b["pb"], name),
                                          err_msg=name)
        assert b["version"] == b["step"]
        assert (b["pb"].token_version == b["version"]).all()  # lag 0 throughout


@pytest.mark.parametrize("bound", [1, 2])
def test_the_staleness_bound_holds_under_a_slow_learner(tmp_path, tiny_model_dir, bound):
    """A learner slower than generation: the producer waits (it never queues more than
    ``bound + 1`` steps' groups), and no token older than the bound is trained."""
    cfg = _cfg(tmp_path, tiny_model_dir, fully_async=True, max_steps=5,
               learner={"lr": 1e-3, "use_kl_loss": False, "max_staleness": bound})
    trainer = Trainer(cfg, backend=_scripted(tiny_model_dir, latency_s=0.005))
    seen = _record_batches(trainer, slow_s=0.4)
    peak = []

    def watch():  # groups started and not yet trained or dropped, at every group start
        p = trainer.producer
        peak.append(p.next_group - p.discarded - p.synced * cfg.tasks_per_step)

    from agentgym.learner import async_rollout

    real_feed = async_rollout.AsyncRollouts._feed

    async def feed(self):
        async for r in real_feed(self):
            if r.sample_index == 0:
                watch()
            yield r

    async_rollout.AsyncRollouts._feed = feed
    try:
        trainer.train()
    finally:
        async_rollout.AsyncRollouts._feed = real_feed
    assert len(seen) == 5
    assert max(peak) <= (bound + 1) * cfg.tasks_per_step
    assert max(peak) == (bound + 1) * cfg.tasks_per_step  # it ran ahead as far as allowed
    lags = np.concatenate([s["version"] - s["pb"].token_version[s["pb"].loss_mask == 1]
                           .astype(np.int64) for s in seen])
    assert lags.max() <= bound and lags.min() >= 0
    assert lags.max() >= 1  # generation really ran ahead of the learner
    throttled = [r["async/throttled_s"] for r in trainer.history]
    assert sum(throttled) > 0.3  # the producer waited for the learner


def test_a_group_past_the_bound_is_dropped_and_replaced(tmp_path, tiny_model_dir):
    """A finished group older than the bound when the learner takes it is dropped, counted,
    and a fresh group takes its place (the batch stays whole)."""
    import asyncio

    from agentgym.learner.async_rollout import AsyncRollouts

    cfg = _cfg(tmp_path, tiny_model_dir, fully_async=True, max_steps=2,
               learner={"lr": 1e-3, "use_kl_loss": False, "max_staleness": 0})
    trainer = Trainer(cfg, backend=_scripted(tiny_model_dir))
    seen = _record_batches(trainer)
    real = AsyncRollouts.next_batch
    bumped = []

    async def next_batch(self):
        if not bumped:  # the first batch's groups finish, then the weights move on twice
            self.start()
            while len(self._ready) < self.per_batch:
                await asyncio.sleep(0.005)
            await self.trainer.runner.update_weights({}, version=2)
            bumped.append(True)
            self.synced += 2
        return await real(self)

    AsyncRollouts.next_batch = next_batch
    try:
        trainer.train()
    finally:
        AsyncRollouts.next_batch = real
    first = seen[0]
    assert len(first["pb"]) == cfg.tasks_per_step * cfg.n_samples
    assert (first["pb"].policy_version >= first["version"]).all()  # only fresh groups
    dropped = trainer.history[0]["async/stale_dropped_groups"]
    assert dropped >= 1


def test_partial_rollouts_carry_each_replys_version_and_logprobs(tmp_path, tiny_model_dir):
    """Transformers backend: weights updated while episodes are in flight. Every model token
    carries the version of the weights that generated it, and its behaviour logprob is that
    version's (recomputed with those weights)."""
    import asyncio

    from transformers import AutoModelForCausalLM

    from agentgym.backends import make_backend
    from agentgym.data.trajectories import pack
    from agentgym.engine.episode import EpisodeRequest
    from agentgym.engine.orchestrator import open_engine
    from agentgym.learner.microbatch import collate
    from agentgym.learner.update import compute_logprobs

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, torch_dtype=torch.float32)
    v0 = {k: v.clone() for k, v in model.state_dict().items()}
    v1 = {k: v + 0.05 * torch.randn_like(v) if v.dtype.is_floating_point else v
          for k, v in v0.items()}
    backend = make_backend("transformers", tiny_model_dir, device="cpu", seed=0)

    async def go():
        engine = open_engine(backend, tiny_model_dir, max_concurrency=8, max_turns=4,
                             max_new_tokens=6, temperature=1.0)
        reqs = [EpisodeRequest(3, g, 0) for g in range(8)]  # task 3: four turns each
        trajs, calls, real = [], [], backend.generate
        updated: list = []

        async def generate(*a, **k):  # the weights change once the first turns are asked
            calls.append(1)
            if len(calls) == 9:
                updated.append(asyncio.ensure_future(engine.update_weights(v1)))
            return await real(*a, **k)

        backend.generate = generate
        async for t in engine.stream_requests(reqs, "_async_walk"):
            trajs.append(t)
        await updated[0]
        await engine.aclose()
        await backend.close()
        return trajs

    trajs = asyncio.run(go())
    spanned = [t for t in trajs if t.version_at]
    assert spanned, "no episode spanned the weight update"
    assert all(t.version_at == [1] for t in spanned)
    checked = {0: 0, 1: 0}
    for t in trajs:
        versions = t.token_versions()
        mask = np.asarray(t.loss_mask, bool)
        for v, weights in ((0, v0), (1, v1)):
            sel = mask & (versions == v)
            if not sel.any():
                continue
            model.load_state_dict(weights)
            mb = collate(pack([t]), np.arange(1))
            with torch.no_grad():
                lp = compute_logprobs(model, mb, with_entropy=False)[0][0].numpy()
            got = np.asarray(t.logprobs, np.float32)
            # the model's logprob of token i is column i - 1 of the next-token logprobs
            want = np.concatenate([[0.0], lp])[:len(got)]
            np.testing.assert_allclose(got[sel], want[sel], atol=2e-3)
            checked[v] += int(sel.sum())
    assert checked[0] and checked[1]


def test_an_async_run_resumes_from_its_checkpoint(tmp_path, tiny_model_dir):
    """Stopped after step 2 (its checkpoint), a fully asynchronous run resumes where the
    draws stood: with bound 0 the resumed steps train exactly the batches an uninterrupted
    run trains."""
    from agentgym.learner.checkpoint import find_checkpoint

    lrn = {"lr": 1e-3, "use_kl_loss": False, "max_staleness": 0}
    whole = Trainer(_cfg(tmp_path, tiny_model_dir, name="whole", fully_async=True,
                         learner=lrn), backend=_scripted(tiny_model_dir))
    want = _record_batches(whole)
    whole.train()
    first = Trainer(_cfg(tmp_path, tiny_model_dir, name="cut", fully_async=True, max_steps=2,
                         save_every=2, learner=lrn), backend=_scripted(tiny_model_dir))
    first.train()
    ckpt = find_checkpoint(tmp_path / "cut")
    resumed = Trainer(_cfg(tmp_path, tiny_model_dir, name="cut", fully_async=True,
                           resume=str(ckpt), learner=lrn), backend=_scripted(tiny_model_dir))
    got = _record_batches(resumed)
    summary = resumed.train()
    assert summary["steps"] == 4 and [g["step"] for g in got] == [2, 3]
    for a, b in zip(want[2:], got):
        assert a["groups"] == b["groups"]
        np.testing.assert_array_equal(a["pb"].token_ids, b["pb"].token_ids)
        np.testing.assert_array_equal(a["pb"].rewards, b["pb"].rewards)


def test_fully_async_config_errors_are_one_line():
    from agentgym.errors import ConfigError

    with pytest.raises(ConfigError, match="set one"):
        TrainerConfig(fully_async=True, async_rollouts=True)
    with pytest.raises(ConfigError, match="backend"):
        TrainerConfig(fully_async=True, backend="openai")
    with pytest.raises(ConfigError, match="max_staleness"):
        TrainerConfig.from_dict({"fully_async": True, "learner": {"max_staleness": None}})
    lc = TrainerConfig(fully_async=True).learner_config()
    assert lc.max_staleness == 1 and lc.old_logprob_source == "recompute"


def test_behaviour_weights_truncate_or_drop_tokens_past_the_cap():
    """The off-policy correction on a hand-built batch: proximal/behaviour weights 3.0, 0.5
    and 1.0 with cap 2: TIS truncates the first to 2, the decoupled objective drops it; the
    loss of a dropped token has no gradient."""
    from agentgym.learner.losses import behaviour_weights, policy_loss

    prox = torch.log(torch.tensor([[3.0, 0.5, 1.0]]))
    behav = torch.zeros(1, 3)
    w, over = behaviour_weights(prox, behav, 2.0, "tis")
    assert w[0].tolist() == pytest.approx([2.0, 0.5, 1.0])
    assert over.tolist() == [[True, False, False]]
    w, over = behaviour_weights(prox, behav, 2.0, "decoupled")
    assert w[0].tolist() == pytest.approx([0.0, 0.5, 1.0])
    logp = prox.clone().requires_grad_(True)
    loss, _ = policy_loss(logp, prox, torch.ones(1, 3), torch.ones(1, 3), weights=w)
    loss.backward()
    assert logp.grad[0, 0] == 0 and logp.grad[0, 1] != 0 and logp.grad[0, 2] != 0
    with pytest.raises(ValueError, match="off_policy"):
        behaviour_weights(prox, behav, 2.0, "clip")


def test_version_runs_survive_packing_and_selection():
    """A partial rollout's per-token versions go through pack, select, rows and unpack."""
    from agentgym.data.trajectories import RowInfo, Trajectory, pack, unpack

    def traj(g, pos, at):
        return Trajectory(task_id=0, env_id="maze", group_id=g, sample_index=0,
                          token_ids=list(range(8)), loss_mask=[0, 0, 1, 1, 0, 1, 1, 0],
                          logprobs=[0.0] * 8, prompt_len=2, turn_rewards=[0.0, 1.0],
                          reward=1.0, num_turns=2, stop_reason="done", policy_version=3,
                          version_pos=pos, version_at=at)

    a, b = traj(0, [5], [4]), traj(1, [], [])
    pb = pack([a, b])
    assert pb.token_version.tolist() == [3] * 5 + [4] * 3 + [3] * 8
    assert pb.select([1, 0]).token_version.tolist() == [3] * 8 + [3] * 5 + [4] * 3
    assert pb.rows(0, 1).token_version.tolist() == [3] * 5 + [4] * 3
    back = unpack(pb, RowInfo.of([a, b]))
    assert (back[0].version_pos, back[0].version_at) == ([5], [4])
    assert (back[1].version_pos, back[1].version_at) == ([], [])
