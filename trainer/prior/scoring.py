"""Log-probabilities of the move words at chosen positions: what pretraining trains and the probe measures."""

from __future__ import annotations

import torch


def move_logprobs(
    policy, ids: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor, allowed: torch.Tensor
) -> torch.Tensor:
    """[N, K] float log-probs over the action space `allowed` [K] (long token ids) at the N (row, position)
    pairs of a right-padded batch ids [B, W] (long) with mask [B, W], for a `Policy` (whose hidden_states
    encode the prompt the rows share - the system prompt, the skills preamble - once)."""
    return _head_logprobs(policy.hidden_states(ids, mask)[rows, positions], policy.head.weight[allowed])


def _head_logprobs(hidden: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
    """[N, K] float log-softmax of hidden [N, H] against the head rows [K, H]."""
    return torch.log_softmax(hidden.float() @ head.float().T, dim=-1)
