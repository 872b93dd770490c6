"""OpenEnv environments through the adapter (``openenv:<module:Class>``, ``openenv:<URL>``):
the observation and reply rules, an Environment defined here played in-process through
``make`` and the engine (one that raises in ``step``, and a reply that does not parse, end
only their own episodes), bad ids in one line, and the round trip across both directions:
``agentgym-rl serve-env --protocol openenv maze`` served for real and consumed back as
``openenv:http://...`` reproduces the native maze turn by turn."""

from __future__ import annotations

import pytest
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State

import agentgym
from agentgym.envs import registry
from agentgym.envs.suites import HELD_OUT_BASE, list_suite
from agentgym.envs.suites.openenv import listed_actions, reply_action, turn_text
from agentgym.errors import EnvError, UnknownEnvError
from tests.serving.test_openenv_server import maze_url  # noqa: F401 (the served maze)

pytestmark = pytest.mark.timeout(120)

HERE = "tests.envs.suites.test_openenv"


class CountAction(Action):
    message: str


class CountObservation(Observation):
    text: str = ""
    valid_actions: list[str] = []
    truncated: bool = False


class CounterEnv(Environment[CountAction, CountObservation, State]):
    """Count up to a target the seed sets; every step of an odd task raises."""

    def __init__(self, limit: int = 6):
        super().__init__()
        self.limit = limit
        self.resets: list[tuple] = []
        self.count = self.target = self.steps = 0
        self.task = None

    def reset(self, seed=None, episode_id=None, task=None, **kwargs) -> CountObservation:
        self.resets.append((seed, task, kwargs))
        self.target, self.count, self.steps, self.task = 1 + (seed or 0) % 3, 0, 0, task
        return CountObservation(text=f"reach {self.target}", valid_actions=["add", "stay"])

    def step(self, action: CountAction, timeout_s=None, **kwargs) -> CountObservation:
        if isinstance(self.task, int) and self.task % 2:
            raise RuntimeError(f"the counter broke on task {self.task}")
        self.steps += 1
        if action.message == "add":
            self.count += 1
        elif action.message != "stay":
            return CountObservation(text="no such move", valid_actions=["add", "stay"],
                                    reward=-0.5)
        if self.count == self.target:
            return CountObservation(text="reached", reward=1.0, done=True)
        if self.steps >= self.limit:
            return CountObservation(text="out of moves", done=True, truncated=True)
        return CountObservation(text=f"at {self.count}", valid_actions=["add", "stay"],
                                reward=0.0)

    @property
    def state(self) -> State:
        return State(step_count=self.steps)


class Mark(Action):
    row: int
    col: int


class GridObservation(Observation):
    board: list[int]
    legal_actions: list = []


class GridEnv(Environment[Mark, GridObservation, State]):
    """Mark the hidden cell of a 2x2 grid (its reset takes no task); an odd task lists only
    'pass', which is no action."""

    def reset(self, seed=None, episode_id=None) -> GridObservation:
        self.hidden = (seed or 0) % 4
        legal = ["pass"] if (seed or 0) % 2 else \
            [{"row": r, "col": c} for r in range(2) for c in range(2)]
        return GridObservation(board=[0] * 4, legal_actions=legal)

    def step(self, action, timeout_s=None, **kwargs) -> GridObservation:
        cell = action.row * 2 + action.col
        board = [int(i == cell) for i in range(4)]
        return GridObservation(board=board, reward=float(cell == self.hidden), done=True)

    @property
    def state(self) -> State:
        return State()


class Untyped(Environment):
    def reset(self, seed=None, episode_id=None, **kwargs):
        return Observation()

    def step(self, action, timeout_s=None, **kwargs):
        return Observation(done=True)

    @property
    def state(self):
        return State()


class NotAnEnv:
    pass


def test_the_observation_rules():
    assert turn_text({"prompt": "p", "text": "t"}) == "t"
    assert turn_text({"message": "m", "content": "c"}) == "m"
    assert turn_text({"text": None, "observation": "o"}) == "o"
    assert turn_text({"b": [1], "a": 2}) == '{"a": 2, "b": [1]}'
    assert listed_actions({"legal_actions": ["x", {"row": 1}]}) == ["x", '{"row": 1}']
    assert listed_actions({"valid_actions": "x"}) == []


def test_the_reply_rules():
    one = CountAction.model_json_schema()
    assert reply_action("  add", one, "e") == {"message": "  add"}
    two = Mark.model_json_schema()
    assert reply_action('{"row": 1, "col": 0}', two, "e") == {"row": 1, "col": 0}
    with pytest.raises(EnvError, match=r"^e: the reply must be a JSON object .*\(row, col\)"):
        reply_action("top left", two, "e")


def test_an_in_process_environment_plays_through_make():
    env = agentgym.make(f"openenv:{HERE}:CounterEnv")
    assert registry.kind(f"openenv:{HERE}:CounterEnv") == "python"
    assert not registry.snapshots(f"openenv:{HERE}:CounterEnv")
    assert env.instructions.startswith("CounterEnv environment")
    assert env.instructions.endswith("Action: <your action>")
    obs, _ = env.reset(seed=9, options={"task": 4})
    inner = env.unwrapped.env._link.env
    assert obs == "reach 2" and inner.resets[-1] == (4, 4, {})  # task i: seed i
    assert env.unwrapped.valid_actions() == ["add", "stay"]
    assert env.step("jump")[1:3] == (-0.5, False)
    assert env.step("add")[:3] == ("at 1", 0.0, False)
    obs, reward, terminated, truncated, _ = env.step("add")
    assert (obs, reward, terminated, truncated) == ("reached", 1.0, True, False)
    assert env.unwrapped.valid_actions() == []
    env.close()


