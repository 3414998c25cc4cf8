"""rwcore's rollout correction against verl 0.9.1's REAL functions (verl.trainer.ppo.rollout_corr_helper and
verl.trainer.ppo.core_algos, installed as in tests/rwcore/integrations/test_integration_verl.py).

- presets: `RolloutCorrection.preset(name)` is `RolloutCorrection.from_config(RolloutCorrectionConfig.<name>())`
  for every rwcore preset that verl names;
- weights and masks: the per-token weight rwcore puts on the loss (`correction_weights`) is verl's
  `rollout_is_weights * modified_response_mask` from `compute_rollout_correction_and_rejection_mask` (decoupled
  form: old_log_prob = proximal, rollout_log_prob = behaviour), for verl's presets and for IS / RS combinations
  (token / sequence, TIS and IcePop thresholds, every rejection criterion, chained criteria), on random and
  adversarial inputs (log-ratios near +-30, an all-masked sequence, length-1 sequences) in fp32 and bf16;
- metrics: every `rollout_corr/*` key both emit has verl's value;
- loss and gradients, both backends: the decoupled form against verl's `compute_policy_loss_vanilla` with verl's
  weights and mask; bypass ppo_clip against `compute_policy_loss_bypass_mode` (loss_type ppo_clip); bypass
  reinforce against it with loss_type reinforce (same gradient, the loss value differs as documented).

- the drop-in (rwcore.integrations.verl): verl's decoupled mode (its weights and rejected mask through verl's
  `ppo_loss`), and bypass mode end to end: verl's Hydra config, its `apply_bypass_mode` on a real DataProto (rwcore's
  loss_mode kept), the workers' actor config, verl's `get_policy_loss_fn` and `ppo_loss`, against verl's own
  bypass loss; its aggregation over the rejected mask, an all-rejected batch, and a correction it refuses.

Tolerances: fp32 inputs, ~1e-6 relative (the worst errors are summation order in a sum of log-ratios, amplified
by exp). bf16 inputs: both sides get the same bf16 tensors; rwcore computes in fp32, so it is compared tightly
with verl run on those bf16 values upcast to float64, and with bf16 tolerance against verl computing in bf16
itself: the weights on the tokens where verl's bf16 rounding did not flip one of its own threshold decisions,
the loss and gradients with the float64 run's decisions. The metrics of bf16 inputs are compared with verl's on
the same values in fp32 (rwcore accumulates them in fp32).
"""

from __future__ import annotations

import copy
import math
import os

import pytest
import torch
from omegaconf import OmegaConf

try:
    import verl  # (verl >= 0.9 loads rwcore's verl.plugins entry point here)
    import verl.trainer.ppo.core_algos as core_algos
    import verl.trainer.ppo.rollout_corr_helper as rch
    from tensordict import TensorDict
    from verl import DataProto
    from verl.trainer.config.algorithm import RolloutCorrectionConfig
    from verl.utils import tensordict_utils as tu
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import FSDPActorConfig
    from verl.workers.config.actor import PolicyLossConfig
    from verl.workers.utils.losses import ppo_loss
except ImportError as error:  # a clear message, never a skip: CI installs them
    raise ImportError(
        f"these tests need verl 0.9.1 and its CPU-importable dependencies: "
        f"RWCORE_EXTRAS=test,bench,vllm,upstream bash scripts/setup.sh ({error})"
    ) from error

import rwcore.integrations.verl as rv
from rwcore.kernels import filtered_dual_clip_loss
from rwcore.kernels.rollout_correction import PRESETS, RolloutCorrection, correction_weights

assert verl.__version__ == "0.9.1", verl.__version__
# tests/conftest.py runs the Triton kernel in Triton's interpreter on a machine without a GPU
assert torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"

BACKENDS = ("torch", "triton")
KINDS = ("random", "adversarial")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
FIELDS = ("rollout_is", "rollout_is_threshold", "rollout_rs", "rollout_rs_threshold", "bypass_mode", "loss_type")
FP32_RTOL = 2e-6
BF16_RTOL = 2.0**-6  # a few bf16 roundings (eps 2^-8) through exp
LOW, HIGH, CLIP_C = 0.5, 5.0, 3.0  # rwcore's filter = verl's clip_ratio_low=0.5, clip_ratio_high=4.0

# rwcore presets with a verl classmethod of the same name ("off" is verl's `disabled`; decoupled_token_mis and
# decoupled_seq_mis are rwcore's own names)
VERL_PRESETS = [name for name in PRESETS if hasattr(RolloutCorrectionConfig, name)]
assert len(VERL_PRESETS) == len(PRESETS) - 3, sorted(set(PRESETS) - set(VERL_PRESETS))
PPO_CLIP_BYPASS = [
    n
    for n in VERL_PRESETS
    if getattr(RolloutCorrectionConfig, n)().bypass_mode and RolloutCorrection.preset(n).loss_type == "ppo_clip"
]
REINFORCE_BYPASS = [n for n in VERL_PRESETS if RolloutCorrection.preset(n).loss_type == "reinforce"]


def _combo(rollout_is=None, is_threshold=2.0, rollout_rs=None, rs_threshold=None):
    return {
        "rollout_is": rollout_is,
        "rollout_is_threshold": is_threshold,
        "rollout_rs": rollout_rs,
        "rollout_rs_threshold": rs_threshold,
    }


