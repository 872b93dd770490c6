"""Regenerate ``answers.txt`` and ``words.txt`` from Debian's SCOWL-based word lists.

Provenance of the shipped lists (run once; the output is committed, the build never runs this):
``apt-get download wamerican-small wamerican wamerican-large`` and ``dpkg -x`` each into DIR,
then ``python make_words.py DIR/usr/share/dict``. Answers: lowercase five-letter words of
``american-english-small`` (common words) without plain inflections (plural ``-s``/``-es``,
past ``-ed``) whose base is a word, Roman numerals, or a short blocklist; shuffled once with a
fixed seed so that any range of task indices is an unbiased sample. Allowed guesses: every
lowercase five-letter word of the three lists, plus the answers, sorted.
"""

import random
import re
import sys
from pathlib import Path

BLOCK = {
    "bitch", "dyke", "faggy", "fagot", "gooks", "homo", "kike", "negro", "nigga", "pussy",
    "whore", "spics", "wanks", "dildo", "penis", "semen", "sluts", "slutty", "rapes", "raped",
    "rapist", "boobs", "boozy", "crack", "horny", "bonks", "shits", "turds", "paki", "slut",
}
ROMAN = re.compile(r"[ivxlcdm]+")
FIVE = re.compile(r"[a-z]{5}")


def inflected(w: str, words: set[str]) -> bool:
    if w.endswith("s") and not w.endswith("ss"):
        if w[:-1] in words or (w.endswith("es") and w[:-2] in words):
            return True
        if w.endswith("ies") and w[:-3] + "y" in words:
            return True
    if w.endswith("ed"):
        if w[:-2] in words or w[:-1] in words or (w[-3] == w[-4] and w[:-3] in words):
            return True
    return False


def main(dict_dir: str) -> None:
    d = Path(dict_dir)
    lists = [d / "american-english-small", d / "american-english", d / "american-english-large"]
    small = [w.strip() for w in lists[0].read_text(encoding="latin-1").split("\n")]
    every = set()
    for p in lists:
        every.update(w.strip() for w in p.read_text(encoding="latin-1").split("\n"))
    answers = sorted(
        w
        for w in set(small)
        if FIVE.fullmatch(w) and not ROMAN.fullmatch(w) and w not in BLOCK
        and not inflected(w, every)
    )
    random.Random(20250601).shuffle(answers)
    guesses = sorted(
        {w for w in every if FIVE.fullmatch(w) and not ROMAN.fullmatch(w) and w not in BLOCK}
        | set(answers)
    )
    here = Path(__file__).parent
    (here / "answers.txt").write_text("\n".join(answers) + "\n")
    (here / "words.txt").write_text("\n".join(guesses) + "\n")
    print(f"{len(answers)} answers, {len(guesses)} allowed guesses")


if __name__ == "__main__":
    main(sys.argv[1])
