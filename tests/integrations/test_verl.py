"""The verl agent loop against the real verl 0.9 classes (in the verl virtualenv: verl pins
transformers < 5.11): verl's own dataset class reads the rows ``write_dataset`` writes,
verl's ``AgentLoopWorker.generate_sequences`` instantiates the registered loop through
hydra, runs it and pads the outputs into its ``DataProto``. Generation is real: a
transformers model behind an object with verl's ``server_manager.generate`` interface."""

from __future__ import annotations

import asyncio
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

# The main test run deselects this module's tests by their marker (``-m "not verl"``); they
# run in the verl virtualenv (scripts/test.sh), where these imports succeed.
try:
    with warnings.catch_warnings():  # verl's and Ray's own import-time deprecations
        warnings.simplefilter("ignore")
        import verl.experimental.agent_loop.agent_loop as verl_agent_loop
        from omegaconf import OmegaConf
        from verl.protocol import DataProto
        from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn
        from verl.workers.rollout.replica import TokenOutput

        from agentgym.integrations import verl as ag_verl

        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
        # verl's AgentLoopWorker without its Ray/model setup, as the verl peer bench builds it
        from bench.peer_verl import make_worker
except ImportError as e:  # collected, then deselected, outside the verl virtualenv
    VERL_MISSING = e
else:
    VERL_MISSING = None

pytestmark = pytest.mark.verl


@pytest.fixture(autouse=True)
def _needs_verl():
    if VERL_MISSING is not None:
        pytest.fail(f"verl is not importable ({VERL_MISSING}); run these tests with "
                    ".venv-verl/bin/python (scripts/setup.sh makes it)")


PROMPT_LEN, RESPONSE_LEN = 512, 256


class HFServerManager:
    """verl's ``LLMServerClient.generate`` contract (token ids in, ``TokenOutput`` out) over
    a transformers model; records every request."""

    def __init__(self, model_dir: str, fail: bool = False):
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
        self.calls: list[dict] = []
        self.fail = fail
        self.rng = torch.Generator().manual_seed(0)

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        if self.fail:  # stand-in fault: a dead server, which the real client cannot fake
            raise ConnectionError("server gone")
        await asyncio.sleep(0)
        tokens, logprobs = self._sample(list(prompt_ids), dict(sampling_params))
        self.calls.append({"request_id": request_id, "prompt_ids": list(prompt_ids),
                           "token_ids": tokens, "log_probs": logprobs,
                           "sampling_params": dict(sampling_params)})
        return TokenOutput(token_ids=tokens, log_probs=logprobs if sampling_params.get(
            "logprobs") else None, stop_reason="completed", extra_fields={"global_steps": 3})

    @torch.no_grad()
    def _sample(self, prompt, sp):
        stop = set(sp.get("stop_token_ids") or [])
        ids = torch.tensor([prompt])
        past, tokens, logprobs = None, [], []
        for _ in range(sp["max_tokens"]):
            out = self.model(input_ids=ids, past_key_values=past, use_cache=True)
            past = out.past_key_values
            logits = out.logits[0, -1].float()
            logp = torch.log_softmax(logits, -1)
            t = sp.get("temperature", 1.0)
            if t == 0:
                tok = int(logits.argmax())
            else:
                tok = int(torch.multinomial(torch.softmax(logits / t, -1), 1, generator=self.rng))
            tokens.append(tok)
            logprobs.append(float(logp[tok]))
            if tok in stop:
                break
            ids = torch.tensor([[tok]])
        return tokens, logprobs


def verl_config(max_turns=3, prompt_length=PROMPT_LEN):
    return OmegaConf.create({
        "actor_rollout_ref": {
            "rollout": {
                "prompt_length": prompt_length, "response_length": RESPONSE_LEN,
                "temperature": 1.0, "top_p": 1.0, "top_k": -1, "calculate_log_probs": True,
                "val_kwargs": {"temperature": 0, "top_p": 1.0, "top_k": -1},
                "agent": {"default_agent_loop": "single_turn_agent"},
                "multi_turn": {"max_assistant_turns": max_turns, "tool_config_path": None},
            },
            "model": {"path": "unused", "tokenizer_path": "unused"},
        },
        "data": {"tool_config_path": None, "apply_chat_template_kwargs": {}},
    })