# verl-syntax combinations beyond the presets: both IS levels with TIS and IcePop thresholds, every rejection
# criterion alone (k1 with "lower_upper" and with a single number), chained criteria with one threshold each
# and with one shared threshold.
COMBOS = {
    "token_tis_1.5": _combo("token", 1.5),
    "token_icepop": _combo("token", "0.8_1.25"),
    "seq_tis_3": _combo("sequence", 3.0),
    "seq_icepop": _combo("sequence", "0.2_5.0"),
    "token_k1": _combo(None, 2.0, "token_k1", "0.5_2.0"),
    "token_k1_single": _combo(None, 2.0, "token_k1", 1.5),
    "token_k2": _combo(None, 2.0, "token_k2", 0.1),
    "token_k3": _combo(None, 2.0, "token_k3", 0.05),
    "seq_sum_k1": _combo(None, 2.0, "seq_sum_k1", "0.3_3.0"),
    "seq_sum_k2": _combo(None, 2.0, "seq_sum_k2", 0.5),
    "seq_sum_k3": _combo(None, 2.0, "seq_sum_k3", 0.5),
    "seq_mean_k1": _combo(None, 2.0, "seq_mean_k1", "0.9_1.1"),
    "seq_mean_k2": _combo(None, 2.0, "seq_mean_k2", 0.02),
    "seq_mean_k3": _combo(None, 2.0, "seq_mean_k3", 0.02),
    "seq_max_k2": _combo(None, 2.0, "seq_max_k2", 0.5),
    "seq_max_k3": _combo(None, 2.0, "seq_max_k3", 0.5),
    "token_tis+token_k1,seq_max_k3": _combo("token", 2.0, "token_k1,seq_max_k3", "0.5_2.0,0.3"),
    "seq_icepop+seq_mean_k3,seq_sum_k1,token_k2": _combo(
        "sequence", "0.1_10.0", "seq_mean_k3,seq_sum_k1,token_k2", "0.05,0.2_5.0,0.5"
    ),
    "token_icepop+seq_sum_k2,seq_max_k2 shared": _combo("token", "0.5_2.0", "seq_sum_k2,seq_max_k2", 0.4),
}
SETTINGS = {
    **{f"preset:{name}": name for name in VERL_PRESETS},
    **{f"combo:{name}": combo for name, combo in COMBOS.items()},
}
DECOUPLED_SETTINGS = [key for key in SETTINGS if not key.startswith("preset:bypass")]


def _verl_fields(setting) -> dict:
    """verl's RolloutCorrectionConfig fields of a preset name (from verl's own classmethod) or a combination."""
    if isinstance(setting, str):
        config = getattr(RolloutCorrectionConfig, setting)()
        return {key: getattr(config, key) for key in FIELDS}
    return dict(setting, bypass_mode=False, loss_type="ppo_clip")


def _rwcore_correction(setting) -> RolloutCorrection:
    correction = (
        RolloutCorrection.preset(setting) if isinstance(setting, str) else RolloutCorrection.from_verl(**setting)
    )
    assert correction is not None
    return correction


def _case(kind: str, seed: int, dtype=torch.float32, form: str = "decoupled", B: int = 10, T: int = 12):
    """(behavior, proximal, current, advantages, mask): [B, T] log-probs, prefix masks of varied length.

    The correction's log-ratio (proximal - behavior in the decoupled form, current - behavior in the bypass forms)
    has one scale per sequence, from 1e-4 (passes the geometric rejection at 0.999_1.001) to 2; adversarial adds
    ratios near e^+-30, an all-masked sequence, length-1 sequences and +-30 tokens that cancel in a sequence sum.
    The PPO ratio (current / proximal, decoupled; current / behavior, bypass ppo_clip) stays inside rwcore's
    filter (0.5, 5), away from its edges and from the dual-clip kink at 3, where verl's clip and rwcore's filter
    agree: in bypass ppo_clip the log-ratio is clamped to it (extremes become the filter's edges), and after the
    cast to bf16 a token whose rounded ratio left it gets ratio 1. Padding rows carry garbage.
    """
    g = torch.Generator().manual_seed(seed)
    behavior = -(torch.rand(B, T, generator=g) * 4.0 + 0.05)
    scales = torch.tensor([1e-4, 2e-4, 5e-4, 0.02, 0.05, 0.1, 0.3, 0.6, 1.0, 2.0])[torch.arange(B) % 10]
    log_ratio = torch.randn(B, T, generator=g) * scales[:, None]
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0], lengths[3] = T, 1
    if kind == "adversarial":
        lengths[5] = 0  # an all-masked sequence
        lengths[8] = 1  # a length-1 sequence near e^30
        log_ratio[8, 0] = 29.7
        log_ratio[6, :4] = 30.0 - torch.rand(4, generator=g) * 0.5  # ratios near inf
        log_ratio[7, :] = -30.0 + torch.rand(T, generator=g) * 0.5  # ratios near 0
        log_ratio[9, 0::2], log_ratio[9, 1::2] = 30.0, -30.0  # +-30 that cancel in the sequence sum
        log_ratio[2, 1] = -29.5  # one extreme token in an otherwise tiny sequence
        lengths[2] = max(int(lengths[2]), 2)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    if form == "bypass_ppo_clip":
        log_ratio = _inside_filter(log_ratio)
    # realistic log-probs: the larger of the two policies' log-probs near 0, the other below it
    train = torch.where(log_ratio > 0, -torch.rand(B, T, generator=g) * 0.5, behavior + log_ratio)
    behavior = torch.where(log_ratio > 0, train - log_ratio, behavior)
    padding = torch.randn(B, T, generator=g) * 8.0  # padding rows carry garbage neither side may read
    train = torch.where(mask, train, padding)
    ppo = _inside_filter(torch.empty(B, T).uniform_(math.log(LOW), math.log(HIGH), generator=g))
    current = train if form != "decoupled" else train + ppo
    advantages = torch.randn(B, T, generator=g)
    advantages[1, :3] = -advantages[1, :3].abs() - 0.2  # negative advantages for the dual clip
    behavior, train, current, advantages = (x.to(dtype) for x in (behavior, train, current, advantages))
    if form != "bypass_reinforce":
        anchor = behavior if form == "bypass_ppo_clip" else train
        rounded = current.double() - anchor.double()
        current = torch.where(mask & (_inside_filter(rounded) != rounded), anchor, current)
    return behavior, train, current, advantages, mask


def _inside_filter(log_ratio, margin=0.02):
    """log-ratios moved inside (log 0.5, log 5) by a margin, and off the dual-clip kink at log 3."""
    low, high, kink = math.log(LOW) + margin, math.log(HIGH) - margin, math.log(CLIP_C)
    inside = log_ratio.clamp(low, high)
    return torch.where((inside - kink).abs() < margin, inside - 2 * margin, inside)


