"""Chat-template token plumbing for token-in-token-out rollouts.

The template is applied once, to the system prompt and the first observation. After that
each turn appends (a) the model's own token ids, exactly as generated, and (b) the next
observation wrapped in the template's turn markers and tokenized once. The model's text is
never re-encoded. For an append-only template (ChatML and most others) the result equals
the template applied to the final message list; :class:`ChatFormatter` checks that the
template is append-only when it is built and refuses templates that are not.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentgym import _core

_OBS = "\x00OBSERVATION\x00"
_PROBE = "\x00MODEL\x00"


class ChatTemplateError(ValueError):
    """The tokenizer's chat template cannot be used for append-only multi-turn rollouts."""


class ChatFormatter:
    """Builds prompt and observation token ids from a Hugging Face tokenizer.

    ``end_of_turn`` is the token that ends an assistant message (``<|im_end|>`` for ChatML);
    by default the tokenizer's ``eos_token``. The tokenizer must be a fast one (backed by
    ``tokenizers``, as ``AutoTokenizer`` loads by default): the Rust turn codec tokenizes
    with the same ``tokenizer.json``.
    """

    def __init__(self, tokenizer, end_of_turn: str | None = None):
        self.tokenizer = tokenizer
        self.fast = getattr(tokenizer, "backend_tokenizer", None)
        if self.fast is None:
            raise ChatTemplateError(
                f"{type(tokenizer).__name__} is a slow tokenizer; load a fast one "
                "(AutoTokenizer.from_pretrained(..., use_fast=True))")
        self.end_of_turn = end_of_turn or tokenizer.eos_token
        if not self.end_of_turn:
            raise ChatTemplateError("tokenizer has no eos_token; pass end_of_turn explicitly")
        eot_ids = tokenizer.convert_tokens_to_ids([self.end_of_turn])
        if not eot_ids or eot_ids[0] is None or eot_ids[0] == tokenizer.unk_token_id:
            raise ChatTemplateError(f"end-of-turn {self.end_of_turn!r} is not a single token")
        self.end_of_turn_id: int = int(eot_ids[0])
        self.obs_prefix, self.obs_suffix = self._observation_wrapper()
        self._head_cache: dict[str, list[int] | None] = {}
        self._codecs: dict[str, _core.TurnCodec] = {}

    def codec(self, action_format: str = "auto", reply_prefix: str = "") -> _core.TurnCodec:
        """The Rust :class:`agentgym._core.TurnCodec` of this tokenizer and template (one per
        action format and reply prefix).

        It decodes replies, parses actions, and tokenizes templated observations with the
        same ``tokenizer.json`` (so its ids equal :meth:`encode`'s), in parallel and
        without the GIL; the engine does a whole turn's token bookkeeping in it.
        ``reply_prefix`` is text that opens every assistant turn after its header, as
        prompt tokens (mask 0): the model's reply continues it, and only the reply is
        parsed.
        """
        codec = self._codecs.get((action_format, reply_prefix))
        if codec is None:
            codec = _core.TurnCodec(self.fast.to_str(), self.obs_prefix,
                                    self.obs_suffix + reply_prefix, self.end_of_turn_id,
                                    action_format)
            self._codecs[(action_format, reply_prefix)] = codec
        return codec

    def _render(self, messages, add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def _observation_wrapper(self) -> tuple[str, str]:
        base = [
            {"role": "system", "content": "S"},
            {"role": "user", "content": "U"},
            {"role": "assistant", "content": _PROBE},
        ]
        first = self._render(base[:2], add_generation_prompt=True)
        with_reply = self._render(base, add_generation_prompt=False)
        full = self._render(base + [{"role": "user", "content": _OBS}], add_generation_prompt=True)
        if not with_reply.startswith(first) or not full.startswith(with_reply.split(_PROBE)[0]):
            raise ChatTemplateError("chat template is not append-only across turns")
        marker = _PROBE + self.end_of_turn
        at = full.find(marker)
        if at < 0:
            raise ChatTemplateError(
                f"assistant messages do not end with {self.end_of_turn!r} in this chat template"
            )
        wrapper = full[at + len(marker) :]
        if wrapper.count(_OBS) != 1:
            raise ChatTemplateError("could not locate the user turn in the chat template")
        prefix, suffix = wrapper.split(_OBS)
        return prefix, suffix

    def encode(self, text: str) -> list[int]:
        """Tokenize text (special-token markers in it are recognised, none are added)."""
        return self.fast.encode(text, add_special_tokens=False).ids

    def decode_batch(self, ids: Sequence[Sequence[int]]) -> list[str]:
        """Model text for action parsing (special tokens dropped)."""
        return self.fast.decode_batch([list(x) for x in ids], skip_special_tokens=True)

    def system_ids(self, system: str) -> list[int] | None:
        """Token ids of the conversation head before the first user turn (cached per system
        prompt), or None when the template does not split there cleanly."""
        if system in self._head_cache:
            return self._head_cache[system]
        messages = [{"role": "user", "content": _OBS}]
        if system:
            messages.insert(0, {"role": "system", "content": system})
        text = self._render(messages, add_generation_prompt=True)
        head, _, tail = text.partition(_OBS)
        ids = None
        if tail == self.obs_suffix and head.endswith(self.end_of_turn + self.obs_prefix):
            ids = self.encode(head[: len(head) - len(self.obs_prefix)])
        if len(self._head_cache) > 64:
            self._head_cache.clear()
        self._head_cache[system] = ids
        return ids

    def initial_prompt(self, system: str, observation: str, reply_prefix: str = "") -> list[int]:
        """Token ids of the system prompt and first observation, ready for generation
        (followed by ``reply_prefix``, see :meth:`codec`).

        Equal to tokenizing the template applied to ``[system, user]``: the head ends with
        the end-of-turn special token, a hard token boundary, so it is tokenized once per
        system prompt and the observation is tokenized as a user turn.
        """
        head = self.system_ids(system)
        if head is None:
            messages = [{"role": "user", "content": observation}]
            if system:
                messages.insert(0, {"role": "system", "content": system})
            return self.encode(self._render(messages, add_generation_prompt=True)
                               + reply_prefix)
        return head + self.observation_ids([observation], reply_prefix)[0]

    def observation_ids(self, observations: Sequence[str], reply_prefix: str = ""
                        ) -> list[list[int]]:
        """Each observation as a user turn plus the next assistant header (and
        ``reply_prefix``), tokenized once (memoised in the codec: observations repeat a lot
        across episodes)."""
        return self.codec(reply_prefix=reply_prefix).observation_ids(list(observations))
