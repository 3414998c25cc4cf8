"""Multi-turn rollouts: episodes of many tasks advanced together, one batched generate per turn.

Every agent turn of every live episode is generated in one `model.generate`
call (left-padded); the environment answers each, and its reply is appended
to that episode's token ids. After the episodes end, one forward pass scores
every policy-generated token under the policy that produced it (the behavior
log-probs the loss's importance ratios need).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from rwcore.kernels import token_logprobs
from rwcore.trainer.envs.base import Environment, Episode, Outcome, Task
from rwcore.types import Trajectory, Turn


@dataclass
class Rollout:
    """One episode as the update sees it.

    token_ids: [L] the whole conversation.
    generated: [L] True where the policy generated the token (these get loss).
    behavior_logprobs: [L] fp32 log-prob of token t given tokens < t under the
        behavior policy, at the sampling temperature (0 where not generated).
    """

    trajectory: Trajectory
    outcome: Outcome
    token_ids: list[int]
    generated: list[bool]
    behavior_logprobs: torch.Tensor = field(default_factory=lambda: torch.zeros(0))


def pad_left(sequences: Sequence[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        ids[row, width - len(seq):] = torch.tensor(seq, dtype=torch.long)
        mask[row, width - len(seq):] = 1
    return ids.to(device), mask.to(device)


def pad_right(sequences: Sequence[list], pad, dtype, device) -> torch.Tensor:
    width = max(len(s) for s in sequences)
    out = torch.full((len(sequences), width), pad, dtype=dtype)
    for row, seq in enumerate(sequences):
        out[row, :len(seq)] = torch.tensor(seq, dtype=dtype)
    return out.to(device)


@torch.no_grad()
def run_episodes(env: Environment, policy, jobs: Sequence[tuple[Task, int, str]], system_prompt: str,
                 temperature: float, max_new_tokens: int, greedy: bool = False) -> list[Rollout]:
    """Runs one episode per (task, seed, group_id) job with the current policy; returns them in job order."""
    codec, model = policy.codec, policy.model
    was_training = model.training
    model.eval()
    episodes: list[Episode] = [env.reset(task, seed) for task, seed, _ in jobs]
    ids = [codec.start(system_prompt, ep.observation) for ep in episodes]
    generated = [[False] * len(seq) for seq in ids]
    turns = [[Turn("system", system_prompt), Turn("partner", ep.observation)] for ep in episodes]
    for _ in range(env.max_turns):
        live = [i for i, ep in enumerate(episodes) if not ep.done]
        if not live:
            break
        input_ids, attention = pad_left([ids[i] for i in live], codec.pad_id, policy.device)
        output = model.generate(
            input_ids=input_ids, attention_mask=attention, max_new_tokens=max_new_tokens,
            do_sample=not greedy, temperature=temperature if not greedy else None, top_k=0, top_p=1.0,
            eos_token_id=codec.end_id, pad_token_id=codec.pad_id, suppress_tokens=policy.suppressed(),
        )
        new_tokens = output[:, input_ids.shape[1]:].tolist()
        for row, i in enumerate(live):
            sampled = new_tokens[row]
            if codec.end_id in sampled:
                tokens = sampled[:sampled.index(codec.end_id) + 1]
                flags = [True] * len(tokens)
            else:
                # Out of budget: the message is closed with an <end> the policy did not choose.
                tokens = sampled + [codec.end_id]
                flags = [True] * len(sampled) + [False]
            message = codec.decode(tokens)
            ids[i].extend(tokens)
            generated[i].extend(flags)
            turns[i].append(Turn("assistant", message, generated=True))
            episodes[i] = env.step(episodes[i], message)
            if not episodes[i].done:
                reply = codec.reply("partner", episodes[i].observation, turns[i])
                turns[i].append(Turn("partner", episodes[i].observation))
                ids[i].extend(reply)
                generated[i].extend([False] * len(reply))
    if was_training:
        model.train()
    rollouts = []
    for (task, seed, group_id), episode, seq, gen, episode_turns in zip(jobs, episodes, ids, generated, turns):
        outcome = env.outcome(episode)
        index = sum(1 for r in rollouts if r.trajectory.group_id == group_id)
        trajectory = Trajectory(
            task_id=task.task_id, turns=episode_turns, outcome=float(outcome.reward), tags=tuple(task.tags),
            group_id=group_id, policy_version=policy.version, generated_length=int(sum(gen)),
            token_spans=_spans(gen), trajectory_id=f"{group_id}/{index}",
            metadata={"env_state": episode.state, "task": task.data, "task_id": task.task_id, "seed": seed,
                      "success": bool(outcome.success)},
        )
        rollouts.append(Rollout(trajectory, outcome, seq, gen))
    return rollouts


def _spans(generated: Sequence[bool]) -> tuple[tuple[int, int], ...]:
    spans, start = [], None
    for t, flag in enumerate(list(generated) + [False]):
        if flag and start is None:
            start = t
        elif not flag and start is not None:
            spans.append((start, t))
            start = None
    return tuple(spans)


def batch_tensors(rollouts: Sequence[Rollout], pad_id: int, device):
    """(input_ids [B, L], attention [B, L], generated [B, L] bool), right-padded."""
    input_ids = pad_right([r.token_ids for r in rollouts], pad_id, torch.long, device)
    attention = pad_right([[1] * len(r.token_ids) for r in rollouts], 0, torch.long, device)
    generated = pad_right([r.generated for r in rollouts], False, torch.bool, device)
    return input_ids, attention, generated


@torch.no_grad()
def score_behavior(policy, rollouts: Sequence[Rollout], temperature: float, backend: str) -> None:
    """Fills each rollout's behavior_logprobs [L] under the current (behavior) policy."""
    was_training = policy.model.training
    policy.model.eval()
    input_ids, attention, generated = batch_tensors(rollouts, policy.codec.pad_id, policy.device)
    logits = policy.model(input_ids=input_ids, attention_mask=attention).logits[:, :-1]
    labels = input_ids[:, 1:]
    if policy.allowed is not None:  # the same restricted softmax the sampler drew from
        _, labels = policy.action_space(labels)
        logits = logits.index_select(-1, policy.allowed)
    logp = token_logprobs(logits.float(), labels, temperature=temperature, backend=backend, validate=False)
    logp = torch.cat([torch.zeros_like(logp[:, :1]), logp], dim=1) * generated
    for row, rollout in enumerate(rollouts):
        rollout.behavior_logprobs = logp[row, :len(rollout.token_ids)].cpu()
    if was_training:
        policy.model.train()
