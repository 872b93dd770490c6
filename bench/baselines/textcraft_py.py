"""Pure-Python TextCraft: a clean-room baseline of the native ``textcraft`` env.

The same game as ``rust/core/src/envs/textcraft`` (AgentGym's TextCraft on the recipe data in
``envs/textcraft/recipes``), written the way AgentGym's server steps it: one Python object
per episode, regular expressions per action, dicts for the inventory. Same recipe loading,
same task order, same SplitMix64 draws and the same texts, so that the benchmark and the
parity tests can compare the two step by step. See ``envs/textcraft/README.md``.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

RECIPES_DIR = Path(__file__).resolve().parents[2] / "envs" / "textcraft" / "recipes"
MASK64 = (1 << 64) - 1
COUNT_MAX = MASK64  # counts saturate at 2**64 - 1 (AgentGym's are unbounded ints)
USES_PER_INPUT = 10
PREFIX = "minecraft:"

_CRAFT = re.compile(r"craft (.*) using (.*)")
_GET = re.compile(r"get ([0-9]+) (.*)")
_COUNT = re.compile(r"([0-9]+) (.*)")
_UNCLEAN = re.compile(r"[^A-Za-z0-9, ]+")


def sanitize(action: str) -> str:
    """AgentGym's TextCraft client cleanup of an action before it is sent to the server."""
    action = " ".join(_UNCLEAN.sub("", action).split())
    return "inventory" if action.lower() == "look" else action


class SplitMix64:
    """SplitMix64 (Steele, Lea, Flood 2014); ``below(n)`` is the multiply-shift map."""

    def __init__(self, state: int):
        self.state = state & MASK64

    def next(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)

    def below(self, n: int) -> int:
        return (self.next() * n) >> 64


def fnv1a64(text: str) -> int:
    h = 0xCBF29CE484222325
    for b in text.encode():
        h = ((h ^ b) * 0x100000001B3) & MASK64
    return h


def display(name: str) -> str:
    return name.replace(PREFIX, "").replace("_", " ")


def to_id(text: str) -> str:
    return PREFIX + text.replace(" ", "_")


def parse_count(digits: str) -> int:
    return min(int(digits), COUNT_MAX)


class Recipe:
    """One crafting recipe: ``inputs`` is a list of [name, count, is_tag] (names are ids)."""

    __slots__ = ("inputs", "output", "count", "index", "_text")

    def __init__(self, inputs, output, count, index):
        self.inputs, self.output, self.count, self.index = inputs, output, count, index
        self._text = None

    def text(self) -> str:
        if self._text is None:
            ins = ", ".join(f"{c} {display(n)}" for n, c, _ in self.inputs)
            self._text = f"craft {self.count} {display(self.output)} using {ins}"
        return self._text


