"""Local models: the tiny Qwen2-architecture model used by tests, examples and benchmarks."""

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
    "TinyModelConfig",
    "build_tiny_model",
    "train_tokenizer",
]
