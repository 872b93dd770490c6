"""OpenEnv environments as envs: ``openenv:<module.path:EnvClass>`` and
``openenv:http://host:port``.

``openenv:<module.path:EnvClass>`` builds an OpenEnv ``Environment`` subclass in-process
(``make(..., env_kwargs={...})`` are its constructor's arguments);
``openenv:http://host:port`` (or ``https://``) drives a running OpenEnv server through
OpenEnv's own client (``GenericEnvClient``, its sync wrapper: one WebSocket session per
env). Either is a single-agent env (:class:`OpenEnvEnv`), which is also how an env of this
project served by ``agentgym-rl serve-env --protocol openenv`` plays here again.

What maps onto what (the observation is OpenEnv's serialized one: the Observation's
fields less ``done``, ``reward`` and ``metadata``; the action schema is the Action model's
JSON schema, over HTTP the server's ``GET /schema``):

* the system prompt: the env's metadata description (``get_metadata()``, over HTTP
  ``GET /metadata``), then the reply format: ``Action: <your action>`` where the Action has
  one string field (unless the description states the reply format already), else
  ``Action:`` followed by a JSON object of its fields;
* the turn text: the first string among the observation's ``text``, ``prompt``,
  ``message``, ``content`` and ``observation`` fields (:data:`TEXT_FIELDS`); else the
  observation's JSON (keys sorted);
* ``valid_actions``: the first list among ``valid_actions``, ``legal_actions`` and
  ``available_actions`` (:data:`ACTION_FIELDS`), each item as text; [] otherwise;
* the reply: an Action with one string field (besides ``metadata``) gets the reply text in
  it; any other Action gets the reply parsed as a JSON object and validated by the Action
  model. A reply that does not parse or validate raises :class:`~agentgym.errors.EnvError`
  naming the fields, so that episode alone ends with ``env_error`` and that message;
* the reward: ``observation.reward`` (None is 0); the episode ends when
  ``observation.done``; a done observation with ``truncated: true`` is a cut
  (``info["truncated"]``), not a terminal state;
* tasks: task ``i`` of split ``train`` is ``reset(seed=i, task=i)``, of split ``test``
  (held out) ``reset(seed=2**32 + i, task=i)``; without a task, ``reset(seed=<episode
  seed>)``. ``reset_kwargs`` are added to every reset; an in-process env gets only the
  arguments its ``reset`` takes (as OpenEnv's server does);
* snapshots: unsupported (an OpenEnv env's state is its own), so the engine refuses undo,
  reflection retries and branched groups before any episode starts;
* no scripted solver: the random legal player picks among ``valid_actions``.

An env that raises in ``step`` (in-process), or a server that answers an error, ends only
its own episode (``env_error``). The installed ``openenv-core`` ships no example
environments, so :func:`entries` lists none.
"""

from __future__ import annotations

import inspect
import json
import typing
from typing import Any
from urllib.parse import urlsplit

import httpx
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.serialization import deserialize_action, serialize_observation
from openenv.core.env_server.types import Action
from openenv.core.generic_client import GenericEnvClient
from pydantic import ValidationError

from agentgym.envs.base import BaseEnv, action_line
from agentgym.envs.suites import HELD_OUT_BASE, SPLITS, SuiteEntry, chance_seed, check_split
from agentgym.errors import EnvError, UnknownEnvError

__all__ = ["ACTION_FIELDS", "TEXT_FIELDS", "OpenEnvEnv", "entries", "listed_actions",
           "reply_action", "spec", "turn_text"]

#: The observation fields that hold the turn text, in order of precedence.
TEXT_FIELDS = ("text", "prompt", "message", "content", "observation")
#: The observation fields that list the actions meaningful now, in order of precedence.
ACTION_FIELDS = ("valid_actions", "legal_actions", "available_actions")
_URL_SCHEMES = ("http", "https")
#: The reply format's first line, as :func:`~agentgym.envs.base.action_line` writes it.
_REPLY_FORMAT = action_line("").strip().splitlines()[0]


# ------------------------------------------------------------------------ the rules
def turn_text(observation: dict[str, Any]) -> str:
    """The turn text of a serialized observation (see the module docs)."""
    for key in TEXT_FIELDS:
        if isinstance(observation.get(key), str):
            return observation[key]
    return json.dumps(observation, sort_keys=True, default=str)


def listed_actions(observation: dict[str, Any]) -> list[str]:
    """The actions a serialized observation lists as meaningful now ([]: none)."""
    for key in ACTION_FIELDS:
        if isinstance(observation.get(key), list):
            return [a if isinstance(a, str) else json.dumps(a) for a in observation[key]]
    return []