class Book:
    """The recipe book: AgentGym's CraftingTree rules, files read in sorted name order."""

    def __init__(self, recipes_dir: Path = RECIPES_DIR):
        self.items: set[str] = set()
        self.tags: set[str] = set()
        self.item_tag: dict[str, str] = {}
        self.item_recipes: dict[str, list[Recipe]] = {}
        self.tag_recipes: dict[str, list[Recipe]] = {}
        self.recipes: list[Recipe] = []
        deps: dict[str, set[str]] = {}
        for fname in sorted(os.listdir(recipes_dir)):
            if fname.endswith(".json"):
                with open(recipes_dir / fname) as fp:
                    self._load(json.load(fp), deps)
        self._clean_up()
        self._depth: dict[str, int] = {}
        goals = [(item, self.depth(item)) for item in self.item_recipes]
        self.goals = [g for g, d in sorted(goals, key=lambda x: x[1]) if d >= 1]
        self.uses: dict[str, list[Recipe]] = {}
        for r in self.recipes:
            for name, _, _ in r.inputs:
                lst = self.uses.setdefault(name, [])
                if not lst or lst[-1] is not r:
                    lst.append(r)
        self.by_text: dict[str, Recipe] = {}
        for r in self.recipes:
            self.by_text.setdefault(r.text(), r)
        self.members: dict[str, list[str]] = {}
        for item, tag in self.item_tag.items():
            self.members.setdefault(tag, []).append(item)
        self._plans: dict[str, tuple] = {}

    def _ingredient(self, ing):
        if isinstance(ing, list):
            ing = ing[0]
        if "item" in ing:
            self.items.add(ing["item"])
            return ing["item"], False
        if "tag" in ing:
            self.tags.add(ing["tag"])
            return ing["tag"], True
        raise ValueError(f"unknown ingredient {ing!r}")

    def _load(self, data: dict, deps: dict[str, set[str]]) -> None:
        kind = data.get("type")
        inputs: list[list] = []
        if kind == "minecraft:crafting_shaped":
            for key, ing in data["key"].items():
                name, is_tag = self._ingredient(ing)
                count = sum(line.count(key) for line in data["pattern"])
                inputs.append([name, count, is_tag])
        elif kind == "minecraft:crafting_shapeless":
            for ing in data["ingredients"]:
                name, is_tag = self._ingredient(ing)
                for entry in inputs:
                    if entry[0] == name:
                        entry[1] += 1
                        break
                else:
                    inputs.append([name, 1, is_tag])
        else:
            return
        result = data["result"]
        if isinstance(result, str):
            output, count = result, 1
        else:
            output, count = result["item"], result.get("count") or 1
        self.items.add(output)
        if len(inputs) == 1 and inputs[0][0].endswith("_block"):
            return
        tag = None
        if "group" in data:
            tag = PREFIX + data["group"]
            if tag != output:
                self.tags.add(tag)
                self.item_tag[output] = tag
        out_deps = deps.setdefault(output, set())
        if any(output in deps.get(name, ()) for name, _, _ in inputs):
            return  # would close a cycle
        recipe = Recipe(inputs, output, count, len(self.recipes))
        self.recipes.append(recipe)
        self.item_recipes.setdefault(output, []).append(recipe)
        for name, _, _ in inputs:
            out_deps.add(name)
            out_deps.update(deps.get(name, ()))
        if tag is not None:
            self.tag_recipes.setdefault(tag, []).append(recipe)

    def _clean_up(self) -> None:
        """A tag input that no recipe can make becomes a plain (gettable) item."""
        converted = set()
        for recipes in self.item_recipes.values():
            for r in recipes:
                for entry in r.inputs:
                    name, _, is_tag = entry
                    if not is_tag:
                        continue
                    members = [i for i, t in self.item_tag.items() if t == name]
                    if not any(m in self.item_recipes for m in members):
                        entry[2] = False
                        converted.add(name)
        for name in converted:
            self.items.add(name)
            self.tags.discard(name)

    def recipes_of(self, name: str) -> list[Recipe]:
        return self.item_recipes.get(name) or self.tag_recipes.get(name) or []

    def craftable(self, name: str) -> bool:
        return name in self.item_recipes or name in self.tag_recipes

    def gettable(self, name: str) -> bool:
        return name in self.items and name not in self.tags and not self.craftable(name)

    def depth(self, name: str) -> int:
        if name not in self._depth:
            self._depth[name] = 1 << 30  # cycle guard
            recipes = self.recipes_of(name)
            d = 0
            if recipes:
                d = min(max(self.depth(n) + 1 for n, _, _ in r.inputs) for r in recipes)
            self._depth[name] = d
        return self._depth[name]

    def plan(self, goal: str):
        """(needed recipes in traversal order, their distinct input names) for a goal."""
        if goal not in self._plans:
            needed, seen, names = [], set(), []

            def visit(name):
                if name in seen:
                    return
                seen.add(name)
                for r in self.recipes_of(name):
                    needed.append(r)
                    for n, _, _ in r.inputs:
                        if n not in names:
                            names.append(n)
                        visit(n)

            visit(goal)
            texts, uniq = set(), []
            for r in needed:
                if r.text() not in texts:
                    texts.add(r.text())
                    uniq.append(r)
            self._plans[goal] = (uniq, names, texts)
        return self._plans[goal]


def sample(rng: SplitMix64, items: list, k: int) -> list:
    """All of ``items`` (no draws) when k >= len, else the first k of a partial Fisher-Yates
    shuffle of a copy."""
    arr = list(items)
    if k >= len(arr):
        return arr
    for i in range(k):
        j = i + rng.below(len(arr) - i)
        arr[i], arr[j] = arr[j], arr[i]
    return arr[:k]


