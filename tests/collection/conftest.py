"""Fixtures of the collection tests: the tiny model's tokenizer and a scripted engine."""

import pytest


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)
