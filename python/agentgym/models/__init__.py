"""Local models: the tiny Qwen2-architecture model used by tests, examples and benchmarks, and
named models built from installed packages (``smollm2-135m``: :mod:`agentgym.models.smollm2`)."""

from agentgym.models.names import (
    NAMED_MODELS,
    cache_dir,
    cached_tiny_model,
    is_named_model,
    resolve_model,
)
from agentgym.models.tiny import (
    CHAT_TEMPLATE,
    ENDOFTEXT,
    IM_END,
    IM_START,
    TinyModelConfig,
    build_tiny_model,
    train_tokenizer,
)

__all__ = [
    "CHAT_TEMPLATE",
    "ENDOFTEXT",
    "IM_END",
    "IM_START",
    "NAMED_MODELS",
    "TinyModelConfig",
    "build_tiny_model",
    "cache_dir",
    "cached_tiny_model",
    "is_named_model",
    "resolve_model",
    "train_tokenizer",
]
