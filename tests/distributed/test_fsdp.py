"""The sharded learner (FSDP2): 2 gloo ranks on CPU take the one-process update, a meta-device
build equals a normal one, checkpoints resume at another world size, and 2 nodes x 2
processes (HSDP) launched by two ``torchrun``s on 127.0.0.1 train as one process does."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from agentgym.distributed.parallel import ParallelConfig  # noqa: E402
from agentgym.learner.models import build_learner  # noqa: E402
from agentgym.learner.update import policy_update  # noqa: E402
from tests.distributed.test_ddp import (  # noqa: E402
    CONFIGS,
    _fixed_batch,
    _free_port,
    _initial,
    _learner_config,
    _update,
    gloo_group,
)

pytestmark = pytest.mark.timeout(300)

#: Each sharded run: (learner config, parallel options, LoRA settings, batch name). The
#: first three are test_ddp's configs (several mini-batches, a rank left without rows, the KL
#: reference sharded, two epochs, every loss aggregation); then activation checkpointing,
#: LoRA (its reference the base with the adapter disabled), a bounded-context batch (one
#: sample per reply), PPO (a sharded critic beside the policy) and packed micro-batches.
RUNS = [(over, {}, None, "fixed") for over in CONFIGS] + [
    (CONFIGS[0], {"activation_checkpointing": True}, None, "fixed"),
    (dict(loss_agg_mode="token-mean", use_kl_loss=True, kl_coef=0.1, num_mini_batches=2),
     {}, {"r": 4, "alpha": 8}, "fixed"),
    (dict(loss_agg_mode="seq-mean-token-mean", use_kl_loss=True, kl_coef=0.1,
          max_tokens_per_microbatch=64), {}, None, "steps"),
    (dict(adv_estimator="gae", loss_agg_mode="token-mean", use_kl_loss=False,
          num_mini_batches=2, max_tokens_per_microbatch=64), {}, None, "fixed"),
    ({**CONFIGS[1], "packing": True, "max_tokens_per_microbatch": 48}, {}, None, "fixed"),
]


def _run(model_dir: str, pb, over: dict, parallel: dict, lora: dict | None,
         distributed: bool):
    """(the base model's weights after one policy_update, its metrics, the critic's weights
    or None) for a learner built by build_learner; on a rank other than 0 the weights are
    None."""
    torch.manual_seed(0)
    cfg = _learner_config(over)
    lm = build_learner(model_dir, cfg, device=torch.device("cpu"),
                       parallel=ParallelConfig(**parallel), lora=lora,
                       use_ref=cfg.use_kl_loss, critic=cfg.adv_estimator == "gae",
                       distributed=distributed)
    opt = torch.optim.SGD([p for p in lm.model.parameters() if p.requires_grad], lr=1.0) \
        if over.get("sgd") else lm.optimizer
    metrics = policy_update(lm.model, opt, pb, cfg, lm.ref, lm.critic,
                            critic_optimizer=lm.critic_optimizer, data_parallel=lm.dp)
    return lm.full_weights(), metrics, lm.critic_weights()


def _rank(rank: int, world: int, port: int, model_dir: str, work: str) -> None:
    with gloo_group(rank, world, port):
        with open(f"{work}/batches.pkl", "rb") as f:
            batches = pickle.load(f)
        results = []
        for over, parallel, lora, name in RUNS:
            results.append(_run(model_dir, batches[name], over,
                                {"strategy": "fsdp", **parallel}, lora, True))
        if rank == 0:
            torch.save(results, f"{work}/fsdp.pt")


@pytest.fixture(scope="module")
def batches(tiny_model_dir):
    """test_ddp's fixed batch and a batch played with a bounded context (one reply a
    sample), with behaviour logprobs from the model itself."""
    from agentgym.backends import make_backend
    from agentgym.data import pack
    from agentgym.engine import RolloutEngine

    tok = transformers.AutoTokenizer.from_pretrained(tiny_model_dir)
    backend = make_backend("transformers", tiny_model_dir, max_batch_size=8)
    eng = RolloutEngine(backend, tok, max_turns=4, max_new_tokens=6, max_total_tokens=512,
                        context_window=1, temperature=1.0, own_backend=True, seed=3)
    played = eng.collect_sync(3, "maze", n_samples=2)
    eng.close()
    steps = pack(played.trajectories)
    steps = steps.with_rewards(np.linspace(0.0, 1.0, len(steps), dtype=np.float32))
    assert steps.has_steps and any(t.num_turns > 1 for t in played)
    return {"fixed": _fixed_batch(tiny_model_dir), "steps": steps}


@pytest.mark.slow
def test_two_fsdp_ranks_take_the_one_process_update(tmp_path, tiny_model_dir, batches):
    """Every run's weights after one update on 2 FSDP2 ranks (gathered from the shards)
    equal the one-process update's, and so do the logged losses and gradient norm; a LoRA
    run changes only what its adapter can (merged into the base weights)."""
    import torch.multiprocessing as mp

    with open(tmp_path / "batches.pkl", "wb") as f:
        pickle.dump(batches, f)
    mp.spawn(_rank, args=(2, _free_port(), tiny_model_dir, str(tmp_path)), nprocs=2,
             join=True)
    sharded = torch.load(tmp_path / "fsdp.pt", weights_only=False)
    initial = _initial(tiny_model_dir)
    for (over, parallel, lora, name), (got, metrics, critic) in zip(RUNS, sharded):
        label = f"{over} {parallel} lora={lora} {name}"
        pb = batches[name]
        if lora is None and not parallel and name == "fixed" and "adv_estimator" not in over:
            model, single = _update(tiny_model_dir, pb, over)  # the plain one-process path
            want, want_critic = model.state_dict(), None
        else:
            want, single, want_critic = _run(tiny_model_dir, pb, over,
                                             {"strategy": "ddp", **parallel}, lora, False)
        if want_critic is not None:  # PPO: the sharded critic's update too
            assert critic.keys() == want_critic.keys()
            for key, w in want_critic.items():
                torch.testing.assert_close(critic[key], w, rtol=1e-4, atol=1e-5)
            assert metrics["critic/vf_loss"] == pytest.approx(single["critic/vf_loss"],
                                                              rel=1e-4, abs=1e-7)
        assert got.keys() == want.keys() == initial.keys(), label
        moved = 0.0
        for key, w in want.items():  # atol: 0.1% of an Adam step (lr 1e-2)
            torch.testing.assert_close(got[key], w, rtol=1e-4, atol=1e-5,
                                       msg=lambda m, k=key, lb=label: f"{lb}: {k}: {m}")
            moved = max(moved, float((w - initial[key]).abs().max()))
        assert moved > 1e-5, label
        for key in ("actor/pg_loss", "actor/grad_norm", "actor/entropy",
                    "learner/num_trained", "learner/num_samples"):
            assert metrics[key] == pytest.approx(single[key], rel=1e-4, abs=1e-6), (label, key)
        if over.get("use_kl_loss"):
            assert metrics["actor/kl_loss"] == pytest.approx(single["actor/kl_loss"],
                                                             rel=1e-4, abs=1e-7), label
        if lora is not None:  # a LoRA update moves only the adapted linear layers
            still = [k for k in want if torch.equal(want[k], initial[k])]
            assert any("embed" in k for k in still) and all("layers" in k or "norm" in k
                                                             or "embed" in k or "lm_head" in k
                                                             for k in want)
            assert any(not torch.equal(want[k], initial[k]) for k in want if "proj" in k)


def _meta_rank(rank: int, world: int, port: int, folders: list[str], work: str) -> None:
    with gloo_group(rank, world, port):
        out = []
        for folder in folders:
            from agentgym.learner.update import LearnerConfig

            lm = build_learner(folder, LearnerConfig(), device=torch.device("cpu"),
                               parallel=ParallelConfig(strategy="fsdp"), distributed=True)
            ids = torch.arange(3, 23).reshape(2, 10)
            with torch.no_grad():
                logits = lm.unit(lambda policy, i: policy(input_ids=i).logits, ids)
            policy = lm.model
            inv = {n: b.clone() for n, b in policy.named_buffers() if "inv_freq" in n}
            tied = policy.get_output_embeddings().weight is policy.get_input_embeddings().weight
            # a backward that accumulates (not a mini-batch's last) leaves sharded gradients:
            # each parameter's gradient is its own shard, never the unsharded tensor
            with lm.dp.accumulating(True):
                lm.dp.join_backward()
            sharded = all(p.grad is not None and p.grad._local_tensor.shape ==
                          p._local_tensor.shape for p in policy.parameters())
            out.append((logits, inv, tied, sharded))
        torch.save(out, f"{work}/meta{rank}.pt")


@pytest.mark.slow
def test_a_meta_device_build_equals_a_normal_build(tmp_path, tiny_model_dir):
    """Built on the meta device on every rank and filled from rank 0's load, the sharded
    policy gives a normal build's logits on both ranks: its rotary ``inv_freq`` (not in
    the state dict, so an empty buffer would stay garbage) is the loaded one, and tied
    embeddings stay tied (a tied Llama as well as the untied tiny Qwen2). A backward of a
    micro-batch that is not its mini-batch's last leaves the gradients sharded."""
    import torch.multiprocessing as mp

    tied_dir = tmp_path / "tied"
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, tie_word_embeddings=True,
                                   max_position_embeddings=128)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(tied_dir)
    folders = [tiny_model_dir, str(tied_dir)]
    mp.spawn(_meta_rank, args=(2, _free_port(), folders, str(tmp_path)), nprocs=2, join=True)
    for k, folder in enumerate(folders):
        normal = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        with torch.no_grad():
            want = normal(input_ids=torch.arange(3, 23).reshape(2, 10)).logits
        want_inv = {n: b for n, b in normal.named_buffers() if "inv_freq" in n}
        assert want_inv and all(float(b.abs().sum()) > 0 for b in want_inv.values())
        for rank in range(2):
            logits, inv, tied, sharded_grads = torch.load(tmp_path / f"meta{rank}.pt")[k]
            assert sharded_grads
            torch.testing.assert_close(logits, want, rtol=0, atol=1e-6)
            assert inv.keys() == want_inv.keys()
            for name, b in want_inv.items():
                torch.testing.assert_close(inv[name], b, rtol=0, atol=0)
            assert tied == bool(normal.config.tie_word_embeddings)


