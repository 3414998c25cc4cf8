"""The environment protocol: what `rw train` needs from a task family.

Simulator and optional providers
--------------------------------
An environment is a *simulator*; that is all `rw train` requires:

    name, system_prompt, max_turns       attributes
    tasks(split) -> list[Task]           "train" / "eval": disjoint, seeded, each Task with task-type tags
    reset(task, seed) -> Episode         a new episode (its first observation is the task brief)
    step(episode, action) -> Episode     the counterpart's reply to the agent's message
    outcome(episode) -> Outcome          reward in [0, 1], success, reason
    vocabulary() -> list[str]            words of its language (the built-in word-level policy's tokenizer)

Optional, batched stepping (environments whose counterpart is an LLM):

    step_many(episodes, actions) -> list[Episode]
        One call per agent turn with every live episode of the batch; the default (`step_all`) loops over
        `step`. An LLM-partner environment overrides it to send all partner requests at once (concurrently,
        through rwcore.judges.client.ChatClient's concurrency limit, retries and timeouts).
        `rwcore.trainer.rollout.run_episodes` calls it once per turn.

    outcome_many(episodes) -> list[Outcome]
        Every finished episode's outcome at once (an LLM outcome evaluator); default loops over `outcome`.
    attach_policy(generate)
        Self-play: the trainer hands the environment generate([(system, brief), ...]) -> messages, the
        policy sampling without gradients (rwcore.trainer.rollout.policy_text_generator).
    opening(task) -> list[(role, text)]
        The conversation before the first observation, each role "partner" or "assistant" (env.name=tasks:
        a task file's multi-turn opening): rollouts encode it ahead of the brief, through the model's chat
        template, and keep it in the trajectory's turns.

Optional *providers* (a method that is absent, or returns None, means "not provided"):

    rules() -> list[Rule]                programmatic rubric library (the RuleJudge of judge.kind=rule)
    reflector() -> RubricReflector       Arise reflection without an LLM
    attributor() -> Attributor           RewardWeaver failure attribution without an LLM
    labelled_cases(rule_ids) -> list     LabelledCase examples for admitting rules as capabilities
    labelled_cases_by_rule(rule_ids) -> dict, initial_library() -> ids   (refinements of the above)
    capability_candidates() -> list[RubricSpec]
                                         capability definitions without labelled cases (see below)
    action_vocabulary() -> list[str]     the built-in policy samples only these words
    guidance_language() -> GuidanceLanguage
                                         how guidance in the prompt names the agent's situations and moves:
                                         what the built-in model's reading prior is pretrained on
                                         (rwcore.trainer.prior; without it model.init resolves to random)

`provided(env, name)` reads a provider (None when absent or when it returns None).

Who fills in what (rwcore.trainer.method_setup):
- judge.kind=openai: the LLM judge scores rubrics; one OpenAIReflector on the judge's server is the
  reflector, attributor, capability proposer and evaluator reviser (so an environment needs none of its
  own; the environment's programmatic ones serve judge.kind=rule runs).
- judge.kind=rule needs the environment's rules(); without them `rw train` stops at start with an error
  naming env.name and what is missing (the same for reflector / attributor needed by the variant).
- RewardWeaver's library: the environment's rules, admitted by the source-disjoint acceptance test on
  its labelled cases. An environment with no labelled cases gives `capability_candidates()` (or, when it
  has none, the LLM proposer writes candidates from the training tasks' first views); these are admitted
  WITHOUT the acceptance test (there is nothing to test them on): the admission report says
  "unvalidated: no labelled cases", a warning is logged, and method.json / the reward history keep it.

Partner failures
----------------
A partner failure travels as one typed field, the reason (a non-empty string), from the environment to the
trajectory. An episode whose counterpart failed (an LLM partner timed out or answered garbage) ends with
`Episode.partner_failure = reason` (`partner_failed(episode, reason)` sets it and `done=True`); an outcome
evaluator that failed returns `Outcome(..., failure=reason)`. `failure_of(episode, outcome)` reads the two and
the rollout copies its answer to `Trajectory.partner_failure`; `rwcore.AdaptiveMethod.score` then gives the
trajectory no
advantage (0, left out of its group's normalization), no judged evidence (every verdict INVALID, so the
sampler, the pool and reflection learn nothing from it; VADE's outcome evidence gives it its group's
mean outcome), and the trainer masks its tokens out of the loss. Attribution sees the reason
(rwcore.rewardweaver.attribute records a partner failure with cause
"partner" and the reason as evidence: rejected as cause_partner, the trajectory "external"). The run goes on;
`partner_failures` counts them per step in metrics.jsonl.

Your own environment (no fork)
------------------------------
An environment lives in any importable package: a factory (any callable taking `env.options` as keyword
arguments) returns an object with the simulator part above and any providers. `env.name=my_pkg.envs:make_env`
names it directly; a pip-installed package can declare it under a name in the entry-point group
`rwcore.environments` (`env.name=my_env`); in one process `register(name, factory)` does the same
(rwcore.trainer.envs.registry says how a name is looked up). examples/my_env_package/ is a worked one.

    provenance() -> dict[str, str]      optional: what besides its code decides the environment (a data file,
                                         a reward module), each entry's digest; rwcore.trainer.envs.provenance
                                         records it with the code's digest in the run folder's environment.json,
                                         and `rw train --resume` / `rw eval` refuse a run whose entry changed
"""

