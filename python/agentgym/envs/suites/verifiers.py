"""verifiers (Prime Intellect, 0.4 ``verifiers.v1``) environments as envs: ``verifiers:<id>``.

``<id>`` names what verifiers itself loads (``vf-eval <taskset> [--env.id <env>]``): a taskset id
(``verifiers:textarena``, or an installed environment package: ``verifiers:my-env``, imported
as ``my_env``), played by the taskset's own ``Env`` (its exported ``Env`` subclass, else
``SingleAgentEnv``); or ``verifiers:<env>+<taskset>``, verifiers' paired id, an ``Env``
of ``verifiers.v1.envs`` over a taskset (``verifiers:best-of-n+my-env``). The taskset's config
fields are ``make`` keyword ``config`` (``make("verifiers:textarena",
config={"game": "Wordle-v0"})``), the env's own fields ``env_config``. Every id is a
single-agent env (:class:`VerifiersEnv`): verifiers' own ``Env.run_episode`` plays the
episode, with its one seat played by the engine's policy.

What maps onto what:

* the system prompt: the system prompt of the split's first task (``TaskData.system_prompt``,
  after the taskset config's ``system_prompt`` override), then the reply format; a task whose
  own system prompt differs gets it at the head of its first turn text;
* the first turn text: the text of the task's prompt messages (``TaskData.prompt``; its
  system messages count as the task's system prompt), joined by blank lines;
* the next turn text (a multi-turn env): the user turn the env's ``run()`` sends with
  ``interaction.turn(message)`` (verifiers 0.4 has no per-turn response hook: the env's
  ``run()`` is the control flow between the seat and the world, and the adapter runs it);
* the seat's reply: the turn's action, recorded as the assistant message that the rewards
  read; the seat is played as verifiers' tool-less ``null`` harness plays it (one model reply
  per segment; the default ``bash`` harness's shell in a runtime is not used);
* the reward: verifiers scores the FINISHED rollout, so the adapter does too. Once the episode
  ends (the env's ``run()`` returns, a ``@vf.stop`` or the seat's ``max_turns`` fires), verifiers'
  own ``Task.score`` runs the task's ``@vf.reward``/``@vf.metric`` functions (and the env's
  ``finalize``) and the final turn gets the trace's weighted reward (``Trace.reward``: the sum of
  score x weight); every earlier turn gets 0. An episode the engine cuts at its horizon is
  never scored;
* tasks: verifiers 0.4's ``Taskset`` declares no eval split (its ``select`` views pick rows), so
  the adapter holds one out deterministically: split ``test`` is the tasks whose content key
  (verifiers' ``task_key`` of the task data without its position ``idx``) hashes to 0 mod
  10, split ``train`` the rest, each in ``load()`` order; an endless taskset is read to
  ``size`` tasks (default 1000);
* the scripted solver: the task data's ``answer`` field, where its ``TaskData`` declares one;
* snapshots: unsupported (an episode is a live coroutine of the env's ``run()``).

What cannot run here is refused by :func:`spec` (at make time for what the taskset config
adds), before any episode starts, with one line naming the reason: an LLM judge (``judges``),
a sandbox (a task ``setup``/``finalize`` or a reward that takes the ``runtime`` box, a task
that needs a container), tools (MCP tool servers), a second model (an env of several roles),
network (the shipped tasksets and envs listed in :data:`_SHIPPED_NEEDS`). A verifiers failure
inside one episode (a reward that raises, the env's ``run()`` failing) ends only that episode,
as the env error the Python drivers record (``env_error``).

The episodes run as coroutines on one background event loop per process; ``reset`` and
``step`` hand a reply in and wait for the env's next model call or its end.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import importlib.metadata
import inspect
import os
import pkgutil
import re
import sys
import threading
import time
from contextlib import asynccontextmanager
from typing import Any

import verifiers
import verifiers.v1 as vf
from verifiers.v1 import tasksets as vf_tasksets
from verifiers.v1.session import RolloutLimits, call_hook, hook_boundary
from verifiers.v1.state import state_cls
from verifiers.v1.task import task_key
from verifiers.v1.types import content_text
from verifiers.v1.utils import loaders
from verifiers.v1.utils.decorators import discover_decorated
from verifiers.v1.utils.generic import concrete_type

from agentgym.envs.base import BaseEnv, action_line
from agentgym.envs.suites import SPLITS, SuiteEntry, check_split, task_index
from agentgym.errors import EnvError, UnknownEnvError

__all__ = ["VerifiersEnv", "entries", "spec"]

#: Tasks read from an endless taskset (``Taskset.INFINITE``) unless ``size`` says otherwise.
DEFAULT_ENDLESS_SIZE = 1000
#: A task is held out (split ``test``) when its content key hashes to 0 mod this.
HELD_OUT_EVERY = 10
#: Seconds ``reset``/``step`` wait for the env's next model call or its end.
DEFAULT_TIMEOUT_S = 120.0
#: The harness the seat is played as: verifiers' tool-less chat program.
SEAT_HARNESS = "null"

#: What a taskset or env that verifiers ships needs beyond what :func:`_needs` checks on
#: every class, by module name.
_SHIPPED_NEEDS: dict[str, str] = {
    "openenv": "it starts or reaches an OpenEnv server (uv, Docker or network)",
    "textarena": "it needs NLTK's 'words' corpus, which verifiers downloads when it loads "
                 "(network)",
    "harbor": "it runs every task in a container sandbox (Harbor)",
    "nemo_gym": "it verifies episodes on a NeMo Gym resource server (network)",
    "best_of_n": "it plays n attempts of a task per episode (n trajectories; one here)",
    "isolated_verifier": "it grades every episode in a fresh sandbox box",
    "agentic_judge": "an agentic LLM judge grades every episode in a sandbox",
    "shared_agentic_judge": "an agentic LLM judge grades every episode in a sandbox",
    "user_sim": "an LLM user simulator (role 'user') talks to the seat",
}


def _shipped_need(name: str) -> str | None:
    """:data:`_SHIPPED_NEEDS` of module ``name``; None for textarena when NLTK's ``words``
    corpus is installed (then nothing downloads)."""
    if name == "textarena":
        import nltk

        try:
            nltk.data.find("corpora/words")
            return None
        except LookupError:
            pass
    return _SHIPPED_NEEDS.get(name)


def _module_name(plugin_id: str) -> str:
    """The module name verifiers imports for a plugin id (its ``_import_plugin`` rule)."""
    return plugin_id.rsplit("/", 1)[-1].split("@", 1)[0].replace("-", "_").lower()


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")


# ----------------------------------------------------------------------------- the checks
def _roles(env_cls: type) -> list[str]:
    """The seat names an ``Env`` class's config declares (its ``AgentConfig`` fields)."""
    config_cls = concrete_type(env_cls, vf.EnvConfig, origin=vf.Env) or vf.EnvConfig
    return [name for name, f in config_cls.model_fields.items()
            if isinstance(f.default, vf.AgentConfig)]