def verl_batch(tmp_path, tokenizer, env_id, tasks, repeat):
    path = ag_verl.write_dataset(tmp_path / f"{env_id}.parquet", env_id, tasks)
    ds = RLHFDataset(data_files=[str(path)], tokenizer=tokenizer,
                     config=OmegaConf.create({"max_prompt_length": PROMPT_LEN,
                                              "filter_overlong_prompts": False,
                                              "cache_dir": str(tmp_path / "cache")}))
    rows = [ds[i] for i in range(len(ds)) for _ in range(repeat)]  # verl's rollout.n repeat
    return DataProto.from_single_dict(collate_fn(rows))


@pytest.fixture(scope="module")
def tokenizer(turn_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(turn_model_dir)


def test_registered_with_verl():
    entry = verl_agent_loop._agent_loop_registry[ag_verl.AGENT_NAME]
    assert entry["_target_"] == "agentgym.integrations.verl.AgentGymAgentLoop"
    assert issubclass(ag_verl.AgentGymAgentLoop, verl_agent_loop.AgentLoopBase)


def test_dataset_rows_read_by_verl(tmp_path, tokenizer):
    batch = verl_batch(tmp_path, tokenizer, "maze", [5, 7], repeat=1)
    nt = batch.non_tensor_batch
    assert list(nt["agent_name"]) == ["agentgym", "agentgym"]
    assert [e["task"] for e in nt["extra_info"]] == [5, 7]
    assert [e["env_id"] for e in nt["extra_info"]] == ["maze", "maze"]
    assert list(nt["index"]) == [0, 1]
    assert nt["raw_prompt"][0][0]["content"] == "agentgym maze task 5"


def episodes_of(calls):
    by_rid: dict[str, list[dict]] = {}
    for c in calls:
        by_rid.setdefault(c["request_id"], []).append(c)
    return list(by_rid.values())


def test_generate_sequences_plays_token_exact_episodes(tmp_path, turn_model_dir, tokenizer):
    sm = HFServerManager(turn_model_dir)
    config = verl_config(max_turns=3)
    worker = make_worker(config, sm, tokenizer)
    batch = verl_batch(tmp_path, tokenizer, "maze", [0, 1, 2], repeat=2)
    out = asyncio.run(worker.generate_sequences(batch))
    assert isinstance(out, DataProto) and len(out) == 6

    episodes = episodes_of(sm.calls)
    assert len(episodes) == 6  # one request id per episode, every turn under it
    assert max(len(e) for e in episodes) >= 2  # multi-turn episodes were played
    # The engine's per-turn sampling went to verl's server: its token cap, the end-of-turn
    # stop token, logprobs on.
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
    for c in sm.calls:
        sp = c["sampling_params"]
        assert sp["stop_token_ids"] == [eot] and sp["logprobs"] is True
        assert 1 <= sp["max_tokens"] <= 128 and sp["temperature"] == 1.0

    prompts, responses = out.batch["prompts"], out.batch["responses"]
    mask, attn = out.batch["response_mask"], out.batch["attention_mask"]
    logprobs, rm = out.batch["rollout_log_probs"], out.batch["rm_scores"]
    unmatched = list(range(len(episodes)))
    for b in range(6):
        p_len = int(attn[b, :PROMPT_LEN].sum())
        r_len = int(attn[b, PROMPT_LEN:].sum())
        prompt = prompts[b, PROMPT_LEN - p_len:].tolist()
        seq = prompt + responses[b, :r_len].tolist()
        # The episode whose every request is a prefix of this sequence.
        k = next(k for k in unmatched
                 if all(seq[:len(c["prompt_ids"])] == c["prompt_ids"] for c in episodes[k]))
        unmatched.remove(k)
        ep = episodes[k]
        assert ep[0]["prompt_ids"] == prompt  # the first request is verl's prompt
        want_mask = [0] * len(seq)
        want_lp = [0.0] * len(seq)
        for c in ep:
            s = len(c["prompt_ids"])
            assert seq[s:s + len(c["token_ids"])] == c["token_ids"]  # the reply, as generated
            want_mask[s:s + len(c["token_ids"])] = [1] * len(c["token_ids"])
            want_lp[s:s + len(c["token_ids"])] = c["log_probs"]
        assert mask[b, :r_len].tolist() == want_mask[p_len:]
        assert not mask[b, r_len:].any()
        assert logprobs[b, :r_len].tolist() == pytest.approx(want_lp[p_len:], abs=1e-6)
        # 0 between the replies: the env's observations, templated as user turns
        assert 0 in want_mask[p_len + len(ep[0]["token_ids"]):] or len(ep) == 1
        turn_scores = out.non_tensor_batch["turn_scores"][b]
        assert len(turn_scores) == len(ep) or out.non_tensor_batch[
            "agentgym_stop_reason"][b] == "length"
        assert float(rm[b].sum()) == pytest.approx(sum(turn_scores))
        assert out.non_tensor_batch["__num_turns__"][b] == 1 + 2 * len(turn_scores)
        assert out.non_tensor_batch["agentgym_stop_reason"][b] in ("done", "horizon", "length")
    assert not unmatched


def test_rollouts_of_one_prompt_are_one_group(tmp_path, turn_model_dir, tokenizer):
    """verl's n rollouts of a row are n samples of one task: the same first prompt (same
    seed), and the batch's rows reach the engine together (one engine for the batch)."""
    sm = HFServerManager(turn_model_dir)
    config = verl_config(max_turns=1)
    worker = make_worker(config, sm, tokenizer)
    ag_verl._COALESCERS.clear()
    batch = verl_batch(tmp_path, tokenizer, "game2048", [0, 1], repeat=3)
    out = asyncio.run(worker.generate_sequences(batch))
    firsts = [e[0]["prompt_ids"] for e in episodes_of(sm.calls)]
    assert len(firsts) == 6
    assert len({tuple(p) for p in firsts}) == 2  # 2048 spawns tiles from the seed
    ((_, _, coalescer),) = ag_verl._COALESCERS.values()
    assert len(coalescer._engines) == 1
    rows = out.batch["prompts"]
    assert torch.equal(rows[0], rows[1]) and torch.equal(rows[0], rows[2])
    assert not torch.equal(rows[0], rows[3])


def test_validation_sampling_and_server_failure(tmp_path, turn_model_dir, tokenizer):
    """Validation (greedy) sampling reaches the server; a server that fails ends its
    episodes as data: stop reason backend_error, nothing trained on."""
    sm = HFServerManager(turn_model_dir)
    worker = make_worker(verl_config(max_turns=2), sm, tokenizer)
    batch = verl_batch(tmp_path, tokenizer, "maze", [3], repeat=1)
    batch.meta_info["validate"] = True
    asyncio.run(worker.generate_sequences(batch))
    assert sm.calls and all(c["sampling_params"]["temperature"] == 0 for c in sm.calls)

    bad = HFServerManager(turn_model_dir, fail=True)
    worker = make_worker(verl_config(max_turns=2), bad, tokenizer)
    out = asyncio.run(worker.generate_sequences(verl_batch(tmp_path, tokenizer, "maze", [3, 4], 1)))
    assert list(out.non_tensor_batch["agentgym_stop_reason"]) == ["backend_error"] * 2
    assert not out.batch["response_mask"].any()


def test_prompt_longer_than_verls_prompt_length_is_masked_out(tmp_path, turn_model_dir,
                                                              tokenizer):
    sm = HFServerManager(turn_model_dir)
    worker = make_worker(verl_config(max_turns=2, prompt_length=32), sm, tokenizer)
    batch = verl_batch(tmp_path, tokenizer, "maze", [0, 1], repeat=1)
    out = asyncio.run(worker.generate_sequences(batch))
    assert out.batch["prompts"].shape[1] == 32
    assert list(out.non_tensor_batch["agentgym_prompt_too_long"]) == [True, True]
    assert not out.batch["response_mask"].any()
    assert not out.batch["rm_scores"].any()
    assert all(len(c["prompt_ids"]) > 32 for c in sm.calls)  # the episodes were played


def test_unknown_env_is_a_named_error(tmp_path, turn_model_dir, tokenizer):
    sm = HFServerManager(turn_model_dir)
    worker = make_worker(verl_config(), sm, tokenizer)
    batch = verl_batch(tmp_path, tokenizer, "no-such-env", [0], repeat=1)
    with pytest.raises(Exception, match="no-such-env"):
        asyncio.run(worker.generate_sequences(batch))
    bad = verl_batch(tmp_path, tokenizer, "maze", [0], repeat=1)
    bad.non_tensor_batch["extra_info"] = np.array([{"index": 0}], dtype=object)
    with pytest.raises(ag_verl.TaskRefError):
        asyncio.run(worker.generate_sequences(bad))



def test_verls_server_backend_refuses_images_by_name():
    from agentgym.backends import InvalidRequestError, SamplingParams
    from agentgym.integrations.verl import VerlServerBackend

    backend = VerlServerBackend(server_manager=object())
    with pytest.raises(InvalidRequestError, match="takes text only"):
        asyncio.run(backend.generate([1, 2], SamplingParams(max_new_tokens=2),
                                     images=[np.zeros((28, 28, 3), np.uint8)]))
