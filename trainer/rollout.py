"""Multi-turn rollouts: episodes of many tasks advanced together, one batched generate per turn.

Every agent turn of every live episode is generated in one batched call —
HFGenerator (rwcore.trainer.generation) on the policy's own model (left-padded; its own decode loop, which
samples exactly as HF `model.generate` does, or `generate` itself) by default,
or a `Generator` such as the vLLM engine (rwcore.trainer.vllm_rollout); the
environment answers each, and its reply is appended to that episode's token ids.

Behavior log-probs (the denominator of Arise eq. 18's importance ratio) are the
ones the engine computed while sampling — log-softmax of the scores it sampled
from, at the sampling temperature and over the allowed tokens — stored per token
with the policy version that sampled them (rollout.behavior_logprobs=engine).
`score_behavior` recomputes them with the training model instead
(rollout.behavior_logprobs=trainer), through the chunked fused-linear path, so
no [B, L, V] logits are ever materialized.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from rwcore.kernels import fused_linear_logprobs
from rwcore.trainer.envs.base import (
    Environment,
    Episode,
    Outcome,
    Task,
    failure_of,
    outcome_all,
    provided,
    step_all,
)
from rwcore.trainer.generation import Generator, HFGenerator
from rwcore.types import Trajectory, Turn


@dataclass
class Rollout:
    """One episode as the update sees it.

    token_ids: [L] the whole conversation.
    generated: [L] True where the policy generated the token (these get loss).
    behavior_logprobs: [L] fp32 log-prob of token t given tokens < t under the
        behavior policy, at the sampling temperature (0 where not generated);
        empty until an engine or `score_behavior` fills it.
    behavior_version: the policy version that sampled the generated tokens.
    """

    trajectory: Trajectory
    outcome: Outcome
    token_ids: list[int]
    generated: list[bool]
    behavior_logprobs: torch.Tensor = field(default_factory=lambda: torch.zeros(0))
    behavior_version: int = 0


def pad_right(sequences: Sequence[list], pad, dtype, device) -> torch.Tensor:
    """[B, W] of `dtype`, right-padded with `pad` to the longest sequence."""
    width = max(len(s) for s in sequences)
    return torch.tensor([list(s) + [pad] * (width - len(s)) for s in sequences], dtype=dtype).to(device)


def turn_seed(episode_seed: int, turn: int) -> int:
    """The per-request seed of an agent turn (for generators that take one)."""
    return (episode_seed * 1_000_003 + turn * 7_919 + 1) % (2**31 - 1)


@torch.no_grad()
def run_episodes(
    env: Environment,
    policy,
    jobs: Sequence[tuple[Task, int, str]],
    system_prompt: str,
    temperature: float,
    max_new_tokens: int,
    greedy: bool = False,
    generator: Generator | None = None,
    on_group: Callable[[str, list[Rollout]], None] | None = None,
) -> list[Rollout]:
    """Runs one episode per (task, seed, group_id) job with the current policy; returns them in job order.
    `generator` samples the agent messages (default: HF generate on the policy's model). When it reports
    log-probs, each rollout's behavior_logprobs holds them; otherwise it stays empty (see score_behavior).
    `on_group(group_id, rollouts)` is called as soon as every episode of a group has ended, while the other
    groups still generate (the trainer starts judging it then); the rollouts are the same objects returned."""
    codec, model = policy.codec, policy.model
    generator = generator or HFGenerator(policy)
    was_training = model.training
    model.eval()
    episodes: list[Episode] = [env.reset(task, seed) for task, seed, _ in jobs]
    # an environment's `opening(task)` provider: the conversation before the first observation (a task file's
    # multi-turn opening), encoded ahead of it and kept in the trajectory
    openings = [list(provided(env, "opening", task) or ()) for task, _, _ in jobs]
    ids = [codec.start(system_prompt, ep.observation, opening) for ep, opening in zip(episodes, openings)]
    generated = [[False] * len(seq) for seq in ids]
    behavior = [[0.0] * len(seq) for seq in ids]
    engine_logprobs = True  # every completion came with its log-probs
    turns = [
        [Turn("system", system_prompt), *(Turn(role, text) for role, text in opening), Turn("partner", ep.observation)]
        for ep, opening in zip(episodes, openings)
    ]
    built: dict[int, Rollout] = {}
    members: dict[str, list[int]] = {}
    for i, (_, _, group_id) in enumerate(jobs):
        members.setdefault(group_id, []).append(i)
    index_in_group = {i: rows.index(i) for rows in members.values() for i in rows}

    def build(rows: list[int]) -> list[Rollout]:
        """The rollouts of finished episodes `rows` (one outcome call for them all)."""
        outcomes = outcome_all(env, [episodes[i] for i in rows])
        for i, outcome in zip(rows, outcomes):
            built[i] = _rollout(
                jobs[i],
                episodes[i],
                outcome,
                ids[i],
                generated[i],
                behavior[i],
                turns[i],
                index_in_group[i],
                policy.version,
                engine_logprobs,
            )
        return [built[i] for i in rows]

    emitted: set[str] = set()
    for turn in range(env.max_turns):
        live = [i for i, ep in enumerate(episodes) if not ep.done]
        if not live:
            break
        new_tokens = generator(
            [ids[i] for i in live], [turn_seed(jobs[i][1], turn) for i in live], temperature, max_new_tokens, greedy
        )
        messages = []
        for row, i in enumerate(live):
            completion = new_tokens[row]
            sampled = completion.tokens
            if codec.end_id in sampled:
                tokens = sampled[: sampled.index(codec.end_id) + 1]
                flags = [True] * len(tokens)
            else:
                # Out of budget: the message is closed with an <end> the policy did not choose.
                tokens = sampled + [codec.end_id]
                flags = [True] * len(sampled) + [False]
            if completion.logprobs is None:
                engine_logprobs = False
            else:
                behavior[i].extend(
                    completion.logprobs[: len(tokens)] + [0.0] * (len(tokens) - len(completion.logprobs))
                )
            message = codec.decode(tokens)
            ids[i].extend(tokens)
            generated[i].extend(flags)
            turns[i].append(Turn("assistant", message, generated=True))
            messages.append(message)
        # one environment call per turn for every live episode (an LLM partner answers them concurrently)
        for i, episode in zip(live, step_all(env, [episodes[i] for i in live], messages)):
            episodes[i] = episode
            if not episode.done:
                reply = codec.reply("partner", episode.observation, turns[i])
                turns[i].append(Turn("partner", episode.observation))
                ids[i].extend(reply)
                generated[i].extend([False] * len(reply))
                behavior[i].extend([0.0] * len(reply))
        if on_group is not None:
            for group_id, rows in members.items():
                if group_id not in emitted and all(episodes[i].done for i in rows):
                    emitted.add(group_id)
                    on_group(group_id, build(rows))
    if was_training:
        model.train()
    if on_group is not None:
        for group_id, rows in members.items():
            if group_id not in emitted:  # out of turns: ended by the turn limit
                on_group(group_id, build(rows))
        if not engine_logprobs:  # a later completion came without log-probs: none of them has any
            for rollout in built.values():
                rollout.behavior_logprobs = torch.zeros(0)
        return [built[i] for i in range(len(jobs))]
    return build(list(range(len(jobs))))  # one call: an LLM outcome evaluator judges them concurrently


def _rollout(job, episode, outcome, seq, gen, logp, episode_turns, index, version, engine_logprobs) -> Rollout:
    """One finished episode as a Rollout (its Trajectory with the outcome, tokens, flags and behavior log-probs)."""
    task, seed, group_id = job
    trajectory = Trajectory(
        task_id=task.task_id,
        turns=episode_turns,
        outcome=float(outcome.reward),
        tags=tuple(task.tags),
        group_id=group_id,
        policy_version=version,
        generated_length=int(sum(gen)),
        token_spans=_spans(gen),
        trajectory_id=f"{group_id}/{index}",
        metadata={
            "env_state": episode.state,
            "task": task.data,
            "task_id": task.task_id,
            "seed": seed,
            "success": bool(outcome.success),
        },
    )
    if outcome.details:
        trajectory.metadata["outcome_details"] = dict(outcome.details)
    failure = failure_of(episode, outcome)
    if failure:
        # the counterpart failed, not the agent: never charged (AdaptiveMethod.score, the loss mask)
        trajectory.partner_failure = str(failure)
    behavior = (
        torch.tensor([p if flag else 0.0 for p, flag in zip(logp, gen)], dtype=torch.float32)
        if engine_logprobs
        else torch.zeros(0)
    )
    return Rollout(trajectory, outcome, list(seq), list(gen), behavior, version)


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
    """Fills each rollout's behavior_logprobs [L] under the current policy (rollout.behavior_logprobs=trainer),
    from the final hidden states one chunk of logits at a time (never [B, L, V])."""
    was_training = policy.model.training
    policy.model.eval()
    input_ids, attention, generated = batch_tensors(rollouts, policy.codec.pad_id, policy.device)
    hidden = policy.hidden_states(input_ids, attention)[:, :-1]
    weight, labels = policy.action_space(input_ids[:, 1:])  # the restricted softmax the sampler drew from
    bias = policy.head.bias
    if bias is not None and policy.allowed is not None:
        bias = bias[policy.allowed]
    logp = fused_linear_logprobs(
        hidden.reshape(-1, hidden.shape[-1]),
        weight,
        labels.reshape(-1),
        bias,
        temperature=temperature,
        backend=backend,
        validate=False,
    ).view(labels.shape)
    logp = torch.cat([torch.zeros_like(logp[:, :1]), logp], dim=1) * generated
    for row, rollout in enumerate(rollouts):
        rollout.behavior_logprobs = logp[row, : len(rollout.token_ids)].cpu()
        rollout.behavior_version = policy.version
    if was_training:
        policy.model.train()


def policy_text_generator(policy, generator: Generator | None, temperature: float, max_new_tokens: int, seed: int = 0):
    """generate([(system prompt, brief), ...]) -> one message each, sampled by the policy without gradients:
    the self-play partner's writer (rwcore.trainer.envs.llm_partner.PolicyPartner). Its tokens never
    enter a rollout's generated tokens, so no loss flows through them."""
    counter = [0]

    @torch.no_grad()
    def generate(briefs):
        if not briefs:
            return []
        codec = policy.codec
        engine = generator or HFGenerator(policy)
        was_training = policy.model.training
        policy.model.eval()
        prompts = [codec.start(system, brief) for system, brief in briefs]
        seeds = [turn_seed(seed + counter[0] * 7_919 + i, 0) for i in range(len(prompts))]
        counter[0] += 1
        completions = engine(prompts, seeds, temperature, max_new_tokens, False)
        if was_training:
            policy.model.train()
        texts = []
        for completion in completions:
            tokens = completion.tokens
            if codec.end_id in tokens:
                tokens = tokens[: tokens.index(codec.end_id)]
            texts.append(codec.decode(tokens))
        return texts

    return generate