def commands_for(book: Book, goal: str, seed: int, max_distractors: int) -> list[Recipe]:
    needed, names, texts = book.plan(goal)
    rng = SplitMix64(seed ^ fnv1a64(goal))
    pool, pool_texts = [], set()
    for name in names:
        uses = book.uses.get(name, [])
        for r in sample(rng, uses, USES_PER_INPUT):
            t = r.text()
            if t not in texts and t not in pool_texts:
                pool_texts.add(t)
                pool.append(r)
    lines = list(needed) + sample(rng, pool, min(max_distractors, len(pool)))
    for i in range(len(lines) - 1, 0, -1):
        j = rng.below(i + 1)
        lines[i], lines[j] = lines[j], lines[i]
    return lines


_BOOK: Book | None = None


def book() -> Book:
    global _BOOK
    if _BOOK is None:
        _BOOK = Book()
    return _BOOK


def _item_tag_repr(name: str, is_tag: bool) -> str:
    if is_tag:
        return f"ItemTag(tag={repr(name)}, item_id=None)"
    return f"ItemTag(tag=None, item_id={repr(name)})"


class Env:
    """One TextCraft episode (reset with a task index or an explicit task text)."""

    def __init__(self, max_distractors: int = 10, sanitize_actions: bool = True):
        self.book = book()
        self.max_distractors = max_distractors
        self.sanitize_actions = sanitize_actions
        self.inventory: dict[str, int] = {}
        self.goal = ""
        self.listed: list[Recipe] = []

    @property
    def num_tasks(self) -> int:
        return len(self.book.goals)

    def reset(self, task: int | str = 0, seed: int = 0) -> str:
        self.inventory = {}
        if isinstance(task, str):
            self.goal, commands = parse_spec(self.book, task)
        else:
            self.goal, commands = self.book.goals[task % len(self.book.goals)], None
        if commands is None:
            self.listed = commands_for(self.book, self.goal, seed, self.max_distractors)
            text = "\n".join(r.text() for r in self.listed)
        else:
            text = commands
            found = (self.book.by_text.get(line) for line in commands.split("\n"))
            self.listed = [r for r in found if r is not None]
        return f"Crafting commands:\n{text}\n\nGoal: craft {display(self.goal)}."

    def _resolve(self, text: str) -> tuple[str, bool]:
        name = to_id(text)
        return name, name in self.book.tags

    def step(self, action: str) -> tuple[str, float, bool]:
        if self.sanitize_actions:
            action = sanitize(action)
        line = action.split("\n", 1)[0]
        m = _CRAFT.match(line)
        if m:
            return self._craft(m.group(1), m.group(2))
        m = _GET.match(line)
        if m:
            return self._get(parse_count(m.group(1)), m.group(2))
        if line.startswith("inventory"):
            if not self.inventory:
                return "Inventory: You are not carrying anything.", 0.0, False
            parts = "".join(f"[{display(k)}] ({v}) " for k, v in self.inventory.items())
            return "Inventory: " + parts, 0.0, False
        return f"Could not execute {action}", 0.0, False

    def _get(self, count: int, text: str):
        name, is_tag = self._resolve(text)
        if is_tag or not self.book.gettable(name):
            return f"Could not find {text}", 0.0, False
        self._add(name, count)
        done = name == self.goal
        return f"Got {count} {text}", float(done), done

    def _add(self, name: str, count: int) -> None:
        self.inventory[name] = min(self.inventory.get(name, 0) + count, COUNT_MAX)

    def _craft(self, out_text: str, ins_text: str):
        m = _COUNT.match(out_text)
        out_count, out_text = (parse_count(m.group(1)), m.group(2)) if m else (1, out_text)
        out_name, out_is_tag = self._resolve(out_text)
        inputs = []
        for piece in ins_text.split(","):
            piece = piece.strip()
            m = _COUNT.match(piece)
            if not m:
                return f"Wrong item format: {piece}", 0.0, False
            name, is_tag = self._resolve(m.group(2))
            inputs.append((name, parse_count(m.group(1)), is_tag))
        need: dict[str, int] = {}
        enough = True
        for name, count, is_tag in inputs:
            need[name] = need.get(name, 0) + count
            if is_tag or self.inventory.get(name, -1) < count:
                enough = False
        if not enough or any(self.inventory[n] < c for n, c in need.items()):
            shown = "None" if out_is_tag else out_name
            return f"Could not find enough items to craft {shown}", 0.0, False
        recipe = None if out_is_tag else self._match(out_name, inputs)
        if recipe is None:
            tag = _item_tag_repr(out_name, out_is_tag)
            msg = f"ItemTagWithCount(item_tag={tag}, count={out_count})"
            return f"Could not find a valid recipe for {msg}", 0.0, False
        for name, count, _ in inputs:
            self.inventory[name] -= count
            if self.inventory[name] == 0:
                del self.inventory[name]
        self._add(recipe.output, recipe.count)
        done = recipe.output == self.goal
        return f"Crafted {recipe.count} {recipe.output}", float(done), done

    def _match(self, out_name: str, inputs) -> Recipe | None:
        for recipe in self.book.item_recipes.get(out_name, ()):
            left = list(inputs)
            ok = True
            for want, want_count, want_tag in recipe.inputs:
                hit = None
                for k, (name, _, _) in enumerate(left):
                    if name == want if not want_tag else self.book.item_tag.get(name) == want:
                        hit = k
                        break
                if hit is None or left[hit][1] != want_count:
                    ok = False
                    break
                del left[hit]
            if ok and not left:
                return recipe
        return None

    def valid_actions(self) -> list[str]:
        out = ["inventory"]
        seen = {"inventory"}
        for r in self.listed:
            for name, count, _ in r.inputs:
                a = f"get {count} {display(name)}"
                if self.book.gettable(name) and a not in seen:
                    seen.add(a)
                    out.append(a)
        for r in self.listed:
            ins = ", ".join(f"{c} {display(self._concrete(n, t))}" for n, c, t in r.inputs)
            a = f"craft {r.count} {display(r.output)} using {ins}"
            if a not in seen:
                seen.add(a)
                out.append(a)
        return out

    def _concrete(self, name: str, is_tag: bool) -> str:
        if not is_tag:
            return name
        for item in self.inventory:
            if self.book.item_tag.get(item) == name:
                return item
        for r in self.listed:
            if self.book.item_tag.get(r.output) == name:
                return r.output
        return self.book.members[name][0]


