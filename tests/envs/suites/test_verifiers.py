"""verifiers (0.4, ``verifiers.v1``) through the adapter (``verifiers:<taskset>``).

verifiers 0.4 ships no environment that runs offline: its four tasksets need a container
(``harbor``), a NeMo Gym server (``nemo-gym``), an OpenEnv server (``openenv``) or NLTK's
downloaded ``words`` corpus (``textarena``), and its reusable envs a second model, a judge or
a sandbox. So this module defines three small environment packages with verifiers' own
public classes (``vf.TaskData``/``vf.Task``/``vf.Taskset``, ``@vf.reward``/``@vf.stop``,
``vf.Env``/``vf.EnvConfig``/``vf.AgentConfig``), installed as modules the way verifiers
imports an installed environment, not a re-creation of verifiers: a one-question taskset
(played by verifiers' ``SingleAgentEnv``), a multi-turn guessing game whose own ``Env.run``
answers each guess through ``interaction.turn``, and a taskset whose reward raises on odd
answers. The tests cover a correct reply scored 1 and a wrong one 0 on the final turn only,
a ``@vf.stop`` ending an episode, the held-out split, the refusals (shipped tasksets, an LLM
judge, a sandbox reward) as one line each, and a failing reward ending only its episode.
"""

from __future__ import annotations

import sys
import types

import pytest
import verifiers.v1 as vf

from agentgym.cli import main
from agentgym.envs import registry
from agentgym.envs.registry import make
from agentgym.envs.tasks import task_set
from agentgym.errors import EnvError, UnknownEnvError


# ------------------------------------------------------------- the test environments
class AnswerData(vf.TaskData):
    answer: str


class SumTask(vf.Task[AnswerData]):
    @vf.reward(weight=1.0)
    async def correct(self, task, trace) -> float:
        return float(trace.last_reply.strip() == task.answer)


class SumTaskset(vf.Taskset[SumTask, vf.TasksetConfig]):
    """Sums: one question, one number."""

    def load(self):
        for i in range(40):
            yield SumTask(AnswerData(prompt=f"What is {i} + 1?", answer=str(i + 1),
                                     system_prompt="Answer with the number only."),
                          self.config.task)


class GuessTask(vf.Task[AnswerData]):
    @vf.reward(weight=1.0)
    async def found(self, task, trace) -> float:
        return float(any((m.content or "").strip() == task.answer
                         for m in trace.assistant_messages))

    @vf.stop
    async def five_guesses(self, trace: vf.Trace) -> bool:
        return trace.num_turns >= 5


class GuessTaskset(vf.Taskset[GuessTask, vf.TasksetConfig]):
    """Guess: find the number from higher/lower hints."""

    def load(self):
        for i in range(30):
            yield GuessTask(AnswerData(prompt=f"Game {i}: guess my number, 1 to 10.",
                                       answer=str(i % 10 + 1),
                                       system_prompt="Reply with one number."),
                            self.config.task)


class GuessEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig()


class GuessEnv(vf.Env[GuessEnvConfig]):
    """The game engine is the user: each wrong guess is answered with a hint."""

    async def run(self, task, agents):
        async with agents.player.interaction(task) as chat:
            segment = await chat.turn()
            while not segment.terminated and segment.last_reply != task.data.answer:
                low = segment.last_reply.isdigit() and int(segment.last_reply) < int(
                    task.data.answer)
                segment = await chat.turn(f"Wrong: go {'higher' if low else 'lower'}.")
        chat.trace.record_metric("guesses", chat.trace.num_turns)


class FlakyTask(SumTask):
    @vf.reward(weight=1.0)
    async def correct(self, task, trace) -> float:
        if int(task.answer) % 2:
            raise RuntimeError(f"reward failed on answer {task.answer}")
        return float(trace.last_reply.strip() == task.answer)


class FlakyTaskset(vf.Taskset[FlakyTask, vf.TasksetConfig]):
    def load(self):
        for task in SumTaskset(self.config).load():
            yield FlakyTask(task.data, self.config.task)


class SandboxTask(SumTask):
    @vf.reward(weight=1.0)
    async def correct(self, task, trace, runtime) -> float:
        return 1.0


class SandboxTaskset(vf.Taskset[SandboxTask, vf.TasksetConfig]):
    def load(self):
        return []


def _install(name: str, *exports) -> None:
    """Install ``exports`` as environment module ``name`` (what verifiers imports for the
    id ``name`` with ``_`` written ``-``)."""
    module = types.ModuleType(name)
    for obj in exports:
        setattr(module, obj.__name__, obj)
    module.__all__ = [obj.__name__ for obj in exports]
    sys.modules[name] = module


_install("agentgym_vf_sums", SumTaskset)
_install("agentgym_vf_guess", GuessTaskset, GuessEnv)
_install("agentgym_vf_flaky", FlakyTaskset)
_install("agentgym_vf_sandbox", SandboxTaskset)

SUMS, GUESS, FLAKY = "verifiers:agentgym-vf-sums", "verifiers:agentgym-vf-guess", \
    "verifiers:agentgym-vf-flaky"


