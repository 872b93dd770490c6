"""What a caller needs to put images into a token-exact context, read from a model folder.

A vision-language model sees an image as a run of placeholder tokens in its prompt (the
model's own image markup) plus the image's pixels beside the tokens. The rollout engine
keeps contexts as token ids, so it expands each image's markup itself, once, and the
backends receive prompts whose markup is already expanded plus the frames in order
(``Backend.generate(..., images=frames)``). :class:`VisionSpec` is everything about a model
folder that this needs, with no backend involved:

* the markup of one image of a given size (:meth:`VisionSpec.markup`,
  :meth:`VisionSpec.markup_ids`) and its placeholder count
  (:meth:`VisionSpec.placeholder_count`);
* where the expanded images are in a prompt (:meth:`VisionSpec.image_spans`), and the
  prompt with each image back to the single placeholder the chat template writes
  (:meth:`VisionSpec.collapse`: what vLLM wants, since it expands placeholders itself);
* the model inputs of a list of frames from the model's own image processor
  (:meth:`VisionSpec.pixel_inputs`).

Supported: Idefics3 (``model_type`` ``idefics3``; the local ``tiny-vl``,
:mod:`agentgym.models.tiny_vl`), with or without image splitting. Frames are
``(height, width, 3)`` uint8 RGB arrays.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

__all__ = ["PROCESSOR_FILES", "VisionSpec", "as_frames", "copy_processor_files", "image_markup",
           "image_placeholder_count", "policy_class"]

#: The files of a model folder that hold its processor (image processor, processor, chat
#: template), beside what ``save_pretrained`` of the model and its tokenizer write.
PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json", "chat_template.json")


def as_frames(images) -> list[np.ndarray]:
    """``images`` as a list of ``(h, w, 3)`` uint8 arrays (``ValueError`` otherwise)."""
    if isinstance(images, np.ndarray):
        raise ValueError("images must be a sequence of (h, w, 3) uint8 arrays, not one array")
    frames = []
    for i, f in enumerate(images):
        if not isinstance(f, np.ndarray):
            raise ValueError(f"image {i} is a {type(f).__name__}, not a numpy array")
        if f.ndim != 3 or f.shape[2] != 3 or f.shape[0] < 1 or f.shape[1] < 1:
            raise ValueError(f"image {i} has shape {f.shape}, expected (h, w, 3)")
        if f.dtype != np.uint8:
            raise ValueError(f"image {i} has dtype {f.dtype}, expected uint8")
        frames.append(f)
    return frames


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}


@dataclass(frozen=True)
class VisionSpec:
    """The image markup of an Idefics3 model folder (see the module docstring).

    The markup of one image without splitting is ``fake_token`` + ``global_token`` +
    ``image_token`` * ``image_seq_len`` + ``fake_token``; with splitting (a frame larger
    than ``max_image_size``), one tile per row and column (``fake_token`` +
    ``<row_i_col_j>`` + ``image_token`` * ``image_seq_len``, a newline after each row), a
    newline, then the whole image as above. ``prompt_markup`` is what the chat template
    writes for one image (``<image>``).
    """

    model_dir: str
    model_type: str
    image_token: str
    image_token_id: int
    fake_token: str
    fake_token_id: int
    global_token: str
    global_token_id: int
    patch_size: int
    #: The connector's pixel shuffle factor (patches merged per side into one token).
    merge_size: int
    #: Side of the square the vision tower sees (``vision_config.image_size``).
    image_size: int
    #: Image tokens per tile (or per image without splitting).
    image_seq_len: int
    do_image_splitting: bool

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_model(cls, path: str | os.PathLike) -> VisionSpec | None:
        """The spec of the model folder ``path``; None for a text-only model (or a path
        that is not a local model folder). ``ValueError`` for a vision-language
        architecture this module does not know."""
        d = Path(path)
        cfg = _read_json(d / "config.json") if d.is_dir() else {}
        if not cfg or "vision_config" not in cfg:
            return None
        model_type = cfg.get("model_type")
        if model_type != "idefics3":
            raise ValueError(
                f"{path}: vision-language model type {model_type!r} is not supported (only "
                "Idefics3: see agentgym.models.vision)")
        added = {
            t["content"]: t["id"]
            for t in _read_json(d / "tokenizer.json").get("added_tokens", [])
        }
        image_token, fake_token, global_token = (
            "<image>", "<fake_token_around_image>", "<global-img>")
        missing = [t for t in (image_token, fake_token, global_token) if t not in added]
        if missing:
            raise ValueError(f"{path}: the tokenizer has no {missing}")
        vision = cfg["vision_config"]
        patch, image_size = int(vision["patch_size"]), int(vision["image_size"])
        scale = int(cfg.get("scale_factor", 2))
        seq_len = int((image_size // patch) ** 2 / scale**2)
        proc = _read_json(d / "processor_config.json")
        if int(proc.get("image_seq_len", seq_len)) != seq_len:
            raise ValueError(f"{path}: processor_config.json's image_seq_len "
                             f"{proc['image_seq_len']} is not the model's {seq_len}")
        pre = _read_json(d / "preprocessor_config.json")
        image_id = int(cfg.get("image_token_id", added[image_token]))
        if image_id != added[image_token]:
            raise ValueError(f"{path}: config's image_token_id {image_id} is not the "
                             f"tokenizer's {image_token} ({added[image_token]})")
        return cls(
            model_dir=str(d),
            model_type=model_type,
            image_token=image_token,
            image_token_id=image_id,
            fake_token=fake_token,
            fake_token_id=int(added[fake_token]),
            global_token=global_token,
            global_token_id=int(added[global_token]),
            patch_size=patch,
            merge_size=scale,
            image_size=image_size,
            image_seq_len=seq_len,
            do_image_splitting=bool(pre.get("do_image_splitting", True)),
        )

    # ------------------------------------------------------------------ lazily loaded
    @cached_property
    def image_processor(self):
        """The model's own image processor (transformers' ``AutoImageProcessor``)."""
        from transformers import AutoImageProcessor

        return AutoImageProcessor.from_pretrained(self.model_dir)

    @cached_property
    def _tokenizer(self):
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(Path(self.model_dir) / "tokenizer.json"))

    # ------------------------------------------------------------------ markup
    @property
    def prompt_markup(self) -> str:
        """What the chat template writes for one image, before expansion."""
        return self.image_token

    @property
    def prompt_markup_ids(self) -> list[int]:
        return [self.image_token_id]

    @property
    def input_only_ids(self) -> list[int]:
        """The markup's token ids, which only the prompt may hold: the backends never
        sample them (a reply holding one would break every later request's markup)."""
        return sorted({self.image_token_id, self.fake_token_id, self.global_token_id})

    def grid(self, height: int, width: int) -> tuple[int, int]:
        """Rows and columns of tiles a ``height`` x ``width`` frame is split into ((0, 0):
        not split)."""
        if not self.do_image_splitting:
            return 0, 0
        _, rows, cols = self.image_processor.get_number_of_image_patches(height, width, {})
        return int(rows), int(cols)

    def placeholder_count(self, height: int, width: int) -> int:
        """Image tokens (``<image>``) of one ``height`` x ``width`` frame."""
        rows, cols = self.grid(height, width)
        return (rows * cols + 1) * self.image_seq_len

    @functools.lru_cache(maxsize=64)  # noqa: B019 (specs are few and live as long as a run)
    def markup(self, height: int, width: int) -> str:
        """The expanded text of one ``height`` x ``width`` frame (what the model's processor
        writes for the template's ``<image>``); the same text for every frame of a size."""
        img = self.image_token * self.image_seq_len
        whole = self.fake_token + self.global_token + img + self.fake_token
        rows, cols = self.grid(height, width)
        if not rows and not cols:
            return whole
        tiles = []
        for r in range(rows):
            for c in range(cols):
                tiles.append(f"{self.fake_token}<row_{r + 1}_col_{c + 1}>{img}")
            tiles.append("\n")
        return "".join(tiles) + "\n" + whole

    def observation(self, text: str, height: int, width: int) -> str:
        """An observation ``text`` shown with a ``height`` x ``width`` picture, as the model
        reads it: the picture's markup, then the text (the rollout engine and the format
        warm-up both write it so)."""
        return self.markup(height, width) + text

    def markup_ids(self, height: int, width: int) -> list[int]:
        """The token ids of :meth:`markup` (the model's tokenizer, no special tokens
        added)."""
        rows, cols = self.grid(height, width)
        if not rows and not cols:
            return ([self.fake_token_id, self.global_token_id]
                    + [self.image_token_id] * self.image_seq_len + [self.fake_token_id])
        return self._tokenizer.encode(self.markup(height, width),
                                      add_special_tokens=False).ids

    # ------------------------------------------------------------------ prompts
    def image_spans(self, ids: Sequence[int]) -> list[tuple[int, int]]:
        """``[start, end)`` of each expanded image's markup in ``ids``, in order.
        ``ValueError`` for markup that is not whole (a stray image token, a markup cut
        short)."""
        arr = np.asarray(ids)
        img, fake, glob = self.image_token_id, self.fake_token_id, self.global_token_id
        marks = np.flatnonzero((arr == img) | (arr == fake) | (arr == glob))
        pos, vals = marks.tolist(), arr[marks].tolist()  # only the markup tokens are walked
        spans: list[tuple[int, int]] = []
        start = None
        k = 0
        while k < len(pos):
            i, t = pos[k], vals[k]
            if t == glob:
                if start is None:
                    raise ValueError(f"image markup at {i} does not start with {self.fake_token}")
                j = k + 1
                while j < len(pos) and vals[j] == img and pos[j] == pos[j - 1] + 1:
                    j += 1
                if (j - k - 1 != self.image_seq_len or j >= len(pos) or vals[j] != fake
                        or pos[j] != pos[j - 1] + 1):
                    raise ValueError(f"image markup starting at {start} is not whole")
                spans.append((start, pos[j] + 1))
                start, k = None, j + 1
                continue
            if t == fake and start is None:
                start = i
            elif t == img and start is None:
                raise ValueError(f"image token at {i} is outside any image markup")
            k += 1
        if start is not None:
            raise ValueError(f"image markup starting at {start} is not whole")
        return spans

    def collapse(self, ids: Sequence[int], spans: Sequence[tuple[int, int]] | None = None
                 ) -> list[int]:
        """``ids`` with each expanded image (``spans``, default :meth:`image_spans`) back to
        :attr:`prompt_markup_ids`."""
        spans = self.image_spans(ids) if spans is None else spans
        out: list[int] = []
        prev = 0
        for s, e in spans:
            out.extend(ids[prev:s])
            out.extend(self.prompt_markup_ids)
            prev = e
        out.extend(ids[prev:])
        return out

    def check_prompt(self, ids: Sequence[int], frames: Sequence[np.ndarray]
                     ) -> list[tuple[int, int]]:
        """The image spans of ``ids``, checked against ``frames``: one span per frame, each
        the exact markup of its frame's size (``ValueError`` otherwise)."""
        spans = self.image_spans(ids)
        if len(spans) != len(frames):
            raise ValueError(f"the prompt has {len(spans)} image placeholder spans but "
                             f"{len(frames)} images were given")
        for k, ((s, e), f) in enumerate(zip(spans, frames, strict=True)):
            want = self.markup_ids(f.shape[0], f.shape[1])
            if list(ids[s:e]) != want:
                raise ValueError(
                    f"image {k} ({f.shape[0]}x{f.shape[1]}) needs {len(want)} markup tokens "
                    f"({self.placeholder_count(f.shape[0], f.shape[1])} placeholders), the "
                    f"prompt has {e - s} at {s}")
        return spans

    # ------------------------------------------------------------------ pixels
    def pixel_inputs(self, frames: Sequence[np.ndarray]) -> dict:
        """The model inputs of ``frames`` (in prompt order, for one sequence) from the
        model's image processor, as torch tensors: ``pixel_values`` ``(1, n, 3, H, W)`` and
        ``pixel_attention_mask`` ``(1, n, H, W)`` (n: the frames' tiles, one per frame
        without splitting)."""
        frames = as_frames(frames)
        if not frames:
            raise ValueError("pixel_inputs needs at least one frame")
        out = self.image_processor(images=[frames], return_tensors="pt",
                                   input_data_format="channels_last")
        return {k: out[k] for k in ("pixel_values", "pixel_attention_mask") if k in out}


def image_placeholder_count(model_dir_or_spec, height: int, width: int) -> int:
    """Placeholder tokens of one ``height`` x ``width`` image for a model folder (or a
    :class:`VisionSpec`)."""
    return _spec(model_dir_or_spec).placeholder_count(height, width)


def image_markup(model_dir_or_spec, height: int, width: int) -> str:
    """The expanded markup text of one ``height`` x ``width`` image for a model folder (or a
    :class:`VisionSpec`)."""
    return _spec(model_dir_or_spec).markup(height, width)


def copy_processor_files(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Copy the processor files (:data:`PROCESSOR_FILES`) of model folder ``src`` that
    exist into ``dst``, so that a vision-language model saved with ``save_pretrained`` keeps
    its image processor (a text-only folder has none: nothing is copied)."""
    import shutil

    for name in PROCESSOR_FILES:
        if (Path(src) / name).is_file():
            shutil.copyfile(Path(src) / name, Path(dst) / name)


def policy_class(model_dir: str | os.PathLike):
    """The transformers auto class of the model in ``model_dir``: a vision-language model
    (one :meth:`VisionSpec.from_model` reads) loads as ``AutoModelForImageTextToText``,
    every other model as ``AutoModelForCausalLM``."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    return AutoModelForImageTextToText if VisionSpec.from_model(model_dir) is not None \
        else AutoModelForCausalLM


def _spec(x) -> VisionSpec:
    if isinstance(x, VisionSpec):
        return x
    spec = VisionSpec.from_model(x)
    if spec is None:
        raise ValueError(f"{x} is not a vision-language model folder")
    return spec
