"""The task-sampler registry: `train.method`'s sampler component names one of these.

    @register_sampler("my_sampler", "one line for `rw variants`")
    def build(tasks: dict[str, list[str]], settings: MethodSettings):
        return MySampler(tasks, batch_size=settings.batch_size, group_size=settings.group_size, seed=settings.seed)

A sampler has the interface of `rwcore.tasks.TaskSamplerBase`: `sample(version)`,
`record_group(task_id, verdicts, version, outcomes=...)`, `rubrics` / `set_rubrics`, `task_ids`,
`state_dict` / `load_state_dict` (verl's `register_adv_est` style: the name is the registry key).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["SamplerEntry", "build_sampler", "register_sampler", "sampler_names"]


@dataclass(frozen=True)
class SamplerEntry:
    name: str
    build: Callable
    description: str


_SAMPLERS: dict[str, SamplerEntry] = {}


def register_sampler(name: str, description: str = "") -> Callable:
    """Decorator: registers `build(tasks, settings) -> sampler` under `name` (ValueError if taken)."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"sampler name must be an identifier, got {name!r}")

    def decorator(build: Callable) -> Callable:
        if name in _SAMPLERS:
            raise ValueError(f"a sampler named {name!r} is already registered")
        _SAMPLERS[name] = SamplerEntry(name, build, description)
        return build

    return decorator


def sampler_names() -> tuple[str, ...]:
    return tuple(_SAMPLERS)


def build_sampler(name: str, tasks: Mapping[str, Sequence[str]], settings) -> object:
    """The sampler `name` over `tasks` (task id -> task-type tags) with the method's settings."""
    if name not in _SAMPLERS:
        raise ValueError(f"sampler must be one of {sampler_names()}, got {name!r}")
    return _SAMPLERS[name].build({task_id: list(tags) for task_id, tags in tasks.items()}, settings)


def _common(settings) -> dict:
    return dict(
        batch_size=settings.batch_size,
        group_size=settings.group_size,
        seed=settings.seed,
        capabilities=settings.capabilities,
    )


@register_sampler("capability", "Arise §3.2.2: weight p(1-p)^2 per (task type, capability), with a quota")
def _capability(tasks, settings):
    from rwcore.arise.sampler import CapabilitySampler

    return CapabilitySampler(
        tasks,
        rho_min=settings.rho_min,
        quota_fraction=settings.quota_fraction,
        gamma_obs=settings.gamma_obs,
        gamma_unobs=settings.gamma_unobs,
        **_common(settings),
    )


@register_sampler("outcome", "VADE-style: tasks weighted by their outcome variance")
def _outcome(tasks, settings):
    from rwcore.sampling.baselines import OutcomeSampler

    return OutcomeSampler(tasks, gamma_obs=settings.gamma_obs, gamma_unobs=settings.gamma_unobs, **_common(settings))


@register_sampler("uniform", "every task equally likely")
def _uniform(tasks, settings):
    from rwcore.sampling.baselines import UniformSampler

    return UniformSampler(tasks, **_common(settings))
