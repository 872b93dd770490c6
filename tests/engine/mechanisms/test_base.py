"""The mechanism contract (``agentgym.engine.mechanisms``): a mechanism written outside the
engine, registered in ``MECHANISMS`` and nowhere else, changes episodes through its hooks
alone; the turn loop names no mechanism; every driver serves the snapshot capability."""

from pathlib import Path

import numpy as np
import pytest

import agentgym.engine.mechanisms as mechanisms
from agentgym.backends.scripted import ScriptedBackend
from agentgym.engine import RolloutEngine
from agentgym.engine.drivers import NativeDriver, ProcessDriver, PythonDriver
from agentgym.engine.drivers.base import EnvDriver, Snapshots
from agentgym.engine.mechanisms import HOOKS, MECHANISMS, Mechanism


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


class OverlongPenalty(Mechanism):
    """The docs' example (docs/mechanisms.md, "Writing a mechanism"): each reply cut at
    ``max_new_tokens`` costs ``COST`` reward, and the episode's row counts the replies that
    were generated at all."""

    name = "overlong_penalty"
    COST = 0.25

    @classmethod
    def configured(cls, cfg) -> bool:
        return True

    async def begun(self, eps, obs):
        for e in eps:
            e.state[self.name] = 0
        return [None] * len(eps)

    async def after_turn(self, ep, logprobs):
        ep.state[self.name] += 1

    def closing(self, eps, overrides):
        cut = np.array([e.cut_turns for e in eps], np.float32)
        if not cut.any():
            return overrides
        own = np.array([self.loop.store.reward(e.key) for e in eps], np.float32)
        base = own if overrides is None else np.where(np.isnan(overrides), own, overrides)
        return base - self.COST * cut


def test_a_mechanism_registered_once_changes_episodes_through_its_hooks(tokenizer,
                                                                       monkeypatch):
    kwargs = dict(max_turns=30, max_total_tokens=8192, max_new_tokens=4)
    plain = RolloutEngine(ScriptedBackend(tokenizer), tokenizer, **kwargs)
    base = plain.collect_sync(4, "maze")
    monkeypatch.setattr(mechanisms, "MECHANISMS", [*MECHANISMS, OverlongPenalty])
    eng = RolloutEngine(ScriptedBackend(tokenizer), tokenizer, **kwargs)
    batch = eng.collect_sync(4, "maze")
    assert sum(t.timings.get("cut_turns", 0) for t in base) > 0  # the oracle's replies are cut
    for ref, t in zip(base, batch):
        cut = ref.timings.get("cut_turns", 0)
        assert t.token_ids == ref.token_ids and t.stop_reason == ref.stop_reason
        assert t.reward == pytest.approx(ref.reward - OverlongPenalty.COST * cut)
    eng.close()
    plain.close()


def test_every_hook_is_off_on_the_base_class_and_the_loop_names_no_mechanism():
    assert all(getattr(Mechanism, h) is None for h in HOOKS)
    engine = Path(mechanisms.__file__).parents[1]
    for module in ("turn_loop.py", "orchestrator.py", "play.py"):
        source = (engine / module).read_text().lower()
        for cls in MECHANISMS:
            assert f"mechanisms.{cls.__module__.rsplit('.', 1)[1]}" not in source, (module, cls)
        for word in ("reflection", "planning", "branch", "undo", "frames", "context_window"):
            assert word not in source, (module, word)


@pytest.mark.parametrize("driver", [NativeDriver, PythonDriver, ProcessDriver])
def test_every_driver_implements_the_whole_driver_protocol(driver):
    for proto in (Snapshots, EnvDriver):
        methods = [m for m in vars(proto) if not m.startswith("_") and callable(vars(proto)[m])]
        missing = [m for m in methods if not callable(getattr(driver, m, None))]
        assert not missing, (driver.__name__, proto.__name__, missing)


def test_a_process_driver_refuses_what_its_workers_cannot_copy():
    from agentgym.errors import SnapshotUnsupportedError

    with pytest.raises(SnapshotUnsupportedError, match="branched groups"):
        ProcessDriver("office", 2, num_workers=1, forks=True)
