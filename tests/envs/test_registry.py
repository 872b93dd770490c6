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
        from agentgym.envs.registry import is_native
        assert "_test_panic" not in _core.native_env_ids()
        assert "_test_panic" not in agentgym.list_envs()
        try:
            is_native("_test_panic")
        except agentgym.UnknownEnvError:
            pass
        else:
            raise AssertionError("_test_panic known before registration")
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
        assert "\n## Success\n" in text, f"{readme} does not state what a success is"
        entry = spec(env_id).entry_point
        if spec(env_id).kind == "python":  # each Python env is a package of its own
            import importlib.util

            module = importlib.util.find_spec(entry.partition(":")[0])
            assert module.submodule_search_locations, f"{entry}: not a package folder"


def test_spec_and_is_registered():
    assert is_registered("maze") and spec("maze").native
    assert not is_registered("definitely-not-an-env")
    with pytest.raises(agentgym.UnknownEnvError, match="maze"):
        spec("definitely-not-an-env")
    variant = spec("sciworld-agentgym")
    assert variant.kwargs == {"tasks": "agentgym"} and not variant.native
    assert variant.entry_point == spec("sciworld").entry_point


# ----------------------------------------------------------------- the one env registry
from agentgym.envs import registry  # noqa: E402


def test_every_id_has_one_kind_and_list_envs_shows_the_games():
    ids = agentgym.list_envs()
    assert {"tictactoe", "kuhn_poker", "negotiation"} <= set(ids)
    by_kind = {k: registry.list_envs(kind=k) for k in ("native", "game", "python")}
    assert set(by_kind["native"]) >= {"textcraft", "maze", "wordle", "webshop", "search",
                                      "gridworld", "game2048"}
    assert by_kind["game"] == ["kuhn_poker", "negotiation", "tictactoe"]
    assert {"babyai", "sciworld", "office", "code_debug"} <= set(by_kind["python"])
    assert sorted(sum(by_kind.values(), [])) == ids  # each listed id has exactly one kind
    assert registry.list_envs(kind=("native", "python")) == sorted(
        by_kind["native"] + by_kind["python"])
    with pytest.raises(ValueError, match="kind"):
        registry.list_envs(kind="nope")
    assert registry.kind("remote:textcraft") == "remote"
    assert registry.is_native("maze") and not registry.is_native("office")
    assert registry.is_game("tictactoe") and not registry.is_game("maze")
    with pytest.raises(agentgym.UnknownEnvError):
        registry.kind("definitely-not-an-env")


def test_seats_roles_splits_and_pictures():
    assert registry.seats("maze") == 1 and registry.roles("maze") == ()
    assert registry.seats("tictactoe") == 2 and registry.roles("tictactoe") == ("X", "O")
    assert registry.task_splits("maze") == (("train", "test"), "test")
    assert registry.task_splits("textcraft") == ((), None)
    assert registry.task_splits("office") == (("train", "test", "all"), "test")
    assert registry.task_splits("tictactoe") == ((), None)
    assert registry.snapshots("maze") and registry.snapshots("office")
    assert registry.snapshots("sciworld") is False
    assert registry.snapshots("remote:maze") is False
    assert registry.draws_images("maze") and registry.draws_images("gridworld")
    assert registry.draws_images("babyai") and not registry.draws_images("textcraft")
    assert not registry.draws_images("office")


def test_horizons_live_in_the_specs():
    from agentgym.learner.horizon import HorizonSchedule, presets

    assert registry.horizon_preset("search") == registry.HORIZON_PRESETS["searchqa"]
    assert registry.horizon_preset("sciworld-agentgym").rounds == (10, 20, 30)
    assert registry.horizon_preset("webarena").steps_per_stage == 80
    assert registry.horizon_preset("maze") is None
    assert registry.horizon_preset("no-such-family") is None
    assert presets["babyai"] == {"rounds": (6, 13, 20), "steps_per_stage": 100}
    assert HorizonSchedule.from_preset("remote:textcraft").max_turns(10**6) == 30
    # the default horizon: the env's need (its oracle solves within it), at least the
    # largest preset stage
    assert registry.default_horizon("maze") == 40 and registry.default_horizon("textcraft") == 40
    assert registry.default_horizon("babyai") == 64
    assert registry.default_horizon("search") == 20 >= max(registry.horizon_preset("search").rounds)
    assert registry.default_horizon("remote:textcraft") == 40
    agentgym.register("test/horizon", AIOpsEnv, override=True, default_horizon=7)
    assert registry.default_horizon("test/horizon") == 7


