"""Every progress bar agentgym shows goes through :func:`progress_bar`.

On a terminal it is tqdm's usual bar, redrawn in place. When stderr is not a terminal (a
scheduler's log file, a pipe) it is a :class:`LogLineBar`: the same tqdm, but each refresh is
one plain line ending in a newline (no carriage return, no cursor moves, ASCII), written at
most once per ``AGENTGYM_PROGRESS_INTERVAL`` seconds (tqdm's ``mininterval``, default 30),
plus the first and the last line; ``set_postfix`` never forces a line of its own. A bar of
``T`` seconds writes at most ``T / interval + 2`` lines.

:func:`quiet_library_bars` turns off the Hugging Face libraries' own bars (transformers'
"Loading weights", "Writing model shards"; huggingface_hub's downloads) for a non-terminal
log; the command line calls it before it imports them.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Any, TextIO

__all__ = ["DEFAULT_LOG_INTERVAL_S", "log_interval", "progress_bar", "quiet_library_bars"]

#: Seconds between two lines of a bar in a non-terminal log.
DEFAULT_LOG_INTERVAL_S = 30.0

_LINE_FORMAT = ("{desc}: {n_fmt}/{total_fmt} {unit} ({percentage:.0f}%), {elapsed} elapsed, "
                "{remaining} left, {rate_fmt}{postfix}")
_LINE_FORMAT_NO_TOTAL = "{desc}: {n_fmt} {unit}, {elapsed} elapsed, {rate_fmt}{postfix}"


def log_interval() -> float:
    """Seconds between two lines of a bar in a log: ``AGENTGYM_PROGRESS_INTERVAL`` or 30."""
    raw = os.environ.get("AGENTGYM_PROGRESS_INTERVAL", "")
    try:
        return max(0.0, float(raw)) if raw else DEFAULT_LOG_INTERVAL_S
    except ValueError:
        return DEFAULT_LOG_INTERVAL_S


def _is_tty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


@functools.cache
def _tqdm_class():
    """``LogLineBar``, built on first use (importing this module needs no tqdm)."""
    from tqdm import tqdm

    class LogLineBar(tqdm):
        """A tqdm bar for log files: one newline-terminated line per refresh."""

        def __init__(self, *args: Any, **kwargs: Any):
            interval = kwargs.pop("interval", None)
            interval = log_interval() if interval is None else interval
            total = kwargs.get("total")
            kwargs.setdefault("bar_format",
                              _LINE_FORMAT if total else _LINE_FORMAT_NO_TOTAL)
            kwargs.update(mininterval=interval, maxinterval=max(interval, 1.0), ascii=True,
                          dynamic_ncols=False, ncols=None, disable=False, position=0)
            self._last_line: str | None = None
            super().__init__(*args, **kwargs)

        def display(self, msg: str | None = None, pos: int | None = None) -> bool:
            if msg == "":  # a bar with leave=False clears its line: nothing to clear here
                return False
            line = str(self) if msg is None else msg
            self.fp.write(line + "\n")
            self.fp.flush()
            self._last_line = line
            return True

        def set_postfix(self, ordered_dict=None, refresh: bool = True, **kwargs: Any) -> None:
            super().set_postfix(ordered_dict, refresh=False, **kwargs)

        def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
            super().set_postfix_str(s, refresh=False)

        def close(self) -> None:
            if not self.disable and hasattr(self, "last_print_t"):
                self._ema_dt = lambda: None  # the last line gives the run's overall rate
                line = str(self)
                if line != self._last_line:
                    self.display(line)
            self.leave = False  # the final line is written; tqdm's close writes nothing more
            super().close()

    return LogLineBar


def progress_bar(total: int | None, desc: str, unit: str = "it", *, show: bool | None = None,
                 initial: int = 0, leave: bool = True, file: TextIO | None = None,
                 interval: float | None = None):
    """A tqdm bar over ``total`` items, or None when ``show`` is False, or when ``show`` is
    None and ``file`` (default stderr) is not a terminal. On a terminal: tqdm's redrawn bar;
    otherwise a :class:`LogLineBar` (one plain line every ``interval`` seconds, default
    :func:`log_interval`). Callers use ``update``, ``set_postfix`` and ``close``."""
    stream = sys.stderr if file is None else file
    tty = _is_tty(stream)
    if show is False or (show is None and not tty):
        return None
    if tty:
        from tqdm.auto import tqdm

        return tqdm(total=total, initial=initial, desc=desc, unit=unit, leave=leave,
                    dynamic_ncols=True, file=file)
    return _tqdm_class()(total=total, initial=initial, desc=desc, unit=unit, leave=leave,
                         file=stream, interval=interval)


def quiet_library_bars() -> None:
    """When stderr is not a terminal, turn off the Hugging Face libraries' progress bars
    (unless ``HF_HUB_DISABLE_PROGRESS_BARS`` is set): they redraw with carriage returns.
    Call before transformers is imported; once imported, it is told directly."""
    if _is_tty(sys.stderr) or "HF_HUB_DISABLE_PROGRESS_BARS" in os.environ:
        return
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
