"""Registry, Gymnasium adapters and the user-facing BaseEnv."""

import subprocess
import sys
import textwrap
from pathlib import Path

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import agentgym
from agentgym.envs import BaseEnv
from agentgym.envs.registry import is_registered, spec


class AIOpsEnv(BaseEnv):
    """The announcement's example shape: reset() and step() -> (observation, reward, done, info)."""

    instructions = "Fix the incident. Actions: restart <svc>, clean <disk>."

    def reset(self):
        self.disk = 93
        return "alert: disk 93% full on db-1"

    def step(self, action):
        if action == "clean db-1":
            self.disk = 40
            return "disk at 40%", 1.0, True, {}
        return f"nothing happened after {action!r}", 0.0, False, {}


class SeededEnv(BaseEnv):
    num_tasks = 10

    def reset(self, task=None, seed=None):
        self.task, self.seed = task, seed
        return f"task {task} seed {seed}"

    def step(self, action):
        return f"{self.task}:{action}", 0.5, action == "end", {"truncated": action == "cut"}


@pytest.fixture
def registered():
    agentgym.register("test/aiops", AIOpsEnv, override=True)
    agentgym.register("test/seeded", "tests.envs.test_registry:SeededEnv", override=True)
    agentgym.register("test/cartpole", lambda: gym.make("CartPole-v1"), override=True)
    yield


def test_list_envs_includes_natives_and_hides_test_env():
    ids = agentgym.list_envs()
    assert {"textcraft", "maze", "wordle"} <= set(ids)
    assert "_test_panic" not in ids