def _verl_mask_and_weights(train, behavior, mask, fields):
    """verl's (rollout_is_weights or None, modified_response_mask, metrics), train = old_log_prob."""
    proto, modified, metrics = rch.compute_rollout_correction_and_rejection_mask(
        old_log_prob=train,
        rollout_log_prob=behavior,
        response_mask=mask,
        rollout_is=fields["rollout_is"],
        rollout_is_threshold=fields["rollout_is_threshold"],
        rollout_rs=fields["rollout_rs"],
        rollout_rs_threshold=fields["rollout_rs_threshold"],
    )
    weights = None if proto is None else proto.batch["rollout_is_weights"]
    return weights, modified, metrics


def _verl_loss_weight(train, behavior, mask, fields, applies_weights: bool):
    """The per-token weight verl's loss gives: rollout_is_weights * modified_response_mask (weights only where the
    loss applies them), float64."""
    weights, modified, _ = _verl_mask_and_weights(train, behavior, mask, fields)
    out = modified.to(torch.float64)
    if weights is not None and applies_weights:
        out = out * weights.to(torch.float64)
    return out


def _rwcore_loss_weight(train, behavior, mask, correction):
    B, T = mask.shape
    log_ratio = (train.float() - behavior.float()).flatten()
    seq = torch.arange(B).repeat_interleave(T)
    weight, _ = correction_weights(log_ratio, mask.flatten(), correction, seq, B)
    if weight is None:  # nothing to weight: every model token has weight 1
        weight = mask.flatten().to(torch.float32)
    return weight.reshape(B, T).to(torch.float64)


def _log_weight_magnitude(train, behavior, mask, correction):
    """Per token, the sum of |log-ratio| its importance weight is the exp of (0 without an applied weight)."""
    magnitude = torch.where(mask, (train.double() - behavior.double()).abs().clamp(max=30.0), 0.0)
    if correction.rollout_is is None or not correction.applies_weights:
        return torch.zeros_like(magnitude)
    if correction.rollout_is == "sequence":
        magnitude = magnitude.sum(-1, keepdim=True).expand_as(magnitude)
    return magnitude


WORST: dict[str, tuple[float, float]] = {}  # comparison -> worst (max abs, max rel) error seen (for reports)