# ------------------------------------------------------------------------------- tests
def test_a_single_turn_task_is_scored_by_its_own_reward_when_it_ends():
    assert registry.kind(SUMS) == "python" and registry.default_horizon(SUMS) == 1
    assert not registry.snapshots(SUMS)
    env = make(SUMS)
    assert env.unwrapped.instructions.startswith("Answer with the number only.")
    for task in range(3):
        obs, _ = env.reset(seed=0, options={"task": task})
        answer = env.unwrapped.oracle_action()
        assert obs == f"What is {int(answer) - 1} + 1?"
        _, reward, done, _, info = env.step(answer)
        assert done and reward == 1.0 and info["rewards"] == {"correct": 1.0}
        env.reset(seed=0, options={"task": task})
        _, reward, done, _, info = env.step("certainly not the answer")
        assert done and reward == 0.0 and info["stop"] == "agent_completed"


def test_a_multi_turn_env_answers_each_reply_and_scores_the_finished_rollout():
    assert registry.default_horizon(GUESS) > 1
    env = make(GUESS)
    obs, _ = env.reset(seed=0, options={"task": 0})
    answer = int(env.unwrapped.oracle_action())
    assert obs.startswith("Game") and "Reply with one number." in env.unwrapped.instructions
    rewards = []
    for guess in ("0", "11"):  # wrong guesses: the env's hint is the next turn, reward 0
        obs, reward, done, _, _ = env.step(guess)
        assert not done and reward == 0.0
        assert obs == f"Wrong: go {'higher' if guess == '0' else 'lower'}."
        rewards.append(reward)
    obs, reward, done, _, info = env.step(str(answer))
    assert done and reward == 1.0 and info["metrics"] == {"guesses": 3.0}
    assert all(0.0 <= r <= 1.0 for r in rewards + [reward])


def test_a_stop_hook_ends_the_episode_and_it_is_still_scored():
    env = make(GUESS)
    env.reset(seed=0, options={"task": 1})
    results = [env.step("0") for _ in range(5)]
    assert [r[2] for r in results] == [False] * 4 + [True]
    assert [r[1] for r in results] == [0.0] * 5
    assert results[-1][4]["stop"] == "five_guesses"
    # a new episode on the same env, also after one the engine cut short
    env.reset(seed=0, options={"task": 2})
    env.step("0")
    obs, _ = env.reset(seed=0, options={"task": 2})
    _, reward, done, _, _ = env.step(env.unwrapped.oracle_action())
    assert obs.startswith("Game") and done and reward == 1.0


def test_the_held_out_split_is_disjoint_from_train_and_deterministic():
    ts = task_set(SUMS)
    assert ts.splits == ("train", "test") and ts.held_out == "test"
    train, test = make(SUMS), make(SUMS, split="test")
    n_train, n_test = train.unwrapped.num_tasks, test.unwrapped.num_tasks
    assert n_train + n_test == 40 and n_test >= 1 and n_train >= 1

    def prompts(env, n):
        return [env.reset(options={"task": i})[0] for i in range(n)]

    a, b = prompts(train, n_train), prompts(test, n_test)
    assert not set(a) & set(b) and len(set(a) | set(b)) == 40
    assert prompts(make(SUMS, split="test"), n_test) == b


@pytest.mark.parametrize("env_id, reason", [
    ("verifiers:agentgym-vf-sandbox", "its reward correct reads the runtime box (sandbox)"),
    ("verifiers:harbor", "container sandbox"),
    ("verifiers:nemo-gym", "network"),
    ("verifiers:openenv", "OpenEnv server"),
    ("verifiers:user-sim+agentgym-vf-sums", "LLM user simulator"),
    ("verifiers:agentic-judge+agentgym-vf-sums", "LLM judge"),
    ("verifiers:no-such-taskset", "verifiers cannot load it"),
])
def test_what_cannot_run_here_is_refused_in_one_line_before_any_episode(env_id, reason):
    with pytest.raises(UnknownEnvError) as err:
        registry.spec(env_id)
    assert reason in str(err.value) and "\n" not in str(err.value)


def test_an_llm_judge_in_the_config_is_refused_at_make_time():
    with pytest.raises(ValueError, match="^config: .*LLM judge \\(reference\\)$") as err:
        make(SUMS, config={"task": {"judges": [{"id": "reference"}]}})
    assert "\n" not in str(err.value)


def test_list_shows_what_verifiers_ships_with_its_source(capsys):
    assert main(["list", "--suite", "verifiers"]) == 0
    lines = capsys.readouterr().out.splitlines()
    ids = {line.split()[0] for line in lines}
    assert {"verifiers:textarena", "verifiers:harbor", "verifiers:openenv"} <= ids
    assert all("verifiers.v1.tasksets." in line for line in lines if "verifiers:harbor" in line)


def test_a_failing_reward_ends_only_its_own_episode(engine):
    env = make(FLAKY)
    answers = {}
    for i in range(6):
        env.reset(options={"task": i})
        answers[i] = int(env.unwrapped.oracle_action())
    odd = next(i for i in answers if answers[i] % 2)
    env.reset(options={"task": odd})
    with pytest.raises(EnvError, match="reward failed on answer"):
        env.step(str(answers[odd]))
    batch = engine("oracle", max_turns=1).collect_sync(list(range(6)), FLAKY)
    by_task = {t.task_id: t for t in batch}
    assert sorted(by_task) == list(range(6))
    for task, t in by_task.items():
        if answers[task] % 2:
            assert t.stop_reason == "env_error" and "reward failed" in (t.error or "")
        else:
            assert t.stop_reason == "done" and t.reward == 1.0


def test_an_engine_run_plays_the_multi_turn_env(engine):
    batch = engine("oracle", max_turns=5).collect_sync(4, GUESS, n_samples=2)
    assert len(batch) == 8
    assert {t.stop_reason for t in batch} == {"done"}
    assert {t.reward for t in batch} == {1.0} and all(t.success for t in batch)