def _takes_runtime(fn) -> bool:
    """Whether a task hook needs the runtime box (verifiers' own test in ``Task.score``)."""
    param = inspect.signature(fn).parameters.get("runtime")
    return param is not None and param.default is inspect.Parameter.empty


def _needs(env_id: str, taskset_id: str, env_cls: type, taskset_cls: type,
           task_config: Any) -> str | None:
    """Why this env cannot run here (an LLM judge, a sandbox, network, tools, a second
    model), or None. ``task_config`` is the tasks' ``TaskConfig`` (its plugged judges,
    rewards, metrics and stops count)."""
    for plugin, cls in ((env_id, env_cls), (taskset_id, taskset_cls)):
        if plugin and cls.__module__.startswith("verifiers.v1."):
            reason = _shipped_need(_module_name(plugin))
            if reason:
                return reason
    roles = _roles(env_cls)
    if len(roles) != 1:
        return (f"its env {env_cls.__name__} plays {len(roles)} roles "
                f"({', '.join(roles) or 'none'}), each its own model; one policy plays here")
    harness = loaders.default_harness_id(taskset_id)
    if harness != "bash":
        return f"it plays its tasks with its own harness {harness!r} (an agent program)"
    task_cls = taskset_cls.task_type()
    if task_cls.NEEDS_CONTAINER:
        return f"its task {task_cls.__name__} runs in a container (sandbox)"
    for hook in ("setup", "finalize", "stage_verifier"):
        if getattr(task_cls, hook) is not getattr(vf.Task, hook):
            return f"its task {hook} works in the runtime box (sandbox)"
    if (task_cls.toolsets.__func__ is not vf.Task.toolsets.__func__
            or taskset_cls.toolsets.__func__ is not vf.Taskset.toolsets.__func__):
        return "it serves the model tools (MCP tool servers); a turn here is text"
    if task_config.judges:
        return (f"it scores with an LLM judge "
                f"({', '.join(j.id or type(j).__name__ for j in task_config.judges)})")
    probe = task_cls.__new__(task_cls)
    probe.config = task_config
    for kind in ("reward", "metric"):
        for fn in probe.hooks(kind):
            if _takes_runtime(fn):
                return f"its {kind} {fn.__name__} reads the runtime box (sandbox)"
    if discover_decorated(probe, "intercept"):
        return "it rewrites the model's requests (@vf.intercept)"
    return None


