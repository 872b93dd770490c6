"""Trainer: horizon stages inside the loop, weight sync, exact resume, learning, outputs."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import agentgym  # noqa: E402
from agentgym.envs import BaseEnv  # noqa: E402
from agentgym.learner.checkpoint import find_checkpoint  # noqa: E402
from agentgym.learner.tracking import read_jsonl  # noqa: E402
from agentgym.learner.trainer import Trainer, TrainerConfig, make_schedule  # noqa: E402
from tests.helpers import PickEnv  # noqa: E402

pytestmark = pytest.mark.timeout(240)


class EndlessEnv(BaseEnv):
    """Never ends by itself: every episode runs to the horizon. Reward 0.1 per 'north'."""

    instructions = "Say a direction."
    num_tasks = 1000

    def reset(self, task=None, seed=None):
        return f"Task {task}. Go."

    def step(self, action):
        return "Again.", 0.1 if "north" in action else 0.0, False, {}

    def valid_actions(self):
        return ["move north", "move south"]


class TwoLengthEnv(BaseEnv):
    """Never ends by itself; reward 1 per 'north'. Its last valid action is too long
    for a short reply budget, so a scripted random policy's episodes end both ways: at the
    horizon and cut mid-reply (stop reason ``length``)."""

    instructions = "Say a direction."
    num_tasks = 1000

    def reset(self, task=None, seed=None):
        return f"Task {task}. Go."

    def step(self, action):
        return "Again.", float(action.strip().endswith("north")), False, {}

    def valid_actions(self):
        return ["move north", "go north", "move east",
                "move south and keep walking along the corridor to the far wall"]


agentgym.register("_trainer_endless", EndlessEnv, override=True)
agentgym.register("_trainer_two_length", TwoLengthEnv, override=True)
agentgym.register("_trainer_pick", PickEnv, override=True)


def _scripted(tiny_model_dir):
    from transformers import AutoTokenizer

    from agentgym.backends.scripted import ScriptedBackend

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    return ScriptedBackend(tok, policy="random", seed=0)


def _cfg(tmp_path, tiny_model_dir, **kw):
    base = dict(model=tiny_model_dir, env="_trainer_endless", method="GRPO", max_turns=2,
                max_steps=2, tasks_per_step=2, n_samples=2, max_new_tokens=8, eval_every=0,
                save_every=0, warmup=None, output_dir=str(tmp_path / "run"), progress=False,
                tensorboard=False, torch_threads=1, learner={"lr": 1e-3, "use_kl_loss": False})
    base.update(kw)
    return TrainerConfig.from_dict(base)


def test_config_validation_and_methods():
    with pytest.raises(ValueError, match="unknown method"):
        TrainerConfig(method="DQN")
    with pytest.raises(ValueError, match=r"unknown key lr \(did you mean learner\.lr\?\)"):
        TrainerConfig.from_dict({"lr": 1.0})
    assert TrainerConfig(method="PPO").adv_estimator == "gae"
    assert TrainerConfig(method="REINFORCE++").adv_estimator == "reinforce_pp"
    assert TrainerConfig(method="rloo").adv_estimator == "rloo"
    sched = make_schedule(TrainerConfig(env="textcraft", method="ScalingInter-RL"))
    assert [s.max_turns for s in sched.stages] == [10, 20, 30]
    assert make_schedule(TrainerConfig(method="GRPO", max_turns=7)).max_turns(10**6) == 7
    staged = make_schedule(TrainerConfig(method="ScalingInter-RL", horizon=[2, 5],
                                         steps_per_stage=3))
    assert [staged.max_turns(s) for s in range(5)] == [2, 2, 2, 5, 5]


def test_rollout_settings_live_in_the_rollout_section(tmp_path, tiny_model_dir):
    """The rollout knobs are RolloutConfig's own fields (one place defines them and their
    defaults: the ``rollout`` section), the trainer's engine runs with them, and the old
    flat spellings still set them."""
    import msgspec

    from agentgym.engine import RolloutConfig

    rollout = RolloutConfig()
    assert TrainerConfig().rollout == rollout
    top = {f.name for f in msgspec.structs.fields(TrainerConfig)}
    # no rollout field is repeated at the top but the run's own seed, group size, progress
    assert top & set(RolloutConfig.__struct_fields__) == {"n_samples", "seed", "progress"}
    cfg = _cfg(tmp_path, tiny_model_dir, rollout={"reply_prefix": "Action:"}).to_dict()
    del cfg["rollout"]["max_new_tokens"]
    trainer = Trainer(TrainerConfig.from_dict(cfg), backend=_scripted(tiny_model_dir))

    async def go():
        await trainer.setup()
        try:
            return trainer.runner.config
        finally:
            await trainer.aclose()

    used = asyncio.run(go())
    for name in ("temperature", "max_new_tokens", "max_total_tokens", "max_concurrency"):
        assert getattr(used, name) == getattr(rollout, name), name
    assert used.reply_prefix == "Action:" and used.max_turns == 2
    assert (tmp_path / "run" / "config.yaml").is_file()


def _train_watching_rollouts(trainer) -> list[tuple[dict, list]]:
    """Train ``trainer`` to the end; each step's rollout as (its overrides, trajectories)."""
    seen: list[tuple[dict, list]] = []

    async def go():
        await trainer.setup()
        orig = trainer.runner.collect

        async def spy(*a, **k):
            batch = await orig(*a, **k)
            seen.append((k, batch.trajectories))
            return batch

        trainer.runner.collect = spy
        try:
            return await trainer.train_async()
        finally:
            await trainer.aclose()

    asyncio.run(go())
    return seen


