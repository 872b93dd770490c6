"""The data-parallel learner: 2 gloo ranks on CPU take the same update as one process."""

from __future__ import annotations

import contextlib
import copy
import pickle
import socket

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from agentgym.data import pack  # noqa: E402
from agentgym.distributed.ddp import shard_rows  # noqa: E402
from agentgym.learner.update import LearnerConfig, make_optimizer, policy_update  # noqa: E402
from tests.helpers import make_trajectory  # noqa: E402

pytestmark = pytest.mark.timeout(240)

#: One learner step per config, each a different path through ``policy_update``: several
#: mini-batches (the last with one row, so one rank has none and joins the reduction empty),
#: several micro-batches per rank, the KL loss against a reference (its pass sharded), an
#: entropy bonus, two epochs (Adam state), each loss aggregation's global normaliser.
CONFIGS = [
    dict(loss_agg_mode="token-mean", num_mini_batches=4, max_tokens_per_microbatch=96,
         use_kl_loss=True, kl_coef=0.1, sgd=True),
    dict(loss_agg_mode="seq-mean-token-mean", ppo_epochs=2, entropy_coeff=0.01,
         use_kl_loss=False),
    dict(loss_agg_mode="seq-mean-token-sum-norm", num_mini_batches=2, use_kl_loss=False,
         max_tokens_per_microbatch=64, max_grad_norm=1e-3),
]


def _learner_config(over: dict) -> LearnerConfig:
    over = {k: v for k, v in over.items() if k != "sgd"}
    # AdamW's eps well above float noise in a gradient of ~0: the step stays a smooth function
    # of the gradient, so equal gradients within float tolerance give equal weights
    return LearnerConfig(**{"lr": 1e-2, "adam_eps": 1e-4, "shuffle": True, "seed": 3, **over})


def _fixed_batch(model_dir: str):
    """Seven trajectories of different lengths in three GRPO groups, with behaviour logprobs
    from the model itself (so PPO ratios start at 1)."""
    from transformers import AutoModelForCausalLM

    from agentgym.learner.microbatch import make_micro_batches
    from agentgym.learner.update import compute_logprobs

    rng = np.random.default_rng(0)
    groups = [0, 0, 1, 1, 2, 2, 2]
    rewards = [1.0, 0.0, 0.5, 0.0, 1.0, 0.2, 0.0]
    trajs = []
    for k, (g, r) in enumerate(zip(groups, rewards)):
        prompt = int(rng.integers(3, 9))
        turns = [int(rng.integers(2, 7)) for _ in range(1 + k % 3)]
        mask = [0] * prompt
        for n in turns:
            mask += [1] * n + [0] * int(rng.integers(1, 4))
        ids = rng.integers(3, 500, len(mask)).tolist()
        trajs.append(make_trajectory(ids, mask, group_id=g, sample_index=k, reward=r,
                                     turn_rewards=[0.0] * (len(turns) - 1) + [r]))
    pb = pack(trajs)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    lp = np.zeros(pb.num_tokens, np.float32)
    with torch.no_grad():
        for mb in make_micro_batches(pb, max_tokens_per_microbatch=10_000):
            logp, _ = compute_logprobs(model, mb, with_entropy=False)
            for row, b in enumerate(mb.indices):
                s, n = pb.offsets[b], mb.lengths[row]
                lp[s + 1: s + n] = logp[row, : n - 1].numpy()
    pb.logprobs = (lp * pb.loss_mask).astype(np.float32)
    return pb


