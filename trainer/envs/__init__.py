"""Environments for `rw train`: the protocol, a registry, and the built-in environments."""

from rwcore.trainer.envs.base import (
    Environment,
    Episode,
    Outcome,
    Rule,
    Task,
    failure_of,
    make,
    outcome_all,
    partner_failed,
    provided,
    register,
    step_all,
)
from rwcore.trainer.envs.negotiation import NegotiationEnv

register("negotiation", NegotiationEnv)


__all__ = [
    "Environment",
    "Episode",
    "NegotiationEnv",
    "Outcome",
    "Rule",
    "Task",
    "failure_of",
    "make",
    "outcome_all",
    "partner_failed",
    "provided",
    "register",
    "step_all",
]
