"""rwcore's loss and task sampler inside `trl.GRPOTrainer` (`RWGRPOMixin`), and TRL's vLLM importance
sampling as a rwcore `RolloutCorrection` (`correction_from_trl_args`).

vLLM importance sampling (`GRPOConfig.use_vllm=True`, `vllm_importance_sampling_correction=True`): TRL
computes `importance_sampling_ratio` in `_generate_and_score_completions` from its
`vllm_importance_sampling_mode` / `_clip_min` / `_clip_max` settings (token_truncate, token_mask,
sequence_truncate, sequence_mask; [B, T] or [B, 1]) and multiplies its own per-token loss by it. The
mixin's `_compute_loss` does the same with the fused loss: the ratio goes in as `rollout_is_weights`
(broadcast to [B, T]), the PPO ratio is anchored at `old_per_token_logps` (the training model's log-probs
at generation time, TRL's anchor), and when vLLM's `sampling_per_token_logps` are there too the fused
loss's train-inference mismatch metrics (old vs sampling; NaN sampling log-probs count as no mismatch,
as in TRL's ratio) are logged as `rw/rollout_corr/*`. Users of the plain functions get the same weights
from `correction_from_trl_args(args)` with `proximal_logprobs=old_per_token_logps` and vLLM's log-probs
as `behavior_logprobs`.
"""

from __future__ import annotations

import logging

from .rewards import RubricRecorder
from .sampler import GroupRepeatSampler

logger = logging.getLogger(__name__)

# TRL's vllm_importance_sampling_mode -> rwcore's (rollout_is level, is_mode)
TRL_IS_MODES = {
    "token_truncate": ("token", "truncate"),
    "token_mask": ("token", "mask"),
    "sequence_truncate": ("sequence", "truncate"),
    "sequence_mask": ("sequence", "mask"),
}
MISMATCH_PREFIX = "rw/"  # the fused loss's rollout_corr/* metrics are logged as rw/rollout_corr/*


def correction_from_trl_args(args):
    """TRL's vLLM importance-sampling settings as a decoupled `rwcore.kernels.RolloutCorrection` (or None).

    Args:
        args: a `trl.GRPOConfig` (or anything with its `vllm_importance_sampling_correction`,
            `vllm_importance_sampling_mode`, `vllm_importance_sampling_clip_min` and
            `vllm_importance_sampling_clip_max` attributes, or a mapping with those keys).

    Returns:
        None when `vllm_importance_sampling_correction` is False (`use_vllm` is not consulted: the caller
        decides it has behaviour log-probs); otherwise the `RolloutCorrection` whose weights
        (`rollout_correction.correction_weights` of log pi_old - log pi_vLLM) are TRL's
        `importance_sampling_ratio`: token_* -> rollout_is="token", sequence_* -> "sequence" (the exp of the
        summed log ratio), *_truncate -> is_mode="truncate" (clamp into [clip_min, clip_max]), *_mask ->
        "mask" (0 outside it); a None bound is open. Use it with `filtered_dual_clip_loss(logprobs,
        sampling_logps, advantages, mask, ..., proximal_logprobs=old_logps, rollout_correction=...)`.

    Differences from TRL's arithmetic, none on realistic inputs: rwcore clamps the (token or summed
    sequence) log ratio into [-20, 20] before exp (TRL does not), so with an open bound a ratio beyond
    e^+-20 is e^+-20; tokens off the mask weigh 0 (TRL: 1; neither enters the loss); vLLM's NaN log-probs
    must be replaced by the proximal ones before the call (TRL zeroes their log-ratio; rwcore's validation
    refuses NaN). A bound <= 0 never acts on a positive ratio and is dropped; truncation with no bound
    left is the raw ratio.
    """
    from collections.abc import Mapping

    from rwcore.kernels.rollout_correction import RolloutCorrection

    def get(name, default=None):
        if isinstance(args, Mapping):
            return args.get(name, default)
        return getattr(args, name, default)

    if not get("vllm_importance_sampling_correction", False):
        return None
    mode = get("vllm_importance_sampling_mode", "sequence_mask")
    if mode not in TRL_IS_MODES:
        raise ValueError(f"vllm_importance_sampling_mode must be one of {sorted(TRL_IS_MODES)}, got {mode!r}")
    level, is_mode = TRL_IS_MODES[mode]
    clip_min, clip_max = get("vllm_importance_sampling_clip_min"), get("vllm_importance_sampling_clip_max")
    for name, value in (("clip_min", clip_min), ("clip_max", clip_max)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value != value):
            raise ValueError(f"vllm_importance_sampling_{name} must be a number or None, got {value!r}")
    if clip_max is not None and clip_max <= 0:
        raise ValueError(
            f"vllm_importance_sampling_clip_max={clip_max} would {'zero' if is_mode == 'truncate' else 'mask'} "
            "every importance ratio (ratios are > 0)"
        )
    lower = float(clip_min) if clip_min is not None and clip_min > 0 else None
    upper = float(clip_max) if clip_max is not None else None
    return RolloutCorrection(rollout_is=level, is_mode=is_mode, is_threshold=upper, is_threshold_lower=lower)


