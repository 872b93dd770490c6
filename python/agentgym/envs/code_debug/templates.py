"""Function templates and bug mutations for the ``code_debug`` task set.

Each :class:`Template` is a correct function (``$f`` stands for its name) with a docstring
that states the intended behaviour, a few alternative names, an input generator, edge-case
inputs, and bug sites: ``(kind, old, new)`` replaces ``old`` by ``new`` on the one body line
containing ``old`` (or equal to it, indentation included). Every bug terminates on every
generated input (no infinite loops); ``tests/envs/test_code_debug.py`` checks that each buggy
variant fails at least one visible test and the reference passes all.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Template:
    family: str
    names: tuple[str, ...]
    params: str
    doc: str
    body: str
    bugs: tuple[tuple[str, str, str], ...]
    inputs: Callable[[random.Random], tuple]
    edge: tuple[tuple, ...] = ()


def _ints(r: random.Random, lo: int = -20, hi: int = 20, n: tuple[int, int] = (0, 8)) -> list:
    return [r.randint(lo, hi) for _ in range(r.randint(*n))]


def _word(r: random.Random, letters: str = "abcdeilnorst", n: tuple[int, int] = (1, 7)) -> str:
    return "".join(r.choice(letters) for _ in range(r.randint(*n)))


def _sentence(r: random.Random, caps: bool = True) -> str:
    words = [_word(r) for _ in range(r.randint(0, 6))]
    if caps:
        words = [w.upper() if r.random() < 0.2 else w for w in words]
    return " ".join(words)


def _matrix(r: random.Random) -> list:
    width = r.randint(1, 3)
    return [_ints(r, 0, 9, (width, width)) for _ in range(r.randint(1, 3))]


T = Template
TEMPLATES: tuple[Template, ...] = (
    T("arithmetic", ("sum_to", "triangular", "sum_first_n"), "n",
      "Return 1 + 2 + ... + n (0 when n < 1).",
      "total = 0\nfor i in range(1, n + 1):\n    total += i\nreturn total",
      (("off_by_one", "range(1, n + 1)", "range(1, n)"),
       ("initial_value", "total = 0", "total = 1"),
       ("wrong_operator", "total += i", "total -= i")),
      lambda r: (r.randint(0, 40),), ((0,), (1,), (5,))),
    T("recursion", ("factorial", "fact", "product_to"), "n",
      "Return n! = 1 * 2 * ... * n (1 when n <= 1).",
      "if n <= 1:\n    return 1\nreturn n * $f(n - 1)",
      (("wrong_base_case", "return 1", "return 0"),
       ("missing_base_case", "if n <= 1:", "if n == 1:"),
       ("wrong_operator", "return n * $f(n - 1)", "return n + $f(n - 1)")),
      lambda r: (r.randint(0, 12),), ((0,), (1,), (4,))),
    T("arithmetic", ("fibonacci", "fib", "nth_fib"), "n",
      "Return the n-th Fibonacci number (fib(0) = 0, fib(1) = 1).",
      "a, b = 0, 1\nfor _ in range(n):\n    a, b = b, a + b\nreturn a",
      (("off_by_one", "range(n)", "range(n - 1)"),
       ("initial_value", "a, b = 0, 1", "a, b = 1, 1"),
       ("wrong_variable", "return a", "return b")),
      lambda r: (r.randint(0, 30),), ((0,), (1,), (2,), (7,))),
    T("arithmetic", ("power", "int_pow", "raise_to"), "base, exp",
      "Return base ** exp for an integer exp >= 0, by repeated multiplication.",
      "result = 1\nfor _ in range(exp):\n    result *= base\nreturn result",
      (("initial_value", "result = 1", "result = 0"),
       ("wrong_operator", "result *= base", "result += base"),
       ("off_by_one", "range(exp)", "range(exp + 1)")),
      lambda r: (r.randint(-5, 9), r.randint(0, 8)), ((2, 0), (3, 1), (2, 10))),
    T("arithmetic", ("gcd", "greatest_common_divisor", "hcf"), "a, b",
      "Return the greatest common divisor of two non-negative integers (gcd(0, 0) = 0).",
      "while b:\n    a, b = b, a % b\nreturn a",
      (("wrong_operator", "a, b = b, a % b", "a, b = b, a // b"),
       ("wrong_variable", "return a", "return b"),
       ("wrong_comparison", "while b:", "while b > 1:")),
      lambda r: (r.randint(0, 60) * r.randint(1, 4), r.randint(0, 60) * r.randint(1, 4)),
      ((12, 18), (7, 0), (0, 9), (35, 14))),
    T("arithmetic", ("digit_sum", "sum_digits", "add_digits"), "n",
      "Return the sum of the decimal digits of the integer n (sign ignored).",
      "n = abs(n)\ntotal = 0\nwhile n > 0:\n    total += n % 10\n    n //= 10\nreturn total",
      (("missing_abs", "n = abs(n)", "n = n"),
       ("wrong_comparison", "while n > 0:", "while n > 9:"),
       ("wrong_operator", "total += n % 10", "total += n // 10")),
      lambda r: (r.randint(-99999, 99999),), ((0,), (7,), (-45,), (1009,))),
    T("arithmetic", ("is_prime", "prime", "check_prime"), "n",
      "Return True when the integer n is a prime number, else False.",
      "if n < 2:\n    return False\ni = 2\nwhile i * i <= n:\n    if n % i == 0:\n"
      "        return False\n    i += 1\nreturn True",
      (("wrong_comparison", "while i * i <= n:", "while i * i < n:"),
       ("off_by_one", "if n < 2:", "if n < 1:"),
       ("initial_value", "i = 2", "i = 3")),
      lambda r: (r.randint(-3, 120),), ((1,), (2,), (4,), (9,), (25,), (13,))),
    T("arithmetic", ("clamp", "bound", "limit_range"), "x, lo, hi",
      "Return x limited to the closed interval [lo, hi] (lo <= hi).",
      "if x < lo:\n    return lo\nif x > hi:\n    return hi\nreturn x",
      (("wrong_variable", "return hi", "return lo"),
       ("wrong_comparison", "if x < lo:", "if x > lo:"),
       ("wrong_variable_2", "return x", "return hi")),
      lambda r: (r.randint(-30, 30), r.randint(-10, 0), r.randint(1, 10)),
      ((5, 0, 10), (-5, 0, 10), (15, 0, 10))),
    T("arithmetic", ("mean", "average", "arithmetic_mean"), "nums",
      "Return the arithmetic mean of the list nums as a float (0.0 for an empty list).",
      "if not nums:\n    return 0.0\ntotal = 0\nfor x in nums:\n    total += x\n"
      "return total / len(nums)",
      (("off_by_one", "return total / len(nums)", "return total / (len(nums) + 1)"),
       ("wrong_operator", "return total / len(nums)", "return total // len(nums)"),
       ("missing_base_case", "if not nums:", "if nums is None:")),
      lambda r: (_ints(r, -9, 30, (1, 7)),), (([],), ([3],), ([1, 2],), ([1, 2, 4],))),
    T("string", ("count_vowels", "vowel_count", "num_vowels"), "s",
      "Return how many characters of s are vowels (a, e, i, o, u), ignoring case.",
      "count = 0\nfor ch in s.lower():\n    if ch in \"aeiou\":\n        count += 1\nreturn count",
      (("missing_lower", "for ch in s.lower():", "for ch in s:"),
       ("wrong_constant", "if ch in \"aeiou\":", "if ch in \"aeio\":"),
       ("initial_value", "count = 0", "count = 1")),
      lambda r: (_sentence(r) + r.choice(["U", "u", "", "O"]),), (("",), ("AEIOU",), ("sky",))),
    T("string", ("reverse_words", "flip_words", "words_backwards"), "s",
      "Return the words of s (split on whitespace) in reverse order, joined by single spaces.",
      "words = s.split()\nwords.reverse()\nreturn \" \".join(words)",
      (("wrong_call", "words.reverse()", "words.sort()"),
       ("wrong_constant", "return \" \".join(words)", "return \"\".join(words)"),
       ("wrong_split", "words = s.split()", "words = s.split(\" \")")),
      lambda r: ("  ".join(_word(r) for _ in range(r.randint(2, 5))),),
      (("b a",), ("one  two",), ("",))),
    T("string", ("is_palindrome", "palindrome", "reads_same_backwards"), "s",
      "Return True when s reads the same backwards, looking only at letters and digits and "
      "ignoring case.",
      "cleaned = [ch.lower() for ch in s if ch.isalnum()]\nleft, right = 0, len(cleaned) - 1\n"
      "while left < right:\n    if cleaned[left] != cleaned[right]:\n        return False\n"
      "    left += 1\n    right -= 1\nreturn True",
      (("off_by_one", "left, right = 0, len(cleaned) - 1", "left, right = 0, len(cleaned) - 2"),
       ("missing_lower", "cleaned = [ch.lower()", "cleaned = [ch"),
       ("wrong_comparison", "if cleaned[left] != cleaned[right]:",
        "if cleaned[left] == cleaned[right]:")),
      lambda r: (r.choice([lambda w: w + w[::-1].upper(), lambda w: w + ", " + w[::-1],
                           lambda w: w + "x" + w])(_word(r)),),
      (("Abba",), ("race car",), ("ab",), ("Noon",))),
    T("string", ("capitalize_words", "title_words", "cap_each_word"), "s",
      "Return s with the first character of every space-separated word upper-cased.",
      "out = []\nfor word in s.split(\" \"):\n    out.append(word[:1].upper() + word[1:])\n"
      "return \" \".join(out)",
      (("off_by_one", "word[:1].upper() + word[1:]", "word[:1].upper() + word[2:]"),
       ("missing_upper", "word[:1].upper() + word[1:]", "word[:1] + word[1:]"),
       ("wrong_constant", "return \" \".join(out)", "return \"-\".join(out)")),
      lambda r: (_sentence(r, caps=False),), (("hello world",), ("a b",), ("",))),
    T("string", ("run_length_encode", "rle", "compress_runs"), "s",
      "Return the run-length encoding of s: each run of a character as the character "
      "followed by the run length, e.g. 'aab' -> 'a2b1'.",
      "if not s:\n    return \"\"\nout = []\ncurrent, count = s[0], 1\nfor ch in s[1:]:\n"
      "    if ch == current:\n        count += 1\n    else:\n"
      "        out.append(current + str(count))\n        current, count = ch, 1\n"
      "out.append(current + str(count))\nreturn \"\".join(out)",
      (("initial_value", "current, count = s[0], 1", "current, count = s[0], 0"),
       ("missing_final", "out.append(current + str(count))", "pass"),
       ("off_by_one", "for ch in s[1:]:", "for ch in s:")),
      lambda r: ("".join(r.choice("ab") * r.randint(1, 4) for _ in range(r.randint(1, 4))),),
      (("",), ("a",), ("aab",), ("abbb",))),
    T("string", ("caesar_shift", "rotate_letters", "shift_cipher"), "s, k",
      "Shift every lower-case letter of s forward by k places in the alphabet (wrapping "
      "around); leave every other character unchanged.",
      "out = []\nfor ch in s:\n    if ch.isalpha() and ch.islower():\n"
      "        out.append(chr((ord(ch) - ord(\"a\") + k) % 26 + ord(\"a\")))\n    else:\n"
      "        out.append(ch)\nreturn \"\".join(out)",
      (("wrong_constant", "% 26", "% 25"),
       ("wrong_operator", "ord(\"a\") + k)", "ord(\"a\") - k)"),
       ("missing_else", "        out.append(ch)", "        pass")),
      lambda r: (_sentence(r) + " z!", r.randint(1, 30)), (("abc", 1), ("xyz", 3), ("a b", 2))),
    T("string", ("longest_word", "max_word", "biggest_word"), "s",
      "Return the longest whitespace-separated word of s (the first one on ties; '' if none).",
      "best = \"\"\nfor word in s.split():\n    if len(word) > len(best):\n        best = word\n"
      "return best",
      (("wrong_comparison", "if len(word) > len(best):", "if len(word) >= len(best):"),
       ("wrong_comparison_2", "if len(word) > len(best):", "if len(word) < len(best):"),
       ("wrong_value", "        best = word", "        best = word[:-1]")),
      lambda r: (" ".join(_word(r, n=(2, 4)) for _ in range(r.randint(2, 6))),),
      (("ab cd",), ("a bcd ef",), ("",))),
    T("list", ("max_value", "largest", "find_max"), "nums",
      "Return the largest element of the non-empty list nums.",
      "best = nums[0]\nfor x in nums[1:]:\n    if x > best:\n        best = x\nreturn best",
      (("initial_value", "best = nums[0]", "best = 0"),
       ("wrong_comparison", "if x > best:", "if x < best:"),
       ("off_by_one", "for x in nums[1:]:", "for x in nums[2:]:")),
      lambda r: (_ints(r, -50, 50, (1, 8)),), (([-3, -1, -7],), ([1, 9],), ([5],))),
    T("list", ("count_greater", "num_above", "count_over"), "nums, k",
      "Return how many elements of nums are strictly greater than k.",
      "count = 0\nfor x in nums:\n    if x > k:\n        count += 1\nreturn count",
      (("wrong_comparison", "if x > k:", "if x >= k:"),
       ("wrong_value", "count += 1", "count += x"),
       ("initial_value", "count = 0", "count = 1")),
      lambda r: ((xs := _ints(r, -5, 5)), r.choice(xs) if xs else 0),
      (([1, 2, 3], 2), ([], 0), ([5, 5], 5))),
    T("search", ("binary_search", "bsearch", "find_sorted"), "items, target",
      "Return the index of target in the sorted list of distinct numbers items, or -1.",
      "lo, hi = 0, len(items) - 1\nwhile lo <= hi:\n    mid = (lo + hi) // 2\n"
      "    if items[mid] == target:\n        return mid\n    if items[mid] < target:\n"
      "        lo = mid + 1\n    else:\n        hi = mid - 1\nreturn -1",
      (("wrong_comparison", "while lo <= hi:", "while lo < hi:"),
       ("off_by_one", "lo, hi = 0, len(items) - 1", "lo, hi = 0, len(items) - 2"),
       ("wrong_value", "return -1", "return None")),
      lambda r: ((xs := sorted(set(_ints(r, -30, 30, (1, 10))))), r.choice(xs + [31, -31])),
      (([1, 3, 5], 5), ([2], 2), ([1, 2], 3), ([1, 2, 3, 4], 1))),
    T("list", ("reversed_copy", "reverse_list", "backwards"), "xs",
      "Return a new list with the elements of xs in reverse order.",
      "out = []\nfor i in range(len(xs) - 1, -1, -1):\n    out.append(xs[i])\nreturn out",
      (("off_by_one", "range(len(xs) - 1, -1, -1)", "range(len(xs) - 1, 0, -1)"),
       ("off_by_one_2", "range(len(xs) - 1, -1, -1)", "range(len(xs) - 2, -1, -1)"),
       ("initial_value", "out = []", "out = [0]")),
      lambda r: (_ints(r, 0, 9, (1, 7)),), (([1, 2],), ([],), ([4],))),
    T("list", ("running_sum", "prefix_sums", "cumulative_sum"), "nums",
      "Return the list of running totals of nums: out[i] = nums[0] + ... + nums[i].",
      "out = []\ntotal = 0\nfor x in nums:\n    total += x\n    out.append(total)\nreturn out",
      (("wrong_operator", "total += x", "total = x"),
       ("wrong_variable", "out.append(total)", "out.append(x)"),
       ("initial_value", "total = 0", "total = 1")),
      lambda r: (_ints(r, -9, 9, (1, 7)),), (([1, 2, 3],), ([],), ([5],))),
    T("list", ("dedupe", "unique_in_order", "remove_duplicates"), "items",
      "Return the elements of items without repeats, keeping first occurrences in order.",
      "seen = set()\nout = []\nfor x in items:\n    if x not in seen:\n        seen.add(x)\n"
      "        out.append(x)\nreturn out",
      (("wrong_comparison", "if x not in seen:", "if x in seen:"),
       ("missing_update", "seen.add(x)", "pass"),
       ("wrong_order", "return out", "return sorted(out)")),
      lambda r: (_ints(r, 0, 6, (2, 9)),), (([3, 1, 3],), ([],), ([2, 2],))),
    T("list", ("chunk", "split_every", "batches"), "items, size",
      "Split items into consecutive lists of length size (the last may be shorter).",
      "out = []\nfor i in range(0, len(items), size):\n    out.append(items[i:i + size])\n"
      "return out",
      (("off_by_one", "items[i:i + size]", "items[i:i + size - 1]"),
       ("off_by_one_2", "range(0, len(items), size)", "range(0, len(items) - 1, size)"),
       ("wrong_start", "range(0, len(items), size)", "range(1, len(items), size)")),
      lambda r: (_ints(r, 0, 9, (0, 9)), r.randint(1, 4)), (([1, 2, 3], 2), ([1, 2, 3], 1))),
    T("list", ("merge_sorted", "merge", "merge_lists"), "a, b",
      "Merge two sorted lists into one sorted list.",
      "i, j = 0, 0\nout = []\nwhile i < len(a) and j < len(b):\n    if a[i] <= b[j]:\n"
      "        out.append(a[i])\n        i += 1\n    else:\n        out.append(b[j])\n"
      "        j += 1\nout.extend(a[i:])\nout.extend(b[j:])\nreturn out",
      (("missing_tail", "out.extend(b[j:])", "pass"),
       ("wrong_comparison", "if a[i] <= b[j]:", "if a[i] >= b[j]:"),
       ("initial_value", "i, j = 0, 0", "i, j = 0, 1")),
      lambda r: (sorted(_ints(r, 0, 20, (0, 5))), sorted(_ints(r, 0, 20, (0, 5)))),
      (([1, 3], [2, 4]), ([], [1]), ([5], []), ([1, 2], [3, 4]))),
    T("sort", ("insertion_sort", "sort_list", "sorted_copy"), "xs",
      "Return a new list with the elements of xs in ascending order (insertion sort).",
      "out = list(xs)\nfor i in range(1, len(out)):\n    key = out[i]\n    j = i - 1\n"
      "    while j >= 0 and out[j] > key:\n        out[j + 1] = out[j]\n        j -= 1\n"
      "    out[j + 1] = key\nreturn out",
      (("wrong_comparison", "while j >= 0 and out[j] > key:", "while j > 0 and out[j] > key:"),
       ("wrong_comparison_2", "while j >= 0 and out[j] > key:",
        "while j >= 0 and out[j] < key:"),
       ("off_by_one", "for i in range(1, len(out)):", "for i in range(2, len(out)):")),
      lambda r: (_ints(r, -9, 9, (2, 8)),), (([2, 1],), ([3, 2, 1],), ([],))),
    T("list", ("flatten", "concat_lists", "join_lists"), "nested",
      "Return one list with the elements of each inner list of nested, in order.",
      "out = []\nfor sub in nested:\n    for x in sub:\n        out.append(x)\nreturn out",
      (("wrong_variable", "out.append(x)", "out.append(sub)"),
       ("off_by_one", "for x in sub:", "for x in sub[1:]:"),
       ("off_by_one_2", "for sub in nested:", "for sub in nested[1:]:")),
      lambda r: ([_ints(r, 0, 9, (0, 3)) for _ in range(r.randint(1, 4))],),
      (([[1], [2, 3]],), ([],), ([[1, 2]],))),
    T("list", ("index_of_min", "argmin", "position_of_smallest"), "nums",
      "Return the index of the smallest element of the non-empty list nums (the first on ties).",
      "best = 0\nfor i in range(1, len(nums)):\n    if nums[i] < nums[best]:\n        best = i\n"
      "return best",
      (("wrong_comparison", "if nums[i] < nums[best]:", "if nums[i] <= nums[best]:"),
       ("wrong_value", "        best = i", "        best = nums[i]"),
       ("off_by_one", "range(1, len(nums))", "range(1, len(nums) - 1)")),
      lambda r: (_ints(r, 0, 5, (1, 7)),), (([3, 1, 1],), ([2, 5, 0],), ([4],), ([7, 7],))),
    T("dict", ("word_counts", "word_frequencies", "count_words"), "text",
      "Return a dict mapping each lower-cased whitespace-separated word of text to its count.",
      "counts = {}\nfor word in text.lower().split():\n    counts[word] = counts.get(word, 0) + 1\n"
      "return counts",
      (("initial_value", "counts.get(word, 0) + 1", "counts.get(word, 1) + 1"),
       ("missing_lower", "for word in text.lower().split():", "for word in text.split():"),
       ("wrong_update", "counts[word] = counts.get(word, 0) + 1", "counts[word] = 1")),
      lambda r: (" ".join(r.choice(["a", "b", "A", "c", "B"]) for _ in range(r.randint(1, 7))),),
      (("a A b",), ("",), ("x x",))),
    T("dict", ("most_common", "mode", "most_frequent"), "items",
      "Return the most frequent element of the non-empty list items (on ties, the one whose "
      "first occurrence comes first).",
      "counts = {}\nfor x in items:\n    counts[x] = counts.get(x, 0) + 1\n"
      "best, best_count = None, 0\nfor y in items:\n    if counts[y] > best_count:\n"
      "        best, best_count = y, counts[y]\nreturn best",
      (("wrong_comparison", "if counts[y] > best_count:", "if counts[y] >= best_count:"),
       ("initial_value", "best, best_count = None, 0", "best, best_count = None, 2"),
       ("wrong_update", "counts[x] = counts.get(x, 0) + 1", "counts[x] = 1")),
      lambda r: (_ints(r, 0, 4, (1, 8)),), (([1, 2, 2],), ([3, 4],), ([5],), ([1, 2, 1, 2],))),
    T("list", ("rotate_right", "rotate", "shift_right"), "xs, k",
      "Return xs rotated right by k places (k >= 0), e.g. ([1, 2, 3], 1) -> [3, 1, 2].",
      "if not xs:\n    return []\nk = k % len(xs)\nreturn xs[-k:] + xs[:-k] if k else list(xs)",
      (("missing_mod", "k = k % len(xs)", "k = k"),
       ("wrong_direction", "return xs[-k:] + xs[:-k] if k else list(xs)",
        "return xs[k:] + xs[:k] if k else list(xs)"),
       ("wrong_value", "    return []", "    return None")),
      lambda r: (_ints(r, 0, 9, (1, 6)), r.randint(0, 9)), (([1, 2, 3], 1), ([], 2), ([1, 2], 5))),
    T("list", ("transpose", "flip_matrix", "columns"), "rows",
      "Return the transpose of the rectangular matrix rows (a list of equal-length lists).",
      "if not rows:\n    return []\nout = []\nfor c in range(len(rows[0])):\n"
      "    out.append([row[c] for row in rows])\nreturn out",
      (("wrong_bound", "for c in range(len(rows[0])):", "for c in range(len(rows)):"),
       ("off_by_one", "[row[c] for row in rows]", "[row[c] for row in rows[1:]]"),
       ("wrong_value", "    return []", "    return [[]]")),
      lambda r: (_matrix(r),),
      (([[1, 2, 3], [4, 5, 6]],), ([],), ([[1], [2]],))),
    T("string", ("balanced", "brackets_match", "is_balanced"), "s",
      "Return True when the brackets ()[]{} in s are balanced and properly nested.",
      "pairs = {\")\": \"(\", \"]\": \"[\", \"}\": \"{\"}\nstack = []\nfor ch in s:\n"
      "    if ch in \"([{\":\n        stack.append(ch)\n    elif ch in pairs:\n"
      "        if not stack or stack.pop() != pairs[ch]:\n            return False\n"
      "return not stack",
      (("missing_check", "return not stack", "return True"),
       ("missing_guard", "if not stack or stack.pop() != pairs[ch]:",
        "if stack.pop() != pairs[ch]:"),
       ("wrong_comparison", "if not stack or stack.pop() != pairs[ch]:",
        "if not stack or stack.pop() == pairs[ch]:")),
      lambda r: ("".join(r.choice("()[]{}x") for _ in range(r.randint(0, 8))),),
      (("([]{})",), ("((",), (")(",), ("(]",), ("",))),
)
