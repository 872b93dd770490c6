"""Extraction of the action from model text, in AgentGym's formats (implemented in Rust).

``parse_action(text, format="auto", max_chars=4096) -> str | None`` and
``parse_actions(texts, format="auto", max_chars=4096) -> list[str | None]`` (parallel, GIL
released). Formats (``PARSE_FORMATS``):

- ``react``: the text after the last ``Action:`` (case-insensitive; ``Action:`` alone on a
  line followed by the action also works), cut at a hallucinated ``Observation:`` line;
- ``tags``: the content of the last complete ``<action>...</action>`` pair;
- ``last_line``: the last non-empty line; ``raw``: the whole text;
- ``auto``: tags, then ReAct, then the last non-empty line.

Results are trimmed; end-of-turn markers (``<|im_end|>``, ``</s>``, ``<|eot_id|>``, ...),
surrounding quotes/backticks, markdown emphasis (``**move north**``) and code fences are
stripped, as is the full stop of a one-line action with no other ``.`` (``move north.``;
``U.S.`` keeps its dots); ``**Action:**`` in bold counts as ``Action:``. The length is capped
at ``max_chars`` characters. None means no action was found. An unknown format raises
``ValueError``; a non-str text raises ``TypeError``.
"""

from agentgym._core import DEFAULT_MAX_ACTION_CHARS, PARSE_FORMATS, parse_action, parse_actions

__all__ = ["DEFAULT_MAX_ACTION_CHARS", "PARSE_FORMATS", "REPLY_TEMPLATE", "after_reply_prefix",
           "parse_action", "parse_actions", "reply_text"]

#: The reply that plays an action, in the ReAct format every parse format reads.
REPLY_TEMPLATE = "Action: {action}"


def after_reply_prefix(text: str, reply_prefix: str) -> str:
    """The reply that writes ``text`` after a turn opened by ``reply_prefix``
    (``RolloutConfig.reply_prefix``): ``text`` less the prefix it starts with, else whole."""
    return text[len(reply_prefix):] if reply_prefix and text.startswith(reply_prefix) else text


def reply_text(action: str, reply_prefix: str = "", template: str = REPLY_TEMPLATE) -> str:
    """The reply text that plays ``action`` (``template`` filled in) in a turn opened by
    ``reply_prefix``: ``reply_text("go", "Action:")`` is ``" go"``."""
    return after_reply_prefix(template.format(action=action), reply_prefix)