def _parse(env_id: str, local: str) -> tuple[str, str]:
    """``(env id, taskset id)`` of ``<env>+<taskset>`` or ``<taskset>``."""
    env, sep, taskset = local.rpartition("+")
    if not taskset or (sep and not env):
        raise UnknownEnvError(f"env id {env_id!r}: name a verifiers taskset, "
                              "verifiers:<taskset> or verifiers:<env>+<taskset>")
    return env, taskset


def _classes(env_id: str, env: str, taskset: str) -> tuple[type, type]:
    """The ``Env`` and ``Taskset`` classes verifiers resolves for the id."""
    try:
        return loaders.environment_class(taskset, env), loaders.taskset_class(taskset)
    except Exception as e:  # a module that is not there, or exports no Taskset/Env
        raise UnknownEnvError(f"env id {env_id!r}: verifiers cannot load it "
                              f"({_first_line(e)})") from None


# -------------------------------------------------------------------------- the tasks
_TASKS: dict[tuple, dict[str, list]] = {}


def _held_out(task: Any) -> bool:
    """Whether ``task`` is in split ``test``: its content key (without ``idx``) hashes to 0
    mod :data:`HELD_OUT_EVERY`."""
    key = task_key(task.data.model_dump(mode="json", exclude_none=True, exclude={"idx"}))
    return int(key, 16) % HELD_OUT_EVERY == 0


def _split_tasks(taskset: Any, size: int | None) -> dict[str, list]:
    """The taskset's tasks by split, read once per process for each taskset config."""
    cache = (taskset.config.model_dump_json(), size)
    found = _TASKS.get(cache)
    if found is None:
        if size is not None:
            view = taskset.take(size)
        elif taskset.bounded:
            view = taskset
        else:
            view = taskset.take(DEFAULT_ENDLESS_SIZE)
        tasks = list(view)
        found = _TASKS[cache] = {
            "train": [t for t in tasks if not _held_out(t)],
            "test": [t for t in tasks if _held_out(t)],
        }
    return found


def _opening(data: Any) -> list:
    """The messages a task opens with: its system prompt, then its prompt."""
    out: list = []
    if data.system_prompt:
        out.append(vf.SystemMessage(content=data.system_prompt))
    if isinstance(data.prompt, str):
        out.append(vf.UserMessage(content=data.prompt))
    elif data.prompt:
        out.extend(data.prompt)
    return out


