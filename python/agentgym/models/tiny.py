"""A tiny, randomly initialised Qwen2-architecture causal LM built locally, with no network.

``build_tiny_model(out_dir)`` writes a Hugging Face model folder that ``transformers``
(``AutoModelForCausalLM`` / ``AutoTokenizer``), in-process ``vllm`` and the vLLM
OpenAI-compatible server all load:

* ``config.json`` (``Qwen2ForCausalLM``; head_dim 64, which vLLM's CPU attention needs),
* ``model.safetensors`` (float32: bfloat16 crashes vLLM-CPU on some CPUs),
* ``tokenizer.json``: a byte-level BPE trained with ``tokenizers`` on text of the built-in
  environments (:mod:`agentgym.models.corpus`), with the ChatML special tokens
  ``<|endoftext|>`` (id 0, pad), ``<|im_start|>`` (1) and ``<|im_end|>`` (2, eos),
* ``tokenizer_config.json`` with the ChatML ``chat_template``, ``generation_config.json``.

Only numpy, safetensors and tokenizers are needed (no torch), and the output is
deterministic given the seed: the same seed writes byte-identical files.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)

#: ChatML. Append-only: rendering ``messages[:k]`` is a prefix of rendering ``messages``, and
#: the generation prompt ``<|im_start|>assistant\n`` is a prefix of the assistant turn that
#: follows it, so a multi-turn prompt can be extended turn by turn without re-rendering.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@dataclass(frozen=True)
class TinyModelConfig:
    """Architecture of the tiny model (Qwen2). ``vocab_size`` is the BPE target; the model's
    vocabulary is the trained tokenizer's exact size (at most this)."""

    vocab_size: int = 1024
    hidden_size: int = 128
    intermediate_size: int = 384
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    num_key_value_heads: int = 1
    max_position_embeddings: int = 4096
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    init_std: float = 0.02

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


def train_tokenizer(vocab_size: int = 1024, seed: int = 0):
    """A byte-level BPE ``tokenizers.Tokenizer`` trained on the env corpus; every byte is in
    the alphabet, so any text round-trips. Special tokens take ids 0, 1, 2."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    from agentgym.models.corpus import build_corpus

    if not 256 + len(SPECIAL_TOKENS) < vocab_size <= 65536:
        raise ValueError(f"vocab_size must be in (259, 65536], got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(build_corpus(seed), trainer=trainer)
    return tok


def _init_weights(cfg: TinyModelConfig, vocab: int, seed: int) -> dict[str, np.ndarray]:
    """Random float32 weights under the Hugging Face Qwen2 parameter names (normal(0, std)
    for matrices, ones for RMSNorm scales, zeros for the q/k/v biases)."""
    rng = np.random.Generator(np.random.PCG64(seed))
    h, i, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    nq, nkv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd

    def normal(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * cfg.init_std).astype(np.float32)

    w: dict[str, np.ndarray] = {"model.embed_tokens.weight": normal(vocab, h)}
    for layer in range(cfg.num_hidden_layers):
        p = f"model.layers.{layer}."
        w[p + "self_attn.q_proj.weight"] = normal(nq, h)
        w[p + "self_attn.q_proj.bias"] = np.zeros(nq, np.float32)
        w[p + "self_attn.k_proj.weight"] = normal(nkv, h)
        w[p + "self_attn.k_proj.bias"] = np.zeros(nkv, np.float32)
        w[p + "self_attn.v_proj.weight"] = normal(nkv, h)
        w[p + "self_attn.v_proj.bias"] = np.zeros(nkv, np.float32)
        w[p + "self_attn.o_proj.weight"] = normal(h, nq)
        w[p + "mlp.gate_proj.weight"] = normal(i, h)
        w[p + "mlp.up_proj.weight"] = normal(i, h)
        w[p + "mlp.down_proj.weight"] = normal(h, i)
        w[p + "input_layernorm.weight"] = np.ones(h, np.float32)
        w[p + "post_attention_layernorm.weight"] = np.ones(h, np.float32)
    w["model.norm.weight"] = np.ones(h, np.float32)
    w["lm_head.weight"] = normal(vocab, h)
    return w


def text_stack_config(cfg: TinyModelConfig, vocab: int, eos_id: int, pad_id: int) -> dict:
    """The Hugging Face config fields of the tiny text stack that every tiny model shares
    (sizes, activation, RoPE, norms, special token ids; float32), whatever its model type."""
    return {
        "vocab_size": vocab,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_position_embeddings,
        "initializer_range": cfg.init_std,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "use_cache": True,
        "tie_word_embeddings": False,
        "attention_dropout": 0.0,
        "bos_token_id": None,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
        "dtype": "float32",
    }


def _hf_config(cfg: TinyModelConfig, vocab: int, eos_id: int, pad_id: int) -> dict:
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        **text_stack_config(cfg, vocab, eos_id, pad_id),
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": cfg.num_hidden_layers,
        "torch_dtype": "float32",
    }


def write_tokenizer_config(out: Path, ids: dict[str, int], extra: list[str], template: str,
                           max_len: int) -> None:
    """``tokenizer_config.json`` and ``special_tokens_map.json`` of a tiny model: the
    special tokens ``ids`` (token -> id; ``extra`` the additional ones), ChatML's end and pad
    tokens, the chat ``template`` and ``max_len``."""
    added = {
        str(i): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for t, i in ids.items()
    }
    _write_json(
        out / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "added_tokens_decoder": added,
            "additional_special_tokens": extra,
            "bos_token": None,
            "eos_token": IM_END,
            "pad_token": ENDOFTEXT,
            "unk_token": None,
            "chat_template": template,
            "clean_up_tokenization_spaces": False,
            "model_max_length": max_len,
            "padding_side": "left",
            "split_special_tokens": False,
        },
    )
    _write_json(
        out / "special_tokens_map.json",
        {"eos_token": IM_END, "pad_token": ENDOFTEXT, "additional_special_tokens": extra},
    )


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def build_tiny_model(
    out_dir: str | os.PathLike,
    *,
    seed: int = 0,
    vocab_size: int = 1024,
    config: TinyModelConfig | None = None,
) -> Path:
    """Build the tiny model and its tokenizer into ``out_dir`` (created if needed; existing
    files of the same names are overwritten) and return the folder's path.

    ``seed`` fixes both the tokenizer corpus and the weights. ``config`` overrides the
    architecture (its ``vocab_size`` is replaced by ``vocab_size``).
    """
    from safetensors.numpy import save_file

    cfg = TinyModelConfig(**{**asdict(config or TinyModelConfig()), "vocab_size": vocab_size})
    if cfg.hidden_size % cfg.num_attention_heads:
        raise ValueError("hidden_size must be a multiple of num_attention_heads")
    if cfg.num_attention_heads % cfg.num_key_value_heads:
        raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    tok = train_tokenizer(cfg.vocab_size, seed)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    tok.save(str(out / "tokenizer.json"))

    weights = _init_weights(cfg, vocab, seed)
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})

    eos, pad = ids[IM_END], ids[ENDOFTEXT]
    _write_json(out / "config.json", _hf_config(cfg, vocab, eos, pad))
    _write_json(
        out / "generation_config.json",
        {"bos_token_id": None, "eos_token_id": [eos, pad], "pad_token_id": pad},
    )
    write_tokenizer_config(out, ids, [IM_START, IM_END], CHAT_TEMPLATE,
                           cfg.max_position_embeddings)
    return out
