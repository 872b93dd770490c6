"""agentgym.progress: tqdm's bar on a terminal, plain lines at a bounded rate in a log."""

import io
import time

import pytest

pytest.importorskip("tqdm")

from agentgym.progress import log_interval, progress_bar  # noqa: E402


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_log_bar_writes_plain_lines_at_a_bounded_rate():
    log = io.StringIO()
    bar = progress_bar(200, "warm-up", "step", show=True, file=log, interval=0.05)
    t0 = time.perf_counter()
    for i in range(200):
        time.sleep(0.001)
        bar.update(1)
        bar.set_postfix(loss=f"{i:.3f}")  # never forces a line of its own
    bar.close()
    wall = time.perf_counter() - t0
    text = log.getvalue()
    assert "\r" not in text and "\x1b" not in text and text.endswith("\n")
    lines = text.splitlines()
    assert 2 <= len(lines) <= wall / 0.05 + 3, lines
    assert lines[0].startswith("warm-up: 0/200 step (0%)")
    assert lines[-1].startswith("warm-up: 200/200 step (100%)") and "loss=199.000" in lines[-1]


def test_log_bar_leave_false_and_no_duplicate_last_line():
    log = io.StringIO()
    bar = progress_bar(3, "rollout", "ep", show=True, leave=False, file=log, interval=0)
    bar.update(3)
    bar.close()
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue()
    assert lines[-1].startswith("rollout: 3/3 ep") and len(lines) == len(set(lines))


def test_show_none_follows_the_terminal_and_a_terminal_keeps_tqdm():
    assert progress_bar(5, "x", file=io.StringIO()) is None  # None: only on a terminal
    assert progress_bar(5, "x", show=False, file=_Terminal()) is None
    term = _Terminal()
    bar = progress_bar(5, "x", "ep", file=term)
    bar.update(5)
    bar.close()
    assert "\r" in term.getvalue()  # tqdm redraws in place, as before


def test_interval_from_the_environment(monkeypatch):
    monkeypatch.setenv("AGENTGYM_PROGRESS_INTERVAL", "7.5")
    assert log_interval() == 7.5
    monkeypatch.setenv("AGENTGYM_PROGRESS_INTERVAL", "soon")
    assert log_interval() == 30.0
