"""Backend protocol types (``agentgym.backends.base``): SamplingParams validation, the
error hierarchy and ``make_backend``'s unknown name."""

from __future__ import annotations

import pytest

from agentgym.backends import BackendError, SamplingParams, make_backend
from agentgym.errors import AgentGymError


def test_sampling_params_validation():
    with pytest.raises(ValueError, match="max_new_tokens"):
        SamplingParams(max_new_tokens=0)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)
    assert issubclass(BackendError, AgentGymError)


def test_make_backend_unknown():
    with pytest.raises(ValueError, match="unknown backend"):
        make_backend("nope", "/x")
