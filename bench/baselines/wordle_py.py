"""Pure-Python clean-room baseline of the native ``wordle`` env (``rust/core/src/envs/wordle/``).

Same word lists, texts, rewards and sampled valid actions, bit for bit; used by ``bench/``
to measure the native env against plain Python and by the tests as a reference.
"""

from __future__ import annotations

import bisect
from pathlib import Path

from bench.baselines._splitmix import ASCII_LOWER, STRIP, SplitMix64, derive

SALT = 0x776F7264
TEST_PERCENT = 15
_DIR = Path(__file__).resolve().parents[2] / "envs" / "wordle"
ANSWERS = [w for w in (_DIR / "answers.txt").read_text().split("\n") if w]
ALLOWED = sorted(w for w in (_DIR / "words.txt").read_text().split("\n") if w)
_ALLOWED_SET = frozenset(ALLOWED)
_ALPHA = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


def feedback(guess: str, answer: str) -> str:
    """Per-letter marks ``G``/``Y``/``B`` with Wordle's duplicate-letter rule."""
    marks = ["B"] * 5
    left: dict[str, int] = {}
    for i in range(5):
        if guess[i] == answer[i]:
            marks[i] = "G"
        else:
            left[answer[i]] = left.get(answer[i], 0) + 1
    for i in range(5):
        if marks[i] == "B" and left.get(guess[i], 0) > 0:
            marks[i] = "Y"
            left[guess[i]] -= 1
    return "".join(marks)


def parse_guess(action: str) -> str | None:
    """The lowercased five-letter word of ``guess crane`` / ``Guess: CRANE`` / ``crane``."""
    s = action.strip(STRIP)
    if len(s) >= 6 and s[:5].translate(ASCII_LOWER) == "guess" and s[5] in " :":
        s = s[6:].lstrip(" ")
    if len(s) != 5 or not all(c in _ALPHA for c in s):
        return None
    return s.translate(ASCII_LOWER)


class Env:
    """One Wordle episode at a time; task ``i`` is answer ``i`` of the split."""

    def __init__(
        self,
        max_guesses: int = 6,
        split: str = "all",
        valid_actions: str = "sample",
        num_valid_actions: int = 20,
    ):
        n = len(ANSWERS)
        cut = n - n * TEST_PERCENT // 100
        self.start, self.stop = {"all": (0, n), "train": (0, cut), "test": (cut, n)}[split]
        self.max_guesses = max_guesses
        self.mode = valid_actions
        self.num_valid = num_valid_actions
        self.answer = ""
        self.seed = 0
        self.history: list[tuple[str, str]] = []
        self.done = True

    def reset(self, task: int, seed: int = 0) -> str:
        self.answer = ANSWERS[self.start + task % (self.stop - self.start)]
        self.seed = seed
        self.history = []
        self.done = False
        return (
            f"Guess the secret five-letter word. You have {self.max_guesses} guesses. "
            "Reply: guess <word>."
        )

    def step(self, action: str) -> tuple[str, float, bool]:
        if self.done:
            return "The episode is over.", 0.0, True
        left = self.max_guesses - len(self.history)
        word = parse_guess(action)
        if word is None:
            return f"Invalid action. Reply: guess <five-letter word>. {left} left.", 0.0, False
        i = bisect.bisect_left(ALLOWED, word)
        if i == len(ALLOWED) or ALLOWED[i] != word:
            return f"Not in the word list: {word}. {left} left.", 0.0, False
        marks = feedback(word, self.answer)
        self.history.append((word, marks))
        left -= 1
        shown = " ".join(f"{c}={m}" for c, m in zip(word, marks, strict=True))
        head = f"Guess {len(self.history)}/{self.max_guesses}: {word} -> {shown}."
        if marks == "GGGGG":
            self.done = True
            return head + " Solved!", 1.0, True
        if left == 0:
            self.done = True
            return f"{head} Out of guesses; the word was {self.answer}.", 0.0, True
        return f"{head} {left} left.", 0.0, False

    def valid_actions(self) -> list[str]:
        if self.done:
            return []
        if self.mode == "consistent":
            out = []
            for w in ANSWERS:
                if len(out) >= self.num_valid:
                    break
                if all(feedback(g, w) == m for g, m in self.history):
                    out.append(f"guess {w}")
            return out
        rng = SplitMix64(derive(SALT, self.seed, len(self.history)))
        want = min(self.num_valid, len(ANSWERS))
        picked: list[int] = []
        while len(picked) < want:
            k = rng.below(len(ANSWERS))
            if k not in picked:
                picked.append(k)
        return [f"guess {ANSWERS[k]}" for k in picked]


def make(**kwargs) -> Env:
    """Same kwargs and defaults as the native ``wordle``."""
    return Env(**kwargs)
