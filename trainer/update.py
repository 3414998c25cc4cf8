"""`PolicyUpdate`: one training step's policy update - the fused filtered dual-clip loss (eq. 18-19) over the
step's rollouts, in `optim.minibatches` minibatches and `optim.epochs` optimizer steps, with the entropy bonus
(`loss.entropy_coef`, or TRL's adaptive coefficient: `loss.adaptive_entropy`), the reading prior's retention
term (`loss.reading_retention`) and the rollout correction (`loss.rollout_correction`).

Tensors: the batch is `[B, T]` (B rollouts of this process, T their padded length); the loss runs on the
hidden states `[B * (T - 1), H]` and the LM head restricted to the action space (`[K, H]`), one chunk of
logits at a time, never the `[N, V]` logits. An episode ended by its counterpart's failure gets no loss.
Under DeepSpeed every process updates on its own block of rollouts with the step's global token count as
the loss's denominator, so the mean over processes is the whole batch's update.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from rwcore.kernels import fused_linear_entropy, fused_linear_logprobs, fused_linear_policy_loss
from rwcore.kernels.rollout_correction import PREFIX as CORRECTION_PREFIX
from rwcore.kernels.rollout_correction import merge_metrics
from rwcore.trainer.config import Config, loss_settings, rollout_correction
from rwcore.trainer.entropy_control import AdaptiveEntropyControl
from rwcore.trainer.rollout import Rollout, batch_tensors


class PolicyUpdate:
    """The policy update of `rw train`: `update(rollouts, advantages, step)` runs it on the engine and returns
    its figures for the step's metrics row (rwcore.trainer.metrics: `loss`, `grad_norm`, the loss kernel's
    token fractions, the mismatch metrics `rollout_corr/*`, and `entropy`, `reading_retention_loss`,
    `entropy_coef` where their settings are on).

    `entropy_control`: loss.adaptive_entropy's controller (None when off); its state goes into checkpoints.
    `retention`: loss.reading_retention's corpus batches (rwcore.trainer.prior.retention), None when off."""

    def __init__(self, config: Config, policy, engine, device: torch.device, retention=None) -> None:
        self.config = config
        self.policy = policy
        self.engine = engine
        self.device = device
        self.retention = retention
        loss = config.loss
        self.entropy_control = (
            AdaptiveEntropyControl(
                loss.entropy_coef,
                loss.entropy_target,
                loss.entropy_coef_delta,
                loss.entropy_coef_min,
                loss.entropy_coef_max,
            )
            if loss.adaptive_entropy
            else None
        )

    def update(self, rollouts: Sequence[Rollout], advantages: np.ndarray, step: int) -> dict:
        """One step's update on this process's `rollouts` with their `advantages` (float [B], one per rollout);
        `step`: the 0-based step index (it picks loss.reading_retention's corpus batch)."""
        cfg = self.config
        input_ids, attention, generated = batch_tensors(rollouts, self.policy.codec.pad_id, self.device)
        behavior = torch.nn.utils.rnn.pad_sequence([r.behavior_logprobs for r in rollouts], batch_first=True).to(
            self.device
        )
        _, labels = self.policy.action_space(input_ids[:, 1:])
        mask = generated[:, 1:] & (attention[:, 1:] != 0)
        # an episode ended by its counterpart's failure (Trajectory.partner_failure) gets no loss at all
        partner = torch.tensor(
            [bool(r.trajectory.partner_failure) for r in rollouts], dtype=torch.bool, device=mask.device
        )
        mask = mask & ~partner[:, None]
        adv = torch.as_tensor(np.asarray(advantages), dtype=torch.float32, device=self.device)[:, None].expand_as(
            labels
        )
        total_tokens = self.engine.tokens_denominator(self.engine.all_sum_tensor(mask.sum()).clamp_min(1))
        rows = torch.arange(len(rollouts))
        parts = torch.tensor_split(rows, cfg.optim.minibatches)
        correction = rollout_correction(cfg)
        # the decoupled form's proximal policy: the training model before this update, one no-grad pass
        proximal = (
            self._proximal_logprobs(input_ids, attention, labels, parts)
            if correction and not correction.bypass
            else None
        )
        stats_sum: dict[str, float] = {}
        mismatch: list[dict] = []
        loss_value = retention_value = 0.0
        # loss.adaptive_entropy: TRL's controller; each optimizer step applies the coefficient of the previous one
        control = self.entropy_control
        applied: list[float] = []
        for epoch in range(cfg.optim.epochs):
            self.engine.zero_grad()
            entropy_coef = cfg.loss.entropy_coef if control is None else control.applied()
            applied.append(entropy_coef)
            measured = [0.0, 0.0]  # the optimizer step's entropy sum and model tokens (adaptive_entropy)
            for part in parts:
                # the (restricted) head is taken afresh for every backward pass: a slice of the weight made
                # once would hold a freed graph after the first minibatch and stale values after a step
                head_weight, head_bias = self._action_head(input_ids)
                hidden = self.policy.hidden_states(input_ids[part], attention[part])[:, :-1]
                hidden = hidden.reshape(-1, hidden.shape[-1])
                loss, stats = fused_linear_policy_loss(
                    hidden,
                    head_weight,
                    labels[part].reshape(-1),
                    behavior[part, 1:].reshape(-1),
                    adv[part].reshape(-1),
                    mask[part].reshape(-1),
                    bias=head_bias,
                    temperature=cfg.rollout.temperature,
                    **loss_settings(cfg).to_dict(),  # ratio_low, ratio_high, clip_c, ...: every declared one
                    num_model_tokens=total_tokens,
                    backend=cfg.loss.backend,
                    validate=False,
                    proximal_logprobs=None if proximal is None else proximal[part].reshape(-1),
                    rollout_correction=correction,
                    cu_seqlens=torch.arange(len(part) + 1) * labels.shape[1],  # on the CPU: no device sync
                    mismatch_metrics=epoch == 0,
                )
                if epoch == 0:
                    # the mismatch before any update of this step (decoupled: proximal vs behavior, else the
                    # current policy's), one dict per minibatch, merged below
                    mismatch.append({k: stats.pop(k) for k in [k for k in stats if k.startswith(CORRECTION_PREFIX)]})
                if entropy_coef > 0:
                    entropy = self._entropy_sum(hidden, head_weight, head_bias, mask[part].reshape(-1))
                    loss = loss - entropy_coef * entropy / total_tokens
                    stats["entropy"] = entropy.detach() / mask[part].sum().clamp_min(1)  # per model token
                elif control is not None:  # no bonus this step, but the controller measures the entropy
                    with torch.no_grad():
                        entropy = self._entropy_sum(hidden, head_weight, head_bias, mask[part].reshape(-1))
                    stats["entropy"] = entropy / mask[part].sum().clamp_min(1)
                if control is not None:
                    measured[0] += float(entropy.detach())
                    measured[1] += float(mask[part].sum())
                if self.retention is not None and part is parts[0]:
                    # loss.reading_retention: the reading prior's corpus loss, once per optimizer step
                    kept = self.retention.loss(self.policy.model, step)
                    loss = loss + cfg.loss.reading_retention * kept
                    retention_value += float(kept.detach())
                self.engine.accumulate(loss)
                loss_value += float(loss.detach())
                for name, value in stats.items():
                    stats_sum[name] = stats_sum.get(name, 0.0) + float(value) * len(part) / len(rollouts)
            grad_norm = self.engine.step()
            if control is not None:  # the step's mean entropy over every process's model tokens moves the coefficient
                totals = self.engine.all_sum_tensor(torch.tensor(measured, dtype=torch.float64))
                control.update(float(totals[0]), float(totals[1]))
        epochs = max(1, cfg.optim.epochs)
        tokens = [float(mask[part].sum()) for part in parts]
        # Each rank's loss is its share of the step's tokens scaled by the world size, so the mean over ranks is
        # the whole batch's loss; the statistics are each rank's token fractions, averaged.
        figures = self.engine.all_mean(
            {
                "loss": loss_value / epochs,
                **{name: value / epochs for name, value in stats_sum.items()},
                **merge_metrics(mismatch, tokens),
                **({"reading_retention_loss": retention_value / epochs} if self.retention is not None else {}),
            }
        )
        out = {"loss": figures.pop("loss"), "grad_norm": grad_norm, **figures}
        if control is not None:  # the coefficient applied this step (mean over its optimizer steps, optim.epochs)
            out["entropy_coef"] = float(np.mean(applied))
        return out

    def _action_head(self, input_ids: torch.Tensor):
        """(weight [K, H], bias [K] or None) of the LM head restricted to the action space the sampler drew from."""
        weight, _ = self.policy.action_space(input_ids[:0, 1:])
        bias = self.policy.head.bias
        if bias is not None and self.policy.allowed is not None:
            bias = bias[self.policy.allowed]
        return weight, bias

    @torch.no_grad()
    def _proximal_logprobs(self, input_ids, attention, labels, parts) -> torch.Tensor:
        """[B, T - 1] fp32 log-probs of the labels under the training model as it is now (before the update), one
        minibatch at a time through the chunked head (never the [T, V] logits)."""
        out = torch.zeros(labels.shape, dtype=torch.float32, device=self.device)
        head_weight, head_bias = self._action_head(input_ids)
        for part in parts:
            hidden = self.policy.hidden_states(input_ids[part], attention[part])[:, :-1]
            hidden = hidden.reshape(-1, hidden.shape[-1])
            logp = fused_linear_logprobs(
                hidden,
                head_weight,
                labels[part].reshape(-1),
                bias=head_bias,
                temperature=self.config.rollout.temperature,
                backend=self.config.loss.backend,
                validate=False,
            )
            out[part] = logp.reshape(len(part), -1).float()
        return out

    def _entropy_sum(self, hidden: torch.Tensor, weight: torch.Tensor, bias, mask: torch.Tensor) -> torch.Tensor:
        """Sum over model tokens of the policy's entropy at the sampling temperature (fp32, differentiable),
        one chunk of logits at a time (never the [N, V] logits)."""
        entropy = fused_linear_entropy(
            hidden,
            weight,
            bias,
            temperature=self.config.rollout.temperature,
            backend=self.config.loss.backend,
            validate=False,
        )
        return (entropy * mask).sum()