from __future__ import annotations

import contextlib
import random
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from rwcore.trainer.envs.registry import make, register
from rwcore.types import Attributor, RubricReflector, RubricSpec, Trajectory

__all__ = [
    "Environment",
    "Episode",
    "GuidanceLanguage",
    "GuidanceSituation",
    "Outcome",
    "Providers",
    "Rule",
    "RuleDef",
    "Task",
    "failure_of",
    "make",
    "outcome_all",
    "own_random",
    "partner_failed",
    "provided",
    "register",
    "rule_spec",
    "rules_from",
    "step_all",
]


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
    partner_failure: why the counterpart failed and ended the episode ("" when it did not): set by
        `partner_failed`, never charged to the agent (see the module docstring).
    """

    task: Task
    observation: str
    done: bool = False
    state: dict = field(default_factory=dict)
    partner_failure: str = ""


@dataclass(frozen=True)
class Outcome:
    """How an episode ended: reward in [0, 1], success (what success rates count), and why.

    failure: non-empty when the outcome could not be judged because a counterpart failed (the outcome
        evaluator timed out or answered garbage): the episode is then a partner failure, never charged
        to the agent (like Episode.partner_failure). details: e.g. the rubric's dimension scores;
        details["metrics"] ({name: number}) is averaged into the metrics rows as env/<name> (eval/env/<name>).
    """

    reward: float
    success: bool
    reason: str = ""
    failure: str = ""
    details: dict = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class GuidanceSituation:
    """A situation the agent can be in, as guidance text names it.

    name: an identifier ("agrees"); phrases: the ways a guidance line names it, in the environment's
    words ("the buyer agrees"); every phrase names this situation only."""

    name: str
    phrases: tuple[str, ...]


@dataclass(frozen=True)
class GuidanceLanguage:
    """How guidance in the policy's prompt talks about an environment: its situations, its moves, and how
    an observation shows a situation. The built-in model's reading prior (rwcore.trainer.prior) is pretrained
    on lines "when <situation phrase> say <move>" over this language with moves drawn at random, so it
    learns to read guidance, not which move a situation needs.

    situations: disjoint situations (no observation shows two); actions: the move words (what the policy
    samples, `action_vocabulary()`); observe(name, rng): an observation (the partner's message as the
    policy sees it) that shows situation `name`, drawn from `rng`, with no task or episode behind it;
    situation_of(observation): the situation an observation shows (None: none, e.g. the episode is over);
    skill_texts: the environment's own skill texts (kept out of the corpus, probed on their situations)."""

    situations: tuple[GuidanceSituation, ...]
    actions: tuple[str, ...]
    observe: Callable[[str, random.Random], str]
    situation_of: Callable[[str], str | None]
    skill_texts: tuple[str, ...] = ()

    def situation(self, name: str) -> GuidanceSituation:
        for situation in self.situations:
            if situation.name == name:
                return situation
        raise ValueError(f"unknown situation {name!r}; known: {[s.name for s in self.situations]}")


@dataclass(frozen=True)
class Rule:
    """A programmatic rubric: its spec (capability = Arise category, spec.capability),
    RewardWeaver family, and the check (see rwcore.judges.RuleJudge for the return values)."""

    spec: RubricSpec
    family: str
    check: Callable[[Trajectory], object]


@dataclass(frozen=True)
class RuleDef:
    """A programmatic rubric written over an environment's episode state (the dict its `episode_state`
    rebuilds from a trajectory); `check(state)` -> (True / False / None for n/a, evidence quote)."""

    rule_id: str
    criterion: str
    applicability: str
    category: str  # Arise capability category -> RubricSpec.capability
    family: str  # RewardWeaver family -> Rule.family
    check: Callable[[dict], tuple]


def rule_spec(rule: RuleDef) -> RubricSpec:
    """The rubric a RuleDef checks, as the judge and the methods see it."""
    return RubricSpec(
        rubric_id=rule.rule_id,
        criterion=rule.criterion,
        applicability=rule.applicability,
        capability=rule.category,
        scored=False,
    )


def rules_from(defs: Sequence[RuleDef], episode_state: Callable[[Trajectory], dict]) -> list[Rule]:
    """`defs` as Rules whose checks read a trajectory through `episode_state` (a RuleJudge returns the verdict)."""

    def wrap(rule: RuleDef) -> Callable[[Trajectory], object]:
        def check(trajectory: Trajectory):
            return rule.check(episode_state(trajectory))[0]

        check.__name__ = f"check_{rule.rule_id}"
        check.__doc__ = rule.criterion
        return check

    return [Rule(spec=rule_spec(r), family=r.family, check=wrap(r)) for r in defs]