def _text(messages: list, role: str | None = None) -> str:
    """The text of ``messages`` (of ``role`` only, or of every role but system)."""
    keep = [m for m in messages if (m.role == role if role else m.role != "system")]
    return "\n\n".join(t for t in (content_text(m.content).strip() for m in keep) if t)


# ------------------------------------------------------------------- the background loop
_LOOP_LOCK = threading.Lock()
_LOOP: tuple[int, asyncio.AbstractEventLoop] | None = None


def _loop() -> asyncio.AbstractEventLoop:
    """The process's background event loop that the episodes run on (started once per
    process, so a forked worker starts its own)."""
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None or _LOOP[0] != os.getpid():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="agentgym-verifiers",
                             daemon=True).start()
            _LOOP = (os.getpid(), loop)
        return _LOOP[1]


class _Exchange:
    """One episode between the engine and the env's ``run()``: the seat asks (the turn text
    of its next model call) on the background loop, the engine answers from its thread."""

    def __init__(self, name: str, system: str, timeout_s: float):
        self.name, self.system, self.timeout_s = name, system, timeout_s
        self.asked: concurrent.futures.Future = concurrent.futures.Future()
        self.reply: asyncio.Future | None = None
        self.job: concurrent.futures.Future | None = None
        self.seated = False

    async def ask(self, text: str) -> str:
        """Hand the engine the turn text and wait for its reply (on the background loop)."""
        self.reply = asyncio.get_running_loop().create_future()
        self.asked.set_result(text)
        return await self.reply

    def answer(self, action: str) -> None:
        """Give the waiting model call its reply (from the engine's thread)."""
        reply, self.asked = self.reply, concurrent.futures.Future()
        _loop().call_soon_threadsafe(lambda: reply.done() or reply.set_result(action))

    def wait(self) -> str | None:
        """The next turn text, or None once the episode has ended."""
        done, _ = concurrent.futures.wait([self.asked, self.job], timeout=self.timeout_s,
                                          return_when=concurrent.futures.FIRST_COMPLETED)
        if self.asked in done:
            return self.asked.result()
        if self.job in done:
            return None
        raise EnvError(f"{self.name}: the env neither asked for a reply nor ended within "
                       f"{self.timeout_s:g} s")

    def cancel(self) -> None:
        if self.job is not None and not self.job.done():
            self.job.cancel()


