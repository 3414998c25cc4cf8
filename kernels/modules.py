"""`nn.Module` forms of the kernels' functions, for trainers that compose losses as modules."""

from __future__ import annotations

import torch
from torch import nn

from rwcore.kernels import _checks
from rwcore.kernels.fused_linear_policy_loss import fused_linear_policy_loss
from rwcore.kernels.policy_loss import filtered_dual_clip_loss
from rwcore.kernels.rollout_correction import resolve
from rwcore.kernels.token_logprobs import token_logprobs


class TokenLogProbs(nn.Module):
    """`token_logprobs` with fixed temperature / entropy / backend settings."""

    def __init__(
        self,
        temperature: float = 1.0,
        return_entropy: bool = False,
        ignore_index: int = -100,
        backend: str = "auto",
        validate: bool = True,
    ) -> None:
        super().__init__()
        self.temperature, self.return_entropy, self.ignore_index = temperature, return_entropy, ignore_index
        self.backend, self.validate = backend, validate

    def forward(self, logits: torch.Tensor, labels: torch.Tensor):
        return token_logprobs(
            logits, labels, self.temperature, self.return_entropy, self.ignore_index, self.backend, self.validate
        )


class FilteredDualClipLoss(nn.Module):
    """`filtered_dual_clip_loss` with fixed bounds and rollout correction; forward returns (loss, stats).

    `rollout_correction` is resolved once here (a preset name, a `RolloutCorrection` or verl's fields), so a
    bad one fails at construction; forward takes the per-batch tensors (proximal log-probs for a decoupled
    correction, precomputed weights)."""

    def __init__(
        self,
        ratio_low: float = 0.5,
        ratio_high: float = 5.0,
        clip_c: float = 3.0,
        backend: str = "auto",
        validate: bool = True,
        rollout_correction=None,
        mismatch_metrics: bool = True,
    ) -> None:
        super().__init__()
        _checks.check_loss_bounds(ratio_low, ratio_high, clip_c)
        self.ratio_low, self.ratio_high, self.clip_c = ratio_low, ratio_high, clip_c
        self.backend, self.validate = backend, validate
        self.rollout_correction = resolve(rollout_correction)
        self.mismatch_metrics = mismatch_metrics

    def forward(
        self,
        logprobs,
        behavior_logprobs,
        advantages,
        model_mask,
        num_model_tokens=None,
        proximal_logprobs=None,
        rollout_is_weights=None,
    ):
        return filtered_dual_clip_loss(
            logprobs,
            behavior_logprobs,
            advantages,
            model_mask,
            self.ratio_low,
            self.ratio_high,
            self.clip_c,
            num_model_tokens,
            self.backend,
            self.validate,
            proximal_logprobs=proximal_logprobs,
            rollout_correction=self.rollout_correction,
            rollout_is_weights=rollout_is_weights,
            mismatch_metrics=self.mismatch_metrics,
        )


class FusedLinearPolicyLoss(nn.Module):
    """`fused_linear_policy_loss` with fixed settings (rollout correction included, resolved once); pass the
    LM head's weight (and bias) and the per-batch tensors to forward."""

    def __init__(
        self,
        temperature: float = 1.0,
        ratio_low: float = 0.5,
        ratio_high: float = 5.0,
        clip_c: float = 3.0,
        chunk_size: int | None = None,
        backend: str = "auto",
        validate: bool = True,
        rollout_correction=None,
        mismatch_metrics: bool = True,
    ) -> None:
        super().__init__()
        _checks.check_loss_bounds(ratio_low, ratio_high, clip_c)
        self.temperature, self.ratio_low, self.ratio_high, self.clip_c = temperature, ratio_low, ratio_high, clip_c
        self.chunk_size, self.backend, self.validate = chunk_size, backend, validate
        self.rollout_correction = resolve(rollout_correction)
        self.mismatch_metrics = mismatch_metrics

    def forward(
        self,
        hidden,
        weight,
        labels,
        behavior_logprobs,
        advantages,
        model_mask,
        bias=None,
        num_model_tokens=None,
        proximal_logprobs=None,
        rollout_is_weights=None,
        cu_seqlens=None,
    ):
        return fused_linear_policy_loss(
            hidden,
            weight,
            labels,
            behavior_logprobs,
            advantages,
            model_mask,
            bias=bias,
            temperature=self.temperature,
            ratio_low=self.ratio_low,
            ratio_high=self.ratio_high,
            clip_c=self.clip_c,
            num_model_tokens=num_model_tokens,
            chunk_size=self.chunk_size,
            backend=self.backend,
            validate=self.validate,
            proximal_logprobs=proximal_logprobs,
            rollout_correction=self.rollout_correction,
            rollout_is_weights=rollout_is_weights,
            cu_seqlens=cu_seqlens,
            mismatch_metrics=self.mismatch_metrics,
        )
