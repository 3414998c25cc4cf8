"""rwcore inside verl: the filtered dual-clip policy loss, Arise's advantages and the capability sampler.

    # Trainer process (where verl's RayPPOTrainer runs) and every actor worker, e.g. through
    #   data.sampler.class_path=pkg://rwcore.integrations.verl          (trainer process)
    #   actor_rollout_ref.model.external_lib=rwcore.integrations.verl   (workers)
    # the module registers itself when verl is already imported; or call it yourself:
    import rwcore.integrations.verl as rv
    rv.register()   # policy loss "rwcore_filtered_dual_clip", advantage estimator "rwcore_arise"

    actor_rollout_ref.actor.policy_loss.loss_mode=rwcore_filtered_dual_clip
    algorithm.adv_estimator=rwcore_arise
    data.sampler.class_name=RwcoreCurriculumSampler

The pieces (docs/integrations.md has the full configuration):

- `compute_policy_loss_rwcore`: verl's `PolicyLossFn` -- `(old_log_prob, log_prob, advantages,
  response_mask, loss_agg_mode, config, rollout_is_weights) -> (loss, metrics)`, the signature of
  `compute_policy_loss_vanilla` in verl/trainer/ppo/core_algos.py -- delegating to
  `rwcore.kernels.filtered_dual_clip_loss`. A pure function: it needs neither verl nor a GPU.
- `compute_arise_advantage`: an advantage estimator with the signature of verl's adv-estimator
  functions (that of `compute_gdpo_outcome_advantage`, the one built-in estimator that receives
  `non_tensor_batch`), computing `rwcore.compute_advantages` (Arise eq. 15-17) from the summed
  token-level rewards, the group uids and the rubric verdicts, broadcast over `response_mask`.
  `apply_arise_advantage(data, config)` does the same on a `DataProto`.
- `RwcoreCurriculumSampler`: a sampler for verl's curriculum hook (`AbstractCurriculumSampler`:
  `__init__(data_source, data_config)`, `update(batch)`; `state_dict` / `load_state_dict` for
  torchdata's `StatefulDataLoader`) wrapping `rwcore.CapabilitySampler`.
- `register()`: registers the loss (`register_policy_loss`) and the estimator (`register_adv_est`)
  with verl and makes verl's `compute_advantage` forward `non_tensor_batch` to "rwcore_arise" (verl
  forwards it only to "gdpo"). Without verl it raises ImportError saying `pip install verl`.

verl is imported lazily: by `register()`, and by the first access to `RwcoreCurriculumSampler` (to
subclass verl's `AbstractCurriculumSampler` when that exists). Importing this module never imports
verl; when verl is already imported in the process (verl imported this module), the module calls
`register(forward_non_tensor_batch=<verl's trainer module is loaded>)` itself, because verl's Ray
workers can only be told to import a module, not to call a function (set RWCORE_VERL_AUTOREGISTER=0
to turn that off).

Read against verl 0.7.1 (the last release with the curriculum-sampler hook; PyPI wheel sha256
0f7fb1dd...) and verl 0.9.1 (sha256 db6e6f2a...), whose `PolicyLossFn`, vanilla loss,
`register_policy_loss` and `register_adv_est` are the same (0.9.1's `agg_loss` adds "token-sum");
not run against a real verl here (it needs a CUDA stack). verl 0.8+ removed `verl.experimental.dataset.sampler` and the trainer's
`sampler.update(batch)` call: there the sampler is a plain stateful sampler whose `update` you call.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import math
import os
import sys
import warnings
from collections.abc import Hashable, Mapping, Sequence
from enum import Enum
from typing import Any, NamedTuple, Optional

import numpy as np
import torch

from rwcore.advantages import compute_advantages, length_regularize
from rwcore.kernels import filtered_dual_clip_loss
from rwcore.verdict import Verdict

__all__ = [
    "ADV_ESTIMATOR_NAME",
    "LOSS_AGG_MODES",
    "POLICY_LOSS_NAME",
    "LossParams",
    "RwcoreCurriculumSampler",
    "aggregation",
    "apply_arise_advantage",
    "compute_arise_advantage",
    "compute_policy_loss_rwcore",
    "install_advantage_forwarding",
    "loss_params_from_config",
    "register",
    "verdict_table",
    "verdicts_from_batch",
]

POLICY_LOSS_NAME = "rwcore_filtered_dual_clip"
ADV_ESTIMATOR_NAME = "rwcore_arise"
TESTED_VERL_VERSIONS = ("0.7.1", "0.9.1")

# verl's agg_loss modes (verl/trainer/ppo/core_algos.py; ActorConfig.__post_init__ lists the same).
LOSS_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")

# non_tensor_batch keys (all configurable, see RwcoreCurriculumSampler and compute_arise_advantage).
UID_KEY = "uid"                      # verl's group id: one uuid per prompt, shared by its rollout.n responses
TASK_ID_KEY = "rwcore_task_id"       # dataset column (or key of the extra_info column): the task id
TAGS_KEY = "rwcore_tags"             # dataset column (or extra_info key): task-type tags; default data_source
VERDICTS_KEY = "rwcore_verdicts"     # reward extra info: per response {rubric id: verdict}
OUTCOME_KEY = "rwcore_outcome"       # reward extra info (optional): per response outcome in [0, 1]

# verl's seq-mean-token-mean divides each sequence's token sum by (count + 1e-8).
_SEQ_MEAN_EPS = 1e-8
_LOG_RATIO_CLAMP = 20.0  # verl's clamp of log_prob - old_log_prob (ours is the same: LOG_RATIO_BOUND)


def _get(config, key: str, default=None):
    """`config[key]` for a mapping (dict, DictConfig, verl's BaseConfig), else an attribute; default if absent/None."""
    if config is None:
        return default
    if isinstance(config, Mapping):
        value = config.get(key, default)
    else:
        value = getattr(config, key, default)
    return default if value is None else value


def _plain(value):
    """An OmegaConf container as plain Python; anything else unchanged."""
    module = sys.modules.get("omegaconf")
    if module is not None and module.OmegaConf.is_config(value):
        return module.OmegaConf.to_container(value, resolve=True)
    return value


def _require(module_name: str):
    try:
        return importlib.import_module(module_name)
    except ImportError as error:
        raise ImportError(
            f"rwcore.integrations.verl needs verl for this: pip install verl (read against verl "
            f"{' and '.join(TESTED_VERL_VERSIONS)}). Import of {module_name} failed: {error}"
        ) from error


# --------------------------------------------------------------------------- policy loss


class LossParams(NamedTuple):
    """rwcore loss settings derived from a verl actor config."""

    ratio_low: float
    ratio_high: float
    clip_c: float


def loss_params_from_config(config) -> LossParams:
    """verl's actor clip settings -> (ratio_low, ratio_high, clip_c) of the filtered dual-clip loss.

    ratio_low = max(0, 1 - clip_ratio_low), ratio_high = 1 + clip_ratio_high, clip_c = clip_ratio_c,
    with verl's rules: clip_ratio_low / clip_ratio_high default to clip_ratio (0.2), clip_ratio_c to
    3.0. verl *clips* the ratio to [1 - clip_ratio_low, 1 + clip_ratio_high]; rwcore *drops* tokens
    whose ratio leaves (ratio_low, ratio_high). Arise's (0.5, 5.0) filter is clip_ratio_low=0.5,
    clip_ratio_high=4.0.
    """
    clip_ratio = _get(config, "clip_ratio", 0.2)
    low = _get(config, "clip_ratio_low", clip_ratio)
    high = _get(config, "clip_ratio_high", clip_ratio)
    clip_c = _get(config, "clip_ratio_c", 3.0)
    try:
        low, high, clip_c = float(low), float(high), float(clip_c)
    except (TypeError, ValueError):
        raise ValueError(f"verl actor config: clip_ratio_low={low!r}, clip_ratio_high={high!r}, "
                         f"clip_ratio_c={clip_c!r} must be numbers") from None
    ratio_low, ratio_high = max(0.0, 1.0 - low), 1.0 + high
    if not (math.isfinite(low) and math.isfinite(high) and ratio_low < ratio_high):
        raise ValueError(f"verl actor config: clip_ratio_low={low!r}, clip_ratio_high={high!r} give the empty "
                         f"ratio filter ({ratio_low}, {ratio_high})")
    if not (clip_c > 1.0 and math.isfinite(clip_c)):
        raise ValueError(f"verl actor config: clip_ratio_c must be a finite number > 1 (dual clip), got {clip_c!r}")
    return LossParams(ratio_low, ratio_high, clip_c)


def _global_batch_info(config) -> dict:
    """verl's `config.global_batch_info` (dp_size, batch_num_tokens, global_batch_size, loss_scale_factor)."""
    info = _plain(_get(config, "global_batch_info", None)) or {}
    out = {
        "dp_size": info.get("dp_size", 1) if isinstance(info, Mapping) else 1,
        "batch_num_tokens": info.get("batch_num_tokens") if isinstance(info, Mapping) else None,
        "global_batch_size": info.get("global_batch_size") if isinstance(info, Mapping) else None,
        "loss_scale_factor": info.get("loss_scale_factor") if isinstance(info, Mapping) else None,
    }
    if out["loss_scale_factor"] is None:
        out["loss_scale_factor"] = _get(config, "loss_scale_factor", None)
    if out["dp_size"] is None:
        out["dp_size"] = 1
    return out


def _scalar(value, device) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach().to(device=device, dtype=torch.float32).reshape(())
    return torch.tensor(float(value), dtype=torch.float32, device=device)


def aggregation(response_mask: torch.Tensor, loss_agg_mode: str, dp_size=1, batch_num_tokens=None,
                global_batch_size=None, loss_scale_factor=None):
    """verl's `agg_loss` as (per-sequence advantage scale [B] or None, denominator D, 0-dim tensor).

    rwcore's loss is sum(kept token terms) / D, and each token term min(-w A, c |A|) is positively
    homogeneous in A, so verl's per-sequence weights fold into the advantages:

        token-mean               D = batch_num_tokens / dp_size  (default: this call's response tokens)
        token-sum                D = 1 / dp_size
        seq-mean-token-sum       D = global_batch_size / dp_size (default: non-empty sequences here)
        seq-mean-token-mean      as seq-mean-token-sum, advantages of sequence b times 1 / (n_b + 1e-8)
        seq-mean-token-sum-norm  as seq-mean-token-sum, D times loss_scale_factor (default: T)

    exactly as verl 0.7.1-0.9.1 aggregate (including their ValueError when a global count is missing
    with dp_size > 1).
    """
    if isinstance(dp_size, bool) or not isinstance(dp_size, (int, np.integer)) or dp_size < 1:
        raise ValueError(f"global_batch_info['dp_size'] must be a positive int, got {dp_size!r}")
    device = response_mask.device
    mask = response_mask != 0
    if loss_agg_mode == "token-mean":
        if batch_num_tokens is None:
            if dp_size > 1:
                raise ValueError("(global) batch_num_tokens is required when dp_size > 1")
            batch_num_tokens = mask.sum()
        return None, _scalar(batch_num_tokens, device) / dp_size
    if loss_agg_mode == "token-sum":
        return None, torch.tensor(1.0 / dp_size, dtype=torch.float32, device=device)
    if loss_agg_mode in ("seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        counts = mask.sum(dim=-1)
        if global_batch_size is None:
            if dp_size > 1:
                raise ValueError("global_batch_size is required when dp_size > 1")
            global_batch_size = (counts > 0).sum()
        denominator = _scalar(global_batch_size, device) / dp_size
        scale = None
        if loss_agg_mode == "seq-mean-token-mean":
            scale = 1.0 / (counts.to(torch.float32) + _SEQ_MEAN_EPS)
        elif loss_agg_mode == "seq-mean-token-sum-norm":
            factor = response_mask.shape[-1] if loss_scale_factor is None else loss_scale_factor
            denominator = denominator * _scalar(factor, device)
        return scale, denominator
    raise ValueError(f"Invalid loss_agg_mode: {loss_agg_mode!r}; verl's modes are {list(LOSS_AGG_MODES)}")


def compute_policy_loss_rwcore(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config=None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Arise's filtered dual-clip loss as a verl policy loss (registered as "rwcore_filtered_dual_clip").

    Same signature, argument meaning and return convention as verl's `compute_policy_loss_vanilla`
    (verl/trainer/ppo/core_algos.py, verl 0.7.1-0.9.1); verl calls it with keywords.

    Semantics, with w = exp(clamp(log_prob - old_log_prob, -20, 20)) as in verl:
        rwcore: keep = response_mask & (1 - clip_ratio_low < w < 1 + clip_ratio_high)
                loss = agg(keep * min(-w A, clip_ratio_c |A|))
        verl vanilla: loss = agg(where(A < 0, min(max(-w A, -clip(w) A), clip_ratio_c |A|), max(-w A, -clip(w) A)))
    Inside the bounds the two are equal (the PPO clip is inactive there and both dual-clip negative
    advantages at clip_ratio_c |A|). Outside them verl clips the ratio -- the token keeps a constant,
    gradient-free contribution on one side and full gradient on the other -- while rwcore drops the
    token from the numerator (no loss, no gradient); it still counts in the denominator. Use wide
    bounds (Arise: clip_ratio_low=0.5, clip_ratio_high=4.0, i.e. the filter (0.5, 5.0)).

    Args:
        old_log_prob, log_prob, advantages, response_mask: [B, T] as verl passes them.
        loss_agg_mode: verl's aggregation; every mode of `LOSS_AGG_MODES` is reproduced exactly,
            with `config.global_batch_info` (dp_size, batch_num_tokens, global_batch_size,
            loss_scale_factor) as verl's `agg_loss` uses it -- see `aggregation`.
        config: verl's ActorConfig (or a DictConfig / dict / object with the same fields):
            clip_ratio, clip_ratio_low, clip_ratio_high, clip_ratio_c, global_batch_info.
            None uses verl's defaults (0.2, 0.2, 3.0: the filter (0.8, 1.2)).
        rollout_is_weights: optional [B, T] non-negative rollout-correction weights; like verl, they
            multiply the per-token losses (folded into the advantages).

    Returns:
        (loss, metrics): metrics holds verl's keys -- "actor/pg_clipfrac" (here: the fraction of
        response tokens filtered out), "actor/ppo_kl" (masked mean of -log ratio, as verl),
        "actor/pg_clipfrac_lower" (fraction dual-clipped, verl's meaning) -- and rwcore's statistics
        under "actor/rwcore/<name>", all Python floats.
    """
    params = loss_params_from_config(config)
    scale, denominator = aggregation(response_mask, loss_agg_mode, **_global_batch_info(config))
    adv = advantages
    if adv.dim() == 1:
        adv = adv.unsqueeze(-1).expand(log_prob.shape)
    if scale is not None:
        adv = adv.to(torch.float32) * scale.unsqueeze(-1)
    if rollout_is_weights is not None:
        if bool((rollout_is_weights < 0).any()):
            raise ValueError("rollout_is_weights must be non-negative")
        adv = adv.to(torch.float32) * rollout_is_weights.detach().to(torch.float32)
    loss, stats = filtered_dual_clip_loss(
        log_prob, old_log_prob, adv.detach(), response_mask, params.ratio_low, params.ratio_high, params.clip_c,
        num_model_tokens=denominator,
    )
    with torch.no_grad():
        mask = (response_mask != 0).to(torch.float32)
        log_ratio = (log_prob.detach().float() - old_log_prob.float()).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
        ppo_kl = (torch.where(mask.bool(), -log_ratio, 0.0) * mask).sum() / (mask.sum() + 1e-8)
        values = torch.stack([
            stats["filtered_low_fraction"] + stats["filtered_high_fraction"], ppo_kl,
            stats["dual_clipped_fraction"], *stats.values(),
        ]).tolist()  # one host sync for all metrics
    names = ["actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower", *(f"actor/rwcore/{k}" for k in stats)]
    return loss, dict(zip(names, values))


# --------------------------------------------------------------------------- verdicts


_VERDICT_STRINGS = {
    "pass": Verdict.PASS, "fail": Verdict.FAIL, "na": Verdict.NA, "n/a": Verdict.NA, "invalid": Verdict.INVALID,
}


def _parse_verdict(value, where: str) -> Verdict:
    """One verdict as a reward function may return it.

    True/False (or exactly 1/0), "pass"/"fail"/"na"/"invalid", a `rwcore.Verdict`, or None / NaN
    for "does not apply" (Verdict.NA).
    """
    if isinstance(value, Verdict):
        return value
    if isinstance(value, (bool, np.bool_)):
        return Verdict.PASS if value else Verdict.FAIL
    if value is None:
        return Verdict.NA
    if isinstance(value, str):
        verdict = _VERDICT_STRINGS.get(value.strip().lower())
        if verdict is not None:
            return verdict
    elif isinstance(value, (int, float, np.integer, np.floating)):
        if value != value:
            return Verdict.NA
        if value == 1:
            return Verdict.PASS
        if value == 0:
            return Verdict.FAIL
    raise ValueError(f"{where}: {value!r} is not a verdict (True/False, 1/0, 'pass'/'fail'/'na'/'invalid', "
                     "a rwcore.Verdict, or None/NaN for not applicable)")


def verdict_table(values, num_rows: int, rubric_order: Sequence[Hashable] | None = None,
                  key: str = VERDICTS_KEY) -> tuple[list, np.ndarray]:
    """Per-response verdicts from `non_tensor_batch[key]` -> (rubric ids, uint8 Verdict codes [N, R]).

    Each row is a mapping {rubric id: verdict} (what a verl reward function returns in its extra
    info), None (no verdicts), or a sequence aligned with `rubric_order`; a whole [N, R] array
    works too. A rubric absent from a row is Verdict.INVALID there (not evaluated: neither evidence
    nor coverage; in the advantages it scores as a FAIL, like every INVALID). Rubric ids are
    `rubric_order` when given (a mapping row may then only use those ids), else in order of first
    appearance (sequence rows: 0..R-1).
    """
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise ValueError(f"non_tensor_batch[{key!r}] must hold one entry per response, got {type(values).__name__}")
    if len(values) != num_rows:
        raise ValueError(f"non_tensor_batch[{key!r}] has {len(values)} entries, expected {num_rows} (one per response)")
    order = list(rubric_order) if rubric_order is not None else None
    column: dict = {rubric_id: i for i, rubric_id in enumerate(order)} if order is not None else {}
    rows: list[dict] = []
    for j, row in enumerate(values):
        where = f"non_tensor_batch[{key!r}][{j}]"
        if row is None:
            rows.append({})
        elif isinstance(row, Mapping):
            parsed = {}
            for rubric_id, value in row.items():
                if rubric_id not in column:
                    if order is not None:
                        raise ValueError(f"{where}: rubric {rubric_id!r} is not in rubric_order {order!r}")
                    column[rubric_id] = len(column)
                parsed[column[rubric_id]] = _parse_verdict(value, f"{where}[{rubric_id!r}]")
            rows.append(parsed)
        elif hasattr(row, "__len__") and not isinstance(row, (str, bytes)):
            if order is None:
                for i in range(len(row)):
                    column.setdefault(i, i)
            elif len(row) != len(order):
                raise ValueError(f"{where} holds {len(row)} verdicts, rubric_order has {len(order)}")
            rows.append({i: _parse_verdict(value, f"{where}[{i}]") for i, value in enumerate(row)})
        else:
            raise ValueError(f"{where} must be a mapping rubric id -> verdict, a sequence of verdicts or None, "
                             f"got {type(row).__name__}")
    ids = order if order is not None else sorted(column, key=column.get)
    codes = np.full((num_rows, len(ids)), int(Verdict.INVALID), dtype=np.uint8)
    for j, parsed in enumerate(rows):
        for i, verdict in parsed.items():
            codes[j, i] = int(verdict)
    return ids, codes


def verdicts_from_batch(non_tensor_batch: Mapping, num_rows: int, key: str = VERDICTS_KEY,
                        rubric_order: Sequence[Hashable] | None = None) -> tuple[list, np.ndarray] | None:
    """The rubric verdicts a verl batch carries -> (rubric ids, Verdict codes [N, R]), or None if it has none.

    Two layouts, both what a verl reward function's extra info becomes in `non_tensor_batch`:
    `non_tensor_batch[key]`, one {rubric id: verdict} per response (see `verdict_table`); or one key
    per rubric, `non_tensor_batch[f"{key}/{rubric id}"]`, one verdict per response (1.0 / 0.0 / NaN
    or None for n/a, booleans or strings) -- plain numbers, which verl's metric code can average.
    """
    if key in non_tensor_batch:
        return verdict_table(non_tensor_batch[key], num_rows, rubric_order, key)
    prefix = key + "/"
    columns = [name for name in non_tensor_batch if isinstance(name, str) and name.startswith(prefix)]
    if not columns:
        return None
    for name in columns:
        if len(non_tensor_batch[name]) != num_rows:
            raise ValueError(f"non_tensor_batch[{name!r}] has {len(non_tensor_batch[name])} entries, "
                             f"expected {num_rows} (one per response)")
    rows = [{name[len(prefix):]: non_tensor_batch[name][j] for name in columns} for j in range(num_rows)]
    return verdict_table(rows, num_rows, rubric_order, prefix + "*")


def _verdict_matrix(codes: np.ndarray) -> np.ndarray:
    """Verdict codes -> compute_advantages' matrix: 1.0 pass, 0.0 fail and INVALID, NaN for NA.

    INVALID (the judge failed; also a rubric absent from a row) scores as a FAIL, so that a policy
    never gains by making its judge fail (`rwcore.judged`); evidence still sees it as INVALID.
    """
    matrix = np.full(codes.shape, np.nan)
    matrix[codes == Verdict.PASS] = 1.0
    matrix[(codes == Verdict.FAIL) | (codes == Verdict.INVALID)] = 0.0
    return matrix


def _group_ids(index, n: int) -> np.ndarray:
    """verl's group ids (uuid strings in an object array) -> int64 ids numbered by first appearance."""
    if index is None:
        raise ValueError("rwcore_arise needs the group ids: verl passes non_tensor_batch['uid'] as `index`")
    values = list(index)
    if len(values) != n:
        raise ValueError(f"index has {len(values)} entries, expected {n} (one per response)")
    numbering: dict = {}
    return np.array([numbering.setdefault(value, len(numbering)) for value in values], dtype=np.int64)


# --------------------------------------------------------------------------- advantage estimator


class _AriseSettings(NamedTuple):
    lam: float
    ddof: int
    eps: float | None
    verdicts_key: str | None
    rubric_order: list | None
    length_regularize: bool
    length_alpha: float
    length_threshold: float


def _arise_settings(config) -> _AriseSettings:
    section = _plain(_get(config, "rwcore", None)) or {}
    if not isinstance(section, Mapping):
        raise ValueError(f"algorithm.rwcore must be a mapping, got {type(section).__name__}")
    known = set(_AriseSettings._fields)
    unknown = sorted(set(section) - known)
    if unknown:
        raise ValueError(f"algorithm.rwcore has unknown keys {unknown}; valid: {sorted(known)}")
    verdicts_key = section.get("verdicts_key", VERDICTS_KEY)
    order = section.get("rubric_order")
    return _AriseSettings(
        lam=float(section.get("lam", 0.3)),
        ddof=int(section.get("ddof", 1)),
        eps=None if section.get("eps") is None else float(section["eps"]),
        verdicts_key=None if verdicts_key in (None, "", "none", "null") else str(verdicts_key),
        rubric_order=None if order is None else list(order),
        length_regularize=bool(section.get("length_regularize", False)),
        length_alpha=float(section.get("length_alpha", 0.5)),
        length_threshold=float(section.get("length_threshold", 16384)),
    )


def compute_arise_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-9,
    norm_adv_by_std_in_grpo: bool = True,
    config=None,
    non_tensor_batch: Optional[dict] = None,
    batch: Optional[dict] = None,
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
    `+algorithm.rwcore.lam=0.3` etc.): lam (0.3), ddof (1, sample std like verl's torch.std), eps
    (default: `epsilon`, 1e-9), verdicts_key ("rwcore_verdicts"; null for task advantages only),
    rubric_order (column order for sequence-valued verdicts), length_regularize (false),
    length_alpha (0.5), length_threshold (16384).

    verl's `compute_advantage` passes `non_tensor_batch` only to "gdpo"; `register()` installs a
    forwarder for "rwcore_arise" (or call `apply_arise_advantage` yourself). Without it this raises
    ValueError rather than silently dropping the rubric term.
    """
    settings = _arise_settings(config)
    if not norm_adv_by_std_in_grpo:
        raise ValueError("rwcore_arise always normalizes by the group standard deviation (Arise eq. 15); "
                         "norm_adv_by_std_in_grpo=False is not supported")
    n = token_level_rewards.shape[0]
    groups = _group_ids(index, n)
    with torch.no_grad():
        scores = token_level_rewards.detach().sum(dim=-1)
        if settings.verdicts_key is None:
            matrix = np.zeros((n, 0))
        else:
            if non_tensor_batch is None:
                raise ValueError(
                    "rwcore_arise got no non_tensor_batch: verl's compute_advantage forwards it only to 'gdpo'. "
                    "Call rwcore.integrations.verl.register() in the trainer process (it installs a forwarder), "
                    "use apply_arise_advantage(data, config), or set algorithm.rwcore.verdicts_key=null for "
                    "task advantages only")
            found = verdicts_from_batch(non_tensor_batch, n, settings.verdicts_key, settings.rubric_order)
            if found is None:
                raise ValueError(
                    f"non_tensor_batch has no {settings.verdicts_key!r} (nor '{settings.verdicts_key}/<rubric id>' "
                    "keys): return the verdicts from the reward function's extra info, or set "
                    f"algorithm.rwcore.verdicts_key (null: task advantages only); keys present: "
                    f"{sorted(map(str, non_tensor_batch))}")
            matrix = _verdict_matrix(found[1])
        if settings.length_regularize:
            lengths = (response_mask != 0).sum(dim=-1)
            scores = length_regularize(scores, lengths, groups, alpha=settings.length_alpha,
                                       threshold=settings.length_threshold)
        eps = epsilon if settings.eps is None else settings.eps
        per_response = compute_advantages(scores, matrix, groups, lam=settings.lam, eps=eps, ddof=settings.ddof)
        advantages = per_response.unsqueeze(-1) * response_mask
    return advantages, advantages


def _compute_response_mask(data) -> torch.Tensor:
    """verl's compute_response_mask: the attention mask over the response positions."""
    responses = data.batch["responses"]
    return data.batch["attention_mask"][:, -responses.size(1):]


def apply_arise_advantage(data, config=None):
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
        config=config,
        non_tensor_batch=non_tensor,
        batch=data.batch,
    )
    data.batch["advantages"] = advantages
    data.batch["returns"] = returns
    return data


# --------------------------------------------------------------------------- registration


def _estimator_name(adv_estimator) -> Any:
    return adv_estimator.value if isinstance(adv_estimator, Enum) else adv_estimator


def _forwarding(original):
    """verl's compute_advantage, with "rwcore_arise" routed to apply_arise_advantage."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def compute_advantage(data, adv_estimator, *args, **kwargs):
        if _estimator_name(adv_estimator) != ADV_ESTIMATOR_NAME:
            return original(data, adv_estimator, *args, **kwargs)
        bound = signature.bind(data, adv_estimator, *args, **kwargs)
        return apply_arise_advantage(data, config=bound.arguments.get("config"))

    compute_advantage.__rwcore_forwarding__ = True
    return compute_advantage


def install_advantage_forwarding() -> list[str]:
    """Makes verl's `compute_advantage` pass `non_tensor_batch` to "rwcore_arise"; returns the patched modules.

    Wraps `compute_advantage` in verl.trainer.ppo.ray_trainer (and verl.trainer.ppo.v1.utils, which
    imports it by name, where it exists); every other estimator goes to verl's function unchanged.
    Idempotent.
    """
    _require("verl.trainer.ppo.ray_trainer")
    patched = []
    for module_name in ("verl.trainer.ppo.ray_trainer", "verl.trainer.ppo.v1.utils"):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        original = getattr(module, "compute_advantage", None)
        if original is None or getattr(original, "__rwcore_forwarding__", False):
            continue
        module.compute_advantage = _forwarding(original)
        patched.append(module_name)
    return patched


def register(*, forward_non_tensor_batch: bool = True) -> None:
    """Registers "rwcore_filtered_dual_clip" (policy loss) and "rwcore_arise" (advantage estimator) with verl.

    Through verl's own `register_policy_loss` and `register_adv_est`; idempotent (re-registering this
    module's functions, e.g. after a reload, replaces them). With `forward_non_tensor_batch` it also
    calls `install_advantage_forwarding()` (that imports verl's trainer module). Call it in every
    process that looks them up: the trainer process (estimator) and the actor workers (loss) --
    importing this module there through verl's `external_lib` / `data.sampler.class_path` does it.

    Raises:
        ImportError: verl is not installed (the message says `pip install verl`).
    """
    core_algos = _require("verl.trainer.ppo.core_algos")
    core_algos.register_policy_loss(POLICY_LOSS_NAME)(compute_policy_loss_rwcore)
    try:
        core_algos.register_adv_est(ADV_ESTIMATOR_NAME)(compute_arise_advantage)
    except ValueError:
        existing = core_algos.ADV_ESTIMATOR_REGISTRY.get(ADV_ESTIMATOR_NAME)
        if getattr(existing, "__qualname__", None) != compute_arise_advantage.__qualname__ or \
                getattr(existing, "__module__", None) != compute_arise_advantage.__module__:
            raise
        core_algos.ADV_ESTIMATOR_REGISTRY[ADV_ESTIMATOR_NAME] = compute_arise_advantage
    if forward_non_tensor_batch:
        install_advantage_forwarding()


# --------------------------------------------------------------------------- curriculum sampler


def _column_names(frame):
    if frame is None:
        return None
    names = getattr(frame, "column_names", None)
    if names is None and hasattr(frame, "columns"):
        names = list(frame.columns)
    return None if names is None else list(names)


def _tag_list(value) -> list:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        return [value]
    return list(value)


def _dataset_tasks(data_source, task_id_key: str, tags_key: str) -> tuple[list, list]:
    """(task id, tags) of every dataset row, from columns (a verl RLHFDataset's `dataframe`) or rows.

    Task id: column `task_id_key`, else key `task_id_key` of the row's `extra_info` dict.
    Tags: column `tags_key`, else that key of `extra_info`, else the row's `data_source`, else "default".
    """
    n = len(data_source)
    frame = getattr(data_source, "dataframe", None)
    names = _column_names(frame)
    if names is not None:
        def field(name):
            return list(frame[name]) if name in names else [None] * n
    else:
        rows = [data_source[i] for i in range(n)]

        def field(name):
            return [row.get(name) if isinstance(row, Mapping) else None for row in rows]
    ids, tags, extras, sources = field(task_id_key), field(tags_key), field("extra_info"), field("data_source")
    if len(ids) != n:
        raise ValueError(f"the dataset's dataframe has {len(ids)} rows but len(dataset) is {n}")
    task_ids, task_tags = [], []
    for i in range(n):
        extra = extras[i] if isinstance(extras[i], Mapping) else {}
        task_id = ids[i] if ids[i] is not None else extra.get(task_id_key)
        if task_id is None:
            raise ValueError(f"dataset row {i} has no task id: add a column {task_id_key!r} (or that key in "
                             "extra_info), or set data.sampler.task_id_key")
        tag = tags[i] if tags[i] is not None else extra.get(tags_key)
        if tag is None:
            tag = sources[i] if sources[i] is not None else "default"
        task_ids.append(task_id.item() if isinstance(task_id, np.generic) else task_id)
        task_tags.append(_tag_list(tag))
    return task_ids, task_tags


def _row_values(non_tensor: Mapping, key: str, n: int, required: bool = True):
    """non_tensor_batch[key], or key of each row's extra_info; None when absent and not required."""
    if key in non_tensor:
        values = list(non_tensor[key])
    elif "extra_info" in non_tensor and all(isinstance(e, Mapping) and key in e for e in non_tensor["extra_info"]):
        values = [e[key] for e in non_tensor["extra_info"]]
    elif required:
        raise ValueError(f"batch.non_tensor_batch has no {key!r} (nor extra_info[{key!r}]); keys: {sorted(non_tensor)}")
    else:
        return None
    if len(values) != n:
        raise ValueError(f"non_tensor_batch[{key!r}] has {len(values)} entries, expected {n}")
    return values


class _CurriculumSamplerImpl:
    """The logic of `RwcoreCurriculumSampler` (see its docstring); the base class is chosen lazily."""

    def __init__(self, data_source, data_config=None, *, sampler=None) -> None:
        from rwcore.data import AdaptiveBatchSampler  # torch.utils.data; imported with the sampler only
        from rwcore.sampling import CapabilitySampler

        settings = _plain(_get(data_config, "sampler", None)) or {}
        if not isinstance(settings, Mapping):
            raise ValueError(f"data.sampler must be a mapping, got {type(settings).__name__}")
        self.uid_key = settings.get("uid_key") or UID_KEY
        self.task_id_key = settings.get("task_id_key") or TASK_ID_KEY
        self.tags_key = settings.get("tags_key") or TAGS_KEY
        self.verdicts_key = settings.get("verdicts_key") or VERDICTS_KEY
        self.outcome_key = settings.get("outcome_key") or OUTCOME_KEY
        order = settings.get("rubric_order")
        self.rubric_order = None if order is None else list(order)
        task_ids, task_tags = _dataset_tasks(data_source, self.task_id_key, self.tags_key)
        loader_batch = _get(data_config, "gen_batch_size", None) or _get(data_config, "train_batch_size", None)
        if sampler is None:
            group_size = settings.get("group_size")
            if group_size is None:
                raise ValueError("data.sampler.group_size is required (responses per prompt): "
                                 "+data.sampler.group_size=${actor_rollout_ref.rollout.n}")
            batch_size = settings.get("batch_size") or loader_batch
            if batch_size is None:
                raise ValueError("data.sampler.batch_size (or data.train_batch_size) is required")
            options = {k: settings[k] for k in ("rho_min", "quota_fraction", "gamma_obs", "gamma_unobs", "capabilities")
                       if settings.get(k) is not None}
            seed = settings.get("seed", _get(data_config, "seed", 0))
            sampler = CapabilitySampler(dict(zip(task_ids, task_tags)), batch_size=int(batch_size),
                                        group_size=int(group_size), seed=int(seed or 0), **options)
            rubrics = settings.get("rubrics")
            if rubrics is None and settings.get("rubrics_file"):
                rubrics = _load_rubrics(settings["rubrics_file"])
            if rubrics:
                sampler.set_rubrics(dict(rubrics))
        if loader_batch is not None and int(loader_batch) != sampler.batch_size:
            raise ValueError(f"the sampler draws batches of {sampler.batch_size} tasks but verl's loader takes "
                             f"{loader_batch} (data.gen_batch_size / train_batch_size): they must agree")
        num_batches = settings.get("num_batches") or max(1, len(task_ids) // sampler.batch_size)
        self._batches = AdaptiveBatchSampler(sampler, task_ids, int(num_batches))
        self.last_update: dict = {}
        self._warned_incomplete = False

    # -- the wrapped pieces ---------------------------------------------------------------

    @property
    def sampler(self):
        """The rwcore task sampler (CapabilitySampler unless one was passed)."""
        return self._batches.sampler

    @property
    def batch_size(self) -> int:
        return self.sampler.batch_size

    @property
    def num_batches(self) -> int:
        return self._batches.num_batches

    @property
    def policy_version(self) -> int:
        return self._batches.policy_version

    def set_rubrics(self, rubrics: Mapping[Hashable, str]) -> None:
        """Replaces the active rubric pool (rubric id -> capability), e.g. from RubricSkillPool."""
        self.sampler.set_rubrics(rubrics)

    # -- torch Sampler ---------------------------------------------------------------------

    def __iter__(self):
        # One rwcore batch of distinct tasks per loader batch, drawn when the loader asks for its
        # first index (verl requires num_workers=0 with a curriculum sampler), so it sees every
        # update() so far.
        for batch in self._batches:
            yield from batch

    def __len__(self) -> int:
        return self.num_batches * self.batch_size

    # -- feedback ---------------------------------------------------------------------------

    def groups_from_batch(self, batch) -> list[tuple]:
        """[(task id, {rubric id: [group_size verdicts]}, outcomes or None)] per complete uid group of `batch`."""
        non_tensor = batch.non_tensor_batch
        uids = non_tensor.get(self.uid_key)
        if uids is None:
            raise ValueError(f"batch.non_tensor_batch has no {self.uid_key!r} (verl's per-prompt group id)")
        n = len(uids)
        task_ids = _row_values(non_tensor, self.task_id_key, n)
        found = verdicts_from_batch(non_tensor, n, self.verdicts_key, self.rubric_order)
        rubric_ids, codes = found if found is not None else ([], np.zeros((n, 0), dtype=np.uint8))
        outcomes = _row_values(non_tensor, self.outcome_key, n, required=False)
        members: dict = {}
        for row, uid in enumerate(uids):
            members.setdefault(uid, []).append(row)
        groups, incomplete = [], 0
        for uid, rows in members.items():
            if len(rows) != self.sampler.group_size:
                incomplete += 1
                continue
            task_set = {task_ids[r] for r in rows}
            if len(task_set) != 1:
                raise ValueError(f"group {uid!r} mixes task ids {sorted(map(repr, task_set))}")
            task_id = task_ids[rows[0]]
            task_id = task_id.item() if isinstance(task_id, np.generic) else task_id
            sub = codes[rows]
            verdicts = {rubric_ids[i]: [Verdict(int(code)) for code in sub[:, i]]
                        for i in range(len(rubric_ids)) if np.any(sub[:, i] != Verdict.INVALID)}
            group_outcomes = None if outcomes is None else [float(outcomes[r]) for r in rows]
            groups.append((task_id, verdicts, group_outcomes))
        if incomplete and not self._warned_incomplete:
            warnings.warn(f"RwcoreCurriculumSampler.update: skipped {incomplete} uid group(s) without exactly "
                          f"group_size={self.sampler.group_size} responses", stacklevel=3)
            self._warned_incomplete = True
        self.last_update = {"groups": len(groups), "skipped_groups": incomplete}
        return groups

    def update(self, batch) -> None:
        """verl's curriculum hook, called once per step after the update with the step's `DataProto`.

        Records every complete uid group (task id from non_tensor_batch[task_id_key], verdicts from
        non_tensor_batch[verdicts_key], outcomes from non_tensor_batch[outcome_key] when present) at
        the current policy version, then advances the version. All groups are checked before any is
        recorded, so a bad batch changes nothing.
        """
        from rwcore.tasks import parse_group, parse_outcomes

        groups = self.groups_from_batch(batch)
        known = set(self.sampler.task_ids)
        pool = self.sampler.rubrics
        for task_id, verdicts, outcomes in groups:
            if task_id not in known:
                raise ValueError(f"task id {task_id!r} is not one of the sampler's tasks")
            parse_group(verdicts, pool, self.sampler.group_size)
            parse_outcomes(outcomes, self.sampler.group_size, required=False)
        for task_id, verdicts, outcomes in groups:
            self._batches.feedback(task_id, verdicts, outcomes=outcomes)
        self._batches.advance_policy()

    # -- checkpointing -----------------------------------------------------------------------

    def state_dict(self) -> dict:
        """Sampler evidence and generator, policy version and position in the pass (picklable)."""
        return {"kind": "RwcoreCurriculumSampler", "format": 1, "batches": self._batches.state_dict()}

    def load_state_dict(self, state: Mapping) -> None:
        """Restores `state_dict()`; the next `iter(self)` continues exactly where the saved one stood."""
        if not isinstance(state, Mapping) or state.get("kind") != "RwcoreCurriculumSampler":
            raise ValueError("state_dict is not a RwcoreCurriculumSampler state")
        if state.get("format") != 1:
            raise ValueError(f"state_dict has format {state.get('format')!r}; this version reads 1")
        self._batches.load_state_dict(state["batches"])


def _load_rubrics(path) -> dict:
    """rubric id -> capability from a JSON or YAML file."""
    import json

    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    if str(path).endswith((".yaml", ".yml")):
        import yaml

        data = yaml.safe_load(text)
    else:
        data = json.loads(text)
    if not isinstance(data, Mapping):
        raise ValueError(f"{path}: expected a mapping rubric id -> capability")
    return dict(data)


_SAMPLER_DOC = """Arise's capability sampler as a verl curriculum sampler (an `AbstractCurriculumSampler` when verl has it).

    data.sampler.class_path=pkg://rwcore.integrations.verl
    data.sampler.class_name=RwcoreCurriculumSampler
    +data.sampler.group_size=${actor_rollout_ref.rollout.n}
    +data.sampler.rubrics={cites-order-id: Verification, no-duplicate-calls: Efficiency}
    data.dataloader_num_workers=0

    verl builds it as `cls(data_source=dataset, data_config=config.data)`; the rwcore settings live in
    `data.sampler`: group_size (required), batch_size (default data.gen_batch_size or
    data.train_batch_size, which it must equal), rubrics (rubric id -> capability) or rubrics_file,
    num_batches per pass (default len(dataset) // batch_size), seed (default data.seed, else 0),
    rho_min, quota_fraction, gamma_obs, gamma_unobs, capabilities, and the key names task_id_key
    ("rwcore_task_id"), tags_key ("rwcore_tags"), verdicts_key ("rwcore_verdicts"), outcome_key
    ("rwcore_outcome"), uid_key ("uid"), rubric_order. `sampler=` passes a ready rwcore sampler
    (CapabilitySampler, OutcomeSampler, UniformSampler) instead, e.g. to RayPPOTrainer(train_sampler=...).

    Dataset rows: each row is one task, its id in column `task_id_key` (or that key of `extra_info`),
    its tags in `tags_key` (default: the row's `data_source`). Batches: verl's loader groups the indices
    this sampler yields into batches of batch_size; each is one `sampler.sample(policy_version)`
    (distinct tasks), drawn when the loader needs it.

    `update(batch)` (verl calls it after each step with the step's DataProto) reads, per response,
    non_tensor_batch["uid"] (group), [task_id_key] (the dataset column, carried by verl), and
    [verdicts_key] -- what the reward function returns as extra info: a mapping {rubric id:
    verdict} per response, verdicts True/False/1.0/0.0/"pass"/"fail"/"na"/"invalid"/None or NaN (n/a);
    a rubric absent from a response counts as not evaluated (Verdict.INVALID); or one key
    f"{verdicts_key}/{rubric id}" per rubric with one verdict per response (see verdicts_from_batch)
    -- then records one group per uid with exactly group_size responses (others are skipped with a
    warning) and advances the policy version.

    `state_dict` / `load_state_dict` make it a torchdata `Stateful`: `StatefulDataLoader` saves it
    with the loader (verl's data.pt) and, on resume, loads it and calls `iter(sampler)` afresh, which
    continues with the next batch, evidence, rubric pool and generator restored. Note that verl 0.7.1's
    fit loop saves the checkpoint *before* it calls `update(batch)` in the same step, so a run resumed
    from step k's checkpoint lacks step k's feedback (and its policy version is one lower) compared
    with the uninterrupted run (the sampler itself resumes exactly from the state it saved).
    """


def _build_sampler_class():
    base = torch.utils.data.Sampler
    if importlib.util.find_spec("verl") is not None:
        try:
            from verl.experimental.dataset.sampler import AbstractCurriculumSampler as base  # verl <= 0.7
        except ImportError:
            pass  # verl >= 0.8 has no curriculum hook: a plain stateful Sampler
    return type("RwcoreCurriculumSampler", (_CurriculumSamplerImpl, base), {
        "__module__": __name__, "__qualname__": "RwcoreCurriculumSampler", "__doc__": _SAMPLER_DOC,
    })


def __getattr__(name: str):
    if name == "RwcoreCurriculumSampler":
        cls = _build_sampler_class()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# verl's Ray workers and its trainer process import modules named in the config (external_lib,
# data.sampler.class_path, VERL_USE_EXTERNAL_MODULES) but call nothing: register when verl is
# already there. Never imports verl by itself.
if "verl" in sys.modules and os.environ.get("RWCORE_VERL_AUTOREGISTER", "1") != "0":
    try:
        register(forward_non_tensor_batch="verl.trainer.ppo.ray_trainer" in sys.modules)
    except Exception as _error:  # pragma: no cover - needs verl
        warnings.warn(f"rwcore.integrations.verl: automatic registration with verl failed ({_error!r}); "
                      "call rwcore.integrations.verl.register()", stacklevel=2)
