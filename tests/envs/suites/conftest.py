"""Shared fixtures of the suite adapters' tests: the tiny model's tokenizer and a
scripted-backend engine."""

from __future__ import annotations

import pytest

from agentgym.backends.scripted import ScriptedBackend
from agentgym.engine import RolloutEngine


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture
def engine(tokenizer):
    """``engine(policy, **config)``: a RolloutEngine over a ScriptedBackend playing
    ``policy`` (``"oracle"`` or ``"random"``)."""

    def build(policy: str = "oracle", seed: int = 0, **kw) -> RolloutEngine:
        kw.setdefault("max_total_tokens", 16384)
        return RolloutEngine(ScriptedBackend(tokenizer, policy, seed=seed), tokenizer, **kw)

    return build
