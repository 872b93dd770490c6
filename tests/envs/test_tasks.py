"""Task counts and splits: one answer for every registered env, and where training draws."""

from __future__ import annotations

import pytest

import agentgym
from agentgym.envs import BaseEnv
from agentgym.envs.tasks import HELD_OUT_BASE, plan_tasks, task_set
from agentgym.errors import InvalidTaskError

#: Registered ids whose simulator may be missing here (optional ``sims`` extra).
_SIMS = {"babyai": "minigrid", "sciworld": "scienceworld", "sciworld-agentgym": "scienceworld"}

#: env id -> (task count of the default split or None when unbounded, held-out split)
EXPECTED = {
    "textcraft": (544, None),
    "maze": (None, "test"),
    "gridworld": (None, "test"),
    "game2048": (None, None),
    "wordle": (None, "test"),  # count checked below
    "webshop": (11_500, "test"),
    "search": (None, "test"),
    "ecommerce_service": (800, "test"),
    "office": (800, "test"),
    "project_planning": (800, "test"),
    "code_debug": (None, "test"),
    "babyai": (400_000, None),
    "sciworld": (None, "test"),
    "sciworld-agentgym": (None, "test"),
}


def test_every_shipped_env_is_covered():
    from agentgym import _core
    from agentgym.envs.scenarios import SCENARIOS
    from agentgym.envs.simulators import SIMULATORS

    native = set(_core.native_env_ids()) - set(_core._register_test_envs())
    shipped = native | set(SCENARIOS) | set(SIMULATORS)
    assert shipped == set(EXPECTED)
    assert shipped <= set(agentgym.list_envs())


@pytest.mark.parametrize("env_id", sorted(EXPECTED))
def test_task_set_of_every_env(env_id):
    if env_id in _SIMS:
        pytest.importorskip(_SIMS[env_id])
    ts = task_set(env_id)
    count, held_out = EXPECTED[env_id]
    if count is not None:
        assert ts.num_tasks == count
    assert ts.held_out == held_out
    assert ts.tasks  # says how an index maps to a task
    if ts.num_tasks is None or env_id == "babyai":  # babyai: larger indices are more seeds
        return
    _check_count(env_id, {}, ts)


def _check_count(env_id, kwargs, ts):
    """The last index is a task and the next one is not a new one: it is rejected, or, where
    the env says indices wrap, it is task 0 again."""
    env = agentgym.make(env_id, **kwargs)
    try:
        env.reset(seed=0, options={"task": ts.num_tasks - 1})
        if "wrap" in ts.tasks:
            first, _ = env.reset(seed=0, options={"task": 0})
            again, _ = env.reset(seed=0, options={"task": ts.num_tasks})
            assert again == first
        else:
            with pytest.raises(InvalidTaskError):
                env.reset(seed=0, options={"task": ts.num_tasks})
    finally:
        env.close()


@pytest.mark.parametrize("env_id", ["wordle", "webshop", "search", "ecommerce_service",
                                    "office", "project_planning", "code_debug"])
def test_splits_are_counted_separately(env_id):
    train = task_set(env_id, split="train")
    test = train.with_split("test")
    assert train.split == "train" and test.split == "test"
    assert train.num_tasks and test.num_tasks
    assert test.kwargs["split"] == "test"
    _check_count(env_id, {"split": "test"}, test)


def test_with_split_rejects_unknown_split():
    with pytest.raises(ValueError, match="no split"):
        task_set("textcraft").with_split("test")


def test_plan_uses_the_held_out_split():
    plan = plan_tasks("ecommerce_service", {}, eval_tasks=8)
    assert plan.train_kwargs == {"split": "train"} and plan.train_hi == 800
    assert plan.eval_kwargs == {"split": "test"} and plan.eval_ids == list(range(8))
    # explicit eval kwargs win; the eval count is capped at the split's size
    plan = plan_tasks("ecommerce_service", {"split": "train"}, 500, {"split": "test"})
    assert plan.eval_ids == list(range(200))


def test_plan_holds_out_the_tail_of_an_env_without_splits():
    plan = plan_tasks("textcraft", {}, eval_tasks=44)
    assert plan.train_hi == 500 and plan.eval_ids == list(range(500, 544))
    assert plan.train_kwargs == plan.eval_kwargs == {}
    with pytest.raises(ValueError, match="too few"):
        plan_tasks("textcraft", {}, eval_tasks=544)


def test_plan_of_an_unbounded_env_without_splits():
    plan = plan_tasks("game2048", {}, eval_tasks=4)
    assert plan.train_hi == HELD_OUT_BASE
    assert plan.eval_ids == list(range(HELD_OUT_BASE, HELD_OUT_BASE + 4))


def test_plan_of_a_procedural_env_with_splits():
    plan = plan_tasks("maze", {"size": 3}, eval_tasks=4, num_train_tasks=50)
    assert plan.train_kwargs == {"size": 3, "split": "train"} and plan.train_hi == 50
    assert plan.eval_kwargs == {"size": 3, "split": "test"} and plan.eval_ids == [0, 1, 2, 3]


class _Counted(BaseEnv):
    num_tasks = 10

    def reset(self, task=None, seed=None):
        if not 0 <= int(task) < self.num_tasks:
            raise InvalidTaskError(f"task {task} not in [0, 10)")
        return f"task {task}"

    def step(self, action):
        return "ok", 1.0, True, {}


class _Unbounded(BaseEnv):
    def reset(self, task=None, seed=None):
        return f"task {task}"

    def step(self, action):
        return "ok", 1.0, True, {}


def test_user_base_envs():
    agentgym.register("_tasks_counted", _Counted, override=True)
    agentgym.register("_tasks_unbounded", _Unbounded, override=True)
    ts = task_set("_tasks_counted")
    assert ts.num_tasks == 10 and ts.splits == () and ts.held_out is None
    plan = plan_tasks("_tasks_counted", {}, eval_tasks=2)
    assert plan.train_hi == 8 and plan.eval_ids == [8, 9]
    ts = task_set("_tasks_unbounded")
    assert ts.num_tasks is None and "unbounded" in ts.tasks


def test_init_kwargs_record_constructor_arguments():
    from agentgym.envs import CodeDebugEnv, ECommerceServiceEnv

    assert ECommerceServiceEnv().init_kwargs == {}  # only the arguments given
    assert ECommerceServiceEnv("test").init_kwargs == {"split": "test"}
    env = CodeDebugEnv(split="test", step_penalty=0.1)
    assert env.init_kwargs["split"] == "test" and env.init_kwargs["step_penalty"] == 0.1