def test_splits_seeds_reset_kwargs_and_the_horizon_cut():
    env = agentgym.make(f"openenv:{HERE}:CounterEnv", split="test", env_kwargs={"limit": 2},
                        reset_kwargs={"level": "hard"})
    env.reset(options={"task": 2})
    assert env.unwrapped.env._link.env.resets[-1] == (HELD_OUT_BASE + 2, 2, {"level": "hard"})
    env.step("stay")
    obs, reward, terminated, truncated, _ = env.step("stay")
    assert obs == "out of moves" and not terminated and truncated  # a cut, not an end
    with pytest.raises(ValueError, match="^split:"):
        agentgym.make(f"openenv:{HERE}:CounterEnv", split="dev")
    with pytest.raises(ValueError, match="^env_kwargs: .*'nope'"):
        agentgym.make(f"openenv:{HERE}:CounterEnv", env_kwargs={"nope": 1})


def test_a_json_action_env_and_a_reply_that_does_not_fit():
    env = agentgym.make(f"openenv:{HERE}:GridEnv")
    assert "JSON object with the fields row, col" in env.instructions
    obs, _ = env.reset(options={"task": 2})  # its reset takes no task: the seed alone
    assert obs == ('{"board": [0, 0, 0, 0], "legal_actions": [{"col": 0, "row": 0}, '
                   '{"col": 1, "row": 0}, {"col": 0, "row": 1}, {"col": 1, "row": 1}]}')
    assert env.unwrapped.valid_actions()[2] == '{"row": 1, "col": 0}'
    with pytest.raises(EnvError, match=r"the reply does not fit Mark \(row: .*\)"):
        env.step('{"row": "top", "col": 0}')
    env.reset(options={"task": 2})
    assert env.step('{"row": 1, "col": 0}')[1:3] == (1.0, True)


@pytest.mark.parametrize("env_id, message", [
    ("openenv:no_such_module_xyz:Env", "no module named 'no_such_module_xyz'"),
    (f"openenv:{HERE}:Missing", "has no attribute 'Missing'"),
    (f"openenv:{HERE}:NotAnEnv", "is not an OpenEnv Environment subclass"),
    (f"openenv:{HERE}:Untyped", "cannot tell Untyped's Action model"),
    ("openenv:just_a_name", "name an OpenEnv Environment class"),
    ("openenv:http://", "the URL names no host"),
    ("openenv:", "name the openenv env"),
])
def test_a_bad_id_is_one_line_naming_it(env_id, message):
    with pytest.raises(UnknownEnvError) as err:
        registry.spec(env_id)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_server_that_cannot_be_reached_is_one_line_naming_it():
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(EnvError, match=f"cannot use the OpenEnv server at http://127.0.0.1:{port}"):
        agentgym.make(f"openenv:http://127.0.0.1:{port}")


def test_the_installed_openenv_ships_no_example_envs():
    assert list_suite("openenv") == []


def test_an_env_that_raises_ends_only_its_own_episodes(engine):
    batch = engine("oracle", max_turns=8).collect_sync(list(range(6)), f"openenv:{HERE}:CounterEnv")
    by_task = {t.task_id: t for t in batch}
    assert sorted(by_task) == list(range(6))
    for task, t in by_task.items():
        if task % 2:
            assert t.stop_reason == "env_error" and "the counter broke" in (t.error or "")
        else:
            assert t.stop_reason in ("done", "horizon") and t.error is None


def test_a_reply_that_does_not_parse_ends_only_its_own_episode(engine):
    batch = engine("oracle", max_turns=2).collect_sync(list(range(4)), f"openenv:{HERE}:GridEnv")
    by_task = {t.task_id: t for t in batch}
    for task, t in by_task.items():
        if task % 2:  # the only listed move is 'pass'
            assert t.stop_reason == "env_error" and "must be a JSON object" in t.error
        else:
            assert t.stop_reason == "done" and t.reward in (0.0, 1.0)


def test_the_served_maze_consumed_back_is_the_native_maze(maze_url):  # noqa: F811
    env = agentgym.make(f"openenv:{maze_url}")
    native = agentgym.make("maze")
    try:
        assert env.instructions == native.instructions
        for task in (3, 8):
            obs, _ = env.reset(seed=123, options={"task": task})
            assert obs == native.reset(seed=task, options={"task": task})[0]  # task i: seed i
            for _ in range(100):
                assert env.unwrapped.valid_actions() == native.unwrapped.valid_actions()
                action = native.unwrapped.oracle_action()
                expected = native.step(action)
                got = env.step(action)
                assert got[:4] == expected[:4]
                if got[2] or got[3]:
                    break
            assert got[1] == 1.0 and got[2]
        # the horizon cut crosses both directions as a cut
        cut = agentgym.make(f"openenv:{maze_url}", reset_kwargs={"max_turns": 1})
        cut.reset(options={"task": 0})
        assert cut.step("move north")[2:4] == (False, True)
        cut.close()
    finally:
        env.close()


def test_the_served_maze_plays_through_the_engine(engine, maze_url):  # noqa: F811
    batch = engine("oracle", max_turns=6).collect_sync(list(range(3)), f"openenv:{maze_url}")
    assert len(batch) == 3 and {t.stop_reason for t in batch} <= {"done", "horizon"}