def _fields(schema: dict[str, Any]) -> dict[str, Any]:
    """The Action's fields (JSON schema properties) besides ``metadata``."""
    return {k: v for k, v in (schema.get("properties") or {}).items() if k != "metadata"}


def _text_field(schema: dict[str, Any]) -> str | None:
    """The Action's one field when it has exactly one, a string; else None."""
    fields = _fields(schema)
    if len(fields) == 1:
        (name, field), = fields.items()
        if field.get("type") == "string":
            return name
    return None


def reply_action(reply: str, schema: dict[str, Any], name: str) -> dict[str, Any]:
    """The action payload of ``reply`` under the Action's JSON ``schema`` (see the module
    docs); a reply that is not a JSON object where one is needed raises
    :class:`EnvError` naming ``name`` and the fields."""
    field = _text_field(schema)
    if field is not None:
        return {field: reply}
    try:
        payload = json.loads(reply)
    except ValueError:
        payload = None
    if not isinstance(payload, dict):
        raise EnvError(f"{name}: the reply must be a JSON object with the action's fields "
                       f"({', '.join(_fields(schema)) or 'none'}), got {reply[:80]!r}")
    return payload


def _instructions(description: str, schema: dict[str, Any]) -> str:
    """The system prompt: the env's description, then the reply format (see the module
    docs)."""
    if _text_field(schema) is not None:
        return description if _REPLY_FORMAT in description else \
            description + action_line("<your action>")
    example = json.dumps({k: f"<{v.get('type', 'value')}>" for k, v in _fields(schema).items()})
    return (f"{description}\nYour action is a JSON object with the fields "
            f"{', '.join(_fields(schema))}." + action_line(example))


# ----------------------------------------------------------- an env, in-process or served
def _environment_class(target: str, env_id: str) -> type[Environment]:
    """The ``Environment`` subclass ``module.path:Class`` names, with an Action model this
    adapter can tell; :class:`UnknownEnvError` naming ``env_id`` otherwise."""
    from agentgym.envs.registry import _resolve

    obj = _resolve(target, env_id)
    if not (inspect.isclass(obj) and issubclass(obj, Environment)):
        raise UnknownEnvError(f"env id {env_id!r}: {target} is not an OpenEnv Environment "
                              "subclass")
    _action_class(obj, env_id)
    return obj


def _action_class(cls: type[Environment], env_id: str) -> type[Action]:
    """The Action model ``cls`` steps with: its ``step``'s ``action`` annotation, else the
    first type argument of its ``Environment[Action, Observation, State]`` base."""
    try:
        hint = typing.get_type_hints(cls.step).get("action")
    except Exception:  # an annotation that does not resolve: try the generic base
        hint = None
    if inspect.isclass(hint) and issubclass(hint, Action) and hint is not Action:
        return hint
    for klass in cls.__mro__:
        for base in klass.__dict__.get("__orig_bases__", ()):
            for arg in typing.get_args(base):
                if inspect.isclass(arg) and issubclass(arg, Action) and arg is not Action:
                    return arg
    raise UnknownEnvError(f"env id {env_id!r}: cannot tell {cls.__name__}'s Action model: "
                          "annotate step(self, action: MyAction) or subclass "
                          "Environment[MyAction, MyObservation, State]")


class _InProcess:
    """An ``Environment`` built here; results as OpenEnv's server serializes them."""

    def __init__(self, cls: type[Environment], env_id: str, kwargs: dict[str, Any]):
        self.action = _action_class(cls, env_id)
        try:
            self.env = cls(**kwargs)
        except TypeError as e:  # a constructor argument it does not take
            raise ValueError(f"env_kwargs: {e}") from None
        self.schema = self.action.model_json_schema()
        self.description = self.env.get_metadata().description
        params = inspect.signature(self.env.reset).parameters.values()
        self._any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
        self._takes = {p.name for p in params}

    def reset(self, kwargs: dict[str, Any], name: str) -> dict[str, Any]:
        kwargs = {k: v for k, v in kwargs.items() if self._any or k in self._takes}
        return serialize_observation(self.env.reset(**kwargs))

    def step(self, payload: dict[str, Any], name: str) -> dict[str, Any]:
        try:
            action = deserialize_action(payload, self.action)
        except ValidationError as e:
            problems = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'action'}: {err['msg']}"
                                 for err in e.errors())
            raise EnvError(f"{name}: the reply does not fit {self.action.__name__} "
                           f"({problems})") from None
        return serialize_observation(self.env.step(action))

    def close(self) -> None:
        self.env.close()