# --------------------------------------------------------------------- the engine's seat
class _Run:
    """One rollout of the seat, what verifiers' ``Interaction`` drives (the part of its
    ``Rollout`` that runs without a runtime or harness program): each segment is one model
    call, answered by the engine; closing it scores the trace with the task's own
    ``Task.score``."""

    def __init__(self, task: Any, seat: _Seat):
        self.task, self.seat = task, seat
        self.trace = vf.Trace(
            task=vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key,
                              hash=task.hash),
            state=state_cls(type(task))(),
            agent=vf.AgentInfo(config=seat.config, name=seat.name, trainable=seat.trainable))
        self.stops = [(hook_boundary(fn, allow_trace=True), fn) for fn in task.hooks("stop")]
        self.limits = RolloutLimits(max_turns=seat.config.max_turns)
        self.closed = False
        self._failed = False
        self._opened = False

    @property
    def ok(self) -> bool:
        return not self._failed and self.trace.stop_condition is None

    def fail(self, error: Exception) -> None:
        self._failed = True
        self.trace.record_error(error)

    def _add(self, messages: list, sampled: bool) -> None:
        for message in messages:
            parent = len(self.trace.nodes) - 1 if self.trace.nodes else None
            self.trace.nodes.append(vf.MessageNode(parent=parent, message=message,
                                                   sampled=sampled))

    async def _stopped(self, values: dict) -> bool:
        """Run the task's ``@vf.stop`` hooks whose boundary is in ``values`` (``Trace``,
        ``Request`` or ``Response``, with its value); the first that fires stops the trace."""
        for kind, fn in self.stops:
            if kind in values:
                fired = await call_hook(fn, {**values, vf.Trace: self.trace})
                if not isinstance(fired, bool):
                    raise vf.TaskError(f"@stop must return bool, got {type(fired).__name__}")
                if fired:
                    self.trace.stop(fn.__name__)
                    return True
        return False

    async def step(self, messages: list | None = None, *, on_input=None) -> bool:
        """One segment: the new input messages, then one model call answered by the engine.
        Before the call, the seat's ``max_turns`` and the ``Trace`` and ``Request`` stops (as
        verifiers checks them before each model call); after it, the ``Response`` stops.
        Whether the exchange can go on."""
        if self.closed or not self.ok:
            return False
        new = [] if self._opened else _opening(self.task.data)
        self._opened = True
        new += messages or []
        self._add(new, sampled=False)
        if on_input is not None:
            on_input()
        try:
            if limit := self.limits.reached(self.trace):
                self.trace.stop(limit)
                return False
            if await self._stopped({vf.Trace: self.trace,
                                    vf.Request: vf.Request(messages=self.trace.messages)}):
                return False
            reply = await self.seat.exchange.ask(self.seat.turn_text(new))
            message = vf.AssistantMessage(content=reply)
            self._add([message], sampled=True)
            await self._stopped({vf.Response: vf.Response(
                id=self.trace.id, created=int(time.time()), model="agentgym",
                message=message, finish_reason="stop")})
        except Exception as e:  # a stop hook that raised fails the rollout, as in verifiers
            self.fail(e)
            return False
        return self.ok

    async def steer(self, message: str, *, message_id: str | None = None) -> dict:
        """No harness session runs between segments (what ``Rollout.steer`` answers then)."""
        return {"outcome": "promptRequired", "reason": "noRunningTurn"}

    async def close(self) -> Any:
        """Finish the rollout: score it with the task's own rewards unless it failed."""
        if self.closed:
            return self.trace
        self.closed = True
        if not self._failed:
            try:
                await self.task.score(self.trace)
            except Exception as e:  # verifiers' TaskError from a reward or metric
                self.fail(e)
        self.trace.is_completed = True
        self.trace.ok = not self._failed
        self.seat.completed.append(self.trace)
        return self.trace

    async def abort(self) -> None:
        self.closed = True


class _Seat:
    """The env's one role, played by the engine's policy: the part of verifiers' ``Agent``
    that an ``Env.run`` uses (``run``, ``interaction``, ``trainable``). One rollout per
    episode: an env that runs its agent twice is refused in that episode."""

    def __init__(self, name: str, config: Any, exchange: _Exchange, completed: list):
        self.name, self.config, self.exchange, self.completed = name, config, exchange, completed
        self.trainable = True

    def turn_text(self, new: list) -> str:
        """A segment's turn text: the new messages' text; the first also carries the task's
        system prompt where it differs from the env's."""
        text = _text(new)
        own = _text(new, "system")
        if own and own != self.exchange.system:
            text = f"{own}\n\n{text}" if text else own
        return text

    def _open(self, task: Any) -> _Run:
        if self.exchange.seated:
            raise EnvError(f"{self.exchange.name}: the env runs its agent more than once in "
                           "an episode; one trajectory per episode here")
        self.exchange.seated = True
        return _Run(task, self)

    async def run(self, task: Any, **_: Any) -> Any:
        """One segment on the task's prompt (verifiers' ``Agent.run``)."""
        run = self._open(task)
        if task.data.prompt is None:
            raise vf.TaskError("task has no prompt and no user to open the conversation")
        await run.step()
        if run.ok:
            run.trace.stop("agent_completed")
        return await run.close()

    @asynccontextmanager
    async def interaction(self, task: Any, **_: Any):
        """The rollout held open turn by turn, the env's ``run()`` as its user (verifiers'
        ``Agent.interaction`` over verifiers' own ``Interaction``)."""
        run = self._open(task)
        interaction = vf.Interaction(run)
        try:
            yield interaction
        except Exception as e:
            run.fail(e)
            raise
        except BaseException:
            await run.abort()
            raise
        finally:
            if not run.closed:
                await interaction.close()