def test_test_env_exists_only_once_registered():
    # A fresh interpreter: this test run's conftest has registered the test envs already.
    code = textwrap.dedent("""
        import agentgym
        from agentgym import _core
        from agentgym.engine.drivers import is_native
        assert "_test_panic" not in _core.native_env_ids()
        assert "_test_panic" not in agentgym.list_envs()
        assert not is_native("_test_panic")
        try:
            agentgym.EnvPool("_test_panic", 1)
        except agentgym.UnknownEnvError:
            pass
        else:
            raise AssertionError("_test_panic constructed before registration")
        shipped = _core.native_env_ids()
        test_ids = ["_test_panic", "_bench_cartpole"]
        assert _core._register_test_envs() == test_ids
        assert _core._register_test_envs() == test_ids
        assert _core.native_env_ids() == shipped + test_ids
        assert is_native("_test_panic")
        (obs,) = agentgym.EnvPool("_test_panic", 1).reset()
        assert obs.startswith("reset task=Index(0)"), obs
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr


def test_make_unknown_lists_known_ids():
    with pytest.raises(agentgym.UnknownEnvError, match="textcraft"):
        agentgym.make("definitely-not-an-env")


def test_register_rejects_duplicates_and_bad_entry_points(registered):
    with pytest.raises(ValueError, match="already registered"):
        agentgym.register("test/aiops", AIOpsEnv)
    agentgym.register("test/bad", "no_colon_here", override=True)
    with pytest.raises(ValueError, match="module:Name"):
        agentgym.make("test/bad")
    agentgym.register("test/notenv", lambda: 42, override=True)
    with pytest.raises(TypeError, match="BaseEnv or gymnasium.Env"):
        agentgym.make("test/notenv")


def test_seed_example_runs_through_gymnasium(registered):
    env = agentgym.make("test/aiops")
    obs, info = env.reset(seed=0)
    assert obs.startswith("alert")
    obs, reward, terminated, truncated, _ = env.step("restart db-1")
    assert (reward, terminated, truncated) == (0.0, False, False)
    obs, reward, terminated, truncated, _ = env.step("clean db-1")
    assert (reward, terminated, truncated) == (1.0, True, False)
    with pytest.raises(agentgym.EpisodeFinishedError):
        env.step("clean db-1")
    env.reset()
    with pytest.raises(TypeError):
        env.step(7)


def test_base_env_gets_task_and_seed_and_horizon(registered):
    env = agentgym.make("test/seeded", max_turns=2)
    obs1, info = env.reset(seed=4)
    obs2, _ = env.reset(seed=4)
    assert obs1 == obs2 and info["task"] in range(10)
    obs, _ = env.reset(options={"task": 3})
    assert obs.startswith("task 3 ")
    assert env.step("a")[3] is False
    _, _, terminated, truncated, info = env.step("b")
    assert (terminated, truncated, info["turns"]) == (False, True, 2)
    env.reset(options={"task": 1})
    assert env.step("cut")[2:4] == (False, True)


@pytest.mark.parametrize("env_id,action", [("test/seeded", "a"), ("maze", "jump")])
def test_adapters_take_max_turns_and_seed_the_env_from_the_reset_seed(registered, env_id,
                                                                       action):
    """Both Gymnasium adapters (of a Python env and of a native env): ``options["max_turns"]``
    sets the horizon, and the env's own seed is drawn from the reset seed (equal seeds give
    equal env seeds, other seeds other env seeds)."""
    env = agentgym.make(env_id).unwrapped
    env.reset(seed=4, options={"task": 3, "max_turns": 1})
    assert env.step(action)[2:4] == (False, True)

    def env_seed(seed):  # the Python env echoes its seed; the native adapter reports it
        obs, info = env.reset(seed=seed, options={"task": 3})
        return info.get("seed", obs)

    assert env_seed(4) == env_seed(4) != env_seed(5)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("env_id", ["textcraft", "maze", "wordle", "test/aiops", "test/seeded"])
def test_check_env_passes(registered, env_id):
    check_env(agentgym.make(env_id).unwrapped, skip_render_check=True)


def test_gym_env_entry_point_gets_time_limit(registered):
    env = agentgym.make("test/cartpole", max_turns=3)
    env.reset(seed=0)
    for _ in range(3):
        out = env.step(0)
    assert out[3] or out[2]


@pytest.mark.parametrize("env_id", ["textcraft", "maze", "wordle"])
def test_native_make_is_deterministic_and_matches_pool(env_id):
    env = agentgym.make(env_id)
    obs_a, info = env.reset(seed=9)
    obs_b, _ = env.reset(seed=9)
    assert obs_a == obs_b
    pool = agentgym.EnvPool(env_id, 1)
    (pool_obs,) = pool.reset([0], tasks=[info["task"]], seeds=[info["seed"]])
    assert pool_obs == obs_a
    action = env.valid_actions()[0]
    (pool_out,), pool_rew, _, _ = pool.step([0], [action])
    obs, rew, *_ = env.step(action)
    assert (obs, rew) == (pool_out, float(pool_rew[0]))
    with pytest.raises(TypeError):
        env.step(b"bytes")


@pytest.mark.parametrize("name,env_id", [
    ("TextCraftEnv", "textcraft"), ("MazeEnv", "maze"), ("WordleEnv", "wordle"),
    ("WebShopEnv", "webshop"), ("SearchEnv", "search"), ("GridWorldEnv", "gridworld"),
    ("Game2048Env", "game2048"), ("BabyAIEnv", None), ("SciWorldEnv", None),
    ("ECommerceServiceEnv", None), ("CodeDebugEnv", None), ("OfficeEnv", None),
])
def test_every_suite_is_importable_as_a_class(name, env_id):
    import agentgym.envs as envs

    cls = getattr(envs, name)
    assert name in envs.__all__
    if env_id is not None:  # native classes construct cheaply; check they are that env
        env = cls()
        obs, _ = env.reset(seed=0)
        assert env.env_id == env_id and isinstance(obs, str) and obs


def _shipped(env_id: str) -> bool:
    """Registered by the package itself: a native env or a ``"agentgym...."`` entry point (ids
    that tests register point at test classes)."""
    entry = spec(env_id)
    return entry.native or (isinstance(entry.entry_point, str)
                            and entry.entry_point.startswith("agentgym."))


def _readme_folder(env_id: str) -> str:
    """``envs/<id>/`` holds the README of ``env_id``, except for a variant: an id registered
    with default kwargs on the entry point of an id registered without any (``sciworld-agentgym``
    is ``sciworld`` with ``tasks="agentgym"``) is documented in that base id's folder."""
    entry = spec(env_id)
    if entry.kwargs:
        for other in agentgym.list_envs():
            base = spec(other)
            if not base.kwargs and base.entry_point == entry.entry_point:
                return other
    return env_id


def test_every_shipped_env_has_its_readme_folder():
    root = Path(__file__).resolve().parents[2]
    shipped = [i for i in agentgym.list_envs() if not i.startswith("_") and _shipped(i)]
    assert {"maze", "office", "project_planning", "sciworld", "sciworld-agentgym"} <= set(shipped)
    for env_id in shipped:
        folder = _readme_folder(env_id)
        readme = root / "envs" / folder / "README.md"
        assert readme.is_file(), f"{env_id}: no {readme.relative_to(root)}"
        text = readme.read_text(encoding="utf-8")
        assert folder in text.splitlines()[0], f"{readme}: the title names another env"
        assert f"`{env_id}`" in text or env_id == folder, f"{readme} does not name {env_id!r}"


def test_spec_and_is_registered():
    assert is_registered("maze") and spec("maze").native
    assert not is_registered("definitely-not-an-env")
    with pytest.raises(agentgym.UnknownEnvError, match="maze"):
        spec("definitely-not-an-env")
    variant = spec("sciworld-agentgym")
    assert variant.kwargs == {"tasks": "agentgym"} and not variant.native
    assert variant.entry_point == spec("sciworld").entry_point
