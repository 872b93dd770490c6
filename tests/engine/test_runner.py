"""The runner contract (``agentgym.engine.runner.Runner``) and its factory ``open_runner``:
the in-process engine and the Ray pool implement every member with the same signature, the
factory builds the engine over a named or an open backend, closes only what it opened, and
the contract's reseed and weight-sync members do what they say on the engine."""

from __future__ import annotations

import asyncio
import inspect

import pytest

pytest.importorskip("transformers")

from agentgym.backends.scripted import ScriptedBackend  # noqa: E402
from agentgym.distributed.rollout_workers import RayRolloutPool  # noqa: E402
from agentgym.engine import EpisodeRequest, RolloutEngine  # noqa: E402
from agentgym.engine.runner import Runner, open_runner  # noqa: E402

MEMBERS = [name for name in dir(Runner) if not name.startswith("_")]


def test_the_contract_names_what_its_callers_use():
    assert set(MEMBERS) == {"aclose", "collect", "policy_version", "requests", "reseed",
                            "stream_batches", "stream_requests", "update_weights"}


@pytest.mark.parametrize("cls", [RolloutEngine, RayRolloutPool])
@pytest.mark.parametrize("name", MEMBERS)
def test_engine_and_ray_pool_implement_each_member_alike(cls, name):
    want, got = getattr(Runner, name), getattr(cls, name)
    if isinstance(want, property):
        assert isinstance(got, property) and got.fset is not None, f"{cls.__name__}.{name}"
        return

    def shape(fn):
        sig = inspect.signature(fn)
        params = [(p.name, p.kind, p.default) for p in sig.parameters.values()]
        kind = ("asyncgen" if inspect.isasyncgenfunction(fn) else
                "coroutine" if inspect.iscoroutinefunction(fn) else "function")
        return params, kind

    want_params, want_kind = shape(want)
    got_params, got_kind = shape(got)
    assert got_params == want_params, f"{cls.__name__}.{name}"
    # the Protocol's stubs are plain functions returning async iterators; an implementation
    # is an async generator there, and a coroutine where the stub is one
    if want_kind == "coroutine":
        assert got_kind == "coroutine", f"{cls.__name__}.{name}"
    elif name.startswith("stream_"):
        assert got_kind == "asyncgen", f"{cls.__name__}.{name}"
    else:
        assert got_kind == "function", f"{cls.__name__}.{name}"


class _RecordingBackend(ScriptedBackend):
    """The oracle policy, recording ``reseed`` and ``close`` calls."""

    def __init__(self, tokenizer):
        super().__init__(tokenizer, policy="oracle")
        self.seeds: list[int] = []
        self.closed = 0

    def reseed(self, seed: int) -> None:
        self.seeds.append(seed)

    async def close(self) -> None:
        self.closed += 1


def test_open_runner_builds_an_engine_that_closes_what_it_opened(tiny_model_dir):
    opened = open_runner("scripted", tiny_model_dir, backend_kwargs={"policy": "random"},
                         max_turns=5, progress=False)
    runner = opened.runner
    assert isinstance(runner, RolloutEngine) and isinstance(runner, Runner)
    assert runner.own_backend and runner.config.max_turns == 5
    assert runner.backend.policy == "random"
    assert opened.identity["backend"] == "scripted" and opened.identity["policy"] == "random"
    assert len(opened.identity["tokenizer_sha256"]) == 64

    backend = _RecordingBackend(opened.tokenizer)
    shared = open_runner(backend, tokenizer=opened.tokenizer, max_turns=100).runner
    assert shared.backend is backend and not shared.own_backend

    async def go():
        batch = await shared.collect(3, "maze")
        await shared.aclose()
        await runner.aclose()
        return batch

    batch = asyncio.run(go())
    assert len(batch) == 3 and batch.metrics["success_rate"] == 1.0
    assert backend.closed == 0  # an open backend passed in stays open


def test_open_runner_refuses_what_it_cannot_build(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    with pytest.raises(TypeError, match="by name"):
        open_runner(ScriptedBackend(tok), tokenizer=tok, num_workers=2)
    with pytest.raises(TypeError, match="not an inference backend"):
        open_runner(object(), tokenizer=tok)
    with pytest.raises(ValueError, match="unknown backend"):
        open_runner("nonesuch", tiny_model_dir)


def test_engine_reseed_and_update_weights(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    backend = _RecordingBackend(tok)
    engine = open_runner(backend, tokenizer=tok, max_turns=20).runner
    engine.reseed(7, 100, run_id="rx", sampling_seed=42)
    assert backend.seeds == [42] and engine.run_id == "rx"
    assert [r.group_id for r in engine.requests(3, n_samples=1)] == [7, 8, 9]
    engine.reseed(7)  # no sampling seed: the backend's is left alone
    assert backend.seeds == [42]

    async def go():
        v1 = await engine.update_weights({})
        v2 = await engine.update_weights({}, version=9)
        return v1, v2

    assert asyncio.run(go()) == (1, 9) and engine.policy_version == 9
    engine.policy_version += 2
    assert backend.policy_version == 11
    reqs = [EpisodeRequest(0, 5, 0)]

    async def play():
        return [t async for t in engine.stream_requests(reqs, "maze")]

    (t,) = asyncio.run(play())
    assert t.policy_version == 11 and t.group_id == 5
    engine.close()
