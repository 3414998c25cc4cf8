"""Environments for `rw train`: the protocol, a registry, and the built-in negotiation family."""

from rwcore.trainer.envs.base import Environment, Episode, Outcome, Rule, Task, make, register

__all__ = ["Environment", "Episode", "Outcome", "Rule", "Task", "make", "register"]
