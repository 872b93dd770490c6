"""tiny-vl, the local vision-language model (Idefics3), and VisionSpec: layout, determinism,
loading in transformers, the image markup and pixels against the model's own processor, the
chat template, the named model."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from agentgym.models.tiny_vl import (
    FAKE_IMAGE,
    GLOBAL_IMAGE,
    IMAGE,
    VL_CHAT_TEMPLATE,
    build_tiny_vl_model,
)
from agentgym.models.vision import (
    VisionSpec,
    as_frames,
    image_markup,
    image_placeholder_count,
)

FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "preprocessor_config.json",
    "processor_config.json",
    "chat_template.json",
)


def _frame(h: int, w: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def _digest(d: Path) -> dict[str, str]:
    return {f: hashlib.sha256((d / f).read_bytes()).hexdigest() for f in FILES}


@pytest.fixture(scope="module")
def vl_dir(tmp_path_factory) -> Path:
    return build_tiny_vl_model(tmp_path_factory.mktemp("tiny_vl"), seed=0)


@pytest.fixture(scope="module")
def spec(vl_dir) -> VisionSpec:
    return VisionSpec.from_model(vl_dir)


@pytest.fixture(scope="module")
def processor(vl_dir):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoProcessor.from_pretrained(vl_dir)


def test_layout_and_config(vl_dir, tiny_model_dir):
    for f in FILES:
        assert (vl_dir / f).is_file(), f
    cfg = json.loads((vl_dir / "config.json").read_text())
    text = json.loads((Path(tiny_model_dir) / "config.json").read_text())
    assert cfg["architectures"] == ["Idefics3ForConditionalGeneration"]
    t = cfg["text_config"]
    for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "head_dim", "rope_theta", "eos_token_id", "pad_token_id"):
        assert t[k] == text[k], k  # the tiny text model's stack (head_dim 64 for vLLM-CPU)
    assert t["vocab_size"] == text["vocab_size"] + 3
    assert cfg["torch_dtype"] == "float32"


def test_tokenizer_extends_the_text_models(vl_dir, tiny_model_dir):
    from tokenizers import Tokenizer

    vl = Tokenizer.from_file(str(vl_dir / "tokenizer.json"))
    text = Tokenizer.from_file(str(Path(tiny_model_dir) / "tokenizer.json"))
    n = text.get_vocab_size(with_added_tokens=True)
    sample = "<|im_start|>user\nYou are at row 2, column 3. Action: move north<|im_end|>\n"
    assert vl.encode(sample).ids == text.encode(sample).ids  # every text id unchanged
    assert [vl.token_to_id(t) for t in (FAKE_IMAGE, IMAGE, GLOBAL_IMAGE)] == [n, n + 1, n + 2]
    assert vl.encode(f"a{IMAGE}b").ids[1] == n + 1  # special: one id, never split


def test_deterministic_given_seed(vl_dir, tmp_path):
    again = build_tiny_vl_model(tmp_path / "a", seed=0)
    assert _digest(again) == _digest(vl_dir)
    other = build_tiny_vl_model(tmp_path / "b", seed=1)
    assert _digest(other)["model.safetensors"] != _digest(again)["model.safetensors"]


def test_bad_image_size(tmp_path):
    with pytest.raises(ValueError, match="multiple of 28"):
        build_tiny_vl_model(tmp_path, image_size=50)


def test_loads_in_transformers(vl_dir, processor, spec):
    import torch
    from transformers import AutoModelForImageTextToText

    model, info = AutoModelForImageTextToText.from_pretrained(vl_dir, output_loading_info=True)
    assert not any(info.values())  # no missing, unexpected or mismatched weights
    assert type(model).__name__ == "Idefics3ForConditionalGeneration"
    assert model.dtype == torch.float32
    inputs = processor(text=["<|im_start|>user\nwhere?<image><|im_end|>\n"],
                       images=[[_frame(28, 28)]], return_tensors="pt")
    with torch.no_grad():
        a = model(**inputs).logits
        b = model(**{**inputs, **spec.pixel_inputs([_frame(28, 28, seed=1)])}).logits
    assert a.shape[-1] == model.config.text_config.vocab_size and torch.isfinite(a).all()
    assert not torch.allclose(a[0, -1], b[0, -1])  # the model sees the picture


@pytest.mark.parametrize("hw", [(28, 28), (56, 56), (30, 70)])
def test_vision_spec_matches_the_processor(spec, processor, hw):
    import torch

    frame = _frame(*hw)
    out = processor(text=["a<image>b"], images=[[frame]], return_tensors="pt")
    ids = out["input_ids"][0].tolist()
    a, b = processor.tokenizer.encode("a", add_special_tokens=False), \
        processor.tokenizer.encode("b", add_special_tokens=False)
    assert ids == a + spec.markup_ids(*hw) + b
    assert processor.tokenizer.decode(ids) == "a" + spec.markup(*hw) + "b"
    assert ids.count(spec.image_token_id) == spec.placeholder_count(*hw) == 4
    assert spec.image_spans(ids) == [(len(a), len(ids) - len(b))]
    pix = spec.pixel_inputs([frame])
    assert torch.equal(pix["pixel_values"], out["pixel_values"])
    assert torch.equal(pix["pixel_attention_mask"], out["pixel_attention_mask"])
    assert image_placeholder_count(spec.model_dir, *hw) == 4
    assert image_markup(spec, *hw) == spec.markup(*hw)


def test_vision_spec_with_image_splitting(vl_dir, tmp_path):
    """A folder whose processor tiles frames larger than 56 px (SmolVLM's and Idefics3's
    own setting): markup, counts and spans still match the processor."""
    transformers = pytest.importorskip("transformers")
    d = tmp_path / "split"
    shutil.copytree(vl_dir, d)
    pre = json.loads((d / "preprocessor_config.json").read_text())
    pre.update(do_image_splitting=True, size={"longest_edge": 112})
    (d / "preprocessor_config.json").write_text(json.dumps(pre))
    spec = VisionSpec.from_model(d)
    proc = transformers.AutoProcessor.from_pretrained(d)
    for hw, tiles in (((112, 112), 4), ((56, 112), 2), ((112, 40), 2), ((40, 40), 4)):
        ids = proc(text=["<image>"], images=[[_frame(*hw)]])["input_ids"][0]
        assert proc.tokenizer.decode(ids) == spec.markup(*hw), hw
        assert list(ids) == spec.markup_ids(*hw), hw
        n = list(ids).count(spec.image_token_id)
        assert spec.placeholder_count(*hw) == (tiles + 1) * 4 == n, hw
        assert spec.image_spans(list(ids) + [5]) == [(0, len(ids))]


def test_spans_collapse_and_checks(spec):
    m = spec.markup_ids(28, 28)
    ids = [1, 7] + m + [8] + m + [9]
    spans = spec.image_spans(ids)
    assert spans == [(2, 2 + len(m)), (3 + len(m), 3 + 2 * len(m))]
    assert spec.collapse(ids) == [1, 7, spec.image_token_id, 8, spec.image_token_id, 9]
    assert spec.check_prompt(ids, [_frame(28, 28), _frame(56, 56)]) == spans
    assert spec.image_spans([1, 2, 3]) == []
    with pytest.raises(ValueError, match="2 image placeholder spans but 1 images"):
        spec.check_prompt(ids, [_frame(28, 28)])
    img, fake, glob = spec.image_token_id, spec.fake_token_id, spec.global_token_id
    bad = {
        "outside": [1, img, 2],
        "not whole": [1, fake, glob, img, img, fake],  # 2 image tokens, not 4
        "not whole ": [1] + m[:-1],  # cut short
        "does not start": [1, glob, img, img, img, img, fake],
    }
    for match, prompt in bad.items():
        with pytest.raises(ValueError, match=match.strip()):
            spec.image_spans(prompt)


def test_as_frames_rejects_bad_frames():
    assert len(as_frames([_frame(3, 5)])) == 1
    for bad, match in ((np.zeros((4, 4), np.uint8), "shape"), (np.zeros((4, 4, 3)), "dtype"),
                       ([[1]], "not a numpy array")):
        with pytest.raises(ValueError, match=match):
            as_frames([bad])
    with pytest.raises(ValueError, match="not one array"):
        as_frames(_frame(4, 4))


def test_from_model_of_other_folders(tiny_model_dir, vl_dir, tmp_path):
    assert VisionSpec.from_model(tiny_model_dir) is None  # text-only
    assert VisionSpec.from_model(tmp_path / "nowhere") is None
    assert VisionSpec.from_model("org/some-hub-id") is None
    d = tmp_path / "qwen"
    shutil.copytree(vl_dir, d)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "model_type": "qwen2_vl"}))
    with pytest.raises(ValueError, match="not supported"):
        VisionSpec.from_model(d)
    with pytest.raises(ValueError, match="not a vision-language"):
        image_placeholder_count(tiny_model_dir, 28, 28)


CONVERSATION = [
    {"role": "system", "content": "You are in a maze. Actions: move north|south|east|west."},
    {"role": "user", "content": [{"type": "text", "text": "You see:"}, {"type": "image"}]},
    {"role": "assistant", "content": "Action: move north"},
    {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Bumped."}]},
    {"role": "assistant", "content": "Action: move east"},
    {"role": "user", "content": [{"type": "image"}]},
]


def test_chat_template_is_append_only_and_writes_the_image_placeholder(processor, spec):
    tok = processor.tokenizer
    assert tok.chat_template == VL_CHAT_TEMPLATE

    def render(msgs, gen):
        return tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)

    full = render(CONVERSATION, False)
    assert full.count(IMAGE) == 3 and "You see:<image><|im_end|>" in full
    assert "<|im_start|>user\n<image>Bumped.<|im_end|>" in full
    full_ids = tok.encode(full, add_special_tokens=False)
    for k in range(1, len(CONVERSATION)):
        for gen in (False, True):
            if gen and CONVERSATION[k]["role"] != "assistant":
                continue
            part = render(CONVERSATION[:k], gen)
            assert full.startswith(part), (k, gen)
            ids = tok.encode(part, add_special_tokens=False)
            assert full_ids[: len(ids)] == ids, (k, gen)
    # The processor expands each template placeholder to the spec's markup.
    frames = [_frame(28, 28, i) for i in range(3)]
    ids = processor(text=[full], images=[frames])["input_ids"][0]
    assert [list(ids[s:e]) for s, e in spec.image_spans(ids)] == [spec.markup_ids(28, 28)] * 3
    assert spec.collapse(list(ids)) == full_ids


def test_named_model_tiny_vl(monkeypatch, tmp_path):
    from agentgym.models import resolve_model
    from agentgym.models.names import cached_tiny_vl_model

    monkeypatch.setenv("AGENTGYM_CACHE", str(tmp_path))
    path = resolve_model("tiny-vl")
    assert Path(path) == tmp_path / "models" / "tiny-vl-seed0"
    assert VisionSpec.from_model(path).image_seq_len == 4
    mtime = (Path(path) / "model.safetensors").stat().st_mtime_ns
    assert cached_tiny_vl_model() == Path(path)  # built once
    assert (Path(path) / "model.safetensors").stat().st_mtime_ns == mtime
    assert [p.name for p in (tmp_path / "models").iterdir()] == ["tiny-vl-seed0"]