def test_horizon_switches_at_stage_boundary(tmp_path, tiny_model_dir):
    cfg = _cfg(tmp_path, tiny_model_dir, method="ScalingInter-RL", horizon=[1, 3],
               steps_per_stage=2, max_steps=4)
    trainer = Trainer(cfg, backend=_scripted(tiny_model_dir))
    seen = _train_watching_rollouts(trainer)
    assert [k["max_turns"] for k, _ in seen] == [1, 1, 3, 3]
    for k, trajs in seen:
        assert {t.num_turns for t in trajs} == {k["max_turns"]}
    assert [r["horizon/max_turns"] for r in trainer.history] == [1, 1, 3, 3]
    assert [r["num_turns/mean"] for r in trainer.history] == [1, 1, 3, 3]


class ForkableEndlessEnv(EndlessEnv):
    snapshot_safe = True


agentgym.register("_trainer_forkable", ForkableEndlessEnv, override=True)


def test_branched_groups_fork_only_in_stages_longer_than_the_fork(tmp_path, tiny_model_dir):
    cfg = _cfg(tmp_path, tiny_model_dir, env="_trainer_forkable", method="ScalingInter-RL",
               horizon=[2, 4], steps_per_stage=1, max_steps=2, n_samples=4,
               rollout={"branch_at": 2, "branch_width": 2})
    trainer = Trainer(cfg, backend=_scripted(tiny_model_dir))
    (_, short), (_, long) = _train_watching_rollouts(trainer)
    # horizon 2: every root ends at the fork turn, nothing forks
    assert all(t.branch_parent is None and t.num_turns == 2 for t in short)
    # horizon 4: two trees of two per group, forked after turn 2
    assert len(long) == 8
    assert [t.branch_parent for t in long] == [0, 0, 2, 2] * 2
    assert {t.branch_turn for t in long} == {2} and {t.num_turns for t in long} == {4}
    assert len(trainer.history) == 2 and trainer.history[1]["horizon/max_turns"] == 4


def test_weight_sync_changes_backend_outputs_and_bumps_version(tmp_path, tiny_model_dir):
    from agentgym.backends import SamplingParams

    cfg = _cfg(tmp_path, tiny_model_dir)
    trainer = Trainer(cfg)

    async def go():
        await trainer.setup()
        be = trainer.backend
        prompt = trainer.tokenizer.encode("North: open. South: wall.")
        sp = SamplingParams(max_new_tokens=6, temperature=0.0)
        before = (await be.generate(prompt, sp)).token_ids
        v0 = be.policy_version
        with torch.no_grad():
            trainer.model.lm_head.weight.mul_(-1.0)
        await trainer.sync_weights()
        after = await be.generate(prompt, sp)
        await trainer.aclose()
        return before, after, v0

    before, after, v0 = asyncio.run(go())
    assert after.token_ids != before
    assert after.policy_version == v0 + 1