def _close(name, ours, ref, rtol, atol):
    ours, ref = ours.detach().double(), ref.detach().double()
    abs_err = (ours - ref).abs()
    rel_err = abs_err / ref.abs().clamp_min(1e-30)
    worst = WORST.get(name, (0.0, 0.0))
    if abs_err.numel():
        WORST[name] = (
            max(worst[0], float(abs_err.max())),
            max(worst[1], float(torch.where(abs_err > 0, rel_err, 0).max())),
        )
    torch.testing.assert_close(ours, ref, rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")


# =============================================================================================
# a. presets
# =============================================================================================


@pytest.mark.parametrize("name", VERL_PRESETS)
def test_preset_equals_verls_classmethod(name):
    verl_config = getattr(RolloutCorrectionConfig, name)()
    assert RolloutCorrection.preset(name) == RolloutCorrection.from_config(verl_config)
    # ... and the same through verl's config as a plain mapping (how a DictConfig arrives)
    assert RolloutCorrection.preset(name) == RolloutCorrection.from_config(
        {key: getattr(verl_config, key) for key in (*FIELDS, "rollout_is_batch_normalize")}
    )


def test_verls_disabled_is_rwcores_off():
    assert RolloutCorrection.preset("off") is None
    assert RolloutCorrection.from_config(RolloutCorrectionConfig.disabled()) is None


def test_batch_normalized_weights_are_refused_naming_the_field():
    config = RolloutCorrectionConfig(rollout_is="token", rollout_is_batch_normalize=True)
    with pytest.raises(ValueError, match="rollout_is_batch_normalize"):
        RolloutCorrection.from_config(config)


# =============================================================================================
# b. weights and masks
# =============================================================================================


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("key", SETTINGS)
def test_loss_weight_equals_verls_weights_times_its_mask(key, kind, dtype):
    setting = SETTINGS[key]
    fields, correction = _verl_fields(setting), _rwcore_correction(setting)
    seed = sum(map(ord, key)) + 7 * KINDS.index(kind)
    # the correction's log-ratio is train - behavior: proximal (decoupled) or current (bypass) log-probs
    behavior, train, _, _, mask = _case(kind, seed, DTYPES[dtype])
    ours = _rwcore_loss_weight(train, behavior, mask, correction)
    assert bool((ours[~mask] == 0).all())
    # same inputs, exact arithmetic: verl on the values rwcore received, in float64
    exact = _verl_loss_weight(train.double(), behavior.double(), mask, fields, correction.applies_weights)
    _close(f"weights/{dtype} vs exact", ours[mask], exact[mask], FP32_RTOL, 0)
    if dtype == "fp32":
        ref = _verl_loss_weight(train, behavior, mask, fields, correction.applies_weights)
        _close("weights/fp32", ours[mask], ref[mask], FP32_RTOL, 0)
        return
    # verl computing in bf16 itself: where its own rounding did not flip a threshold decision, bf16 tolerance
    ref = _verl_loss_weight(train, behavior, mask, fields, correction.applies_weights)
    same_decision = mask & ((ref > 0) == (exact > 0))
    assert same_decision.sum() >= 0.9 * mask.sum()
    assert torch.equal(ours[same_decision] > 0, ref[same_decision] > 0)
    # the weights in log space: verl rounds each log-ratio and the sequence sum to bf16, an error of
    # eps * (|log-ratio| summed over what the weight multiplies) in the log-weight
    both = same_decision & (ours > 0)
    log_error = (ours[both].log() - ref[both].double().log()).abs()
    allowed = BF16_RTOL * (1.0 + _log_weight_magnitude(train, behavior, mask, correction)[both])
    assert bool((log_error <= allowed).all()), float((log_error - allowed).max())
    _close("weights/bf16 vs bf16 (log weight / allowed)", log_error / allowed, torch.zeros_like(log_error), 0, 1)


def test_the_weight_comparison_is_not_vacuous():
    """The settings and inputs above reach every branch: weights truncated and masked, tokens and whole sequences
    rejected and kept."""
    truncated = masked = rejected = kept = 0
    for key, setting in SETTINGS.items():
        correction = _rwcore_correction(setting)
        for kind in KINDS:
            behavior, train, _, _, mask = _case(kind, sum(map(ord, key)) + 7 * KINDS.index(kind))
            weight = _rwcore_loss_weight(train, behavior, mask, correction)[mask]
            if correction.rollout_is is not None and correction.applies_weights:
                hit = weight == correction.is_threshold
                truncated += int(hit.sum()) if correction.is_mode == "truncate" else 0
                masked += int((weight == 0).sum()) if correction.is_mode == "mask" else 0
            if correction.rollout_rs:
                rejected += int((weight == 0).sum())
                kept += int((weight > 0).sum())
    assert min(truncated, masked, rejected, kept) > 20, (truncated, masked, rejected, kept)


# =============================================================================================
# c. metrics
# =============================================================================================

# verl keys rwcore does not emit (verl's extra diagnostics, none of them used by the correction itself):
#   rollout_corr/rollout_is_std, rollout_corr/rollout_is_seq_{mean,std,max,min,max_deviation,fraction_high,
#   fraction_low} (per-sequence means of the weights), rollout_corr/rollout_is_batch_norm_factor (batch
#   normalization, refused by rwcore), and per rejection criterion rollout_corr/rollout_rs_<option>_{mean,max,min,
#   fraction_high,fraction_low,std,seq_mean,seq_std,seq_max,seq_min,seq_max_deviation,seq_fraction_high,
#   seq_fraction_low,masked_fraction,seq_masked_fraction} (rwcore reports the combined rollout_rs_masked_fraction
#   and rollout_rs_seq_masked_fraction only).
# rwcore-only keys: ratio_mean, ratio_min, ratio_max, eff_sample_size (of the raw per-token ratio),
#   masked_fraction, truncated_fraction.
VERL_ONLY = (
    "rollout_is_std",
    "rollout_is_seq_",
    "rollout_is_batch_norm_factor",
)
ALWAYS_SHARED = (
    "kl",
    "k3_kl",
    "chi2_token",
    "chi2_seq",
    "training_ppl",
    "training_log_ppl",
    "rollout_ppl",
    "rollout_log_ppl",
    "log_ppl_diff",
    "log_ppl_abs_diff",
    "log_ppl_diff_max",
    "log_ppl_diff_min",
    "ppl_ratio",
)


def _is_verl_only(key: str, correction: RolloutCorrection) -> bool:
    name = key.removeprefix("rollout_corr/")
    if name.startswith(VERL_ONLY):
        return True
    return any(name.startswith(f"rollout_rs_{option}_") for option in correction.rollout_rs)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("key", DECOUPLED_SETTINGS)
def test_metrics_equal_verls(key, kind, dtype):
    setting = SETTINGS[key]
    fields, correction = _verl_fields(setting), _rwcore_correction(setting)
    behavior, proximal, current, advantages, mask = _case(kind, sum(map(ord, key)) + 3, DTYPES[dtype])
    _, stats = filtered_dual_clip_loss(
        current, behavior, advantages, mask, LOW, HIGH, CLIP_C, proximal_logprobs=proximal, rollout_correction=setting
    )
    ours = {k: float(v) for k, v in stats.items() if k.startswith("rollout_corr/")}
    # rwcore computes in fp32 from the bf16 values it gets; verl likewise on those values (fp32 inputs as given)
    _, _, ref = _verl_mask_and_weights(proximal.float(), behavior.float(), mask, fields)
    shared = sorted(set(ours) & set(ref))
    assert {f"rollout_corr/{name}" for name in ALWAYS_SHARED} <= set(shared)
    if correction.rollout_is is not None:
        assert {"rollout_corr/rollout_is_mean", "rollout_corr/rollout_is_eff_sample_size"} <= set(shared)
    if correction.rollout_rs:
        assert {"rollout_corr/rollout_rs_masked_fraction", "rollout_corr/rollout_rs_seq_masked_fraction"} <= set(shared)
    assert all(_is_verl_only(k, correction) for k in set(ref) - set(ours)), sorted(set(ref) - set(ours))
    for name in shared:
        assert math.isfinite(ours[name]), name
        _close(f"metrics/{dtype}", torch.tensor(ours[name]), torch.tensor(ref[name]), 1e-5, 1e-6)


def test_an_all_masked_batch_gives_finite_zero_metrics_where_verl_raises():
    behavior, proximal, current, advantages, mask = _case("adversarial", 11)
    mask = torch.zeros_like(mask)
    with pytest.raises(ValueError, match="at least one valid token"):
        _verl_mask_and_weights(proximal, behavior, mask, _verl_fields("decoupled_geo_rs_seq_tis"))
    leaf = current.clone().requires_grad_(True)
    loss, stats = filtered_dual_clip_loss(
        leaf,
        behavior,
        advantages,
        mask,
        proximal_logprobs=proximal,
        rollout_correction="decoupled_geo_rs_seq_tis",
    )
    loss.backward()
    assert float(loss.detach()) == 0.0 and bool((leaf.grad == 0).all())
    metrics = {k.removeprefix("rollout_corr/"): float(v) for k, v in stats.items() if k.startswith("rollout_corr/")}
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    # no model token: every figure is 0 (not exp(0) = 1 for the empty sequences' perplexities, nor 0 / eps - 1)
    zeros = metrics
    assert len(zeros) >= 20 and zeros == dict.fromkeys(zeros, 0.0), zeros


# =============================================================================================
# d. loss and gradients
# =============================================================================================


def _actor_config(batch_num_tokens, verl_correction=None):
    """verl's FSDPActorConfig with the filter (0.5, 5) as verl's clip bounds, the dual clip at 3 and the
    denominator in global_batch_info (as verl's ppo_loss fills it)."""
    policy_loss = PolicyLossConfig(loss_mode="bypass_mode" if verl_correction is not None else "vanilla")
    if verl_correction is not None:
        policy_loss = PolicyLossConfig(loss_mode="bypass_mode", rollout_correction=verl_correction)
    config = FSDPActorConfig(
        strategy="fsdp",
        ppo_mini_batch_size=2,
        ppo_micro_batch_size_per_gpu=1,
        rollout_n=1,
        clip_ratio_low=1.0 - LOW,
        clip_ratio_high=HIGH - 1.0,
        clip_ratio_c=CLIP_C,
        policy_loss=policy_loss,
    )
    config.global_batch_info.update(dp_size=1, batch_num_tokens=batch_num_tokens, global_batch_size=None)
    return config


def _ours(current, behavior, advantages, mask, backend, proximal_logprobs=None, **kwargs):
    """rwcore's (loss, d loss / d current, stats) on CPU; the Triton backend runs on the GPU where there is one
    (else in Triton's interpreter)."""
    device = "cuda" if backend == "triton" and torch.cuda.is_available() else "cpu"
    move = lambda x: None if x is None else x.to(device)  # noqa: E731
    leaf = move(current).clone().requires_grad_(True)
    loss, stats = filtered_dual_clip_loss(
        leaf,
        move(behavior),
        move(advantages),
        move(mask),
        LOW,
        HIGH,
        CLIP_C,
        backend=backend,
        proximal_logprobs=move(proximal_logprobs),
        **kwargs,
    )
    loss.backward()
    return loss.detach().cpu(), leaf.grad.cpu(), {k: v.cpu() for k, v in stats.items()}


def _against_verl(name, ours, ours_grad, dtype, compute, compare_loss: bool = True):
    """Compares rwcore's (loss, d loss / d current log-probs) with verl's.

    `compute(cast, decisions)` runs verl on the inputs passed through `cast` and returns (loss, grad, decisions,
    scale): decisions = (rollout_is_weights or None, modified_response_mask) verl computed (or was given), scale
    the mean |loss term| bound sum(|A| w ratio) / D.
    fp32: verl on the same fp32 tensors, ~1e-6 relative.
    bf16: (1) verl on the same bf16 values upcast to float64: rwcore computes in fp32, the loss agrees to fp32
    precision and the gradient to the rounding of rwcore's bf16 output; (2) verl computing in bf16 itself, with the
    decisions of (1) (its own bf16 decisions are compared in the weight test): a few bf16 roundings.
    compare_loss=False compares the gradients only.
    """
    if dtype == "fp32":
        ref, grad, _, scale = compute(lambda x: x, None)
        if compare_loss:
            _close(f"{name}/fp32 loss", ours, ref, FP32_RTOL, 1e-7 * scale)
        _close(f"{name}/fp32 grad", ours_grad, grad, FP32_RTOL, 1e-9)
        return
    ref, grad, (weights, modified), scale = compute(lambda x: x.double(), None)
    if compare_loss:
        _close(f"{name}/bf16 vs exact loss", ours, ref, 1e-5, 1e-6 * scale)
    _close(f"{name}/bf16 vs exact grad", ours_grad, grad, 2.0**-7, 1e-9)
    weights = None if weights is None else weights.to(torch.bfloat16)
    ref, grad, _, _ = compute(lambda x: x, (weights, modified))
    if compare_loss:
        _close(f"{name}/bf16 vs bf16 loss", ours, ref, 0, BF16_RTOL * scale)
    _close(f"{name}/bf16 vs bf16 grad", ours_grad, grad, BF16_RTOL, 1e-6)


def _scale(advantages, weights, modified, ratio_bound=HIGH):
    w = 1.0 if weights is None else weights.detach().double()
    return float((advantages.double().abs() * ratio_bound * w * modified).sum() / modified.numel()) + 1e-12


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("key", DECOUPLED_SETTINGS)
def test_decoupled_loss_equals_verls_vanilla_with_its_weights_and_mask(key, kind, dtype, backend):
    setting = SETTINGS[key]
    fields = _verl_fields(setting)
    behavior, proximal, current, advantages, mask = _case(kind, sum(map(ord, key)) + 5, DTYPES[dtype])
    ours, ours_grad, _ = _ours(
        current, behavior, advantages, mask, backend, proximal_logprobs=proximal, rollout_correction=setting
    )

    def compute(cast, decisions):
        if decisions is None:
            weights, modified, _ = _verl_mask_and_weights(cast(proximal), cast(behavior), mask, fields)
        else:
            weights, modified = decisions
        leaf = cast(current).clone().requires_grad_(True)
        loss, _ = core_algos.compute_policy_loss_vanilla(
            old_log_prob=cast(proximal),
            log_prob=leaf,
            advantages=cast(advantages),
            response_mask=modified,
            loss_agg_mode="token-mean",
            config=_actor_config(int(mask.sum())),
            rollout_is_weights=weights,
        )
        loss.backward()
        return loss.detach(), leaf.grad, (weights, modified), _scale(advantages, weights, modified)

    _against_verl("decoupled", ours, ours_grad, dtype, compute)


def _bypass_compute(preset, behavior, current, advantages, mask):
    """verl's bypass loss: `compute_policy_loss_bypass_mode` itself when it computes the decisions, else the loss
    it dispatches to (vanilla for ppo_clip, reinforce) with the given decisions."""
    verl_correction = getattr(RolloutCorrectionConfig, preset)()
    fields = _verl_fields(preset)
    reinforce = verl_correction.loss_type == "reinforce"

    def compute(cast, decisions):
        leaf = cast(current).clone().requires_grad_(True)
        config = _actor_config(int(mask.sum()), verl_correction)
        if decisions is None:
            weights, modified, _ = _verl_mask_and_weights(cast(current), cast(behavior), mask, fields)
            loss, metrics = core_algos.compute_policy_loss_bypass_mode(
                old_log_prob=cast(behavior),
                log_prob=leaf,
                advantages=cast(advantages),
                response_mask=mask,
                loss_agg_mode="token-mean",
                config=config,
            )
        else:
            weights, modified = decisions
            function = core_algos.compute_policy_loss_reinforce if reinforce else core_algos.compute_policy_loss_vanilla
            first = "rollout_log_prob" if reinforce else "old_log_prob"
            loss, _ = function(
                **{first: cast(behavior)},
                log_prob=leaf,
                advantages=cast(advantages),
                response_mask=modified,
                loss_agg_mode="token-mean",
                config=config,
                rollout_is_weights=weights if reinforce else None,
            )
        loss.backward()
        applied = weights if reinforce else None
        return loss.detach(), leaf.grad, (weights, modified), _scale(advantages, applied, modified)

    return compute


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("preset", PPO_CLIP_BYPASS)
def test_bypass_ppo_clip_equals_verls_bypass_mode(preset, kind, dtype, backend):
    behavior, _, current, advantages, mask = _case(kind, sum(map(ord, preset)) + 9, DTYPES[dtype], "bypass_ppo_clip")
    ours, ours_grad, _ = _ours(current, behavior, advantages, mask, backend, rollout_correction=preset)
    _against_verl(
        "bypass ppo_clip", ours, ours_grad, dtype, _bypass_compute(preset, behavior, current, advantages, mask)
    )


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("preset", REINFORCE_BYPASS)
def test_bypass_reinforce_has_verls_gradient_and_the_documented_loss(preset, kind, dtype, backend):
    """Same gradient as verl's REINFORCE bypass; the loss value is sum(-A w) / D where verl's is
    sum(-A w log pi) / D: rwcore's loss is verl's REINFORCE loss with log pi replaced by 1."""
    # the anchor is the current policy (ratio 1): the log-ratio vs the behaviour policy may be anything
    behavior, _, current, advantages, mask = _case(kind, sum(map(ord, preset)) + 13, DTYPES[dtype], "bypass_reinforce")
    ours, ours_grad, _ = _ours(current, behavior, advantages, mask, backend, rollout_correction=preset)
    compute = _bypass_compute(preset, behavior, current, advantages, mask)
    _against_verl("bypass reinforce", ours, ours_grad, dtype, compute, compare_loss=False)
    cast = (lambda x: x.double()) if dtype == "bf16" else (lambda x: x)  # E731
    verl_loss, _, (weights, modified), scale = compute(cast, None)
    documented, _ = core_algos.compute_policy_loss_reinforce(
        rollout_log_prob=cast(behavior),
        log_prob=torch.ones_like(cast(current)),
        advantages=cast(advantages),
        response_mask=modified,
        loss_agg_mode="token-mean",
        config=_actor_config(int(mask.sum())),
        rollout_is_weights=weights,
    )
    _close("bypass reinforce/documented loss", ours, documented, 1e-5, 1e-7 * scale)
    assert not torch.allclose(ours.double(), verl_loss.double(), rtol=1e-3)  # the values do differ


# =============================================================================================
# The verl drop-in (rwcore.integrations.verl): decoupled weights, bypass mode through verl's own functions
# =============================================================================================


def _through_ppo_loss(config, old, log_prob, advantages, mask, weights=None, batch_num_tokens=None, prompt_len=3):
    """verl's actor loss (`verl.workers.utils.losses.ppo_loss`, what the workers call with their actor config) on
    a padded batch; returns (loss, {name: float}, d loss / d log_prob [B, T])."""
    B, T = old.shape
    leaf = log_prob.detach().clone().requires_grad_(True)
    stream = []
    for b in range(B):
        r = int(mask[b].sum())
        assert bool(mask[b, :r].all()), "verl's response masks are prefixes"
        stream.append(torch.cat([torch.zeros(prompt_len - 1, dtype=leaf.dtype), leaf[b, :r], leaf.new_zeros(1)]))
    data = TensorDict(
        {
            "prompts": torch.zeros(B, prompt_len, dtype=torch.long),
            "responses": torch.zeros(B, T, dtype=torch.long),
            "attention_mask": torch.cat([torch.ones(B, prompt_len, dtype=torch.long), mask.long()], dim=1),
            "response_mask": mask.long(),
            "old_log_probs": old,
            "advantages": advantages,
        },
        batch_size=B,
    )
    if weights is not None:
        data["rollout_is_weights"] = weights
    for key, value in (("dp_size", 1), ("batch_num_tokens", batch_num_tokens), ("global_batch_size", None)):
        tu.assign_non_tensor_data(data, key, value)
    loss, metrics = ppo_loss(config, {"log_probs": torch.cat(stream)}, data)
    loss.backward()
    return loss.detach(), {name: _metric_value(value) for name, value in metrics.items()}, leaf.grad


def _metric_value(value):
    values = getattr(value, "values", None)  # ppo_loss wraps each in a verl.utils.metric.Metric
    if values is not None:
        assert len(values) == 1, values
        value = values[0]
    return float(value.item() if isinstance(value, torch.Tensor) else value)


def _compose(overrides):
    """verl 0.9.1's own trainer config (ppo_trainer.yaml, Hydra) with overrides, resolved as verl's task runner
    resolves it before it starts the workers."""
    from hydra import compose, initialize_config_dir

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        cfg = compose("ppo_trainer", overrides=overrides)
    OmegaConf.resolve(cfg)
    return cfg


def _bypass_overrides(preset):
    """The configuration for rwcore's loss in verl's bypass mode: loss_mode=rwcore_filtered_dual_clip, verl's
    algorithm.rollout_correction (here: a preset's fields), and the same correction in the actor's policy_loss
    (the workers never see what apply_bypass_mode writes in the trainer process)."""

    def hydra(value):
        return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)

    correction = [f"algorithm.rollout_correction.{k}={hydra(v)}" for k, v in _verl_fields(preset).items()]
    return [
        f"actor_rollout_ref.actor.policy_loss.loss_mode={rv.POLICY_LOSS_NAME}",
        "actor_rollout_ref.actor.clip_ratio_low=0.5",
        "actor_rollout_ref.actor.clip_ratio_high=4.0",
        "actor_rollout_ref.actor.clip_ratio_c=3.0",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.rollout.n=1",
        *correction,
        "+actor_rollout_ref.actor.policy_loss.rollout_correction=${algorithm.rollout_correction}",
    ]


