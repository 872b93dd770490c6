"""AgentGym's env-server dialects: each family's endpoints, request bodies and reply shapes.

AgentGym's env servers (``agentenv-textcraft``, ``-babyai``, ``-sciworld``, ``-webshop``,
``-searchqa``) each spell the protocol their own way: the key naming the env (``id`` or
``env_idx``), what ``/create`` and ``/reset`` answer (a dict, a bare int, a string, a
``[str, null]`` pair), the step reply's fields (``observation`` or ``state``, with or without
``score``) and the family's extra GET routes. A :class:`Dialect` holds one family's routes as
functions of the :class:`~agentgym.serving.service.EnvService` and the request (the JSON body
of a POST, the query of a GET) returning the JSON value to answer; the server mounts them at
the root when it serves that family's dialect (``agentgym-rl serve-env ENV``, the default
protocol). :func:`env_family` says which env speaks which family (the env registry's
:func:`~agentgym.envs.registry.family`).

Where the dialects differ from AgentGym's servers on purpose: malformed requests, unknown ids
and closed envs get a 4xx status with ``{"error", "type"}`` (AgentGym answers 422 or 200 with
``{"error"}``); a step after the episode has ended answers 200 with the family's step fields,
``done: true``, reward 0 and :data:`FINISHED` as the observation (AgentGym's TextCraft,
WebShop and SearchQA servers step on, BabyAI and SciWorld answer 200 with an error); WebShop
also gets ``POST /close``; TextCraft's ``/create`` honours ``commands`` and ``goal`` and serves
``GET /commands`` and ``GET /goal``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agentgym.serving.service import EnvService, RequestError, json_type

#: The observation of a step sent after the episode has ended.
FINISHED = "The episode has finished; reset to start another."

Handler = Callable[[EnvService, Mapping[str, Any]], Awaitable[Any]]


@dataclass(frozen=True)
class Route:
    """One endpoint: ``handler(service, body_or_query)`` gives the JSON value to answer."""

    method: str
    path: str
    handler: Handler
    #: POST only: whether an empty body is read as ``{}`` (AgentGym's bodiless ``/create``).
    optional_body: bool = False


@dataclass(frozen=True)
class Dialect:
    """One AgentGym family's spelling of the env-server protocol."""

    family: str
    #: What ``GET /`` answers (AgentGym's own greeting string).
    hello: str
    routes: tuple[Route, ...]


def _finished(e: RequestError) -> bool:
    return e.kind == "EpisodeFinishedError"


async def _step(service: EnvService, body: Mapping[str, Any]) -> tuple[dict, Any]:
    """The generic step payload, or ``None`` when the episode had already ended; with the slot."""
    body = dict(body)
    try:
        payload = await service.step(body)
    except RequestError as e:
        if not _finished(e):
            raise
        payload = None
    _, slot = service.slot_for(body)
    return payload, slot


def _required(body: Mapping[str, Any], key: str) -> Any:
    if body.get(key) is None:
        raise RequestError(400, f"missing field {key!r}", "MissingField")
    return body[key]


