"""rwcore's loss and task sampler inside `trl.GRPOTrainer` (`RWGRPOMixin`)."""

from __future__ import annotations

import logging

from .rewards import RubricRecorder
from .sampler import GroupRepeatSampler

logger = logging.getLogger(__name__)

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
        ratio_low, ratio_high, clip_c: the filtered dual-clip loss (Arise eq. 18-19) [0.5, 5.0, 3.0].
        rw_loss: False keeps TRL's own loss (e.g. to ablate the loss while keeping the sampler).
        loss_backend: "auto" | "torch" | "triton" for `filtered_dual_clip_loss`.
        task_sampler: a rwcore sampler; its batch_size must be generation_batch_size // num_generations
            and its group_size num_generations. None keeps TRL's `RepeatSampler`.
        task_id_column: the dataset column with each row's sampler task id [task_id].
        rubric_recorder: the `RubricRecorder` whose verdicts feed the sampler; by default the one of the
            `rubric_reward_funcs` among `reward_funcs`.
    """

    def __init__(
        self,
        *args,
        ratio_low: float = 0.5,
        ratio_high: float = 5.0,
        clip_c: float = 3.0,
        rw_loss: bool = True,
        loss_backend: str = "auto",
        task_sampler=None,
        task_id_column: str = "task_id",
        rubric_recorder: RubricRecorder | None = None,
        **kwargs,
    ) -> None:
        from rwcore.kernels import _checks
        from rwcore.kernels._backend import BACKENDS

        bounds = _checks.check_loss_bounds(ratio_low, ratio_high, clip_c)
        self.rw_ratio_low, self.rw_ratio_high, self.rw_clip_c = bounds
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
        if self.use_vllm and self.vllm_importance_sampling_correction:
            refused.append(
                "vllm_importance_sampling_correction=True (set it to False: the ratio filter of the "
                "loss handles the behavior/current mismatch)"
            )
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
        # On-policy steps carry no old_per_token_logps (TRL skips them): the behavior policy is the
        # current one, ratio 1, as in TRL.
        old_per_token_logps = inputs.get("old_per_token_logps")
        behavior = per_token_logps.detach() if old_per_token_logps is None else old_per_token_logps
        mode = "train" if self.model.training else "eval"
        denominator = self._rw_denominator(inputs, mode)

        loss, stats = filtered_dual_clip_loss(
            per_token_logps,
            behavior,
            inputs["advantages"],
            mask,
            ratio_low=self.rw_ratio_low,
            ratio_high=self.rw_ratio_high,
            clip_c=self.rw_clip_c,
            num_model_tokens=denominator,
            backend=self.rw_loss_backend,
        )

        per_token_kl = None
        if self.beta != 0.0:
            ref_per_token_logps = inputs["ref_per_token_logps"]
            log_ratio_ref = ref_per_token_logps - per_token_logps
            per_token_kl = torch.exp(log_ratio_ref) - log_ratio_ref - 1
            if self.args.use_bias_correction_kl:
                per_token_kl = per_token_kl * torch.exp(per_token_logps - behavior)
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
        return loss

    def log(self, logs, start_time=None):
        sampler = self.rw_task_sampler
        if sampler is not None and self.model.training and callable(getattr(sampler, "coverage", None)):
            self._metrics["train"]["rw/sampler_coverage"].append(float(sampler.coverage()))
        return super().log(logs, start_time)