_TRAIN = ["train", "--env", "maze", "--method", "GRPO", "--max-turns", "2",
          "--tasks-per-step", "2", "--n-samples", "2", "--eval-every", "0", "--no-warmup",
          "--set", "max_new_tokens=8", "--set", "save_every=1", "--set", "tensorboard=false",
          "--set", "torch_threads=1", "--set", "progress=false", "--set", "plot=false",
          "--set", 'learner={"lr": 0.01, "adam_eps": 0.0001, "kl_coef": 0.1, '
          '"entropy_coeff": 0.01}']  # a gradient even where every reward is equal


def _torchrun(args: list[str], nproc: int = 2, **launch) -> subprocess.CompletedProcess:
    torchrun = Path(sys.executable).with_name("torchrun")
    opts = [f"--{k.replace('_', '-')}={v}" for k, v in launch.items()]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([str(torchrun), f"--nproc-per-node={nproc}", *opts, "-m",
                           "agentgym.cli", *args], env=env, capture_output=True, text=True,
                          timeout=250)


def _one(args: list[str]) -> None:
    from agentgym.cli import main

    assert main(args) == 0


def _weights(run: Path, step: int) -> dict:
    from safetensors.torch import load_file

    return load_file(run / f"checkpoints/step_{step}/model/model.safetensors")