def _verls_own_bypass_config(actor_config):
    """The worker's actor config as verl's unpatched apply_bypass_mode would make it: loss_mode "bypass_mode"."""
    reference = copy.deepcopy(actor_config)
    object.__setattr__(reference.policy_loss, "loss_mode", "bypass_mode")
    return reference


@pytest.mark.parametrize("preset", PPO_CLIP_BYPASS + REINFORCE_BYPASS)
def test_bypass_mode_keeps_rwcores_loss_through_verls_own_functions(preset):
    cfg = _compose(_bypass_overrides(preset))
    # the workers' actor config, built when they start (verl's engine worker: omega_conf_to_dataclass)
    worker_config = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    reinforce = RolloutCorrection.preset(preset).loss_type == "reinforce"
    form = "bypass_reinforce" if reinforce else "bypass_ppo_clip"
    behavior, _, current, advantages, mask = _case("random", sum(map(ord, preset)) + 17, torch.float32, form)
    B, T = mask.shape
    # the trainer process: verl's legacy trainer imports apply_bypass_mode from rollout_corr_helper when it
    # calls it (rwcore's registration wrapped it there)
    batch = DataProto.from_dict(
        tensors={
            "rollout_log_probs": behavior,
            "response_mask": mask.long(),
            "advantages": advantages,
            "responses": torch.zeros(B, T, dtype=torch.long),
        }
    )
    from verl.trainer.ppo.rollout_corr_helper import apply_bypass_mode

    assert apply_bypass_mode.__rwcore_keeps_loss__
    apply_bypass_mode(batch, cfg.algorithm.rollout_correction, cfg.actor_rollout_ref.actor.policy_loss)
    assert torch.equal(batch.batch["old_log_probs"], behavior)
    trainer_side = cfg.actor_rollout_ref.actor.policy_loss
    assert trainer_side.loss_mode == rv.POLICY_LOSS_NAME  # verl's would be "bypass_mode"
    assert RolloutCorrection.from_config(trainer_side.rollout_correction) == RolloutCorrection.preset(preset)
    # the workers' loss: verl's registry by the configured name; the trainer-side config agrees with theirs
    assert core_algos.get_policy_loss_fn(worker_config.policy_loss.loss_mode) is rv.compute_policy_loss_rwcore
    assert rv.bypass_correction(worker_config) == RolloutCorrection.preset(preset)
    assert rv.bypass_correction(omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)) == RolloutCorrection.preset(
        preset
    )
    old = batch.batch["old_log_probs"]
    n = int(mask.sum())
    ours, ours_metrics, ours_grad = _through_ppo_loss(worker_config, old, current, advantages, mask, batch_num_tokens=n)
    ref, ref_metrics, ref_grad = _through_ppo_loss(
        _verls_own_bypass_config(worker_config), old, current, advantages, mask, batch_num_tokens=n
    )
    _close("drop-in bypass grad", ours_grad, ref_grad, FP32_RTOL, 1e-9)
    if not reinforce:
        _close("drop-in bypass loss", ours, ref, FP32_RTOL, 1e-8)
    assert float(ref_grad.abs().sum()) > 0  # something is kept
    # verl's rollout_corr/* metrics, current vs rollout log-probs, as Python floats
    shared = sorted(k for k in set(ours_metrics) & set(ref_metrics) if k.startswith("rollout_corr/"))
    assert {f"rollout_corr/{name}" for name in ALWAYS_SHARED} <= set(shared)
    for name in shared:
        _close("drop-in bypass metrics", torch.tensor(ours_metrics[name]), torch.tensor(ref_metrics[name]), 1e-5, 1e-6)
    assert ours_metrics["actor/ppo_kl"] == pytest.approx(ref_metrics["actor/ppo_kl"], abs=1e-6)


