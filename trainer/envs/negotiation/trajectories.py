"""A negotiation episode as the Trajectory the trainer builds (`build_trajectory`: the contract in the package
docstring, what the rubric checks read) and one episode of a policy run to its end (`run_episode`). Both tiers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rwcore.trainer.envs.base import Environment, Episode, Outcome, Task
from rwcore.types import Trajectory, Turn

__all__ = ["build_trajectory", "run_episode"]


def build_trajectory(
    env: Environment,
    episode: Episode,
    agent_messages: Sequence[str],
    partner_messages: Sequence[str],
    *,
    system_prompt: str | None = None,
    outcome: Outcome | None = None,
    trajectory_id: str = "",
    group_id: str = "",
    policy_version: int = 0,
    generated_length: int = 0,
) -> Trajectory:
    """The Trajectory of a finished episode, built the way the trainer must build it.

    partner_messages: the observations in order, the first (the brief) included, so
    len(partner_messages) is len(agent_messages) + 1 (or equal when the episode was cut short).
    system_prompt: the system turn's text (default env.system_prompt; pass it with the injected
    skills appended when Arise adds them).
    turns: system, then partner / assistant alternately (assistant turns generated=True).
    metadata: env_state (episode.state), task (task.data), task_id, seed, success.
    """
    outcome = env.outcome(episode) if outcome is None else outcome
    turns = [Turn("system", env.system_prompt if system_prompt is None else system_prompt)]
    for i, observation in enumerate(partner_messages):
        turns.append(Turn("partner", observation))
        if i < len(agent_messages):
            turns.append(Turn("assistant", agent_messages[i], generated=True))
    return Trajectory(
        task_id=episode.task.task_id,
        turns=turns,
        outcome=float(outcome.reward),
        tags=tuple(episode.task.tags),
        group_id=group_id,
        policy_version=policy_version,
        generated_length=generated_length,
        trajectory_id=trajectory_id or f"{episode.task.task_id}/{group_id}/0",
        metadata={
            "env_state": episode.state,
            "task": dict(episode.task.data),
            "task_id": episode.task.task_id,
            "seed": int(episode.state.get("seed", 0)),
            "success": bool(outcome.success),
        },
    )


def run_episode(
    env: Environment,
    task: Task,
    policy_fn: Callable[[str], str],
    seed: int = 0,
    trajectory_id: str = "",
    group_id: str = "",
) -> Trajectory:
    """Runs `task` with `policy_fn(observation) -> message` and returns its Trajectory."""
    episode = env.reset(task, seed)
    partner = [episode.observation]
    agent: list[str] = []
    while not episode.done:
        message = policy_fn(episode.observation)
        agent.append(message)
        episode = env.step(episode, message)
        partner.append(episode.observation)
    return build_trajectory(
        env,
        episode,
        agent,
        partner,
        trajectory_id=trajectory_id or f"{task.task_id}/{group_id}/{seed}",
        group_id=group_id,
    )
