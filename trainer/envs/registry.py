"""Where `env.name` finds an environment: built in, installed by pip, or named by `module:factory`.

`env.name` is looked up in this order:

1. a name registered in this process with `register(name, factory)`;
2. a built-in environment: the package `rwcore.trainer.envs.<name>` (`negotiation`, `tools`, `social`,
   `textarena`, `sotopia`, `verifiers`), imported on first use, which registers itself;
3. an entry point of the group `rwcore.environments` (`ENTRY_POINT_GROUP`) of an installed distribution: a
   package declares `[project.entry-points."rwcore.environments"] my_env = "my_pkg.envs:make_env"` in its
   pyproject.toml, and `env.name=my_env` builds `my_pkg.envs.make_env(**env.options)` once it is pip-installed;
4. `module:factory` (`env.name=my_pkg.envs:make_env`): the callable `factory` (a dotted attribute path) of an
   importable module - an installed package, or a folder the user put on PYTHONPATH.

Whichever way, the factory is called with `env.options` as keyword arguments (an option it does not take is
refused naming it) and returns the environment (the protocol of rwcore.trainer.envs.base). A name found nowhere
is refused with one line that lists every environment there is: the built-in ones (listed without importing
them, so an optional dependency that is missing hides none) and the installed entry points. Code is only
imported from this Python's path; `check_outside(name, folder)` refuses, before importing anything, a module
that would be loaded from inside a run folder (a folder someone else may have sent).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import inspect
import os
import pkgutil
import re
from collections.abc import Callable
from pathlib import Path

__all__ = [
    "ENTRY_POINT_GROUP",
    "builtin_names",
    "check_outside",
    "installed",
    "load_named",
    "make",
    "register",
    "resolve",
]

ENTRY_POINT_GROUP = "rwcore.environments"
BUILTIN_PACKAGE = "rwcore.trainer.envs"
_DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")

_REGISTRY: dict[str, Callable] = {}


def register(name: str, factory: Callable) -> None:
    """Makes `env.name=<name>` in a config build the environment with `factory(**env.options)` (in this process)."""
    _REGISTRY[name] = factory


def builtin_names() -> list[str]:
    """The built-in environments: the packages inside rwcore.trainer.envs, found without importing them."""
    here = Path(__file__).resolve().parent
    return sorted(info.name for info in pkgutil.iter_modules([str(here)]) if info.ispkg)


def installed() -> dict[str, list[importlib.metadata.EntryPoint]]:
    """The entry points of the group `rwcore.environments` of every installed distribution, by name (a name
    two distributions declare has two)."""
    found: dict[str, list[importlib.metadata.EntryPoint]] = {}
    seen = set()
    for point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = _dist_label(point)
        if (point.name, point.value, dist) in seen:  # one distribution found twice on the path
            continue
        seen.add((point.name, point.value, dist))
        found.setdefault(point.name, []).append(point)
    return found


def _dist_label(point: importlib.metadata.EntryPoint) -> str:
    dist = getattr(point, "dist", None)
    return f"{dist.name} {dist.version}" if dist is not None else "unknown distribution"


def _unknown(name: str) -> ValueError:
    builtins = sorted(set(builtin_names()) | set(_REGISTRY))
    points = installed()
    listed = ", ".join(f"{key} ({', '.join(_dist_label(p) for p in points[key])})" for key in sorted(points))
    return ValueError(
        f"env.name {name!r} is not an environment; built-in: {', '.join(builtins)}; installed (entry points "
        f"{ENTRY_POINT_GROUP}): {listed or 'none'}; or name a factory as module:function "
        "(env.name=my_pkg.envs:make_env, the module importable from this Python's path)"
    )


def _import(label: str, module: str):
    """`module` imported for the setting `label`; ValueError starting with `label`, naming what is missing, when
    it cannot be imported."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        parts = module.split(".")
        if error.name in {".".join(parts[: i + 1]) for i in range(len(parts))}:
            raise ValueError(
                f"{label}: cannot import module {module!r}: no module named {error.name!r} on this Python's path "
                "(install its package, or add the folder that holds it to PYTHONPATH)"
            ) from None
        raise ValueError(f"{label}: its module needs {error.name!r}, which is not installed ({error})") from None
    except Exception as error:  # the module itself raised while importing
        raise ValueError(f"{label}: importing module {module!r} raised {type(error).__name__}: {error}") from None