def _update(model_dir: str, pb, over: dict, data_parallel_model=None):
    """(model after one policy_update, its metrics); ``data_parallel_model`` wraps the model
    for this rank when given."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    cfg = _learner_config(over)
    ref = copy.deepcopy(model).eval().requires_grad_(False) if cfg.use_kl_loss else None
    # plain SGD (lr 1) moves the weights by the gradient itself, which AdamW's scale
    # invariance would hide
    opt = torch.optim.SGD(model.parameters(), lr=1.0) if over.get("sgd") \
        else make_optimizer(model, cfg)
    dp = data_parallel_model(model) if data_parallel_model else None
    metrics = policy_update(model, opt, pb, cfg, ref, data_parallel=dp)
    return model, metrics


@contextlib.contextmanager
def gloo_group(rank: int, world: int, port: int):
    """Rank ``rank`` of a ``world``-rank gloo group on 127.0.0.1:``port`` (one torch thread),
    destroyed on exit."""
    import os

    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _rank(rank: int, world: int, port: int, model_dir: str, work: str) -> None:
    from agentgym.distributed.ddp import DataParallel

    with gloo_group(rank, world, port):
        with open(f"{work}/batch.pkl", "rb") as f:
            pb = pickle.load(f)
        results = []
        for over in CONFIGS:
            model, metrics = _update(model_dir, pb, over, DataParallel)
            results.append(({k: v.detach().clone() for k, v in model.state_dict().items()},
                            metrics))
        torch.save(results, f"{work}/rank{rank}.pt")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_shard_rows_balances_tokens_and_covers_every_row_once():
    lengths = np.array([50, 10, 40, 30, 20, 5, 45])
    rows = np.array([6, 0, 2, 3, 5, 1])
    shares = [shard_rows(rows, lengths, 3, r) for r in range(3)]
    assert sorted(np.concatenate(shares).tolist()) == sorted(rows.tolist())
    assert [s.tolist() for s in shares] == [[0, 5], [1, 6], [2, 3]]  # 55 / 55 / 70 tokens
    assert shard_rows(rows, lengths, 1, 0).tolist() == sorted(rows.tolist())
    assert shard_rows(np.array([3]), lengths, 2, 1).tolist() == []


@pytest.mark.slow
def test_two_gloo_ranks_take_the_single_process_update(tmp_path, tiny_model_dir):
    """Each config's parameters after one update on 2 CPU ranks (gloo, rows split by tokens)
    equal those of the single-process update, and so do the logged losses and grad norm."""
    import torch.multiprocessing as mp

    pb = _fixed_batch(tiny_model_dir)
    with open(tmp_path / "batch.pkl", "wb") as f:
        pickle.dump(pb, f)
    mp.spawn(_rank, args=(2, _free_port(), tiny_model_dir, str(tmp_path)), nprocs=2,
             join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    for k, over in enumerate(CONFIGS):
        model, single = _update(tiny_model_dir, pb, over)
        want = model.state_dict()
        for r in range(2):
            got, metrics = ranks[r][k]
            moved = 0.0
            for name, w in want.items():  # atol: 0.1% of an Adam step (lr 1e-2)
                torch.testing.assert_close(got[name], w, rtol=1e-4, atol=1e-5,
                                           msg=lambda m, n=name, o=over: f"{o}: {n}: {m}")
                moved = max(moved, float((w - _initial(tiny_model_dir)[name]).abs().max()))
            assert moved > 1e-5, over  # the update changed the weights
            for key in ("actor/pg_loss", "actor/grad_norm",
                        "actor/entropy", "learner/num_trained"):
                assert metrics[key] == pytest.approx(single[key], rel=1e-4, abs=1e-6), key
            if over.get("use_kl_loss"):
                assert metrics["actor/kl_loss"] == pytest.approx(single["actor/kl_loss"],
                                                                 rel=1e-4, abs=1e-7)


_INITIAL: dict = {}


def _initial(model_dir: str) -> dict:
    if model_dir not in _INITIAL:
        from transformers import AutoModelForCausalLM

        _INITIAL[model_dir] = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.float32).state_dict()
    return _INITIAL[model_dir]


@pytest.mark.slow
def test_torchrun_training_step_equals_the_single_process_step(tmp_path, tiny_model_dir):
    """``torchrun --nproc-per-node 2 -m agentgym.cli train``: rank 0 rolls out, both ranks
    train, rank 0 alone writes metrics and the checkpoint, whose weights equal those of the
    same step in one process."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from safetensors.torch import load_file

    from agentgym.cli import main

    args = ["train", "--env", "maze", "--model", tiny_model_dir, "--method", "GRPO",
            "--max-turns", "2", "--max-steps", "1", "--tasks-per-step", "2", "--n-samples",
            "2", "--eval-every", "0", "--no-warmup", "--lr", "0.01", "--set",
            "max_new_tokens=8", "--set", "save_every=1", "--set", "tensorboard=false",
            "--set", "torch_threads=1", "--set", "progress=false", "--set", "plot=false",
            "--set", 'learner={"lr": 0.01, "adam_eps": 0.0001, "use_kl_loss": false, '
            '"entropy_coeff": 0.01}']  # a gradient even where every reward is equal
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([str(torchrun), "--nproc-per-node", "2", "--master-addr",
                           "127.0.0.1", "--master-port", str(_free_port()), "-m",
                           "agentgym.cli", *args, "-o", str(tmp_path / "ddp")],
                          env=env, capture_output=True, text=True, timeout=200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("done: 1 steps") == 1  # rank 0 reports, rank 1 does not
    assert main([*args, "-o", str(tmp_path / "one")]) == 0
    rows = [json.loads(x) for x in (tmp_path / "ddp" / "metrics.jsonl").read_text().splitlines()]
    one = [json.loads(x) for x in (tmp_path / "one" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["step"] == 1 and rows[0]["actor/grad_norm"] > 0
    for key in ("actor/pg_loss", "actor/grad_norm", "learner/num_trained", "reward/mean"):
        assert rows[0][key] == pytest.approx(one[0][key], rel=1e-4, abs=1e-7), key
    got = load_file(tmp_path / "ddp/checkpoints/step_1/model/model.safetensors")
    want = load_file(tmp_path / "one/checkpoints/step_1/model/model.safetensors")
    assert got.keys() == want.keys()
    for name, w in want.items():
        torch.testing.assert_close(got[name], w, rtol=1e-4, atol=1e-5)
    assert any(not torch.equal(w, _initial(tiny_model_dir)[name]) for name, w in want.items())
