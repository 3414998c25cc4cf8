"""The social environment's rubric families as keyword checks, and the reflector and attributor without an LLM
that read them (see the package docstring, "Rubric families")."""

from __future__ import annotations

from collections.abc import Sequence

from rwcore.trainer.envs.base import Rule
from rwcore.trainer.envs.social.keywords import PROPOSE, QUESTION, RUDE, words_of
from rwcore.types import AttributionRecord, RubricSkillProposal, RubricSpec, Trajectory


def _skill_hints() -> dict[str, str]:
    return {
        "pursues_goal": "Say plainly what you want, in the words of your goal.",
        "asks_partner": "Ask what your partner needs before you push your own goal.",
        "proposes_terms": "Propose concrete terms: an offer, a split, a plan.",
        "stays_polite": "Stay polite: please, thanks, sorry; never insult.",
        "keeps_secret": "Never say what your secret is.",
        "no_repetition": "Do not repeat a message; move the conversation forward.",
    }


def keyword_rules(by_id: dict[str, dict]) -> list[Rule]:
    """The six rubric families as keyword checks over a trajectory's agent messages; a trajectory's scenario is its
    metadata["task"], else `by_id[task_id]` (scenario id -> scenario)."""

    def agent_words(t: Trajectory) -> list[str]:
        return [w for turn in t.turns if turn.role == "assistant" for w in words_of(turn.content)]

    def scenario(t: Trajectory) -> dict:
        return t.metadata.get("task") or by_id.get(t.task_id, {})

    def pursues_goal(t):
        s = scenario(t)
        goal = {w for k in s.get("goal_keywords", ()) for w in words_of(k)}
        return bool(goal & set(agent_words(t)))

    def keeps_secret(t):
        secret = {w for k in scenario(t).get("secret_keywords", ()) for w in words_of(k)}
        return None if not secret else not (secret & set(agent_words(t)))

    def no_repetition(t):
        messages = [turn.content.strip() for turn in t.turns if turn.role == "assistant"]
        return len(messages) == len(set(messages))

    checks = {
        "pursues_goal": (
            "Understanding",
            "The agent states what it wants in terms of its private goal.",
            pursues_goal,
        ),
        "asks_partner": (
            "Understanding",
            "The agent asks the partner about its needs or views.",
            lambda t: bool(QUESTION & set(agent_words(t))),
        ),
        "proposes_terms": (
            "Execution",
            "The agent proposes concrete terms (an offer, a split, a plan).",
            lambda t: bool(PROPOSE & set(agent_words(t))),
        ),
        "stays_polite": (
            "Execution",
            "The agent stays polite and never insults or threatens the partner.",
            lambda t: not (RUDE & set(agent_words(t))),
        ),
        "keeps_secret": ("Verification", "The agent does not reveal its secret.", keeps_secret),
        "no_repetition": (
            "Efficiency",
            "The agent never repeats a message; each moves the conversation on.",
            no_repetition,
        ),
    }
    return [
        Rule(RubricSpec(rid, criterion, "" if rid != "keeps_secret" else "The agent has a secret.", cap), rid, check)
        for rid, (cap, criterion, check) in checks.items()
    ]


class SocialReflector:
    """Reflection without an LLM: proposes the keyword rubrics not in the pool, with a fixed hint each.
    rules: the environment's rubric library (`SocialEnv.rules()`)."""

    def __init__(self, rules: Sequence[Rule]) -> None:
        self.rules = list(rules)

    def propose_rubric_skills(self, trajectories, existing, max_new):
        known = {spec.rubric_id for spec in existing}
        hints = _skill_hints()
        return [
            RubricSkillProposal(rule.spec, hints[rule.spec.rubric_id])
            for rule in self.rules
            if rule.spec.rubric_id not in known
        ][:max_new]

    def refine_skill(self, rubric, skill, failures):
        return skill if "concrete" in skill else skill + " Be concrete."


class SocialAttributor:
    """Attribution without an LLM: a candidate capability is deficient when its keyword check fails.
    rules: the environment's rubric library (`SocialEnv.rules()`)."""

    def __init__(self, rules: Sequence[Rule]) -> None:
        self.checks = {rule.spec.rubric_id: rule.check for rule in rules}

    def attribute(self, trajectory, candidates):
        records = []
        said = next((t.content for t in trajectory.turns if t.role == "assistant"), "")
        for spec in candidates:
            check = self.checks.get(spec.rubric_id)
            result = check(trajectory) if check else None
            if result is None:
                continue
            records.append(
                AttributionRecord(
                    trajectory.trajectory_id,
                    spec.rubric_id,
                    not result,
                    0.7,
                    f"agent said: {said[:200]}" if said else "",
                    "policy",
                )
            )
        return records
