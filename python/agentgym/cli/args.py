"""What every ``agentgym-rl`` subcommand shares about its arguments: the parser class (a
mistake is one line, exit 2), the help formatter (each option's default shown), the
validated argument types (``type=`` of ``add_argument``: a bad value is refused while
parsing, naming its flag) and the checks that need more than one value (a model folder,
a task list against the env's task count).

A value refused here never reaches a job: nothing is written, no model is loaded.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

__all__ = [
    "Parser",
    "HelpFormatter",
    "check_model",
    "check_tasks",
    "folder",
    "key_value",
    "nonneg_float",
    "nonneg_int",
    "port",
    "positive_float",
    "positive_int",
    "probability",
    "task_indices",
    "format_tasks",
]


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line on stderr,
    ``agentgym-rl <command>: error: <message>``, exit status 2 (no usage block: ``--help``
    has it)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())}\n")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and epilogs as written (the examples), and each option's default at the
    end of its help: ``(default: 1000)``. Nothing is added for an option without a default
    (None), a switch that is off unless given, or a help that names its default already."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if ("%(default)" in text or "default" in text.lower()
                or default is None or default is argparse.SUPPRESS
                or default is False or default == [] or not action.option_strings):
            return text
        return f"{text} (default: %(default)s)" if text else "(default: %(default)s)"

    def _format_action(self, action: argparse.Action) -> str:
        # argparse shows no help line for an option without help: give it the default
        if not action.help and action.option_strings:
            shown = self._get_help_string(action)
            if shown:
                action.help = shown
        return super()._format_action(action)


# -- numbers -------------------------------------------------------------------------------

def _number(cast: Callable[[str], Any], what: str, ok: Callable[[Any], bool],
            rule: str) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = cast(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"must be {rule}, got {text}")
        return value

    parse.__name__ = f"{what.replace(' ', '_')}"
    return parse


#: An integer >= 1 (a count: samples, turns, tokens, workers).
positive_int = _number(int, "an integer", lambda v: v >= 1, ">= 1")
#: An integer >= 0 (an offset, a seed, a count that may be none).
nonneg_int = _number(int, "an integer", lambda v: v >= 0, ">= 0")
#: A number > 0 (seconds).
positive_float = _number(float, "a number", lambda v: v > 0 and v == v, "> 0")
#: A number >= 0 (a temperature).
nonneg_float = _number(float, "a number", lambda v: v >= 0 and v == v, ">= 0")
#: A number in (0, 1] (top-p).
probability = _number(float, "a number", lambda v: 0 < v <= 1, "in (0, 1]")
#: A TCP port (0: any free one).
port = _number(int, "a port number", lambda v: 0 <= v <= 65535, "in 0..65535")


def key_value(text: str) -> str:
    """``KEY=VALUE`` (the value is read as JSON later, :func:`~agentgym.cli.key_values.
    parse_key_values`); the item unchanged."""
    key, sep, _ = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return text


def folder(text: str) -> str:
    """A folder to write: a new path or an existing folder, not an existing file (nor a path
    under one)."""
    p = Path(text).expanduser()
    if p.exists() and not p.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is an existing file; expected a folder "
                                         "(a new path, or a folder)")
    for parent in p.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise argparse.ArgumentTypeError(f"{text}: {parent} is a file, so no folder "
                                                 "can be made under it")
            break
    return text


# -- task lists ----------------------------------------------------------------------------

def task_indices(text: str) -> range | list[int]:
    """``START:STOP[:STEP]`` (a non-empty range of indices >= 0, step >= 1) or ``i,j,k``
    (indices >= 0)."""
    spec = text.strip()
    form = "START:STOP[:STEP] or i,j,k (task indices >= 0)"
    if ":" in spec:
        try:
            parts = [int(x) for x in spec.split(":")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: expected {form}") from None
        if len(parts) not in (2, 3):
            raise argparse.ArgumentTypeError(f"{text!r}: expected {form}")
        start, stop, step = (*parts, 1) if len(parts) == 2 else parts
        if start < 0:
            raise argparse.ArgumentTypeError(f"{text!r}: START must be >= 0, got {start}")
        if step < 1:
            raise argparse.ArgumentTypeError(f"{text!r}: STEP must be >= 1, got {step}")
        if stop <= start:
            raise argparse.ArgumentTypeError(f"{text!r}: no tasks (STOP must be greater than "
                                             f"START {start})")
        return range(start, stop, step)
    try:
        out = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected {form}") from None
    if not out:
        raise argparse.ArgumentTypeError(f"{text!r}: no tasks; expected {form}")
    if min(out) < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: task indices must be >= 0, got "
                                         f"{min(out)}")
    return out


def format_tasks(tasks: Sequence[int | str]) -> str:
    """A task list as a user writes it: ``0:544``, ``10:20:5``, ``3,5,9``."""
    if isinstance(tasks, range):
        step = "" if tasks.step == 1 else f":{tasks.step}"
        return f"{tasks.start}:{tasks.stop}{step}"
    shown = ",".join(str(t) for t in list(tasks)[:8])
    return shown + (",..." if len(tasks) > 8 else "")


def check_tasks(env_id: str, env_kwargs: dict[str, Any], tasks: Sequence[int | str],
                flag: str = "--tasks") -> None:
    """Refuse task indices the env does not have under ``env_kwargs`` (a
    :class:`~agentgym.errors.ConfigError` naming ``flag``, the env's task count and its
    kwargs); task texts are the env's to judge. An unknown env id raises
    :class:`~agentgym.errors.UnknownEnvError`; kwargs the env refuses a ``ConfigError``
    naming ``--env-kwarg``."""
    from agentgym.collection.collector import check_tasks as check

    check(env_id, env_kwargs, tasks, what=flag, kwargs_what="--env-kwarg")


# -- models --------------------------------------------------------------------------------

#: A Hugging Face hub id: ``name`` or ``namespace/name``.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")


def check_model(model: str | None, flag: str = "--model") -> None:
    """Refuse a ``--model`` that is neither an existing path, a named model (``tiny``,
    :data:`~agentgym.models.names.NAMED_MODELS`) nor shaped like a Hugging Face hub id
    (``/nonexistent/model``, ``./typo``, ``a/b/c``): a
    :class:`~agentgym.errors.ModelNotFoundError` saying the path does not exist. A hub id
    is left to the loader (it may be on the hub)."""
    from agentgym.errors import ModelNotFoundError
    from agentgym.models.names import NAMED_MODELS

    if model is None or model == "tiny" or model in NAMED_MODELS:
        return
    if Path(model).expanduser().exists():
        return
    if _HUB_ID.match(model) and ".." not in model and "--" not in model \
            and not model.startswith(("~", ".")):
        return
    named = ", ".join(["tiny", *NAMED_MODELS])
    raise ModelNotFoundError(f"{flag} {model}: no such file or folder (expected a model "
                             f"folder, a Hugging Face hub id, or one of: {named})")


def hub_error(model: str, error: BaseException, flag: str = "--model"):
    """The :class:`~agentgym.errors.ModelNotFoundError` for a ``--model`` that is not a
    local path and that the Hugging Face loader could not get (``error``)."""
    from agentgym.errors import ModelNotFoundError

    why = " ".join(str(error).split())
    return ModelNotFoundError(f"{flag} {model}: not a local folder, and not loadable as a "
                              f"Hugging Face hub id ({why[:200]})")


def is_local(model: str | None) -> bool:
    """Whether ``model`` is the tiny model, a named model or an existing path."""
    from agentgym.models.names import NAMED_MODELS

    return model is None or model == "tiny" or model in NAMED_MODELS or \
        os.path.exists(os.path.expanduser(model))


def say(command: str, message: str) -> None:
    """One line on stderr: ``agentgym-rl <command>: <message>``."""
    print(f"agentgym-rl {command}: {' '.join(message.split())}", file=sys.stderr, flush=True)


# -- backends and rollout settings -----------------------------------------------------------

#: backend name -> (module, class, positional arguments ``make_backend`` passes first)
_BACKENDS = {
    "scripted": ("agentgym.backends.scripted", "ScriptedBackend", 1),
    "transformers": ("agentgym.backends.transformers_backend", "TransformersBackend", 1),
    "vllm": ("agentgym.backends.vllm_backend", "VLLMBackend", 1),
    "openai": ("agentgym.backends.openai_backend", "OpenAIBackend", 0),
}


def check_backend_kwargs(backend: str, kwargs: dict[str, Any],
                         flag: str = "--backend-kwarg") -> None:
    """Refuse a backend argument the backend's constructor does not take (a
    :class:`~agentgym.errors.ConfigError` naming ``flag`` and the key), before any model is
    loaded."""
    import importlib
    import inspect

    from agentgym.errors import ConfigError

    if backend not in _BACKENDS:
        return
    module, name, positional = _BACKENDS[backend]
    cls = getattr(importlib.import_module(module), name)
    params = inspect.signature(cls.__init__).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return
    names = [n for n, p in list(params.items())[1 + positional:]
             if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    unknown = sorted(k for k in kwargs if k not in names and k != "tokenizer")
    if unknown:
        raise ConfigError(f"{flag} {unknown[0]}: the {backend} backend takes no argument "
                          f"{unknown[0]!r} (it takes: {', '.join(names)})")


#: RolloutConfig field -> the flag that sets it (for messages).
ROLLOUT_FLAGS = {
    "max_turns": "--max-turns", "max_new_tokens": "--max-new-tokens",
    "max_total_tokens": "--max-total-tokens", "temperature": "--temperature",
    "top_p": "--top-p", "seed": "--seed", "system_prompt": "--system-prompt",
    "max_concurrency": "--max-concurrency", "env_workers": "--env-workers",
    "opponent": "--opponent", "max_undos": "--undo", "reflection": "--reflection",
    "branch_at": "--branch-at", "branch_width": "--branch-width",
    "replan_every": "--plan", "context_window": "--context-window",
}


def rollout_settings(rollout: dict[str, Any]) -> dict[str, Any]:
    """``rollout`` (RolloutConfig fields the user set) checked by building the config: a
    value it refuses is a :class:`~agentgym.errors.ConfigError` naming the field and its
    flag. Returns ``rollout``."""
    import msgspec

    from agentgym.engine.config import RolloutConfig
    from agentgym.errors import ConfigError

    try:
        RolloutConfig(**rollout)
    except (ValueError, TypeError, msgspec.ValidationError) as e:
        why = " ".join(str(e).split())
        flags = [f"{flag} ({field})" for field, flag in ROLLOUT_FLAGS.items()
                 if field in rollout and field in why]
        raise ConfigError(f"{', '.join(flags) or 'rollout settings'}: {why}") from e
    return dict(rollout)
