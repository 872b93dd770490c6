"""Image observations: an env built with ``obs="image"`` or ``"both"`` is stepped by its
driver, then asked for its pictures (``frames(slots)``); each picture's placeholder markup
(the model's own, :class:`~agentgym.models.vision.VisionSpec`) goes before its observation
text, so the same tokenize-and-append path stores it, and the picture is kept once per
episode (:class:`~agentgym.data.frames.EpisodeFrames`) and sent beside the tokens
(``Backend.generate(..., images=)``). docs/multimodal.md has the rules.
"""

from __future__ import annotations

from agentgym.data.frames import EpisodeFrames, Frame, FrameError, RowImages, frame_of
from agentgym.engine.mechanisms.base import Mechanism

_NO_IMAGES = RowImages([], [])


class Vision(Mechanism):
    """Puts each observation's picture before its text and beside the tokens (see the
    module docs)."""

    name = "vision"
    with_images = True

    @classmethod
    def configured(cls, cfg) -> bool:
        return False  # the env's own ``obs`` option decides, not the rollout config

    @classmethod
    def wanted(cls, cfg, driver) -> bool:
        return bool(getattr(driver, "has_frames", False))

    def __init__(self, loop):
        super().__init__(loop)
        spec = loop.engine.vision
        if spec is None:
            raise ValueError(f"{loop.driver.env_id} observes images (obs='image' or 'both') "
                             f"but the engine's model has no image input: use a "
                             f"vision-language model (for example --model tiny-vl)")
        self.observation = spec.observation

    async def frames(self, eps, texts: list[str]) -> list[tuple[str, Frame | None] | FrameError]:
        """The observations ``texts`` of ``eps`` with their pictures: per episode, the text
        with the picture's placeholder markup before it, and the picture (None where the env
        showed none), or a :class:`~agentgym.data.frames.FrameError` where the env gave a
        malformed picture or failed to draw one."""
        pictures = await self.loop.driver.frames([e.slot for e in eps])
        out: list = []
        for text, picture in zip(texts, pictures):
            if picture is None:  # nothing to show this time
                out.append((text, None))
                continue
            try:
                if isinstance(picture, BaseException):
                    raise FrameError(f"the env could not draw its picture: {picture}")
                frame = frame_of(picture)
            except FrameError as err:
                out.append(err)
                continue
            out.append((self.observation(text, frame.height, frame.width), frame))
        return out

    async def begun(self, eps, obs) -> list:
        """The first prompt holds the first observation's picture."""
        failed: list = [None] * len(eps)
        for e in eps:
            e.state["vision"] = EpisodeFrames()
        for k, got in enumerate(await self.frames(eps, obs)):
            if isinstance(got, BaseException):
                failed[k] = got
            else:
                obs[k], frame = got
                if frame is not None:
                    eps[k].state["vision"].add(frame)
        return failed

    async def stepped(self, turns, outs):
        """Each step's picture before its observation; a malformed picture ends its
        episode with ``env_error``. An ending step's observation is not stored, so it
        shows no picture."""
        from agentgym.engine.drivers.base import StepOutcome

        shown = [k for k, o in enumerate(outs) if o.stop_reason is None]
        if not shown:
            return outs
        got = await self.frames([turns[k].episode for k in shown],
                                [outs[k].observation for k in shown])
        outs = list(outs)
        for k, g in zip(shown, got):
            o = outs[k]
            if isinstance(g, BaseException):
                outs[k] = StepOutcome.env_error(g, o.reward)
            else:  # a running episode's outcome is the driver's fresh object: set in place
                o.observation = g[0]
                if g[1] is not None:
                    turns[k].episode.state["vision_next"] = g[1]
        return outs

    def recorded(self, turns) -> None:
        """A step's picture is kept where its observation was stored (the episode goes
        on)."""
        for t in turns:
            frame = t.episode.state.pop("vision_next", None)
            if frame is not None and t.episode.stop_reason is None:
                t.episode.state["vision"].add(frame)

    def request_kwargs(self, ep) -> dict:
        frames = ep.state.get("vision")
        return {} if frames is None else {"images": frames.arrays}

    def _images(self, eps) -> list[RowImages]:
        return [RowImages(f.frames, f.refs) if (f := e.state.get("vision")) is not None
                else RowImages([], []) for e in eps]

    def trajectory_fields(self, eps) -> dict:
        return {"images": self._images(eps)}

    def packed_fields(self, eps) -> dict:
        return {"images": self._images(eps)}
