"""Helpers shared by the backend test modules (``from tests.backends.helpers import ...``):
the prompts, the transformers reference logprobs, and the checks that the in-process vLLM
engine and the vLLM OpenAI-compatible server both pass."""

from __future__ import annotations

import asyncio

import pytest

from agentgym.backends import GenerateResult, SamplingParams

MODULE_LOOP = pytest.mark.asyncio(loop_scope="module")
# Deprecation noise that vLLM's lazy imports trigger inside torch (not ours to fix).
VLLM_WARNINGS = [
    pytest.mark.filterwarnings("ignore:.*torch.jit.script_method.*:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:.*torch.distributed.reduce_op.*:FutureWarning"),
]

PROMPT = [1, 803, 201, 302, 287, 16, 2, 201, 1, 798, 201, 43, 291, 28, 2, 201, 1, 802, 201]
LONG = SamplingParams(max_new_tokens=900, ignore_eos=True)


def prompts(n: int) -> list[list[int]]:
    """``n`` distinct prompts of different lengths (batched with left padding)."""
    return [PROMPT[: 5 + i % 11] + [3 + (7 * i) % 500] * (1 + i % 4) for i in range(n)]


def ref_logprobs(model, prompt: list[int], tokens: list[int]) -> list[float]:
    """Raw logprobs of ``tokens`` after ``prompt`` from one transformers forward pass."""
    import torch

    with torch.no_grad():
        lp = model(torch.tensor([prompt + tokens])).logits[0].float().log_softmax(-1)
    return [float(lp[len(prompt) - 1 + j, t]) for j, t in enumerate(tokens)]


def assert_consistent(model, prompt, res: GenerateResult, tol: float):
    assert len(res.logprobs) == len(res.token_ids)
    ref = ref_logprobs(model, prompt, res.token_ids)
    assert max(abs(a - b) for a, b in zip(ref, res.logprobs, strict=True)) < tol


def _import_vllm():
    """Import vllm (skip the test only if that fails); its import-time FutureWarnings from
    torch are not ours to fix."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            import vllm  # noqa: F401
        except ImportError as e:
            pytest.skip(f"vllm not importable: {e}")


async def _wait_until(pred, timeout_s: float = 30.0):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await pred():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def _check_concurrent(backend, hf_model, n: int):
    ps = prompts(n)
    results = await asyncio.gather(
        *[
            backend.generate(p, SamplingParams(max_new_tokens=16, seed=i), request_id=f"c{i}")
            for i, p in enumerate(ps)
        ]
    )
    for p, r in zip(ps, results, strict=True):
        assert r.finish_reason in ("stop", "length") and 1 <= len(r.token_ids) <= 16
        assert_consistent(hf_model, p, r, 2e-3)
    return results