def _optional_str(body: Mapping[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise RequestError(400, f"field {key!r} must be a string, got {json_type(value)}",
                           "WrongType")
    return value


async def _close(service: EnvService, body: Mapping[str, Any]) -> bool:
    try:
        return bool((await service.close(dict(body)))["closed"])
    except RequestError as e:
        if e.status == 404:
            return False  # never created: nothing to close, as AgentGym answers
        raise


async def _observation(service: EnvService, query: Mapping[str, Any]) -> str:
    return service.query_slot(query)[1].observation


# ------------------------------------------------------------------- TextCraft
_COMMANDS = re.compile(r"\ACrafting commands:\n(.*)\n\nGoal: craft (.*)\.\Z", re.DOTALL)


def textcraft_parts(observation: str) -> tuple[str, str]:
    """``(commands, goal item id)`` of a TextCraft reset observation
    (``Crafting commands:\\n<commands>\\n\\nGoal: craft <item>.``)."""
    m = _COMMANDS.match(observation)
    if m is None:
        raise RequestError(409, "this env's reset observation holds no crafting commands",
                           "NoCommands")
    return m.group(1), "minecraft:" + m.group(2).replace(" ", "_")


async def _tc_create(service: EnvService, body: Mapping[str, Any]) -> dict:
    goal, commands = _optional_str(body, "goal"), _optional_str(body, "commands")
    if goal is not None:
        spec = {"goal": goal} if commands is None else {"goal": goal, "commands": commands}
        task: Any = json.dumps(spec)
    elif commands is not None:
        raise RequestError(400, "'commands' needs a 'goal' (the item they craft)", "MissingField")
    else:
        task = service.next_id  # AgentGym's server resets a new env to data_idx = its id
    p = await service.create({"data_idx": task})
    return {"id": p["id"], "observation": p["observation"], "done": p["done"],
            "reward": p["reward"]}


async def _tc_reset(service: EnvService, body: Mapping[str, Any]) -> dict:
    body = dict(body)
    if body.get("data_idx") is None:
        body["data_idx"] = 0  # AgentGym's default
    p = await service.reset(body)
    return {"id": p["id"], "observation": p["observation"], "done": p["done"],
            "reward": p["reward"]}


async def _tc_step(service: EnvService, body: Mapping[str, Any]) -> dict:
    p, _ = await _step(service, body)
    if p is None:
        return {"observation": FINISHED, "reward": 0.0, "done": True}
    return {"observation": p["observation"], "reward": p["reward"], "done": p["done"]}


async def _tc_commands(service: EnvService, query: Mapping[str, Any]) -> str:
    return textcraft_parts(service.query_slot(query)[1].reset_observation)[0]


async def _tc_goal(service: EnvService, query: Mapping[str, Any]) -> str:
    return textcraft_parts(service.query_slot(query)[1].reset_observation)[1]


async def _tc_detail(service: EnvService, query: Mapping[str, Any]) -> dict:
    _, slot = service.query_slot(query)
    return {"observation": slot.observation, "done": slot.done, "reward": slot.reward,
            "deleted": False}


TEXTCRAFT = Dialect("textcraft", "This is environment TextCraft.", (
    Route("POST", "/create", _tc_create, optional_body=True),
    Route("POST", "/reset", _tc_reset),
    Route("POST", "/step", _tc_step),
    Route("GET", "/observation", _observation),
    Route("GET", "/commands", _tc_commands),
    Route("GET", "/goal", _tc_goal),
    Route("GET", "/detail", _tc_detail),
    Route("POST", "/close", _close),
))


# ---------------------------------------------------------------------- BabyAI
async def _id_create(service: EnvService, body: Mapping[str, Any]) -> dict:
    return {"id": (await service.create({}))["id"]}


async def _ba_reset(service: EnvService, body: Mapping[str, Any]) -> dict:
    _required(body, "data_idx")
    p = await service.reset(dict(body))
    return {"observation": p["observation"], "reward": p["reward"], "score": p["score"],
            "deleted": False, "done": p["done"]}


async def _ba_step(service: EnvService, body: Mapping[str, Any]) -> dict:
    p, slot = await _step(service, body)
    if p is None:
        return {"observation": FINISHED, "reward": 0.0, "score": slot.score, "done": True}
    return {"observation": p["observation"], "reward": p["reward"], "score": p["score"],
            "done": p["done"]}


async def _ba_observation(service: EnvService, query: Mapping[str, Any]) -> dict:
    _, slot = service.query_slot(query)
    obs = slot.observation
    goal = slot.reset_observation.split("\n", 1)[0]
    if goal.startswith("Your goal:") and not obs.startswith("Your goal:"):
        obs = f"{goal}\n{obs}"  # AgentGym's /observation always leads with the goal
    return {"observation": obs, "reward": slot.reward, "score": slot.score, "done": slot.done,
            "deleted": False}


BABYAI = Dialect("babyai", "This is environment BabyAI.", (
    Route("POST", "/create", _id_create, optional_body=True),
    Route("POST", "/reset", _ba_reset),
    Route("POST", "/step", _ba_step),
    Route("GET", "/observation", _ba_observation),
    Route("POST", "/close", _close),
))


# -------------------------------------------------------------------- SciWorld
def _points(x: float) -> int:
    """A reward or score in the simulator's 0-100 points (ours are points / 100)."""
    return int(round(100 * x))


def _base(env: Any) -> Any:
    """The env a Gymnasium adapter wraps (``BaseEnvAdapter.env``), else the env itself."""
    env = getattr(env, "unwrapped", env)
    return getattr(env, "env", env)


def _sw_state(slot: Any) -> dict:
    env = _base(slot.env)
    description, _, first = slot.reset_observation.partition("\n\n")
    return {"task_name": getattr(env, "task_name", None),
            "var_num": getattr(env, "variation", None), "task_description": description,
            "observation": first if slot.turns == 0 else slot.observation,
            "reward": _points(slot.reward), "score": _points(slot.score), "deleted": False,
            "done": slot.done}


async def _sw_reset(service: EnvService, body: Mapping[str, Any]) -> dict:
    _required(body, "data_idx")
    await service.reset(dict(body))
    return _sw_state(service.slot_for(body)[1])


async def _sw_step(service: EnvService, body: Mapping[str, Any]) -> dict:
    p, slot = await _step(service, body)
    if p is None:
        return {"observation": FINISHED, "reward": 0, "score": _points(slot.score),
                "done": True}
    return {"observation": p["observation"], "reward": _points(slot.reward),
            "score": _points(slot.score), "done": p["done"]}


async def _sw_observation(service: EnvService, query: Mapping[str, Any]) -> str:
    _, slot = service.query_slot(query)
    return _sw_state(slot)["observation"]


async def _sw_detail(service: EnvService, query: Mapping[str, Any]) -> dict:
    return _sw_state(service.query_slot(query)[1])


async def _sw_task_description(service: EnvService, query: Mapping[str, Any]) -> dict:
    return {"task_description": _sw_state(service.query_slot(query)[1])["task_description"]}


def _hint(env: Any) -> dict:
    return _base(env).action_hint()


def _goals(env: Any) -> dict:
    return {"goals": _base(env).goal_progress()}


async def _sw_action_hint(service: EnvService, query: Mapping[str, Any]) -> dict:
    return await service.run_on(service.query_slot(query)[1], _hint)


async def _sw_goals(service: EnvService, query: Mapping[str, Any]) -> dict:
    return await service.run_on(service.query_slot(query)[1], _goals)


SCIWORLD = Dialect("sciworld", "This is environment ScienceWorld.", (
    Route("POST", "/create", _id_create, optional_body=True),
    Route("POST", "/reset", _sw_reset),
    Route("POST", "/step", _sw_step),
    Route("GET", "/observation", _sw_observation),
    Route("GET", "/action_hint", _sw_action_hint),
    Route("GET", "/goals", _sw_goals),
    Route("GET", "/detail", _sw_detail),
    Route("GET", "/task_description", _sw_task_description),
    Route("POST", "/close", _close),
))


# --------------------------------------------------------------------- WebShop
async def _int_create(service: EnvService, body: Mapping[str, Any]) -> int:
    return (await service.create({}))["id"]


async def _ws_reset(service: EnvService, body: Mapping[str, Any]) -> list:
    p = await service.reset(dict(body))
    return [p["observation"], None]


async def _ws_step(service: EnvService, body: Mapping[str, Any]) -> dict:
    p, _ = await _step(service, body)
    if p is None:
        return {"state": FINISHED, "reward": 0.0, "done": True, "info": None}
    return {"state": p["observation"], "reward": p["reward"], "done": p["done"], "info": None}


async def _ws_available(service: EnvService, query: Mapping[str, Any]) -> dict:
    actions = await service.actions(service.query_slot(query)[1])
    search = any(a.startswith("search[") for a in actions)
    clicks = [a[len("click["):-1] for a in actions if a.startswith("click[") and a.endswith("]")]
    return {"has_search_bar": search, "clickables": (["search"] if search else []) + clicks}


def _instruction(slot: Any) -> str:
    for line in slot.reset_observation.splitlines():
        if line.startswith("Instruction:"):
            return line
    return ""


async def _ws_instruction(service: EnvService, query: Mapping[str, Any]) -> str:
    return _instruction(service.query_slot(query)[1])


async def _ws_state(service: EnvService, query: Mapping[str, Any]) -> dict:
    _, slot = service.query_slot(query)
    return {"url": "", "html": "", "instruction_text": _instruction(slot)}


async def _ws_list(service: EnvService, query: Mapping[str, Any]) -> list:
    return sorted(service.envs)


WEBSHOP = Dialect("webshop", "ok", (
    Route("POST", "/create", _int_create, optional_body=True),
    Route("POST", "/reset", _ws_reset),
    Route("POST", "/step", _ws_step),
    Route("GET", "/observation", _observation),
    Route("GET", "/available_actions", _ws_available),
    Route("GET", "/instruction_text", _ws_instruction),
    Route("GET", "/state", _ws_state),
    Route("GET", "/list_envs", _ws_list),
    Route("POST", "/close", _close),
))


# -------------------------------------------------------------------- SearchQA
_TAG = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)
SEARCHQA_INVALID = (
    "Your previous action is invalid. If you want to search, you should put the query between "
    "<search> and </search>. If you want to give the final answer, you should put the answer "
    "between <answer> and </answer>. Please try again.")
SEARCHQA_RIGHT = "Congratulations! You have answered the question correctly."
SEARCHQA_WRONG = "Sorry, your answer is incorrect. Please try again."
SEARCHQA_PROMPT = (
    "You must reason inside <think>...</think> first. If you do not have enough knowledge, "
    "issue a <search>...</search> and then STOP. Do not generate <information> or <answer> "
    "yet. Wait for external input wrapped in <information>...</information>. After receiving "
    "information, reason again in <think>. If confident, output your final answer in "
    "<answer>...</answer>. Do not output <answer> before receiving <information> unless you "
    "are fully confident. If you find no further external knowledge needed, you can directly "
    "provide the answer inside <answer> and </answer>, without detailed illustrations. For "
    "example, <answer> Beijing </answer>. Follow this process every time.\n\n Question: {}")


def searchqa_action(text: str) -> str | None:
    """The ``search`` env's action for a SearchQA reply (its first ``<search>q</search>`` or
    ``<answer>a</answer>``), or None when it has neither."""
    m = _TAG.search(text)
    return None if m is None else f"{m.group(1)}[{m.group(2).strip()}]"


def searchqa_prompt(reset_observation: str) -> str:
    """SearchQA's question prompt for the ``search`` env's reset observation."""
    question = reset_observation.split("\n", 1)[0].removeprefix("Question:")
    return SEARCHQA_PROMPT.format(question.strip())


async def _sq_create(service: EnvService, body: Mapping[str, Any]) -> int:
    return (await service.create({"data_idx": _required(body, "id")}))["id"]


async def _sq_reset(service: EnvService, body: Mapping[str, Any]) -> str:
    await service.reset(dict(body))
    return searchqa_prompt(service.slot_for(body)[1].reset_observation)


async def _sq_step(service: EnvService, body: Mapping[str, Any]) -> dict:
    action = _required(body, "action")
    if not isinstance(action, str):
        raise RequestError(400, f"field 'action' must be a string, got {json_type(action)}",
                           "WrongType")
    translated = searchqa_action(action)
    _, slot = service.slot_for(body)
    if translated is None:
        if slot.done:
            return {"observation": FINISHED, "reward": 0.0, "done": True, "info": None}
        return {"observation": SEARCHQA_INVALID, "reward": 0.0, "done": False, "info": None}
    p, slot = await _step(service, {**body, "action": translated})
    if p is None:
        return {"observation": FINISHED, "reward": 0.0, "done": True, "info": None}
    obs = p["observation"]
    if translated.startswith("answer["):
        obs = SEARCHQA_RIGHT if p["reward"] == 1.0 else SEARCHQA_WRONG
    elif not obs.startswith("Invalid action"):
        obs = f"<information>{obs}</information>"
    return {"observation": obs, "reward": p["reward"], "done": p["done"], "info": None}


async def _sq_observation(service: EnvService, query: Mapping[str, Any]) -> str:
    return searchqa_prompt(service.query_slot(query)[1].reset_observation)


SEARCHQA = Dialect("searchqa", "ok", (
    Route("POST", "/create", _sq_create),
    Route("POST", "/reset", _sq_reset),
    Route("POST", "/step", _sq_step),
    Route("GET", "/observation", _sq_observation),
    Route("POST", "/close", _close),
))

#: The dialects by AgentGym family.
DIALECTS: dict[str, Dialect] = {d.family: d for d in (TEXTCRAFT, BABYAI, SCIWORLD, WEBSHOP,
                                                       SEARCHQA)}


def env_family(env_id: str) -> str | None:
    """The AgentGym family whose dialect ``serve-env`` speaks for ``env_id``: its family in
    the env registry (:func:`agentgym.envs.registry.family`) where a dialect of it exists."""
    from agentgym.envs.registry import family
    from agentgym.errors import UnknownEnvError

    try:
        name = family(env_id)
    except UnknownEnvError:
        return None
    return name if name in DIALECTS else None


def dialect_for(env_id: str, protocol: str = "agentgym") -> Dialect | None:
    """The dialect to serve ``env_id`` in: None for the generic protocol.

    ``protocol`` is ``"generic"``, ``"agentgym"`` (the env's own family, generic for an env
    without one) or a family name of :data:`DIALECTS`.
    """
    if protocol == "generic":
        return None
    if protocol == "agentgym":
        family = env_family(env_id)
        return None if family is None else DIALECTS[family]
    if protocol in DIALECTS:
        return DIALECTS[protocol]
    raise ValueError(f"protocol must be 'generic', 'agentgym' or one of {sorted(DIALECTS)}, "
                     f"got {protocol!r}")


__all__ = ["DIALECTS", "FINISHED", "Dialect", "Route", "dialect_for", "env_family",
           "searchqa_action", "searchqa_prompt", "textcraft_parts"]
