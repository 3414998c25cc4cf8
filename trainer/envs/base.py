"""The environment protocol: what `rw train` needs from a task family.

An environment supplies seeded tasks with disjoint train and held-out splits,
runs multi-turn episodes against its own counterpart (a scripted partner, a
tool sandbox...), scores outcomes, and brings the programmatic pieces the
adaptive methods need when no LLM is configured: a rubric library with rules
(a RuleJudge), a reflector for Arise's pool, an attributor for RewardWeaver,
and labelled cases for admitting capabilities. Users add their own
environments by implementing this protocol and registering a factory with
`rwcore.trainer.envs.register`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from rwcore.types import Attributor, RubricReflector, RubricSpec, Trajectory


@dataclass(frozen=True)
class Task:
    """One task instance.

    task_id: unique within the environment; tags: task-type tags (sampler pairs).
    data: the instance's parameters, private information of both sides included
        (JSON-serializable); the agent only sees what `Episode.observation` shows.
    """

    task_id: str
    tags: tuple[str, ...]
    data: dict = field(default_factory=dict)


@dataclass
class Episode:
    """A running episode: the text the agent sees next, and whether it is over.

    observation: the counterpart's latest message (the first one is the task brief).
    done: no more agent turns.
    state: environment-private state (JSON-serializable), e.g. partner's budget, offers so far.
    """

    task: Task
    observation: str
    done: bool = False
    state: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Outcome:
    """How an episode ended: reward in [0, 1], success (what success rates count), and why."""

    reward: float
    success: bool
    reason: str = ""


@dataclass(frozen=True)
class Rule:
    """A programmatic rubric: its spec (capability = Arise category, spec.capability),
    RewardWeaver family, and the check (see rwcore.judges.RuleJudge for the return values)."""

    spec: RubricSpec
    family: str
    check: Callable[[Trajectory], object]


@runtime_checkable
class Environment(Protocol):
    name: str
    system_prompt: str   # the policy's base system prompt (Arise skills are appended to it)
    max_turns: int       # agent turns per episode at most

    def tasks(self, split: str) -> list[Task]:
        """Tasks of split "train" or "eval" (disjoint, seeded, same every call)."""

    def reset(self, task: Task, seed: int) -> Episode:
        """A new episode of `task`; `seed` drives any randomness of the counterpart."""

    def step(self, episode: Episode, action: str) -> Episode:
        """Applies the agent's message; returns the episode with the counterpart's reply."""

    def outcome(self, episode: Episode) -> Outcome:
        """The finished episode's outcome."""

    def vocabulary(self) -> list[str]:
        """Every word the environment's language uses (prompts, observations, actions, skill texts),
        for building the default policy's word-level tokenizer."""

    def rules(self) -> list[Rule]:
        """The capability rubric library as programmatic checks over trajectories."""

    def reflector(self) -> RubricReflector:
        """Arise reflection without an LLM (proposes rubric-skill pairs from `rules`, refines skills)."""

    def attributor(self) -> Attributor:
        """RewardWeaver failure attribution without an LLM (knows partner/scenario causes)."""

    def labelled_cases(self, rule_ids: Sequence[str]) -> list:
        """rwcore.rewardweaver.LabelledCase examples (scripted trajectories with reference labels and
        source ids) for admitting each rule as a capability."""


_REGISTRY: dict[str, Callable[..., Environment]] = {}


def register(name: str, factory: Callable[..., Environment]) -> None:
    """Makes `env.name=<name>` in a config build the environment with `factory(**env.options)`."""
    _REGISTRY[name] = factory


def make(name: str, **options) -> Environment:
    if name not in _REGISTRY:
        raise ValueError(f"env.name {name!r} is not a registered environment; known: {sorted(_REGISTRY)}")
    return _REGISTRY[name](**options)
