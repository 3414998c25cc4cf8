"""Environments for `rw train`: the protocol, a registry, and the built-in negotiation family."""

from rwcore.trainer.envs.base import Environment, Episode, Outcome, Rule, Task, make, register
from rwcore.trainer.envs.negotiation import NegotiationEnv

register("negotiation", NegotiationEnv)

__all__ = ["Environment", "Episode", "NegotiationEnv", "Outcome", "Rule", "Task", "make", "register"]
