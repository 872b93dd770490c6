"""Image observations as data: one :class:`Frame` per picture an env showed.

A frame is an RGB picture (``height x width x 3`` uint8, row-major) with its content hash.
An episode keeps each distinct frame once (:class:`EpisodeFrames`): its trajectory holds the
frames (``Trajectory.images``) and, per image placeholder span of its tokens in order, the
index of the frame shown there (``Trajectory.image_refs``). A frame seen again (the same
state, say after bumping into a wall) is stored once and referred to twice; a context sent
to a backend refers to the same frame objects, never to copies.
"""

from __future__ import annotations

import io
from typing import NamedTuple

import msgspec
import numpy as np

from agentgym import _core

__all__ = ["EpisodeFrames", "Frame", "FrameError", "RowImages", "frame_of", "png"]


class FrameError(ValueError):
    """An env returned a picture that is not an RGB frame (shape ``(h, w, 3)``, uint8)."""


class Frame(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One RGB picture: ``data`` holds ``height * width * 3`` bytes, row-major; ``hash`` is
    its content id, :func:`agentgym._core.frame_digest` (BLAKE3 of the bytes and the sizes,
    16 bytes as hex): the same id whether Rust drew the frame or Python made it."""

    hash: str
    height: int
    width: int
    data: bytes

    def array(self) -> np.ndarray:
        """The picture as a read-only ``(height, width, 3)`` uint8 array over ``data`` (no
        copy)."""
        return np.frombuffer(self.data, np.uint8).reshape(self.height, self.width, 3)

    @property
    def nbytes(self) -> int:
        return len(self.data)


def frame_of(picture: object) -> Frame:
    """The :class:`Frame` of an env's picture (a ``(h, w, 3)`` uint8 array, or a Frame);
    :class:`FrameError` naming what is wrong otherwise."""
    if isinstance(picture, Frame):
        return picture
    if not isinstance(picture, np.ndarray):
        raise FrameError(f"a frame must be a numpy array, got {type(picture).__name__}")
    if picture.dtype != np.uint8:
        raise FrameError(f"a frame must be uint8, got {picture.dtype}")
    if picture.ndim != 3 or picture.shape[2] != 3 or picture.shape[0] < 1 or picture.shape[1] < 1:
        raise FrameError(f"a frame must have shape (height, width, 3), got {picture.shape}")
    height, width = int(picture.shape[0]), int(picture.shape[1])
    data = np.ascontiguousarray(picture).tobytes()
    return Frame(hash=_core.frame_digest(height, width, data), height=height, width=width,
                 data=data)


def png(picture: Frame | np.ndarray) -> bytes:
    """A picture (a :class:`Frame` or an ``(h, w, 3)`` uint8 array) as a PNG file, 8-bit
    RGB, lossless: decoded, it is the picture exactly (Pillow encodes it)."""
    from PIL import Image

    pixels = picture.array() if isinstance(picture, Frame) else np.ascontiguousarray(picture)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


class EpisodeFrames:
    """The frames of one episode: each distinct frame once (``frames``), the frame of each
    image placeholder span in context order (``refs``), and the arrays a backend is sent
    (``arrays``: one per span, in order; repeated frames are the same array object)."""

    __slots__ = ("_index", "_views", "arrays", "frames", "refs")

    def __init__(self) -> None:
        self.frames: list[Frame] = []
        self.refs: list[int] = []
        self.arrays: list[np.ndarray] = []
        self._index: dict[str, int] = {}
        self._views: list[np.ndarray] = []

    def add(self, frame: Frame) -> None:
        """One more span showing ``frame``."""
        i = self._index.get(frame.hash)
        if i is None:
            i = self._index[frame.hash] = len(self.frames)
            self.frames.append(frame)
            self._views.append(frame.array())
        self.refs.append(i)
        self.arrays.append(self._views[i])

    def __len__(self) -> int:
        return len(self.refs)


class RowImages(NamedTuple):
    """One packed row's images: its distinct ``frames`` and, per image placeholder span of
    its tokens in order, the index of its frame (``refs``)."""

    frames: list[Frame]
    refs: list[int]

    def spans(self) -> list[Frame]:
        """The frame of each span, in order (repeated frames are the same object)."""
        return [self.frames[r] for r in self.refs]