def _assert_same_weights(got: dict, want: dict, atol: float = 1e-6) -> None:
    assert got.keys() == want.keys()
    for name, w in want.items():
        torch.testing.assert_close(got[name], w, rtol=1e-5, atol=atol, msg=lambda m, n=name: n)


@pytest.mark.slow
def test_checkpoints_resume_at_another_world_size(tmp_path, tiny_model_dir, capsys):
    """A sharded run's checkpoint (DCP shards beside the Hugging Face folder) resumed at
    another world size continues exactly: 2 ranks for step 1 then 1 process for step 2,
    and 1 process then 2 ranks, both end at the weights of 2 uninterrupted steps."""
    base = [*_TRAIN, "--model", tiny_model_dir, "--set", 'parallel={"strategy": "fsdp"}']
    _one([*base, "--max-steps", "2", "-o", str(tmp_path / "straight")])
    want = _weights(tmp_path / "straight", 2)
    assert (tmp_path / "straight/checkpoints/step_2/dcp/.metadata").is_file()
    assert not (tmp_path / "straight/checkpoints/step_2/optim.pt").exists()
    # 2 -> 1
    first = _torchrun([*base, "--max-steps", "1", "-o", str(tmp_path / "a")],
                      master_addr="127.0.0.1", master_port=_free_port())
    assert first.returncode == 0, first.stderr[-3000:]
    _one([*base, "--max-steps", "2", "--resume", str(tmp_path / "a"), "-o", str(tmp_path / "a")])
    _assert_same_weights(_weights(tmp_path / "a", 2), want)
    # 1 -> 2
    _one([*base, "--max-steps", "1", "-o", str(tmp_path / "b")])
    second = _torchrun([*base, "--max-steps", "2", "--resume", str(tmp_path / "b"), "-o",
                        str(tmp_path / "b")], master_addr="127.0.0.1", master_port=_free_port())
    assert second.returncode == 0, second.stderr[-3000:]
    _assert_same_weights(_weights(tmp_path / "b", 2), want)
    rows = [json.loads(x) for x in (tmp_path / "b/metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and rows[-1]["timing_s/weight_sync"] > 0
    # a ddp checkpoint is refused by a sharded run: one line naming the setting, exit 2
    _one([*_TRAIN, "--model", tiny_model_dir, "--max-steps", "1", "-o", str(tmp_path / "d")])
    from agentgym.cli import main

    assert main([*base, "--max-steps", "2", "--resume", str(tmp_path / "d"), "-o",
                 str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "parallel.strategy ddp" in err and "Traceback" not in err


@pytest.mark.slow
def test_two_nodes_of_two_processes_train_as_one_process(tmp_path, tiny_model_dir):
    """Two ``torchrun --nnodes 2`` launchers (nodes 0 and 1, 2 processes each) on
    127.0.0.1: HSDP shards within a node and replicates across the two; rank 0 rolls out,
    logs and saves, and the step equals one process's (LoRA with checkpointing too)."""
    for name, extra in (("hsdp", []), ("lora", ["--set", 'lora={"r": 4}'])):
        parallel = {"strategy": "hsdp", "activation_checkpointing": name == "lora"}
        args = [*_TRAIN, "--model", tiny_model_dir, "--max-steps", "1", *extra]
        port = _free_port()
        out = tmp_path / name
        nodes = [subprocess.Popen(
            [str(Path(sys.executable).with_name("torchrun")), "--nnodes=2", f"--node-rank={n}",
             "--nproc-per-node=2", "--master-addr=127.0.0.1", f"--master-port={port}", "-m",
             "agentgym.cli", *args, "--set", f"parallel={json.dumps(parallel)}", "-o",
             str(out)], env={**os.environ, "OMP_NUM_THREADS": "1"},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for n in range(2)]
        logs = [p.communicate(timeout=250) for p in nodes]
        for p, (_, stderr) in zip(nodes, logs):
            assert p.returncode == 0, stderr[-3000:]
        assert sum(stdout.count("done: 1 steps") for stdout, _ in logs) == 1
        _one([*args, "-o", str(tmp_path / f"{name}_one")])
        _assert_same_weights(_weights(out, 1), _weights(tmp_path / f"{name}_one", 1),
                             atol=1e-5)
        state = torch.load(out / "checkpoints/step_1/trainer_state.pt", weights_only=False)
        assert state["parallel"]["strategy"] == "hsdp"
        if name == "lora":
            assert (out / "checkpoints/step_1/adapter/adapter_model.safetensors").is_file()