def load_named(spec, label: str, what: str = "function") -> tuple[Callable, object]:
    """The callable `spec` ("module:attr.path", dotted names) names, and its module, imported from this Python's
    path. `label` starts every ValueError (the setting that named it, e.g. "env.name 'x:y'"); `what` is the kind
    of callable the message asks for ("factory", "function")."""
    module_name, sep, attribute = spec.partition(":") if isinstance(spec, str) else ("", "", "")
    if not sep or not _DOTTED.fullmatch(module_name) or not _DOTTED.fullmatch(attribute):
        raise ValueError(
            f"{label}: name the {what} as 'module:{what}' (dotted names, e.g. my_pkg.envs:make_env), got {spec!r}"
        )
    module = _import(label, module_name)
    target = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise ValueError(f"{label}: module {module_name!r} has no attribute {attribute!r}")
        target = getattr(target, part)
    if not callable(target):
        raise ValueError(f"{label}: {attribute!r} is a {type(target).__name__}, not a {what}")
    return target, module


def _entry_point(name: str) -> importlib.metadata.EntryPoint | None:
    points = installed().get(name, [])
    if len(points) > 1:
        raise ValueError(
            f"env.name {name!r}: two installed distributions declare it in {ENTRY_POINT_GROUP} "
            f"({'; '.join(f'{_dist_label(p)}: {p.value}' for p in points)}); uninstall one, or name the factory "
            "as module:function"
        )
    return points[0] if points else None


def resolve(name: str) -> Callable:
    """The factory `env.name=name` builds its environment with (see the module docstring for the order)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"env.name must be a non-empty string, got {name!r}")
    if ":" in name:
        return load_named(name, f"env.name {name!r}", "factory")[0]
    if name in _REGISTRY:
        return _REGISTRY[name]
    if name.isidentifier() and name in builtin_names():
        _import(f"env.name {name!r}", f"{BUILTIN_PACKAGE}.{name}")  # registers itself
        if name in _REGISTRY:
            return _REGISTRY[name]
    point = _entry_point(name)
    if point is not None:
        return load_named(point.value, f"env.name {name!r}", "factory")[0]
    raise _unknown(name)


def source_spec(name: str) -> str | None:
    """The top-level module `env.name=name` imports code from, when it is not rwcore's (None otherwise)."""
    if ":" in name:
        return name.partition(":")[0].split(".")[0] or None
    if name in _REGISTRY or name in builtin_names():
        return None
    point = _entry_point(name)
    return point.value.partition(":")[0].split(".")[0] if point is not None else None


def check_outside(name: str, folder: str | os.PathLike) -> None:
    """Refuses, before importing anything, an environment module that would be loaded from inside `folder` (a run
    folder: rw never runs code that came with one). `find_spec` of a top-level name only locates it."""
    top = source_spec(name)
    if top is None:
        return
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return  # resolve() names what is missing
    if spec is None:
        return
    places = [spec.origin] if spec.origin else []
    places += list(spec.submodule_search_locations or [])
    run = Path(folder).resolve()
    for place in places:
        path = Path(place).resolve()
        if path == run or run in path.parents:
            raise ValueError(
                f"env.name {name!r}: module {top!r} would be imported from {str(path)!r}, inside the run folder "
                f"{str(folder)!r}; rw never runs code found in a run folder: install the package or put its folder "
                "on PYTHONPATH outside the run"
            )


def make(name: str, **options):
    """The environment `env.name=name` names, built with `factory(**options)` (see the module docstring)."""
    factory = resolve(name)
    _check_options(name, factory, options)
    return factory(**options)


def _check_options(name: str, factory: Callable, options: dict) -> None:
    """Refuses an option the factory does not take, naming it and those it does (before anything is built:
    Python's own TypeError would name neither the config key nor the choices)."""
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return
    known = [
        p.name
        for p in parameters
        if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    unknown = [key for key in options if key not in known]
    if unknown:
        raise ValueError(
            f"config key 'env.options.{unknown[0]}': env.name {name!r} has no option {unknown[0]!r}; "
            f"its options: {', '.join(known) or 'none'}"
        )
