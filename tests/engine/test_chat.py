"""``ChatFormatter``: the chat template's turn wrapper and its refusals."""

import types

import pytest

from agentgym.engine.chat import ChatFormatter, ChatTemplateError


def test_a_tokenizer_without_a_fast_backend_is_refused_by_name():
    # Stand-in: the tiny model ships only tokenizer.json, so no real slow tokenizer loads
    # here; what matters is the missing ``backend_tokenizer`` the Rust codec needs.
    slow = types.SimpleNamespace(eos_token="<|im_end|>")
    with pytest.raises(ChatTemplateError, match="slow tokenizer.*use_fast=True"):
        ChatFormatter(slow)


def test_observation_ids_wrap_the_text_as_a_user_turn(tiny_model_dir):
    from transformers import AutoTokenizer

    fmt = ChatFormatter(AutoTokenizer.from_pretrained(tiny_model_dir))
    text = "You see a wall."
    wrapped = fmt.encode(fmt.obs_prefix + text + fmt.obs_suffix)
    assert fmt.observation_ids([text, text]) == [wrapped, wrapped]