@runtime_checkable
class Environment(Protocol):
    """The simulator part every environment has (the providers are optional; see the module docstring)."""

    name: str
    system_prompt: str  # the policy's base system prompt (Arise skills are appended to it)
    max_turns: int  # agent turns per episode at most

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


class Providers(Protocol):
    """The optional providers, for reference (an environment may define any subset; None = not provided)."""

    def rules(self) -> list[Rule] | None:
        """The capability rubric library as programmatic checks over trajectories."""

    def reflector(self) -> RubricReflector | None:
        """Arise reflection without an LLM (proposes rubric-skill pairs from `rules`, refines skills)."""

    def attributor(self) -> Attributor | None:
        """RewardWeaver failure attribution without an LLM (knows partner/scenario causes)."""

    def labelled_cases(self, rule_ids: Sequence[str]) -> list | None:
        """rwcore.rewardweaver.LabelledCase examples (scripted trajectories with reference labels and
        source ids) for admitting each rule as a capability."""

    def capability_candidates(self) -> list[RubricSpec] | None:
        """Capability definitions the environment suggests but cannot label cases for (admitted unvalidated)."""

    def step_many(self, episodes: Sequence[Episode], actions: Sequence[str]) -> list[Episode]:
        """Every live episode's step at once (default: `step_all`)."""

    def outcome_many(self, episodes: Sequence[Episode]) -> list[Outcome]:
        """Every finished episode's outcome at once (an LLM outcome evaluator; default: `outcome_all`)."""

    def attach_policy(self, generate) -> None:
        """Self-play: the trainer hands over generate([(system, brief), ...]) -> messages (the policy, no
        gradients) for the partner's turns."""


_PROVIDERS = (
    "rules",
    "reflector",
    "attributor",
    "labelled_cases",
    "labelled_cases_by_rule",
    "initial_library",
    "capability_candidates",
)


@contextlib.contextmanager
def own_random():
    """Runs third-party environment code that seeds or draws from Python's global `random` (TextArena, some
    verifiers environments) without moving the trainer's global stream: its state is restored on exit."""
    saved = random.getstate()
    try:
        yield
    finally:
        random.setstate(saved)


def provided(env, name: str, *args):
    """The environment's provider `name` called with `args`, or None when it has none (absent method or
    None returned)."""
    method = getattr(env, name, None)
    if method is None or not callable(method):
        return None
    return method(*args)


def step_all(env, episodes: Sequence[Episode], actions: Sequence[str]) -> list[Episode]:
    """`env.step_many(episodes, actions)` when the environment has it, else `env.step` on each; checks
    that one episode comes back per action."""
    if len(episodes) != len(actions):
        raise ValueError(
            f"step_many needs one action per episode, got {len(actions)} actions for {len(episodes)} episodes"
        )
    many = getattr(env, "step_many", None)
    if many is None:
        return [env.step(episode, action) for episode, action in zip(episodes, actions)]
    out = list(many(list(episodes), list(actions)))
    if len(out) != len(episodes):
        raise ValueError(
            f"env.name {getattr(env, 'name', '?')!r}: step_many returned {len(out)} episodes for {len(episodes)}"
        )
    return out


def outcome_all(env, episodes: Sequence[Episode]) -> list[Outcome]:
    """`env.outcome_many(episodes)` when the environment has it, else `env.outcome` on each."""
    many = getattr(env, "outcome_many", None)
    if many is None:
        return [env.outcome(episode) for episode in episodes]
    out = list(many(list(episodes)))
    if len(out) != len(episodes):
        raise ValueError(
            f"env.name {getattr(env, 'name', '?')!r}: outcome_many returned {len(out)} outcomes for "
            f"{len(episodes)} episodes"
        )
    return out


def failure_of(episode: Episode, outcome: Outcome) -> str:
    """Why the episode is a partner failure ("" when it is not): the episode's partner_failure, else the
    outcome's failure (what the rollout copies to Trajectory.partner_failure). A `state["partner_failure"]`
    written by an environment of an older release is still read, with a DeprecationWarning."""
    legacy = episode.state.get("partner_failure") if isinstance(episode.state, dict) else None
    if legacy and not episode.partner_failure:
        from rwcore._deprecated import REMOVED_IN

        warnings.warn(
            "Episode.state['partner_failure'] is deprecated and will be ignored from rwcore "
            f"{REMOVED_IN}: end the episode with partner_failed(episode, reason)",
            DeprecationWarning,
            stacklevel=2,
        )
        return str(legacy)[:500]
    return str(episode.partner_failure or outcome.failure or "")


def partner_failed(episode: Episode, reason: str) -> Episode:
    """The episode ended by a counterpart failure (timeout, garbage reply...): done, with
    partner_failure = reason (never charged to the agent; see the module docstring)."""
    return Episode(episode.task, episode.observation, True, dict(episode.state), str(reason)[:500] or "partner failure")
