"""Fixtures shared by the backend test modules."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir):
    """A transformers copy of the tiny model, the reference for logprob checks."""
    transformers = pytest.importorskip("transformers")
    return transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