def test_make_refuses_a_game_with_a_clear_error():
    with pytest.raises(agentgym.UnknownEnvError, match="multi-seat game"):
        agentgym.make("tictactoe")
    with pytest.raises(ValueError, match="remote"):
        agentgym.register("remote:x", AIOpsEnv)


def test_module_class_ids_register_on_first_use():
    env_id = "tests.envs.test_registry:SeededEnv"
    env = agentgym.make(env_id, max_turns=3)
    obs, info = env.reset(seed=1, options={"task": 2})
    assert obs.startswith("task 2 ")
    assert registry.is_registered(env_id) and registry.kind(env_id) == "python"
    assert registry.task_splits(env_id) == ((), None)
    from agentgym.envs.tasks import task_set

    assert task_set(env_id).num_tasks == 10
    # a factory, and a gymnasium class
    assert registry.kind("tests.envs.test_registry:_cartpole") == "python"
    gym_id = "gymnasium.envs.classic_control.cartpole:CartPoleEnv"
    assert agentgym.make(gym_id, max_turns=2).reset(seed=0)[0].shape == (4,)


def _cartpole():
    return gym.make("CartPole-v1")


@pytest.mark.parametrize("env_id,message", [
    ("no_such_module_xyz:Env", "cannot import module 'no_such_module_xyz'"),
    ("tests.envs.test_registry:Missing", "has no attribute 'Missing'"),
    ("tests.envs.test_registry:textwrap", "not an env class or a factory"),
    ("tests.envs.test_registry:TestNotAnEnv", "neither a BaseEnv nor a gymnasium.Env"),
    (":Env", "expected 'module:attr'"),
])
def test_a_bad_module_class_id_is_one_clear_unknown_env_error(env_id, message):
    with pytest.raises(agentgym.UnknownEnvError, match=message) as e:
        agentgym.make(env_id)
    assert env_id in str(e.value) and "\n" not in str(e.value)
    assert not registry.is_registered(env_id)


class TestNotAnEnv:  # a class that is no env (pytest collects nothing: no test methods)
    pass


class CountEnv(BaseEnv):
    """Count to three (a user env with an oracle, played by ``module:Class``)."""

    num_tasks = 4

    def reset(self, task=None, seed=None):
        self.n = 0
        return "count to 3 with inc"

    def step(self, action):
        self.n += action == "inc"
        return f"at {self.n}", float(self.n == 3), self.n == 3, {}

    def oracle_action(self):
        return "inc"

    def valid_actions(self):
        return ["inc", "wait"]


@pytest.mark.parametrize("env_workers", [0, 1])
async def test_a_module_class_id_plays_where_env_ids_do(tiny_model_dir, env_workers):
    """The engine resolves a ``module:Class`` id through the registry, in this process and
    in env worker processes (which import it again by the same string)."""
    from transformers import AutoTokenizer

    from agentgym.backends.scripted import ScriptedBackend
    from agentgym.engine import RolloutEngine

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    engine = RolloutEngine(ScriptedBackend(tok, "oracle"), tok, progress=False, max_turns=5,
                           env_workers=env_workers)
    try:
        batch = await engine.collect([0, 1], "tests.envs.test_registry:CountEnv")
    finally:
        engine.close()
    assert [t.success for t in batch.trajectories] == [True, True]
    assert {t.num_turns for t in batch.trajectories} == {3}


ENTRY_POINT_ENV = '''
from agentgym.envs import BaseEnv


class PluginEnv(BaseEnv):
    """An env from an installed plugin."""

    def reset(self, task=None, seed=None):
        return "plugin ready"

    def step(self, action):
        return "done", 1.0, True, {}
'''


def test_entry_point_envs_register_on_first_lookup(tmp_path, monkeypatch):
    (tmp_path / "agentgym_plugin_test.py").write_text(ENTRY_POINT_ENV)
    dist = tmp_path / "agentgym_plugin_test-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: agentgym-plugin-test\n"
                                   "Version: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[agentgym_rl.envs]\nplugin-env = agentgym_plugin_test:PluginEnv\n"
        "bad-plugin = no_such_plugin_module:Env\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    assert not registry.is_registered("plugin-env")
    env = agentgym.make("plugin-env")
    assert env.reset(seed=0)[0] == "plugin ready"
    assert registry.kind("plugin-env") == "python"
    assert registry.describe("plugin-env") == "An env from an installed plugin."
    assert "plugin-env" in agentgym.list_envs()
    with pytest.raises(agentgym.UnknownEnvError, match="no_such_plugin_module"):
        agentgym.make("bad-plugin")