def test_verls_apply_bypass_mode_still_switches_every_other_loss():
    from verl.trainer.ppo.rollout_corr_helper import apply_bypass_mode

    behavior = -torch.rand(2, 3)
    batch = DataProto.from_dict(tensors={"rollout_log_probs": behavior})
    policy_loss = OmegaConf.create({"loss_mode": "vanilla"})
    correction = OmegaConf.structured(RolloutCorrectionConfig.bypass_ppo_clip())
    apply_bypass_mode(batch, correction, policy_loss)
    assert policy_loss.loss_mode == "bypass_mode" and policy_loss.rollout_correction.bypass_mode is True
    # idempotent: registering again wraps nothing twice
    from rwcore.integrations.verl import registration

    assert registration.install_bypass_mode_keeping() is False


@pytest.mark.parametrize("agg", rv.LOSS_AGG_MODES)
@pytest.mark.parametrize("preset", ["bypass_ppo_clip_k3_rs", "bypass_pg_geo_rs_token_tis"])
def test_bypass_aggregates_over_the_mask_after_rejection_as_verl(preset, agg):
    """verl's bypass loss aggregates over its rejected mask (seq-mean-token-mean: per-sequence counts after
    token-level rejection; global counts defaulting to the rejected mask); so does rwcore's."""
    verl_correction = getattr(RolloutCorrectionConfig, preset)()
    reinforce = verl_correction.loss_type == "reinforce"
    form = "bypass_reinforce" if reinforce else "bypass_ppo_clip"
    behavior, _, current, advantages, mask = _case("random", len(agg) + 31, torch.float32, form)
    # a token-level rejection on top, so that sequences lose some of their tokens
    fields = dict(_verl_fields(preset))
    fields["rollout_rs"] = f"{fields['rollout_rs']},token_k1"
    band = "0.9999_1.0001" if "geo" in preset else "0.97_1.03"  # inside what the preset's criterion keeps
    fields["rollout_rs_threshold"] = f"{fields['rollout_rs_threshold']},{band}"
    verl_correction = RolloutCorrectionConfig(**fields)
    _, modified, _ = _verl_mask_and_weights(current, behavior, mask, fields)
    kept, total = modified.sum(-1), mask.sum(-1)
    assert bool(((kept > 0) & (kept < total)).any())  # a sequence loses some of its tokens, not all
    config = FSDPActorConfig(
        strategy="fsdp",
        ppo_mini_batch_size=2,
        ppo_micro_batch_size_per_gpu=1,
        rollout_n=1,
        clip_ratio_low=1.0 - LOW,
        clip_ratio_high=HIGH - 1.0,
        clip_ratio_c=CLIP_C,
        loss_agg_mode=agg,
        policy_loss=PolicyLossConfig(loss_mode=rv.POLICY_LOSS_NAME, rollout_correction=verl_correction),
    )
    results = []
    for loss_fn in (rv.compute_policy_loss_rwcore, core_algos.compute_policy_loss_bypass_mode):
        leaf = current.clone().requires_grad_(True)
        loss, metrics = loss_fn(
            old_log_prob=behavior,
            log_prob=leaf,
            advantages=advantages,
            response_mask=mask,
            loss_agg_mode=agg,
            config=config,
        )
        loss.backward()
        results.append((loss.detach(), leaf.grad, metrics))
    (ours, ours_grad, ours_metrics), (ref, ref_grad, ref_metrics) = results
    rejected_part = ref_metrics["rollout_corr/rollout_rs_masked_fraction"]
    assert 0 < rejected_part < 1 and ours_metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(
        rejected_part
    )
    _close("drop-in bypass agg grad", ours_grad, ref_grad, FP32_RTOL, 1e-9)
    if not reinforce:
        _close("drop-in bypass agg loss", ours, ref, FP32_RTOL, 1e-8)
    assert all(isinstance(v, float) for v in ours_metrics.values())


