"""``make_backend``: a backend by name (its own module: it imports every backend, and every
backend imports :mod:`agentgym.backends.base`)."""

from __future__ import annotations

from agentgym.backends.base import Backend

__all__ = ["make_backend"]


def make_backend(name: str, model_dir: str | None = None, **kw) -> Backend:
    """Construct a backend by name: ``"vllm"`` (in-process AsyncLLM), ``"openai"`` (an
    OpenAI-compatible server: pass ``base_url``; ``model`` defaults to ``model_dir``),
    ``"transformers"`` (a local Hugging Face model) or ``"scripted"`` (the env's oracle or a
    random policy: ``tokenizer``, else ``model_dir``'s). For the local backends a named model
    (``"smollm2-135m"``) resolves to its cached folder (:func:`agentgym.models.resolve_model`)."""
    if name in ("transformers", "vllm"):
        from agentgym.models.names import resolve_model

        model_dir = resolve_model(model_dir)
    if name == "scripted":
        from agentgym.backends.scripted import ScriptedBackend

        tok = kw.pop("tokenizer", None)
        if tok is None:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(model_dir)
        return ScriptedBackend(tok, **kw)
    if name == "transformers":
        from agentgym.backends.transformers_backend import TransformersBackend

        return TransformersBackend(model_dir, **kw)
    if name == "vllm":
        from agentgym.backends.vllm_backend import VLLMBackend

        return VLLMBackend(model_dir, **kw)
    if name == "openai":
        from agentgym.backends.openai_backend import OpenAIBackend

        kw.setdefault("model", model_dir)
        return OpenAIBackend(**kw)
    raise ValueError(f"unknown backend {name!r}; expected 'vllm', 'openai', 'transformers' "
                     "or 'scripted'")
