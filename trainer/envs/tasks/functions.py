"""The user's functions of `env.name=tasks`: the outcome function (`env.options.reward`) and the rubrics'
checks, each named `module:function` and imported from an installed package or a module on the PYTHONPATH the
user set (never from a run folder).

A function is called with keyword arguments, and only with those its signature names (a `**kwargs` parameter
takes them all):

    completion: str          the agent's reply (its last message)
    messages: list[dict]     the conversation as chat messages {"role", "content"}: the task's opening, then the
                             reply (the system prompt left out: under Arise it carries training-only skills)
    metadata: dict           the task row's `metadata` (a copy)
    task_id: str             the row's id
    tags: list[str]          the row's tags

A reward returns a number in [0, 1] (a bool counts as 1.0 / 0.0), or a pair (reward, success). A check returns
True (pass), False (fail) or None (does not apply). Anything else, or an exception, stops the run with a
`UserFunctionError` naming the function and the task: a broken reward is a bug to fix, and a silent 0 would
train on it.
"""

from __future__ import annotations

import hashlib
import inspect
import math
from collections.abc import Callable, Mapping
from pathlib import Path

from rwcore.trainer.envs.registry import load_named

ARGUMENTS = ("completion", "messages", "metadata", "task_id", "tags")


class UserFunctionError(RuntimeError):
    """A user's reward or check function raised or returned something it may not (the message names the
    function, the task and its row); `rw train` stops with it as one error."""


class UserFunction:
    """`module:function` imported and checked; `call(**arguments)` passes the ones its signature takes.

    option: the config key that named it (for errors), e.g. "env.options.reward"."""

    def __init__(self, spec: str, option: str) -> None:
        self.spec, self.option = spec, option
        function, module = load_named(spec, f"{option} {spec!r}" if spec else option)
        self.module_name = module.__name__
        self.function: Callable = function
        self.source = _source_file(module)
        self.takes = self._arguments(function)

    def _arguments(self, function: Callable) -> tuple[str, ...]:
        try:
            parameters = list(inspect.signature(function).parameters.values())
        except (TypeError, ValueError):
            return ARGUMENTS
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
            return ARGUMENTS
        takes = []
        for p in parameters:
            if p.kind is inspect.Parameter.VAR_POSITIONAL:
                continue
            if p.name in ARGUMENTS and p.kind is not inspect.Parameter.POSITIONAL_ONLY:
                takes.append(p.name)
            elif p.default is inspect.Parameter.empty:
                raise ValueError(
                    f"{self.option} {self.spec!r}: its parameter {p.name!r} is not one rwcore passes; it may take "
                    f"any of {', '.join(ARGUMENTS)} (by these names)"
                )
        if not takes:
            raise ValueError(
                f"{self.option} {self.spec!r}: takes none of {', '.join(ARGUMENTS)}; it needs at least the "
                "completion to score"
            )
        return tuple(takes)

    def call(self, where: str, arguments: Mapping):
        """The function's result on `arguments`; UserFunctionError (naming `where`: the task and its row) when
        it raises."""
        try:
            return self.function(**{name: arguments[name] for name in self.takes})
        except Exception as error:
            raise UserFunctionError(
                f"{self.option} {self.spec!r} raised {type(error).__name__} on {where}: {error}"
            ) from error

    def digest(self) -> str:
        """sha256 of the module's source file ("" when it has none, e.g. a compiled module)."""
        return file_digest(self.source) if self.source else ""


def reward_value(value, function: UserFunction, where: str, threshold: float) -> tuple[float, bool]:
    """(reward in [0, 1], success) from a reward's return value: a number (success when >= threshold), a bool,
    or a pair (reward, success); UserFunctionError for anything else."""
    success = None
    if isinstance(value, tuple) and len(value) == 2:
        value, success = value
        if not isinstance(success, bool) and type(success).__name__ != "bool_":
            raise UserFunctionError(
                f"{function.option} {function.spec!r} returned success {success!r} on {where}; the pair is "
                "(reward, success) with success a bool"
            )
        success = bool(success)
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        reward = 1.0 if value else 0.0
    else:
        try:
            reward = float(value)
        except (TypeError, ValueError):
            reward = math.nan
        if isinstance(value, (str, bytes)) or not math.isfinite(reward):
            raise UserFunctionError(
                f"{function.option} {function.spec!r} returned {value!r} ({type(value).__name__}) on {where}; a "
                "reward is a number in [0, 1], a bool, or a pair (reward, success)"
            )
    if not 0.0 <= reward <= 1.0:
        raise UserFunctionError(
            f"{function.option} {function.spec!r} returned {reward!r} on {where}; a reward lies in [0, 1]"
        )
    return reward, (reward >= threshold if success is None else success)


def check_value(value, function: UserFunction, where: str) -> bool | None:
    """A check's verdict: True / False / None; UserFunctionError for anything else."""
    if value is None or isinstance(value, bool):
        return value
    if type(value).__name__ == "bool_":
        return bool(value)
    raise UserFunctionError(
        f"{function.option} {function.spec!r} returned {value!r} ({type(value).__name__}) on {where}; a check "
        "returns True, False or None (does not apply)"
    )


def file_digest(path: str | Path) -> str:
    """sha256 (hex) of a file's bytes: what provenance() records of the task files, rubrics and modules."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _source_file(module) -> Path | None:
    try:
        name = inspect.getsourcefile(module) or getattr(module, "__file__", None)
    except TypeError:
        name = getattr(module, "__file__", None)
    if not name:
        return None
    path = Path(name).resolve()
    return path if path.is_file() else None
