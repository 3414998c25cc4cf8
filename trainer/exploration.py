"""How much outcome signal a policy's own rollouts give: pass@1, pass@k and the share of zero-variance groups.

GRPO learns from a task only when the outcomes of its group differ. Where the starting policy's pass@k is near 0,
nearly every group of an outcome-only run fails entirely and carries no gradient: that is the regime in which the
papers (and PRIME, PAV, MT-GRPO, GiGPO) find process credit to pay. `rw train` measures it before training (a row of
kind "exploration" at step 0, `train.start_pass_k`), every training step (`groups/zero_variance`,
`groups/all_failed`) and `rw probe` for the prior or any checkpoint.

For a task with k sampled episodes, pass@1 is the mean success and pass@k whether any succeeded (with n = k samples
the unbiased estimator 1 - C(n - c, k) / C(n, k) is exactly that); a group is zero-variance when its k outcomes are
all equal (all failed, or all succeeded).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["EXPLORATION_SEED", "exploration_figures", "format_exploration", "group_figures", "sample_groups"]

EXPLORATION_SEED = 3_000_017  # the starting policy's k episodes per held-out task: their own seeds, fixed


def group_figures(outcomes: np.ndarray, successes: np.ndarray) -> dict:
    """Figures of [T, k] outcome rewards and success flags (T task groups of k episodes each): pass@1, pass@k,
    the share of zero-variance groups (outcomes all equal) and of all-failed groups (no success)."""
    outcomes = np.asarray(outcomes, dtype=np.float64)
    successes = np.asarray(successes, dtype=bool)
    if outcomes.ndim != 2 or outcomes.shape != successes.shape or outcomes.size == 0:
        raise ValueError(f"outcomes and successes must be [T, k] arrays of one shape, got {outcomes.shape}")
    k = outcomes.shape[1]
    return {
        "pass@1": float(successes.mean()),
        f"pass@{k}": float(successes.any(axis=1).mean()),
        "zero_variance_groups": float((outcomes.max(axis=1) == outcomes.min(axis=1)).mean()),
        "all_failed_groups": float((~successes.any(axis=1)).mean()),
    }


def sample_groups(
    env,
    policy,
    tasks: Sequence,
    k: int = 8,
    *,
    temperature: float = 1.0,
    max_new_tokens: int = 1,
    generator=None,
    system_prompt: str | None = None,
    seed: int = EXPLORATION_SEED,
    offset: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """k sampled episodes of each task under `system_prompt` (default: the environment's base prompt, as at
    evaluation) -> ([T, k] float64 outcome rewards, [T, k] bool successes). Task i's episodes have seeds
    seed + 31 (offset + i) + j, so a block of tasks (offset = its first index) samples what the whole list would;
    torch's global generator is left as it was."""
    import torch

    from rwcore.trainer.rollout import run_episodes

    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k!r}")
    tasks = list(tasks)
    if not tasks:
        return np.zeros((0, k)), np.zeros((0, k), dtype=bool)
    jobs = [
        (task, seed + 31 * (offset + i) + j, f"exploration/{offset + i}")
        for i, task in enumerate(tasks)
        for j in range(k)
    ]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + offset)
        rollouts = run_episodes(
            env,
            policy,
            jobs,
            env.system_prompt if system_prompt is None else system_prompt,
            temperature,
            max_new_tokens,
            generator=generator,
        )
    outcomes = np.array([r.outcome.reward for r in rollouts], dtype=np.float64).reshape(len(tasks), k)
    successes = np.array([bool(r.outcome.success) for r in rollouts]).reshape(len(tasks), k)
    return outcomes, successes


def exploration_figures(tasks: Sequence, outcomes: np.ndarray, successes: np.ndarray) -> dict:
    """`group_figures` of the tasks' [T, k] samples (`sample_groups`), plus pass@k per task type (a task counts
    under each of its tags) and the share of task types whose pass@k is below 0.05."""
    tasks = list(tasks)
    if len(tasks) != len(successes):
        raise ValueError(f"{len(tasks)} tasks for {len(successes)} sampled groups")
    return {**group_figures(outcomes, successes), **_per_type(tasks, np.asarray(successes, dtype=bool))}


def _per_type(tasks: Sequence, successes: np.ndarray) -> dict:
    k = successes.shape[1]
    by_tag: dict[str, list[bool]] = {}
    for task, row in zip(tasks, successes):
        for tag in task.tags or ("untagged",):
            by_tag.setdefault(tag, []).append(bool(row.any()))
    rates = {tag: float(np.mean(found)) for tag, found in sorted(by_tag.items())}
    out = {f"pass@{k}/{tag}": rate for tag, rate in rates.items()}
    out[f"types_pass@{k}_below_0.05"] = float(np.mean([rate < 0.05 for rate in rates.values()]))
    return out


def format_exploration(figures: dict) -> str:
    """The figures as two lines for the terminal."""
    k = next(
        int(key.split("@")[1]) for key in figures if key.startswith("pass@") and "/" not in key and key != "pass@1"
    )
    per_type = ", ".join(
        f"{key.split('/', 1)[1]} {value:.3f}" for key, value in figures.items() if key.startswith(f"pass@{k}/")
    )
    return (
        f"starting policy on the held-out tasks ({k} episodes each): pass@1 {figures['pass@1']:.4f}, "
        f"pass@{k} {figures[f'pass@{k}']:.4f}, zero-variance groups {figures['zero_variance_groups']:.3f} "
        f"(all failed {figures['all_failed_groups']:.3f})\n"
        f"pass@{k} per task type: {per_type}; types below 0.05: {figures[f'types_pass@{k}_below_0.05']:.2f}"
    )