STAT_METRICS = {
    "kept_fraction": "rw/kept_fraction",
    "filtered_low_fraction": "rw/filtered_low_fraction",
    "filtered_high_fraction": "rw/filtered_high_fraction",
    "dual_clipped_fraction": "rw/dual_clipped_fraction",
    "mean_ratio": "rw/mean_ratio",
}


class RWGRPOMixin:
    """rwcore's loss and task sampler for a `trl.GRPOTrainer` subclass (`RWGRPOTrainer` is the ready one).

    Extra keyword arguments (everything else goes to `GRPOTrainer`):
        ratio_low, ratio_high, clip_c, and every other field of `rwcore.kernels.LossSettings`: the filtered
            dual-clip loss's settings (Arise eq. 18-19); defaults and ranges are LossSettings' (Arise's).
        rw_loss: False keeps TRL's own loss (e.g. to ablate the loss while keeping the sampler).
        loss_backend: "auto" | "torch" | "triton" for `filtered_dual_clip_loss`.
        task_sampler: a rwcore sampler; its batch_size must be generation_batch_size // num_generations
            and its group_size num_generations. None keeps TRL's `RepeatSampler`.
        task_id_column: the dataset column with each row's sampler task id [task_id].
        rubric_recorder: the `RubricRecorder` whose verdicts feed the sampler; by default the one of the
            `rubric_reward_funcs` among `reward_funcs`.

    The loss is anchored at TRL's `old_per_token_logps` (at the current policy, ratio 1, on the on-policy
    steps where TRL computes none) and takes TRL's vLLM importance sampling (`use_vllm=True` with
    `vllm_importance_sampling_correction=True`, every `vllm_importance_sampling_mode`): TRL's
    `importance_sampling_ratio` multiplies each token's term, as in TRL's own loss (module docstring).
    Refused with rw_loss=True: importance_sampling_level="sequence", top_entropy_quantile < 1,
    off_policy_mask_threshold, an entropy bonus.
    """

    def __init__(
        self,
        *args,
        rw_loss: bool = True,
        loss_backend: str = "auto",
        task_sampler=None,
        task_id_column: str = "task_id",
        rubric_recorder: RubricRecorder | None = None,
        **kwargs,
    ) -> None:
        from rwcore.kernels._backend import BACKENDS
        from rwcore.kernels.loss_settings import pop_loss_settings

        self.rw_loss_settings = pop_loss_settings(kwargs)  # the loss's keywords; GRPOTrainer gets the rest
        if not isinstance(rw_loss, bool):
            raise ValueError(f"rw_loss must be True or False, got {rw_loss!r}")
        if loss_backend not in BACKENDS:
            raise ValueError(f"loss_backend must be one of {BACKENDS}, got {loss_backend!r}")
        self.rw_loss = rw_loss
        self.rw_loss_backend = loss_backend
        self.rw_task_sampler = task_sampler
        self.rw_task_id_column = task_id_column
        self.rw_batch_sampler = None
        self.rw_feedback_callback = None
        super().__init__(*args, **kwargs)
        if self.rw_loss:
            self._rw_check_loss_support()
        self.rw_recorder = rubric_recorder if rubric_recorder is not None else self._rw_find_recorder()
        if task_sampler is not None:
            self.rw_batch_sampler = self._rw_build_batch_sampler()
            if self.rw_recorder is None:
                from rwcore.sampling.baselines import UniformSampler

                if not isinstance(task_sampler, UniformSampler):  # an adaptive sampler without feedback: refuse
                    raise ValueError(
                        f"task_sampler={type(task_sampler).__name__} adapts to feedback, but reward_funcs hold no "
                        "rubric reward functions (rubric_reward_funcs) and no rubric_recorder= was given: it would "
                        "never get any. Pass one of them, or a UniformSampler"
                    )
            else:
                from .callbacks import callback_class

                callback = callback_class("RubricFeedbackCallback")(
                    self.rw_batch_sampler, self.rw_recorder, group_size=self.num_generations
                )
                self.add_callback(callback)
                self.rw_feedback_callback = callback

    # -- set-up -------------------------------------------------------------

    def _rw_check_loss_support(self) -> None:
        refused = []
        if self.importance_sampling_level != "token":
            refused.append(f"importance_sampling_level={self.importance_sampling_level!r} (the loss is token-level)")
        if self.top_entropy_quantile < 1.0:
            refused.append(f"top_entropy_quantile={self.top_entropy_quantile}")
        if self.off_policy_mask_threshold is not None:
            refused.append(f"off_policy_mask_threshold={self.off_policy_mask_threshold}")
        if getattr(self, "_entropy_bonus_enabled", False):
            refused.append("an entropy bonus (entropy_coef / use_adaptive_entropy)")
        if refused:
            raise ValueError(
                "RWGRPOTrainer's filtered dual-clip loss does not support "
                + "; ".join(refused)
                + ". Pass rw_loss=False to keep TRL's loss, or change these GRPOConfig settings."
            )
        if self.loss_type != "dapo":
            logger.info(
                "RWGRPOTrainer: loss_type=%r is ignored; the filtered dual-clip loss uses TRL's 'dapo' "
                "token normalization",
                self.loss_type,
            )

    def _rw_find_recorder(self):
        found = []
        for func in getattr(self, "reward_funcs", []):
            recorder = getattr(func, "rw_recorder", None)
            if recorder is not None and all(recorder is not r for r in found):
                found.append(recorder)
        if len(found) > 1:
            raise ValueError(
                "reward_funcs hold rubric reward functions with different recorders; "
                "share one (rubric_reward_funcs(..., recorder=...)) or pass rubric_recorder="
            )
        return found[0] if found else None

    def _rw_build_batch_sampler(self):
        from datasets import IterableDataset

        from rwcore.sampling.batch import AdaptiveBatchSampler

        sampler, dataset, column = self.rw_task_sampler, self.train_dataset, self.rw_task_id_column
        if isinstance(dataset, IterableDataset):
            raise ValueError("task_sampler needs a map-style train_dataset (datasets.Dataset), not an IterableDataset")
        if column not in dataset.column_names:
            raise ValueError(
                f"task_id_column {column!r} is not a column of train_dataset (columns: {dataset.column_names})"
            )
        if getattr(self.args, "remove_unused_columns", False):
            raise ValueError(f"remove_unused_columns=True would drop the {column!r} column; set it to False")
        per_round = self.args.generation_batch_size // self.num_generations
        if sampler.group_size != self.num_generations:
            raise ValueError(
                f"task_sampler.group_size ({sampler.group_size}) must equal num_generations ({self.num_generations})"
            )
        if sampler.batch_size != per_round:
            raise ValueError(
                f"task_sampler.batch_size ({sampler.batch_size}) must equal generation_batch_size // num_generations "
                f"({self.args.generation_batch_size} // {self.num_generations} = {per_round})"
            )
        num_batches = max(1, len(sampler.task_ids) // per_round)
        return AdaptiveBatchSampler(sampler, dataset[column], num_batches=num_batches)

    # -- TRL extension points -------------------------------------------------

    def _get_train_sampler(self, dataset=None):
        if self.rw_batch_sampler is None:
            return super()._get_train_sampler(dataset)
        if dataset is not None and len(dataset) != len(self.train_dataset):
            raise ValueError("RWGRPOTrainer's task sampler indexes train_dataset; got another dataset")
        return GroupRepeatSampler(
            self.rw_batch_sampler,
            mini_repeat_count=self.num_generations,
            repeat_count=self.num_iterations * self.args.steps_per_generation,
        )

    # The multimodal inputs some TRL release passes to _get_per_token_logps_and_entropies (the set grew
    # and was renamed across 1.x: pixel_position_ids became image_position_ids, spatial_shapes and
    # num_tiles were added); each release gets the ones its signature names.
    _RW_MODEL_INPUTS = (
        "pixel_values",
        "image_grid_thw",
        "num_images",
        "pixel_attention_mask",
        "spatial_shapes",
        "num_tiles",
        "image_sizes",
        "token_type_ids",
        "mm_token_type_ids",
        "image_position_ids",
        "pixel_position_ids",
    )

    def _rw_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, inputs):
        """TRL's per-token log-probs and entropies (+ MoE aux loss where the release computes it): 3 values."""
        import inspect

        accepted = inspect.signature(self._get_per_token_logps_and_entropies).parameters
        kwargs = {name: inputs.get(name) for name in self._RW_MODEL_INPUTS if name in accepted}
        aux_enabled = getattr(self, "aux_loss_enabled", False)
        if "compute_aux_loss" in accepted:
            kwargs["compute_aux_loss"] = aux_enabled
        out = self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, logits_to_keep, compute_entropy=True, **kwargs
        )
        if isinstance(out, tuple) and len(out) == 3:
            return out
        per_token_logps, entropies = out
        return per_token_logps, entropies, None

    def _rw_denominator(self, inputs, mode: str):
        """TRL's "dapo" normalizer: model tokens of the generation batch per process and accumulation window."""
        normalizer = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
        if mode == "train":
            normalizer = normalizer * self.current_gradient_accumulation_steps / self.args.steps_per_generation
        return normalizer

    def _compute_loss(self, model, inputs):
        if not self.rw_loss:
            return super()._compute_loss(model, inputs)
        import torch

        from rwcore.kernels import filtered_dual_clip_loss
        from rwcore.kernels.policy_loss import STAT_NAMES

        # As GRPOTrainer._compute_loss (TRL 1.16) up to the loss itself.
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        logits_to_keep = completion_ids.size(1)
        mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]
        per_token_logps, entropies, aux_loss = self._rw_logps_and_entropies(
            model, input_ids, attention_mask, logits_to_keep, inputs
        )
        # On-policy steps carry no old_per_token_logps (TRL skips them): the ratio's anchor is the current
        # policy, ratio 1, as in TRL.
        old_per_token_logps = inputs.get("old_per_token_logps")
        anchor = per_token_logps.detach() if old_per_token_logps is None else old_per_token_logps
        mode = "train" if self.model.training else "eval"
        denominator = self._rw_denominator(inputs, mode)
        loss, stats = filtered_dual_clip_loss(
            per_token_logps,
            advantages=inputs["advantages"],
            model_mask=mask,
            num_model_tokens=denominator,
            backend=self.rw_loss_backend,
            **self._rw_correction_inputs(inputs, per_token_logps, anchor),
            **self.rw_loss_settings.to_dict(),
        )

        per_token_kl = None
        if self.beta != 0.0:
            ref_per_token_logps = inputs["ref_per_token_logps"]
            log_ratio_ref = ref_per_token_logps - per_token_logps
            per_token_kl = torch.exp(log_ratio_ref) - log_ratio_ref - 1
            if self.args.use_bias_correction_kl:
                per_token_kl = per_token_kl * torch.exp(per_token_logps - anchor)
            loss = loss + self.beta * (per_token_kl * mask).sum() / denominator
        if getattr(self, "aux_loss_enabled", False) and aux_loss is not None:
            normalizer = self.current_gradient_accumulation_steps if mode == "train" else 1.0
            loss = loss + self.router_aux_loss_coef * aux_loss / normalizer
            self._metrics[mode]["aux_loss"].append(self.accelerator.gather_for_metrics(aux_loss).mean().item())

        # Metrics: token-weighted means over every process, in one reduction.
        with torch.no_grad():
            count = mask.sum().float()
            fmask = mask.float()
            values = [stats[name].float() * count for name in STAT_NAMES]
            values.append((entropies.float() * fmask).sum())
            if per_token_kl is not None:
                values.append((per_token_kl.float() * fmask).sum())
            values.append(count)
            totals = self.accelerator.reduce(torch.stack(values), reduction="sum").tolist()
        total_count = max(totals[-1], 1.0)
        for name, total in zip(STAT_NAMES, totals):
            self._metrics[mode][STAT_METRICS[name]].append(total / total_count)
        self._metrics[mode]["entropy"].append(totals[len(STAT_NAMES)] / total_count)
        if per_token_kl is not None:
            self._metrics[mode]["kl"].append(totals[len(STAT_NAMES) + 1] / total_count)
        self._rw_log_mismatch(stats, count, mode)
        return loss

    def _rw_correction_inputs(self, inputs, per_token_logps, anchor) -> dict:
        """The fused loss's behaviour / proximal / weight arguments from TRL's inputs.

        TRL's `importance_sampling_ratio` ([B, T], or [B, 1] in its sequence modes) multiplies each token's
        term, as TRL's own loss does. With both vLLM's `sampling_per_token_logps` (behaviour) and
        `old_per_token_logps` (proximal) the loss runs in the decoupled form -- the ratio still anchored at the
        old log-probs -- and computes the rollout_corr/* mismatch metrics; otherwise none are computed."""
        import torch

        kwargs = {"behavior_logprobs": anchor, "mismatch_metrics": False}
        ratio = inputs.get("importance_sampling_ratio")
        if ratio is not None:
            kwargs["rollout_is_weights"] = ratio.detach().float().expand(per_token_logps.shape)
        old, sampling = inputs.get("old_per_token_logps"), inputs.get("sampling_per_token_logps")
        if old is not None and sampling is not None:
            # vLLM's NaN log-probs (tokens it could not score): no mismatch there, as TRL's ratio treats them
            behavior = torch.where(torch.isnan(sampling), old.to(sampling.dtype), sampling)
            kwargs.update(behavior_logprobs=behavior, proximal_logprobs=old, mismatch_metrics=True)
        return kwargs

    def _rw_log_mismatch(self, stats, count, mode: str) -> None:
        """The rollout_corr/* metrics as rw/rollout_corr/*: token-weighted means over the processes, min of
        *_min and max of *_max (`rollout_correction.merge_metrics`)."""
        names = sorted(name for name in stats if name.startswith("rollout_corr/"))
        if not names:
            return
        import torch

        from rwcore.kernels.rollout_correction import merge_metrics

        with torch.no_grad():
            local = torch.stack([stats[name].float() for name in names] + [count.float()])
            rows = self.accelerator.gather(local).reshape(-1, len(names) + 1).tolist()
        parts = [dict(zip(names, row[:-1])) for row in rows]
        merged = merge_metrics(parts, [row[-1] for row in rows])
        for name in names:
            self._metrics[mode][MISMATCH_PREFIX + name].append(merged[name])

    def log(self, logs, start_time=None):
        sampler = self.rw_task_sampler
        if sampler is not None and self.model.training and callable(getattr(sampler, "coverage", None)):
            self._metrics["train"]["rw/sampler_coverage"].append(float(sampler.coverage()))
        return super().log(logs, start_time)
