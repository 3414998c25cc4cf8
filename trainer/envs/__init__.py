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
from rwcore.trainer.envs.negotiation_hard import HardNegotiationEnv, make_negotiation

# env.options.difficulty=learnable (NegotiationEnv, the embedded default) | hard (HardNegotiationEnv)
register("negotiation", make_negotiation)


__all__ = [
    "Environment",
    "Episode",
    "HardNegotiationEnv",
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
