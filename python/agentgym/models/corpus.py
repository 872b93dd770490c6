"""Training text for the tiny model's tokenizer.

The corpus mixes two sources, both generated locally and deterministically from a seed:

* episodes played in the built-in native environments (``textcraft``, ``maze``, ``wordle``)
  through :class:`agentgym.EnvPool`: instructions, observations, valid actions, and
  ReAct-style ``Thought: ...`` / ``Action: ...`` turns (oracle or random valid actions);
* a synthetic text set in the style of those environments (crafting recipes, grid moves,
  five-letter guesses with feedback, ReAct turns), so the tokenizer has a full vocabulary
  even where an environment is unavailable.

An environment that is not registered or fails while it is played is skipped; the corpus
is then built from the remaining sources.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

NATIVE_ENVS = ("textcraft", "maze", "wordle")

_ITEMS = (
    "oak planks",
    "oak log",
    "birch planks",
    "spruce log",
    "stick",
    "crafting table",
    "wooden pickaxe",
    "stone pickaxe",
    "iron ingot",
    "iron pickaxe",
    "cobblestone",
    "furnace",
    "gold ingot",
    "gold nugget",
    "diamond",
    "diamond sword",
    "torch",
    "coal",
    "charcoal",
    "string",
    "bow",
    "arrow",
    "flint",
    "feather",
    "chest",
    "ladder",
    "bread",
    "wheat",
    "white wool",
    "white bed",
    "red dye",
    "red wool",
    "glass",
    "glass pane",
    "sand",
    "redstone",
    "compass",
    "clock",
    "bucket",
    "shears",
    "iron door",
    "paper",
    "book",
    "bookshelf",
    "leather",
    "sugar cane",
    "green dye",
    "lime dye",
    "blue dye",
    "stone slab",
)
_WORDS = (
    "crane",
    "slate",
    "about",
    "other",
    "which",
    "their",
    "there",
    "would",
    "these",
    "words",
    "apple",
    "brick",
    "chair",
    "dance",
    "eagle",
    "flame",
    "grape",
    "house",
    "index",
    "joker",
    "knife",
    "lemon",
    "mango",
    "night",
    "ocean",
    "piano",
    "queen",
    "river",
    "stone",
    "tiger",
    "uncle",
    "vivid",
    "whale",
    "xenon",
    "yacht",
    "zebra",
    "plant",
    "shore",
    "trace",
    "audio",
)
_DIRECTIONS = ("north", "south", "east", "west", "up", "down", "left", "right")
_THOUGHTS = (
    "I need to find out what I can do here.",
    "Let me check my inventory first.",
    "The goal requires {item}, so I should craft it.",
    "I should get {item} before anything else.",
    "The wall blocks the way {d}, so I will go another way.",
    "Moving {d} brings me closer to the goal.",
    "The letters in yellow are in the word but in another position.",
    "The green letters are correct, so I keep them.",
    "I have all the ingredients now.",
    "That did not work; I will try something else.",
)


def _synthetic(rng: random.Random, n: int) -> Iterator[str]:
    """``n`` synthetic lines in the style of the three native environments."""
    for _ in range(n):
        kind = rng.randrange(5)
        item = rng.choice(_ITEMS)
        d = rng.choice(_DIRECTIONS)
        if kind == 0:
            ings = ", ".join(
                f"{rng.randint(1, 4)} {rng.choice(_ITEMS)}" for _ in range(rng.randint(1, 3))
            )
            yield f"craft {rng.randint(1, 4)} {item} using {ings}"
            yield f"Got {rng.randint(1, 8)} {item}. Inventory: [{item}] ({rng.randint(1, 64)})"
            yield f"get {rng.randint(1, 4)} {item}"
        elif kind == 1:
            r, c = rng.randint(0, 15), rng.randint(0, 15)
            yield (
                f"You are at row {r}, column {c}. The goal is at row {rng.randint(0, 15)}, "
                f"column {rng.randint(0, 15)}. There is a wall to the {d}."
            )
            yield f"move {d}"
        elif kind == 2:
            word = rng.choice(_WORDS)
            fb = " ".join(f"{ch}:{rng.choice(['green', 'yellow', 'gray'])}" for ch in word)
            yield f"guess {word}"
            yield f"Feedback for {word}: {fb}. You have {rng.randint(1, 5)} guesses left."
        elif kind == 3:
            thought = rng.choice(_THOUGHTS).format(item=item, d=d)
            action = rng.choice(
                [
                    f"craft 1 {item}",
                    f"get 1 {item}",
                    f"move {d}",
                    f"guess {rng.choice(_WORDS)}",
                    "inventory",
                    "look",
                ]
            )
            yield f"Thought: {thought}\nAction: {action}"
        else:
            yield (
                f"Task {rng.randint(0, 9999)}: craft {item}. Valid actions: get, craft, "
                f"inventory. Reward: {rng.choice(['0', '1', '0.5', '-0.1'])}. Done: "
                f"{rng.choice(['True', 'False'])}. Step {rng.randint(1, 40)} of "
                f"{rng.randint(10, 50)}."
            )


def _env_text(env_id: str, rng: random.Random, episodes: int, turns: int) -> list[str]:
    """Text of a few episodes played in the native env ``env_id`` (oracle or random valid
    actions). Returns an empty list when the env is unavailable or fails."""
    try:
        from agentgym.pool import EnvPool

        pool = EnvPool(env_id, episodes, seed=rng.randrange(2**31), max_turns=turns)
        out = [pool.instructions]
        obs = pool.reset()
        out.extend(obs)
        live = list(range(episodes))
        for _ in range(turns):
            if not live:
                break
            actions = []
            for i in live:
                valid = pool.valid_actions(i)
                oracle = pool.oracle_action(i)
                if oracle is not None and (not valid or rng.random() < 0.6):
                    act = oracle
                elif valid:
                    act = rng.choice(valid)
                else:
                    act = "look"
                out.append("Valid actions: " + ", ".join(valid[:20]))
                out.append(
                    f"Thought: {rng.choice(_THOUGHTS).format(item=act, d='north')}\nAction: {act}"
                )
                actions.append(act)
            obs, _rew, term, trunc = pool.step(live, actions)
            out.extend(obs)
            live = [i for i, t, u in zip(live, term, trunc, strict=True) if not (t or u)]
        return out
    except Exception:  # an env that is missing or broken only loses its share of the corpus
        return []


def build_corpus(
    seed: int = 0, synthetic_lines: int = 6000, env_episodes: int = 16, env_turns: int = 12
) -> list[str]:
    """The tokenizer training corpus: env episodes plus synthetic env-style lines and a
    few chat transcripts, deterministic given ``seed`` (and the env implementations)."""
    rng = random.Random(seed)
    texts: list[str] = []
    for env_id in NATIVE_ENVS:
        texts.extend(_env_text(env_id, rng, env_episodes, env_turns))
    texts.extend(_synthetic(rng, synthetic_lines))
    roles = ("system", "user", "assistant")
    texts.extend(f"{r}\n" for r in roles for _ in range(50))
    texts.extend(
        "".join(chr(c) for c in range(32, 127)) for _ in range(5)
    )  # printable ASCII in one run, so every symbol is seen
    return texts