def _episode_agents(env: Any, ctx: _Exchange, completed: list, on_trace, on_discard) -> Any:
    """``Env._episode_agents`` for the engine: the env's roles (one) as :class:`_Seat`s on
    the episode's exchange (``ctx``)."""
    return vf.Agents(env.config, lambda name, config: _Seat(name, config, ctx, completed))


# ------------------------------------------------------------------------------- the env
class VerifiersEnv(BaseEnv):
    """A verifiers environment, one task per episode, scored when it ends (see the module
    docs)."""

    splits = SPLITS
    held_out_split = "test"

    def __init__(self, taskset: str, env: str = "", split: str = "train",
                 config: dict[str, Any] | None = None,
                 env_config: dict[str, Any] | None = None, size: int | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S):
        check_split(split)
        if size is not None and int(size) < 1:
            raise ValueError(f"size: must be >= 1, got {size}")
        self.name = f"verifiers:{env + '+' if env else ''}{taskset}"
        self.split, self.timeout_s = split, float(timeout_s)
        env_cls, _ = _classes(self.name, env, taskset)
        seats = {role: {"harness": {"id": SEAT_HARNESS}} for role in _roles(env_cls)}
        try:
            cfg = vf.resolve_env_config({**seats, **(env_config or {}), "id": env,
                                         "taskset": {**(config or {}), "id": taskset}})
        except Exception as e:  # pydantic's ValidationError: a missing or wrong field
            raise ValueError(f"config: {self.name}: {_first_line(e)}") from None
        self._env = vf.load_environment(cfg)
        reason = _needs(env, taskset, type(self._env), type(self._env.taskset),
                        self._env.taskset.config.task)
        if reason:
            raise ValueError(f"config: {self.name} cannot run here: {reason}")
        self._env._episode_agents = functools.partial(_episode_agents, self._env)
        try:
            self._tasks = _split_tasks(self._env.taskset, size)[split]
        except Exception as e:  # the taskset's own load() failed
            raise EnvError(f"{self.name}: the taskset failed to load ({_first_line(e)})") from None
        if not self._tasks:
            raise ValueError(f"split: {self.name} has no tasks in split {split!r}")
        self.num_tasks = len(self._tasks)
        self.tasks_doc = (f"task i is the i-th task in load() order of split {split!r}: "
                          f"split 'test' holds the tasks whose content key hashes to 0 mod "
                          f"{HELD_OUT_EVERY}, 'train' the rest")
        self.system = _text(_opening(self._tasks[0].data), "system")
        self.instructions = ((self.system + "\n") if self.system else
                             "Do the task you are given.\n") + action_line("<your reply>")
        self._task: Any = None
        self._exchange: _Exchange | None = None

    def reset(self, task: int | str | None = None, seed: int | None = None) -> str:
        index = task_index(self.name, task, seed, self.num_tasks)
        self.close()
        self._task = self._tasks[index]
        ex = self._exchange = _Exchange(self.name, self.system, self.timeout_s)
        ex.job = asyncio.run_coroutine_threadsafe(self._env.run_episode(self._task, ex),
                                                  _loop())
        text = ex.wait()
        if text is None:
            self._result()  # raises the episode's error
            raise EnvError(f"{self.name}: the episode ended before the first reply")
        return text

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        ex = self._exchange
        if ex is None or ex.reply is None or ex.reply.done():
            raise EnvError(f"{self.name}: step before reset (or after the episode ended)")
        ex.answer(action)
        text = ex.wait()
        if text is not None:
            return text, 0.0, False, {}
        trace = self._result()
        info = {"rewards": {k: r.score for k, r in trace.rewards.items() if r is not None},
                "metrics": dict(trace.metrics), "stop": trace.stop_condition}
        return (f"The episode is over ({trace.stop_condition}).", float(trace.reward), True,
                info)

    def _result(self) -> Any:
        """The seat's scored trace of the episode that just ended; its error (the episode's,
        else the trace's) as an :class:`EnvError`."""
        episode = self._exchange.job.result()
        errors = list(episode.errors) or [e for t in episode.traces for e in t.errors]
        if errors:
            first = (errors[-1].message.strip().splitlines() or [""])[0]
            raise EnvError(f"{self.name}: {errors[-1].type}: {first}")
        return episode.traces[0]

    def oracle_action(self) -> str | None:
        answer = getattr(self._task.data, "answer", None) if self._task is not None else None
        return None if answer is None else str(answer)

    def close(self) -> None:
        if self._exchange is not None:
            self._exchange.cancel()
            self._exchange = None


