"""Arise's advantages as a verl advantage estimator ("rwcore_arise")."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from rwcore.arise.advantages import compute_advantages, length_regularize
from rwcore.method.settings import MethodSettings, inapplicable_settings

from .config import UID_KEY, VERDICTS_KEY, _get, _plain
from .verdicts import _group_ids, _verdict_matrix, verdicts_from_batch

# The verdicts of the batch being estimated, for trainers whose compute_advantage passes the estimator
# no non_tensor_batch (verl 0.9's V1 trainer passes only uid): set by `verdicts_in_scope`.
_SCOPED_NON_TENSOR: contextvars.ContextVar[Mapping | None] = contextvars.ContextVar(
    "rwcore_verl_non_tensor", default=None
)


@contextlib.contextmanager
def verdicts_in_scope(non_tensor_batch: Mapping):
    """Within the block, `compute_arise_advantage` called without `non_tensor_batch` reads this one.

    `non_tensor_batch` maps keys to one entry per response, in the row order of the batch verl's
    `compute_advantage` will hand the estimator (the V1 trainer fetches both by the same keys).
    """
    token = _SCOPED_NON_TENSOR.set(non_tensor_batch)
    try:
        yield
    finally:
        _SCOPED_NON_TENSOR.reset(token)


# algorithm.rwcore keys that are `MethodSettings` fields: their defaults, ranges and choices are the method's
METHOD_KEYS = (
    "lam",
    "ddof",
    "eps",
    "length_alpha",
    "length_threshold",
    "scale_rewards",
    "aggregation",
    "process_gate",
    "low_outcome",
)
OWN_KEYS = ("verdicts_key", "rubric_order", "length_regularize")  # the estimator's own


@dataclass(frozen=True)
class _AriseSettings:
    """What `compute_arise_advantage` runs with: `method` (a validated `MethodSettings` built from the
    `METHOD_KEYS` given under algorithm.rwcore and verl's norm_adv_by_std_in_grpo), whether `eps` was given
    (else verl's `epsilon` argument), and the estimator's own keys."""

    method: MethodSettings
    eps_given: bool
    verdicts_key: str | None
    rubric_order: list | None
    length_regularize: bool


def _arise_settings(config, norm_adv_by_std_in_grpo: bool = True) -> _AriseSettings:
    """`config` is verl's `algorithm` section: its `rwcore` mapping and `norm_adv_by_std_in_grpo` (False, here
    or as the argument, is scale_rewards="none": centred on the group mean, not divided by its std)."""
    section = _plain(_get(config, "rwcore", None)) or {}
    if not isinstance(section, Mapping):
        raise ValueError(f"algorithm.rwcore must be a mapping, got {type(section).__name__}")
    known = set(METHOD_KEYS) | set(OWN_KEYS)
    unknown = sorted(set(section) - known)
    if unknown:
        raise ValueError(f"algorithm.rwcore has unknown keys {unknown}; valid: {sorted(known)}")
    values = {key: section[key] for key in METHOD_KEYS if section.get(key) is not None}
    if not (norm_adv_by_std_in_grpo and bool(_get(config, "norm_adv_by_std_in_grpo", True))):
        if values.get("scale_rewards", "none") != "none":
            raise ValueError(
                f"algorithm.norm_adv_by_std_in_grpo=False and algorithm.rwcore.scale_rewards="
                f"{values['scale_rewards']!r} disagree: False is scale_rewards='none' (leave one of them out)"
            )
        values["scale_rewards"] = "none"
    try:
        method = MethodSettings(**values)
    except (TypeError, ValueError) as error:
        raise ValueError(f"algorithm.rwcore: {error}") from None
    verdicts_key = section.get("verdicts_key", VERDICTS_KEY)
    verdicts_key = None if verdicts_key in (None, "", "none", "null") else str(verdicts_key)
    # the estimator is Arise's advantages (the "arise" variant's credit), or outcome-only without verdicts
    reasons = {
        "advantage.aggregation": "aggregation: rwcore_arise has no RewardWeaver process reward to combine with "
        "the outcome; leave it at 'sum_then_normalize'",
        "advantage.process_gate": "process_gate: with algorithm.rwcore.verdicts_key=null rwcore_arise has no "
        "process credit to gate; leave it at 'off'",
    }
    inapplicable = inapplicable_settings("arise" if verdicts_key is not None else "outcome_only", method)
    if inapplicable:
        raise ValueError("; ".join(f"algorithm.rwcore.{reasons[key]}" for key in inapplicable))
    order = section.get("rubric_order")
    return _AriseSettings(
        method=method,
        eps_given=section.get("eps") is not None,
        verdicts_key=verdicts_key,
        rubric_order=None if order is None else list(order),
        length_regularize=bool(section.get("length_regularize", True)),  # as AdaptiveMethod.score, always
    )


def compute_arise_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-9,
    norm_adv_by_std_in_grpo: bool = True,
    config=None,
    non_tensor_batch: dict | None = None,
    batch: dict | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Arise's task + rubric advantages (eq. 15-17) as a verl advantage estimator ("rwcore_arise").

    The signature of verl's `compute_gdpo_outcome_advantage` (verl/trainer/ppo/core_algos.py,
    0.7.1-0.9.1); `**kwargs` absorbs what verl's `compute_advantage` passes to other estimators
    (reward_baselines, ...). Returns (advantages, returns), both
    `rwcore.compute_advantages(R, V, groups)[:, None] * response_mask`, like verl's GRPO, where

        R = token_level_rewards.sum(-1)                  (length-regularized when enabled, Arise B.4)
        groups = index (verl's uid per prompt, numbered by first appearance)
        V = the verdicts in non_tensor_batch (`verdicts_from_batch`: [verdicts_key] or [verdicts_key/<rubric>])
            as [N, R]: 1.0 pass, 0.0 fail, invalid or missing (INVALID never pays), NaN for n/a

    Settings come from `config.rwcore` (verl passes `config=algorithm`; add them with
    `+algorithm.rwcore.lam=...` etc.): the `rwcore.method.MethodSettings` fields of `METHOD_KEYS` -- lam, ddof
    (the default is the sample std, like verl's torch.std), eps (default: verl's `epsilon` argument),
    length_alpha, length_threshold, scale_rewards, process_gate (success = R >= low_outcome, before length
    regularization) -- with MethodSettings' defaults and ranges, built into a validated `MethodSettings`
    (aggregation has no process reward to combine here: only its default is accepted); and the estimator's own
    verdicts_key ("rwcore_verdicts"; null for task advantages only), rubric_order (column order for
    sequence-valued verdicts), length_regularize (true, as the method). verl's own `norm_adv_by_std_in_grpo`
    (the argument, or the key of `config`) False is scale_rewards="none", as in verl's GRPO (Dr. GRPO).

    verl's `compute_advantage` passes `non_tensor_batch` only to "gdpo"; `register()` installs a
    forwarder for "rwcore_arise" (or call `apply_arise_advantage` yourself). Without it this raises
    ValueError rather than silently dropping the rubric term.
    """
    settings = _arise_settings(config, norm_adv_by_std_in_grpo)
    method = settings.method
    n = token_level_rewards.shape[0]
    groups = _group_ids(index, n)
    with torch.no_grad():
        scores = token_level_rewards.detach().sum(dim=-1)
        if settings.verdicts_key is None:
            matrix = np.zeros((n, 0))
        else:
            scoped = _SCOPED_NON_TENSOR.get()
            if non_tensor_batch is None and scoped is None:
                raise ValueError(
                    "rwcore_arise got no non_tensor_batch: verl's compute_advantage forwards it only to 'gdpo'. "
                    "On verl 0.9's V1 trainer set trainer.v1.trainer_mode=rwcore_sync; on the legacy trainer call "
                    "rwcore.integrations.verl.register() in the trainer process (it installs a forwarder); or "
                    "set algorithm.rwcore.verdicts_key=null for task advantages only"
                )
            found = None
            if non_tensor_batch is not None:
                found = verdicts_from_batch(non_tensor_batch, n, settings.verdicts_key, settings.rubric_order)
            if found is None and scoped is not None:  # V1: the batch carries only uid, the trainer fetched the rest
                found = verdicts_from_batch(scoped, n, settings.verdicts_key, settings.rubric_order)
            if found is None:
                present = sorted(map(str, non_tensor_batch if non_tensor_batch is not None else scoped))
                raise ValueError(
                    f"non_tensor_batch has no {settings.verdicts_key!r} (nor '{settings.verdicts_key}/<rubric id>' "
                    "keys): return the verdicts from the reward function's extra info, or set "
                    f"algorithm.rwcore.verdicts_key (null: task advantages only); keys present: {present}"
                )
            matrix = _verdict_matrix(found[1])
        successes = (scores >= method.low_outcome).cpu().numpy()  # the task outcome, before length regularization
        if settings.length_regularize:
            lengths = (response_mask != 0).sum(dim=-1)
            scores = length_regularize(
                scores, lengths, groups, alpha=method.length_alpha, threshold=method.length_threshold
            )
        per_response = compute_advantages(
            scores,
            matrix,
            groups,
            lam=method.lam,
            eps=method.eps if settings.eps_given else epsilon,
            ddof=method.ddof,
            scale_rewards=method.scale_rewards,
            process_gate=method.process_gate,
            successes=successes,
        )
        advantages = per_response.unsqueeze(-1) * response_mask
    return advantages, advantages


def _compute_response_mask(data) -> torch.Tensor:
    """verl's compute_response_mask: the attention mask over the response positions."""
    responses = data.batch["responses"]
    return data.batch["attention_mask"][:, -responses.size(1) :]


def apply_arise_advantage(data, config=None, norm_adv_by_std_in_grpo: bool = True):
    """`compute_arise_advantage` on a verl `DataProto` (any object with `.batch` and `.non_tensor_batch`).

    Writes data.batch["advantages"] and data.batch["returns"] (and "response_mask" when missing,
    as verl's compute_advantage does) and returns `data`.
    """
    if "response_mask" not in data.batch.keys():
        data.batch["response_mask"] = _compute_response_mask(data)
    non_tensor = data.non_tensor_batch
    advantages, returns = compute_arise_advantage(
        token_level_rewards=data.batch["token_level_rewards"],
        response_mask=data.batch["response_mask"],
        index=non_tensor.get(UID_KEY),
        norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
        config=config,
        non_tensor_batch=non_tensor,
        batch=data.batch,
    )
    data.batch["advantages"] = advantages
    data.batch["returns"] = returns
    return data