class _Served:
    """A running OpenEnv server, one session of OpenEnv's own client."""

    def __init__(self, url: str, name: str):
        base = url.rstrip("/")
        self.client = GenericEnvClient(base_url=base).sync()
        try:
            self.schema = httpx.get(f"{base}/schema", timeout=30).raise_for_status() \
                .json()["action"]
            self.description = str(httpx.get(f"{base}/metadata", timeout=30)
                                   .raise_for_status().json().get("description") or "")
            self.client.connect()
        except Exception as e:
            self.client.close()
            raise EnvError(f"{name}: cannot use the OpenEnv server at {base} "
                           f"({' '.join(str(e).split())})") from None

    @staticmethod
    def _result(result: Any) -> dict[str, Any]:
        return {"observation": result.observation, "reward": result.reward,
                "done": result.done}

    def _call(self, name: str, fn, *args: Any, **kwargs: Any) -> dict[str, Any]:
        try:
            return self._result(fn(*args, **kwargs))
        except Exception as e:  # the server's refusal or a lost connection: one line
            raise EnvError(f"{name}: {' '.join(str(e).split())}") from None

    def reset(self, kwargs: dict[str, Any], name: str) -> dict[str, Any]:
        return self._call(name, self.client.reset, **kwargs)

    def step(self, payload: dict[str, Any], name: str) -> dict[str, Any]:
        return self._call(name, self.client.step, payload)

    def close(self) -> None:
        self.client.close()


class OpenEnvEnv(BaseEnv):
    """An OpenEnv environment, in-process or served, as a text env (see the module docs)."""

    splits = SPLITS
    held_out_split = "test"
    num_tasks = None
    tasks_doc = ("unbounded: task i is reset(seed=i, task=i) of split 'train'; split 'test' "
                 f"seeds from {HELD_OUT_BASE} + i")

    def __init__(self, target: str, split: str = "train",
                 env_kwargs: dict[str, Any] | None = None,
                 reset_kwargs: dict[str, Any] | None = None):
        self.name = f"openenv:{target}"
        self.split = check_split(split)
        self.reset_kwargs = dict(reset_kwargs or {})
        if urlsplit(target).scheme in _URL_SCHEMES:
            if env_kwargs:
                raise ValueError("env_kwargs: a served env is built by its server")
            self._link: Any = _Served(target, self.name)
        else:
            self._link = _InProcess(_environment_class(target, self.name), self.name,
                                    dict(env_kwargs or {}))
        self.instructions = _instructions(self._link.description, self._link.schema)
        self._actions: list[str] = []

    def reset(self, task: int | str | None = None, seed: int | None = None) -> str:
        kwargs = {**self.reset_kwargs,
                  "seed": chance_seed(self.name, self.split, task, 0 if seed is None else seed)}
        if task is not None:
            kwargs["task"] = task
        return self._turn(self._link.reset(kwargs, self.name))[0]

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        payload = reply_action(action, self._link.schema, self.name)
        return self._turn(self._link.step(payload, self.name))

    def _turn(self, result: dict[str, Any]) -> tuple[str, float, bool, dict[str, Any]]:
        observation = result.get("observation") or {}
        done = bool(result.get("done"))
        self._actions = [] if done else listed_actions(observation)
        info = {"truncated": True} if done and observation.get("truncated") is True else {}
        return turn_text(observation), float(result.get("reward") or 0.0), done, info

    def valid_actions(self) -> list[str]:
        return list(self._actions)

    def close(self) -> None:
        self._link.close()


# ------------------------------------------------------------------------------ registry
def spec(env_id: str, target: str):
    """The registry's spec of ``openenv:<module.path:Class>`` or ``openenv:<URL>`` (a URL is
    not reached until the env is built)."""
    from agentgym.envs.registry import EnvSpec

    parts = urlsplit(target)
    if parts.scheme in _URL_SCHEMES:
        if not parts.netloc:
            raise UnknownEnvError(f"env id {env_id!r}: the URL names no host")
        description = f"OpenEnv server at {target}"
    elif ":" in target and "/" not in target:
        cls = _environment_class(target, env_id)
        doc = (cls.__doc__ or "").strip().splitlines()
        description = f"OpenEnv {cls.__name__}" + (f": {doc[0].rstrip('.')}" if doc else "")
    else:
        raise UnknownEnvError(f"env id {env_id!r}: name an OpenEnv Environment class "
                              "(openenv:package.module:Class) or a server "
                              "(openenv:http://host:port)")
    return EnvSpec(env_id, OpenEnvEnv, {"target": target}, description, "python",
                   snapshots=False, images=False)


def entries() -> list[SuiteEntry]:
    """The Environment classes the installed OpenEnv ships as examples: none
    (``openenv-core`` 0.3.0 ships only the framework and a project template)."""
    return []