# ------------------------------------------------------------------------------ registry
def spec(env_id: str, name: str):
    """The registry's spec of ``verifiers:<taskset>`` or ``verifiers:<env>+<taskset>``;
    :class:`UnknownEnvError` naming the reason where it cannot run here."""
    from agentgym.envs.registry import DEFAULT_HORIZON, EnvSpec, SuccessRule

    env, taskset = _parse(env_id, name)
    env_cls, taskset_cls = _classes(env_id, env, taskset)
    reason = _needs(env, taskset, env_cls, taskset_cls, taskset_cls.task_type().config_type()())
    if reason:
        raise UnknownEnvError(f"env id {env_id!r}: cannot run here: {reason}")
    doc = (taskset_cls.__doc__ or sys.modules[taskset_cls.__module__].__doc__ or "").strip()
    doc = doc.splitlines()
    single = env_cls is vf.SingleAgentEnv
    return EnvSpec(env_id, VerifiersEnv, {"taskset": taskset, "env": env},
                   f"verifiers {taskset}" + (f": {doc[0].rstrip('.')}" if doc else ""),
                   "python", default_horizon=1 if single else DEFAULT_HORIZON,
                   success=SuccessRule(1.0, "verifiers' weighted reward of the finished "
                                            "rollout (Trace.reward) reaches 1"),
                   snapshots=False, images=False)


def _installed() -> list[tuple[str, str]]:
    """``(module, distribution)`` of each top-level module of an installed package that
    requires verifiers (not only as an extra)."""
    md = importlib.metadata
    requiring = {d.metadata["Name"]: d.version for d in md.distributions()
                 if any(re.match(r"verifiers\b", r) and "extra ==" not in r
                        for r in d.requires or [])}
    return sorted((module, f"{name} {requiring[name]}")
                  for module, names in md.packages_distributions().items()
                  for name in names if name in requiring)


def entries() -> list[SuiteEntry]:
    """What verifiers ships (its tasksets) or has installed (packages requiring verifiers
    that export a Taskset), each with where it comes from and, where it cannot run here,
    why."""
    found: list[tuple[str, str]] = [
        (m.name.replace("_", "-"), f"verifiers.v1.tasksets.{m.name} (shipped, verifiers "
                                   f"{verifiers.__version__})")
        for m in pkgutil.iter_modules(vf_tasksets.__path__)]
    for module, dist in _installed():
        try:
            loaders.taskset_class(module)
        except Exception:  # not an environment package
            continue
        found.append((module.replace("_", "-"), f"{module} (installed: {dist})"))
    out = []
    for taskset, source in found:
        try:
            env_cls, taskset_cls = _classes(taskset, "", taskset)
            reason = _needs("", taskset, env_cls, taskset_cls,
                            taskset_cls.task_type().config_type()())
        except Exception as e:  # one that does not even import here
            reason = _first_line(e)
        out.append(SuiteEntry(f"verifiers:{taskset}", "python", 1,
                              source + (f"; refused here: {reason}" if reason else "")))
    return out