class SpecError(ValueError):
    """An explicit task text that is not a TextCraft task."""


def parse_spec(book: Book, text: str) -> tuple[str, str | None]:
    """(goal id, commands text or None) from a JSON object or a reset-observation text."""
    stripped = text.strip()
    if stripped.startswith("{"):
        try:
            obj = json.loads(stripped)
        except json.JSONDecodeError as e:
            raise SpecError(f"task spec is not valid JSON: {e}") from None
        extra = set(obj) - {"goal", "commands"}
        if extra:
            raise SpecError(f"unknown task spec keys {sorted(extra)} (allowed: goal, commands)")
        goal, commands = obj.get("goal"), obj.get("commands")
        if not isinstance(goal, str):
            raise SpecError('task spec needs "goal": an item name string')
        if isinstance(commands, list) and all(isinstance(c, str) for c in commands):
            commands = "\n".join(commands)
        elif commands is not None and not isinstance(commands, str):
            raise SpecError('"commands" must be a string or a list of strings')
    else:
        head, sep, tail = "Crafting commands:\n", "\n\nGoal: craft ", "."
        cut = text.rfind(sep)
        if not text.startswith(head) or cut < 0 or not text.endswith(tail):
            raise SpecError(
                'task spec must be a JSON object {"goal": ..., "commands": ...} or the text '
                '"Crafting commands:\\n<commands>\\n\\nGoal: craft <item>."'
            )
        commands, goal = text[len(head) : cut], text[cut + len(sep) : -1]
    goal = goal.strip()
    name = goal if goal.startswith(PREFIX) else to_id(goal)
    if not goal or name not in book.items:
        raise SpecError(f"unknown goal item {goal!r}")
    return name, commands


def make(**kwargs) -> Env:
    return Env(**kwargs)
