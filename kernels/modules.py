"""`nn.Module` forms of the kernels' functions, for trainers that compose losses as modules."""

from __future__ import annotations

import torch
from torch import nn

from rwcore.kernels.fused_linear_policy_loss import fused_linear_policy_loss
from rwcore.kernels.loss_settings import LOSS_DEFAULTS, loss_setting_names, resolve_loss_settings
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


class _LossSettingsModule(nn.Module):
    """Holds every declared loss setting (`LossSettings`) as an attribute of its own name, resolved and checked at
    construction; `_loss_settings()` passes them (as they are now) to the functional form."""

    def _set_loss_settings(self, **values) -> None:
        for name, value in resolve_loss_settings(**values).to_dict().items():
            setattr(self, name, value)

    def _loss_settings(self) -> dict:
        return {name: getattr(self, name) for name in loss_setting_names()}


class FilteredDualClipLoss(_LossSettingsModule):
    """`filtered_dual_clip_loss` with fixed loss settings and rollout correction; forward returns (loss, stats).

    The loss settings (ratio_low, ratio_high, clip_c and any other `LossSettings` field as a keyword) take their
    defaults and ranges from `rwcore.kernels.loss_settings.LossSettings`. `rollout_correction` is resolved once
    here (a preset name, a `RolloutCorrection` or verl's fields), so a bad one fails at construction; forward
    takes the per-batch tensors (proximal log-probs for a decoupled correction, precomputed weights)."""

    def __init__(
        self,
        ratio_low: float = LOSS_DEFAULTS.ratio_low,
        ratio_high: float = LOSS_DEFAULTS.ratio_high,
        clip_c: float = LOSS_DEFAULTS.clip_c,
        backend: str = "auto",
        validate: bool = True,
        rollout_correction=None,
        mismatch_metrics: bool = True,
        **settings,
    ) -> None:
        super().__init__()
        self._set_loss_settings(ratio_low=ratio_low, ratio_high=ratio_high, clip_c=clip_c, **settings)
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
            num_model_tokens=num_model_tokens,
            backend=self.backend,
            validate=self.validate,
            proximal_logprobs=proximal_logprobs,
            rollout_correction=self.rollout_correction,
            rollout_is_weights=rollout_is_weights,
            mismatch_metrics=self.mismatch_metrics,
            **self._loss_settings(),
        )


class FusedLinearPolicyLoss(_LossSettingsModule):
    """`fused_linear_policy_loss` with fixed settings (the loss settings as in `FilteredDualClipLoss`, rollout
    correction included, resolved once); pass the LM head's weight (and bias) and the per-batch tensors to
    forward."""

    def __init__(
        self,
        temperature: float = 1.0,
        ratio_low: float = LOSS_DEFAULTS.ratio_low,
        ratio_high: float = LOSS_DEFAULTS.ratio_high,
        clip_c: float = LOSS_DEFAULTS.clip_c,
        chunk_size: int | None = None,
        backend: str = "auto",
        validate: bool = True,
        rollout_correction=None,
        mismatch_metrics: bool = True,
        **settings,
    ) -> None:
        super().__init__()
        self._set_loss_settings(ratio_low=ratio_low, ratio_high=ratio_high, clip_c=clip_c, **settings)
        self.temperature = temperature
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
            num_model_tokens=num_model_tokens,
            chunk_size=self.chunk_size,
            backend=self.backend,
            validate=self.validate,
            proximal_logprobs=proximal_logprobs,
            rollout_correction=self.rollout_correction,
            rollout_is_weights=rollout_is_weights,
            cu_seqlens=cu_seqlens,
            mismatch_metrics=self.mismatch_metrics,
            **self._loss_settings(),
        )