def test_bypass_with_everything_rejected_gives_a_zero_loss_where_verl_gives_nan():
    behavior, _, current, advantages, mask = _case("random", 41, torch.float32, "bypass_ppo_clip")
    current = torch.where(mask, behavior + 0.3, current)  # every sequence outside the geometric band
    config = _actor_config(None, RolloutCorrectionConfig.bypass_ppo_clip_geo_rs())
    config.global_batch_info.clear()
    leaf = current.clone().requires_grad_(True)
    loss, metrics = rv.compute_policy_loss_rwcore(behavior, leaf, advantages, mask, "token-mean", config)
    loss.backward()
    assert float(loss.detach()) == 0.0 and bool((leaf.grad == 0).all())
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == 1.0
    ref, _ = core_algos.compute_policy_loss_bypass_mode(behavior, current, advantages, mask, "token-mean", config)
    assert math.isnan(float(ref))


def test_decoupled_mode_passes_verls_weights_and_mask_and_adds_no_mismatch_metrics():
    """verl's decoupled mode: the trainer's weights (rollout_is_weights) and rejected mask go to the loss; the
    actor's default policy_loss.rollout_correction (bypass_mode false) is ignored; verl logs the rollout_corr/*
    metrics itself."""
    behavior, proximal, current, advantages, mask = _case("adversarial", 43)
    weights, modified, _ = _verl_mask_and_weights(proximal, behavior, mask, _verl_fields("decoupled_geo_rs_token_tis"))
    worker_config = omega_conf_to_dataclass(
        _compose(
            [
                f"actor_rollout_ref.actor.policy_loss.loss_mode={rv.POLICY_LOSS_NAME}",
                "actor_rollout_ref.actor.clip_ratio_low=0.5",
                "actor_rollout_ref.actor.clip_ratio_high=4.0",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
                "actor_rollout_ref.rollout.n=1",
            ]
        ).actor_rollout_ref.actor
    )
    assert worker_config.policy_loss.rollout_correction.bypass_mode is False
    assert rv.bypass_correction(worker_config) is None
    n = int(mask.sum())
    ours, ours_metrics, ours_grad = _through_ppo_loss(
        worker_config, proximal, current, advantages, modified.bool(), weights=weights, batch_num_tokens=n
    )
    vanilla = copy.deepcopy(worker_config)
    object.__setattr__(vanilla.policy_loss, "loss_mode", "vanilla")
    ref, _, ref_grad = _through_ppo_loss(
        vanilla, proximal, current, advantages, modified.bool(), weights=weights, batch_num_tokens=n
    )
    _close("drop-in decoupled loss", ours, ref, FP32_RTOL, 1e-8)
    _close("drop-in decoupled grad", ours_grad, ref_grad, FP32_RTOL, 1e-9)
    assert not any(k.startswith("rollout_corr/") for k in ours_metrics)


def test_a_bypass_correction_rwcore_cannot_reproduce_is_refused_naming_the_field():
    behavior, _, current, advantages, mask = _case("random", 47, torch.float32, "bypass_ppo_clip")
    bad = RolloutCorrectionConfig(rollout_is="token", bypass_mode=True, rollout_is_batch_normalize=True)
    config = _actor_config(int(mask.sum()), bad)
    with pytest.raises(ValueError, match=r"policy_loss\.rollout_correction.*rollout_is_batch_normalize"):
        rv.compute_policy_loss_rwcore(behavior, current, advantages, mask, "token-mean", config)
    # ... and in the trainer process, when verl's bypass mode starts with rwcore's loss
    from verl.trainer.ppo.rollout_corr_helper import apply_bypass_mode

    batch = DataProto.from_dict(tensors={"rollout_log_probs": behavior})
    policy_loss = OmegaConf.create({"loss_mode": rv.POLICY_LOSS_NAME})
    with pytest.raises(ValueError, match=r"algorithm\.rollout_correction.*rollout_is_batch_normalize"):
        apply_bypass_mode(batch, OmegaConf.structured(bad), policy_loss)
    assert "old_log_probs" not in batch.batch.keys()  # refused before verl's function changed anything
