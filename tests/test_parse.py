"""Action parsing through the binding: the format table, errors, and fuzzing (random unicode,
huge strings, batches)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentgym.parse import DEFAULT_MAX_ACTION_CHARS, PARSE_FORMATS, parse_action, parse_actions

pytestmark = pytest.mark.timeout(120)

CASES = [
    # ReAct (AgentGym's "Thought: ...\nAction: ...")
    ("Thought: I should look.\nAction: look", "react", "look"),
    ("Thought: x\nAction:\ngo to cabinet 1\n", "react", "go to cabinet 1"),
    ("Action: a\nObservation: fake\nThought: b\nAction: take key", "react", "take key"),
    ("Action: look\nObservation: you see", "react", "look"),
    ("Thought:\n...\n\nAction:\nsearch[red shoes]", "react", "search[red shoes]"),
    (
        'Thought: t\nAction: get_weather with Action Input: {"city": "Paris"}',
        "react",
        'get_weather with Action Input: {"city": "Paris"}',
    ),
    ("Action: `craft 4 oak planks`<|im_end|>", "react", "craft 4 oak planks"),
    ('Action: "click[Buy Now]"</s>', "react", "click[Buy Now]"),
    ("Action:\n```sql\nSELECT 1;\n```<|eot_id|>", "react", "SELECT 1;"),
    ("nothing to see", "react", None),
    # Tags
    ("<action>a</action> then <action> b </action>", "tags", "b"),
    ("<ACTION>x</Action>", "tags", "x"),
    ("<action>a</action><action>cut off", "tags", "a"),
    ("<action>cut off", "tags", None),
    # Last line and raw
    ("reasoning\n\ngo west\n\n", "last_line", "go west"),
    ("  \n\t", "last_line", None),
    ("  all of it  ", "raw", "all of it"),
    # Auto: tags, then ReAct, then last line
    ("Thought\nAction: x\n<action>y</action>", "auto", "y"),
    ("Thought\nAction: x", "auto", "x"),
    ("I will\nmove left", "auto", "move left"),
    ("", "auto", None),
    ("<|im_end|>", "auto", None),
]


@pytest.mark.parametrize(("text", "fmt", "want"), CASES)
def test_format_table(text, fmt, want):
    assert parse_action(text, fmt) == want
    assert parse_actions([text], format=fmt) == [want]


def test_formats_and_aliases():
    assert PARSE_FORMATS == ("auto", "react", "tags", "last_line", "raw")
    assert parse_action("<action>x</action>", "XML") == "x"
    assert parse_action("a\nb", "line") == "b"
    assert parse_action("Action: x") == "x"  # auto is the default


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown action format"):
        parse_action("x", "json")
    with pytest.raises(ValueError, match="unknown action format"):
        parse_actions(["x"], "json")
    with pytest.raises(TypeError):
        parse_action(b"Action: x")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        parse_action(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        parse_actions("Action: x")  # type: ignore[arg-type]  # a str is not a list
    with pytest.raises(TypeError):
        parse_actions(["ok", 3])  # type: ignore[list-item]
    with pytest.raises(OverflowError):
        parse_action("x", max_chars=-1)


def test_max_chars_caps_on_char_boundary():
    assert parse_action("Action: " + "é" * 10, max_chars=3) == "ééé"
    assert len(parse_action("Action: " + "x" * 10_000)) == DEFAULT_MAX_ACTION_CHARS
    assert parse_action("Action: abc", max_chars=0) is None


def test_huge_strings():
    big = "Thought: hmm\nAction: go north\n" * 100_000  # 3 MB
    assert parse_action(big, "react") == "go north"
    assert parse_action("<action>" * 300_000, "tags") is None
    out = parse_action("Action: " + "y" * 2_000_000, "react", max_chars=100)
    assert out == "y" * 100


def test_batch_keeps_order_and_matches_single():
    texts = [f"Thought: t{i}\nAction: step {i}" for i in range(2000)]
    texts[5] = "no action"
    out = parse_actions(texts, "react")
    assert len(out) == 2000 and out[5] is None
    assert out[1999] == "step 1999"
    assert out == [parse_action(t, "react") for t in texts]


# Surrogates cannot cross into Rust strings; everything else may appear.
unicode_text = st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=300)
markers = st.sampled_from(
    ["Action:", "<action>", "</action>", "\n", "<|im_end|>", "```", '"', "Observation:"]
)
structured = st.lists(st.one_of(markers, unicode_text), max_size=30).map("".join)


def _check(out, max_chars=DEFAULT_MAX_ACTION_CHARS):
    if out is not None:
        assert isinstance(out, str) and out and out == out.strip()
        assert len(out) <= max_chars


@settings(max_examples=200, deadline=None)
@given(text=st.one_of(unicode_text, structured), fmt=st.sampled_from(PARSE_FORMATS))
def test_fuzz_never_fails(text, fmt):
    _check(parse_action(text, fmt))


@settings(max_examples=100, deadline=None)
@given(raw=st.binary(max_size=400), max_chars=st.integers(0, 50))
def test_fuzz_lossy_decoded_bytes(raw, max_chars):
    text = raw.decode("utf-8", errors="replace")
    for fmt in PARSE_FORMATS:
        _check(parse_action(text, fmt, max_chars), max_chars)


@settings(max_examples=6, deadline=None)
@given(
    unit=st.one_of(structured, unicode_text).filter(bool),
    reps=st.integers(20_000, 60_000),
)
def test_fuzz_megabyte_strings(unit, reps):
    big = unit * reps
    for fmt in PARSE_FORMATS:
        _check(parse_action(big, fmt))


@settings(max_examples=30, deadline=None)
@given(texts=st.lists(structured, max_size=300), fmt=st.sampled_from(PARSE_FORMATS))
def test_fuzz_batch_equals_singles(texts, fmt):
    assert parse_actions(texts, fmt) == [parse_action(t, fmt) for t in texts]
