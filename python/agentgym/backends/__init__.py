"""Inference backends: one protocol (:class:`Backend`), several engines.

* ``"vllm"`` — :class:`~agentgym.backends.vllm_backend.VLLMBackend`, vLLM's AsyncLLM in-process;
* ``"openai"`` — :class:`~agentgym.backends.openai_backend.OpenAIBackend`, any
  OpenAI-compatible completions server (``launch_vllm_server`` starts vLLM's);
* ``"transformers"`` — :class:`~agentgym.backends.transformers_backend.TransformersBackend`,
  a local Hugging Face model (the exact reference).

Engines are imported lazily, so ``import agentgym.backends`` needs neither torch nor vllm.
"""

from agentgym.backends.base import (
    Backend,
    BackendError,
    FinishReason,
    GenerateResult,
    InvalidRequestError,
    SamplingParams,
)
from agentgym.backends.factory import make_backend

__all__ = [
    "Backend",
    "BackendError",
    "FinishReason",
    "GenerateResult",
    "InvalidRequestError",
    "SamplingParams",
    "make_backend",
]


def __getattr__(name: str):
    if name == "TransformersBackend":
        from agentgym.backends.transformers_backend import TransformersBackend

        return TransformersBackend
    if name == "VLLMBackend":
        from agentgym.backends.vllm_backend import VLLMBackend

        return VLLMBackend
    if name in ("OpenAIBackend", "launch_vllm_server"):
        from agentgym.backends import openai_backend

        return getattr(openai_backend, name)
    raise AttributeError(f"module 'agentgym.backends' has no attribute {name!r}")
