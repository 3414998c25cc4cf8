"""The rubric library: three checks over a finished episode's state, and the skill text Arise shows for each.

A check reads `trajectory.metadata["env_state"]` (the finished Episode.state, which `rw train` copies there)
and returns True (pass), False (fail) or None (does not apply). `rules_from` turns each RuleDef into the Rule a
RuleJudge calls.
"""

from __future__ import annotations

from rwcore.trainer.envs.base import RuleDef, rules_from

# what Arise puts in the prompt once a rule joins its pool (words of the environment's language)
SKILLS = {
    "asks_when_untold": "when the customer does not say the size ask",
    "no_needless_ask": "when the customer says the size serve it",
    "serves_known_size": "serve only a size the customer said",
}


def _asks_when_untold(state: dict) -> tuple:
    if state["told"]:
        return None, "the customer said the size"
    return state["asked"] > 0, f"asked {state['asked']} times"


def _no_needless_ask(state: dict) -> tuple:
    if not state["told"]:
        return None, "the customer did not say the size"
    return state["asked"] == 0, f"asked {state['asked']} times"


def _serves_known_size(state: dict) -> tuple:
    if state["served"] is None:
        return None, "nothing was served"
    return bool(state["known_when_served"]), f"served {state['served']}"


DEFS = (
    RuleDef(
        "asks_when_untold",
        "The agent asks the size before serving when the customer did not say it.",
        "The customer did not say the size.",
        "Understanding",  # the Arise capability category
        "elicitation",  # the RewardWeaver family
        _asks_when_untold,
    ),
    RuleDef(
        "no_needless_ask",
        "The agent does not ask for a size the customer already said.",
        "The customer said the size.",
        "Efficiency",
        "efficiency",
        _no_needless_ask,
    ),
    RuleDef(
        "serves_known_size",
        "The agent serves only once it knows the size.",
        "The agent served a coffee.",
        "Execution",
        "execution",
        _serves_known_size,
    ),
)


def _state(trajectory) -> dict:
    state = trajectory.metadata.get("env_state")
    if not isinstance(state, dict):
        raise ValueError("the trajectory carries no env_state")  # the RuleJudge records INVALID
    return state


def rules():
    return rules_from(DEFS, _state)