def _params(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _metrics_equal(a: dict, b: dict) -> None:
    """The learning metrics of two train rows agree (timings and throughputs aside)."""
    keys = [k for k in a if isinstance(a[k], float) and not k.startswith(("timing_s/", "perf/"))]
    assert set(keys) <= set(b)
    for k in keys:
        assert a[k] == pytest.approx(b[k], rel=1e-6, abs=1e-8), k


def _optim_states_equal(a: torch.optim.Optimizer, b: torch.optim.Optimizer) -> None:
    sa, sb = a.state_dict()["state"], b.state_dict()["state"]
    assert sa.keys() == sb.keys() and sa
    for i in sa:
        for name in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(torch.as_tensor(sa[i][name]), torch.as_tensor(sb[i][name])), name


def test_resume_continues_identically(tmp_path, tiny_model_dir):
    """PPO with the real-policy backend: the resumed run's backend generates with the
    checkpoint's weights, the critic and both optimizers continue, so steps 3-4 match an
    uninterrupted run exactly (rollout tokens, metrics, weights)."""
    kw = dict(method="PPO", max_steps=4, save_every=2, format_penalty=1.0,
              learner={"lr": 1e-3, "critic_lr": 1e-3, "use_kl_loss": False})

    def run(out, **extra):
        trainer = Trainer(_cfg(out, tiny_model_dir, **kw, **extra))
        tokens = []
        orig = trainer.update

        def update(batch, step):
            tokens.append(batch.packed().token_ids.copy())
            return orig(batch, step)

        trainer.update = update
        trainer.train()
        return trainer, tokens

    full, full_tokens = run(tmp_path / "a")
    ckpt = find_checkpoint(tmp_path / "a" / "run" / "checkpoints" / "step_2")
    resumed, resumed_tokens = run(tmp_path / "b", resume=str(ckpt))
    assert resumed.step == 4 and len(resumed.history) == 2
    # the resumed rollouts are the ones the uninterrupted run generated
    for a, b in zip(full_tokens[2:], resumed_tokens, strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(full.history[2:], resumed.history, strict=True):
        _metrics_equal(a, b)
        assert a["policy_version"] == b["policy_version"]
    for mine, theirs in ((full.model, resumed.model), (full.critic, resumed.critic)):
        pa, pb = _params(mine), _params(theirs)
        assert all(torch.equal(pa[k], pb[k]) for k in pa)
    _optim_states_equal(full.optimizer, resumed.optimizer)
    _optim_states_equal(full.critic_optimizer, resumed.critic_optimizer)
    assert full.schedule.state_dict() == resumed.schedule.state_dict()
    # the global RNGs continue from the checkpoint, not from the seed
    assert full.task_rng.bit_generator.state == resumed.task_rng.bit_generator.state


def test_outputs_metrics_eval_rows_plot_checkpoint(tmp_path, tiny_model_dir):
    cfg = _cfg(tmp_path, tiny_model_dir, max_steps=2, eval_every=1, eval_tasks=3,
               save_every=2)
    summary = Trainer(cfg, backend=_scripted(tiny_model_dir)).train()
    rows = read_jsonl(summary["metrics"])
    train = [r for r in rows if r["type"] == "train"]
    evals = [r for r in rows if r["type"] == "eval"]
    assert [r["step"] for r in train] == [1, 2]
    assert [r["step"] for r in evals] == [0, 1, 2]
    for key in ("reward/mean", "success_rate", "num_turns/mean", "horizon/max_turns",
                "actor/entropy", "actor/pg_loss", "timing_s/gen", "timing_s/update",
                "timing_s/sync", "perf/tokens_per_s"):
        assert key in train[0], key
    assert all(0.0 <= r["success_rate"] <= 1.0 for r in evals)
    out = tmp_path / "run"
    assert (out / "learning_curve.png").stat().st_size > 0
    assert (out / "metrics.csv").read_text().startswith("step,")
    assert (find_checkpoint(out) / "model" / "config.json").is_file()
    assert json.loads(json.dumps(summary))["steps"] == 2


def _spy_policy_update(monkeypatch, trainer):
    """Record what each ``Trainer.update`` hands to the real ``policy_update`` (the packed
    batch, the version it is judged against, the config, the backend's version) and what
    it returns."""
    import agentgym.learner as learner

    calls = []
    real = learner.policy_update

    def spy(model, optimizer, pb, config, *args, current_version=None, **kwargs):
        out = real(model, optimizer, pb, config, *args, current_version=current_version,
                   **kwargs)
        calls.append({"pb": pb, "current": current_version, "config": config, "out": out,
                      "backend": trainer.backend.policy_version})
        return out

    monkeypatch.setattr(learner, "policy_update", spy)
    return calls


@pytest.mark.parametrize("async_rollouts, max_staleness, mode", [
    (False, 0, "drop"), (True, 1, "drop"), (True, 0, "drop"), (True, 0, "downweight")])
def test_async_rollouts_lag_one_version_and_staleness_rule(
        tmp_path, tiny_model_dir, monkeypatch, async_rollouts, max_staleness, mode):
    """With async rollouts the batch of step k >= 1 was generated by policy version k - 1
    while the backend is at k: one version stale, kept at ``max_staleness=1``, dropped or
    down-weighted (``staleness_decay`` 0.5) at 0. The PPO ratio then compares the learner
    with the older behaviour logprobs. A sync run has no lag."""
    cfg = _cfg(tmp_path, tiny_model_dir, max_steps=3, async_rollouts=async_rollouts,
               max_staleness=max_staleness, staleness_mode=mode,
               learner={"lr": 3e-2, "use_kl_loss": False, "entropy_coeff": 0.5})
    trainer = Trainer(cfg)
    calls = _spy_policy_update(monkeypatch, trainer)
    trainer.train()
    assert [r["policy_version"] for r in trainer.history] == [1, 2, 3]
    assert len(calls) == 3
    lag = 1 if async_rollouts else 0
    for k, c in enumerate(calls):
        pb, out = c["pb"], c["out"]
        n = len(pb)
        assert n == 4
        assert c["current"] == c["backend"] == k
        model_lp = pb.logprobs[pb.loss_mask == 1]
        assert model_lp.size and (model_lp < 0).all()  # a real policy's logprobs
        want = max(k - lag, 0)
        assert pb.policy_version.tolist() == [want] * n
        stale = k - want > (max_staleness if async_rollouts else 10**9)
        if stale and mode == "drop":
            assert out["learner/num_stale_dropped"] == n and out["learner/num_trained"] == 0
            assert out["learner/num_model_tokens"] == 0
        else:
            assert out["learner/num_stale_dropped"] == 0 and out["learner/num_trained"] == n
        if async_rollouts:
            assert c["config"].max_staleness == max_staleness
            assert c["config"].staleness_mode == mode
        if k - want == 0:  # on-policy: behaviour and learner logprobs agree
            assert abs(out["actor/ppo_kl"]) < 1e-4
        elif not (stale and mode == "drop"):  # one update behind: the ratio sees it
            assert abs(out["actor/ppo_kl"]) > 1e-3


def test_update_shapes_rewards_by_stage_and_penalises_cut_replies(
        tmp_path, tiny_model_dir, monkeypatch):
    """``Trainer.update`` hands ``policy_update`` the stage-shaped score minus the format
    penalty of episodes cut mid-reply, and the advantages are computed from it."""
    from agentgym.learner.horizon import HorizonSchedule, HorizonStage

    cfg = _cfg(tmp_path, tiny_model_dir, env="_trainer_two_length", tasks_per_step=4,
               max_turns=3, max_new_tokens=8, format_penalty=0.3,
               rollout={"truncated_turn": "end"})
    trainer = Trainer(cfg, backend=_scripted(tiny_model_dir))
    calls = _spy_policy_update(monkeypatch, trainer)

    async def go():
        await trainer.setup()
        try:
            batch = await trainer.rollout(0)
            trainer.schedule = HorizonSchedule(
                [HorizonStage(3, turn_penalty=0.1, reward_discount=0.5)])
            return batch, trainer.update(batch, 0)
        finally:
            await trainer.aclose()

    batch, out = asyncio.run(go())
    raw = np.array([t.reward for t in batch.trajectories])
    turns = np.array([t.num_turns for t in batch.trajectories])
    cut = np.array([t.stop_reason == "length" for t in batch.trajectories])
    # both endings, several scores and turn counts are present
    assert cut.any() and (~cut).any() and len(set(raw.tolist())) > 1 and len(set(turns)) > 2
    want = raw * 0.5 ** np.maximum(turns - 1, 0) - 0.1 * turns - 0.3 * cut
    (call,) = calls
    np.testing.assert_allclose(call["pb"].rewards, want, rtol=0, atol=1e-6)
    assert out["critic/score/mean"] == pytest.approx(want.mean(), abs=1e-6)
    assert out["critic/score/min"] == pytest.approx(want.min(), abs=1e-6)


def test_ppo_critic_learns_on_a_fixed_batch(tmp_path, tiny_model_dir):
    """PPO through ``Trainer.update``: on one fixed batch of real-policy rollouts the
    critic's weights move and its value loss falls well below where it started."""
    # the format penalty gives the cut replies (most of a random policy's) a return of -1
    cfg = _cfg(tmp_path, tiny_model_dir, method="PPO", format_penalty=1.0,
               rollout={"truncated_turn": "end"},
               learner={"lr": 1e-3, "critic_lr": 5e-4, "use_kl_loss": False})
    trainer = Trainer(cfg)

    async def go():
        await trainer.setup()  # (its torch thread count holds until aclose)
        try:
            batch = await trainer.rollout(0)
            assert trainer.critic is not None and trainer.critic_optimizer is not None
            before = _params(trainer.critic), _params(trainer.model)
            return before, [trainer.update(batch, 0)["critic/vf_loss"] for _ in range(5)]
        finally:
            await trainer.aclose()

    (critic0, actor0), losses = asyncio.run(go())
    assert max(losses[1:]) < losses[0] and losses[-1] < 0.2 * losses[0], losses
    critic1, actor1 = _params(trainer.critic), _params(trainer.model)
    assert any(not torch.equal(critic0[k], critic1[k]) for k in critic0)
    assert any(not torch.equal(actor0[k], actor1[k]) for k in actor0)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_training_improves_reward_far_beyond_noise(tmp_path, tiny_model_dir):
    """A one-turn bandit after a random-policy warm-up: GRPO lifts the reward from ~0.25."""
    cfg = _cfg(tmp_path, tiny_model_dir, env="_trainer_pick", method="GRPO", max_turns=1,
               max_steps=20, tasks_per_step=4, n_samples=8, max_new_tokens=8,
               eval_every=20, eval_tasks=32, eval_temperature=1.0, model="tiny",
               warmup={"episodes": 64, "steps": 30, "batch_size": 16, "lr": 5e-3},
               learner={"lr": 1e-3, "use_kl_loss": False}, seed=1)
    trainer = Trainer(cfg)
    summary = trainer.train()
    start, end = summary["eval_success_start"], summary["eval_success_end"]
    first = np.mean([r["reward/mean"] for r in trainer.history[:3]])
    last = np.mean([r["reward/mean"] for r in trainer.history[-3:]])
    # random over four moves is 0.25 (binomial sd over 32 episodes ~0.08)
    assert start < 0.5
    assert end >= start + 0.4
    assert last >= first + 0.4


class ConstantEnv(EndlessEnv):
    """Reward 0.5 whatever the action: every GRPO group scores alike."""

    def step(self, action):
        return "Again.", 0.5, False, {}


agentgym.register("_trainer_constant", ConstantEnv, override=True)


def _rollout_with_draws(cfg, tiny_model_dir, monkeypatch):
    """One ``Trainer.rollout`` of ``cfg`` on the scripted random policy, and every batch
    the engine collected for it (dynamic sampling's draws)."""
    trainer = Trainer(cfg, backend=_scripted(tiny_model_dir))
    played = []

    async def go():
        await trainer.setup()
        real = trainer.runner.collect

        async def spy(*args, **kwargs):
            played.append(await real(*args, **kwargs))
            return played[-1]

        monkeypatch.setattr(trainer.runner, "collect", spy)
        try:
            return await trainer.rollout(0)
        finally:
            await trainer.aclose()

    return asyncio.run(go()), played


def test_dynamic_sampling_keeps_only_groups_whose_scores_differ(tmp_path, tiny_model_dir,
                                                                 monkeypatch):
    """filter_groups: groups whose samples all scored alike are dropped and fresh groups
    drawn until tasks_per_step informative groups are kept (at most max_draws draws); the
    batch holds the first informative groups in draw order, its metrics count the drops."""
    cfg = _cfg(tmp_path, tiny_model_dir, tasks_per_step=4, n_samples=2, max_turns=1,
               filter_groups={"max_draws": 6})
    batch, played = _rollout_with_draws(cfg, tiny_model_dir, monkeypatch)

    def groups(trajs):
        out = {}
        for t in trajs:
            out.setdefault(t.group_id, []).append(t.reward)
        return out

    informative = [(g, r) for b in played for g, r in groups(b.trajectories).items()
                   if len(set(r)) > 1]
    total = sum(len(groups(b.trajectories)) for b in played)
    assert 1 < len(played) <= 6 and total > len(informative)  # some groups were dropped
    kept = groups(batch.trajectories)
    assert list(kept.items()) == informative[:4]
    assert len({g for b in played for g in groups(b.trajectories)}) == total  # fresh ids
    m = batch.metrics
    assert m["filter_groups/draws"] == len(played)
    assert m["filter_groups/dropped_share"] == pytest.approx(1 - len(informative) / total)
    assert m["batch/size"] == 2 * total and m["batch/trained"] == len(batch) == 8


def test_dynamic_sampling_gives_up_after_max_draws(tmp_path, tiny_model_dir, monkeypatch):
    """When no group carries a signal, dynamic sampling stops after max_draws draws with
    every group counted as dropped, and the step makes no update (the weights stay)."""
    cfg = _cfg(tmp_path, tiny_model_dir, env="_trainer_constant", tasks_per_step=2,
               n_samples=2, max_turns=1, filter_groups={"max_draws": 3}, max_steps=1)
    batch, played = _rollout_with_draws(cfg, tiny_model_dir, monkeypatch)
    assert len(played) == 3 and len(batch) == 0 and batch.metrics["batch/size"] == 12
    assert batch.metrics["filter_groups/dropped_share"] == 1.0
    trainer = Trainer(cfg, backend=_scripted(tiny_model_dir))
    trainer.train()
    from transformers import AutoModelForCausalLM

    before = _params(AutoModelForCausalLM.from_pretrained(tiny_model_dir))
    assert all(torch.equal(before[k], v) for k, v in _params(trainer.model).items())
    (row,) = [r for r in read_jsonl(trainer.logger.jsonl_path) if r["type"] == "train"]
    assert row["learner/num_trajectories"] == 0.0
    with pytest.raises(ValueError, match="filter_groups"):
        TrainerConfig(filter_groups={"max_draws": 0})


def test_trains_the_tiny_vision_language_model_on_image_observations(tmp_path):
    """``model: tiny-vl`` on a maze whose goal shows only in the picture: it is built into
    the run folder, warmed up on random-policy transcripts with their pictures, trained on
    image episodes (transformers backend, weights synced) and checkpointed with its image
    processor, which the vision spec reads back."""
    from agentgym.models.vision import VisionSpec

    cfg = TrainerConfig(
        model="tiny-vl", env="maze", env_kwargs={"size": 2, "loops": 4, "obs": "image"},
        method="GRPO", max_turns=2, max_steps=2, tasks_per_step=2, n_samples=2,
        max_new_tokens=8, max_total_tokens=1024, eval_every=2, eval_tasks=2,
        eval_max_turns=2, save_every=2, seed=0, output_dir=str(tmp_path / "run"),
        warmup={"episodes": 8, "steps": 2, "batch_size": 4, "max_turns": 2},
        learner={"max_tokens_per_microbatch": 4096}, progress=False, plot=False)
    summary = Trainer(cfg).train()
    train = [r for r in read_jsonl(summary["metrics"]) if r["type"] == "train"]
    assert [r["step"] for r in train] == [1, 2]
    assert all(r["learner/num_trajectories"] == 4 for r in train)
    assert all(r["learner/num_model_tokens"] > 0 for r in train)
    saved = VisionSpec.from_model(find_checkpoint(tmp_path / "run") / "model")
    base = VisionSpec.from_model(tmp_path / "run" / "base_model")
    assert saved is not None and saved.markup(28, 28) == base.markup(28, 28)
