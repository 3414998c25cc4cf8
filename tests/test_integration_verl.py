"""rwcore.integrations.verl against verl's documented interfaces -- WITHOUT verl installed.

verl needs a CUDA stack (vLLM/SGLang, flash-attn, Ray) and is not installed in this test
environment, so nothing here imports verl. Instead:

- signature conformance compares `inspect.signature` of our functions with reference stubs
  pasted below from verl's source;
- the "must show" comparison with verl's own `vanilla` policy loss uses an INDEPENDENT
  TRANSCRIPTION of verl's `compute_policy_loss_vanilla` + `agg_loss` + `masked_sum` /
  `masked_mean` (below, clearly marked), not the real function;
- the curriculum sampler and the advantage estimator are driven with duck-typed stand-ins for
  verl's `DataProto` (`.batch`, `.non_tensor_batch`) and for its `torch` DataLoader usage.

Source of every reference (read from the PyPI wheels, not from a git checkout):
- verl 0.9.1  (verl-0.9.1-py3-none-any.whl, sha256 db6e6f2a8d9d5808d9ec32d357a42319fdc6967df688ff9d9810050f49bfdd14)
- verl 0.7.1  (verl-0.7.1-py3-none-any.whl, sha256 0f7fb1dd6a37d20f7d8795c65ed0d1b9797ffb9947f283bbefd758dced08e216)
  verl/trainer/ppo/core_algos.py: PolicyLossFn (l.37), register_policy_loss (l.53), register_adv_est
  (l.116), compute_gdpo_outcome_advantage (l.362), agg_loss (0.9.1 l.1140 / 0.7.1 l.1136),
  compute_policy_loss_vanilla (0.9.1 l.1286 / 0.7.1 l.1277) -- vanilla identical in both versions;
  agg_loss identical except that 0.9.1 adds "token-sum".
  verl/utils/torch_functional.py: masked_sum, masked_mean (identical in both).
  verl/experimental/dataset/sampler.py (0.7.1 only; removed in 0.8.0): AbstractSampler,
  AbstractCurriculumSampler.
  verl/trainer/ppo/ray_trainer.py (0.7.1): compute_advantage (l.129) forwards non_tensor_batch only
  to "gdpo" (l.204); the fit loop calls `self.train_dataloader.sampler.update(batch=batch)` (l.1600).
"""

import inspect
import math
import pickle
import sys
import uuid
import warnings
from types import SimpleNamespace
from typing import Any, Optional

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import rwcore
import rwcore.integrations.verl as rv
from rwcore import Verdict

from _util import normalize

VERL_INSTALLED = "verl" in sys.modules or __import__("importlib").util.find_spec("verl") is not None


# =============================================================================================
# Reference signatures, pasted from verl's source (bodies elided). See the module docstring.
# =============================================================================================

# verl 0.9.1 / 0.7.1, verl/trainer/ppo/core_algos.py, `@register_policy_loss("vanilla")`
def REF_compute_policy_loss_vanilla(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Optional[Any] = None,  # Optional[ActorConfig]
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]: ...


# verl 0.9.1 / 0.7.1, verl/trainer/ppo/core_algos.py, `@register_adv_est(AdvantageEstimator.GDPO)`:
# the built-in estimator that receives non_tensor_batch (ours mirrors it).
def REF_compute_gdpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config: Optional[Any] = None,  # Optional[AlgoConfig]
    non_tensor_batch: Optional[dict] = None,
    batch: Optional[dict] = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]: ...


# verl 0.7.1, verl/experimental/dataset/sampler.py
class REF_AbstractCurriculumSampler:
    def __init__(self, data_source, data_config): ...   # AbstractSampler.__init__(data_source: Sized, data_config: DictConfig)

    def update(self, batch) -> None: ...                 # batch: DataProto


# verl 0.7.1, verl/trainer/ppo/ray_trainer.py l.129
def REF_compute_advantage(data, adv_estimator, gamma: float = 1.0, lam: float = 1.0, num_repeat: int = 1,
                          norm_adv_by_std_in_grpo: bool = True, config=None): ...


# Keyword arguments verl's compute_advantage (0.7.1 l.194-211 / 0.9.1 l.250-276) may pass to a
# registered estimator other than gae/grpo.
VERL_ESTIMATOR_KWARGS = {"token_level_rewards", "response_mask", "config", "index", "reward_baselines",
                         "non_tensor_batch", "batch", "sum_pi_squared", "old_log_probs", "rollout_is_weights"}
# Keyword arguments verl passes to every policy loss (workers/actor/dp_actor.py 0.7.1 l.615-623;
# workers/utils/losses.py 0.9.1 l.104-112).
VERL_POLICY_LOSS_KWARGS = ["old_log_prob", "log_prob", "advantages", "response_mask", "loss_agg_mode", "config",
                           "rollout_is_weights"]


def _params(fn, skip_self=False):
    params = list(inspect.signature(fn).parameters.values())
    if skip_self:
        params = params[1:]
    return [(p.name, p.kind, p.default) for p in params]


# =============================================================================================
# TRANSCRIPTION of verl's vanilla policy loss -- NOT rwcore code, NOT the real verl function.
# Copied statement by statement from verl 0.9.1 verl/trainer/ppo/core_algos.py
# (compute_policy_loss_vanilla l.1286-1376, agg_loss l.1140-1207) and verl/utils/torch_functional.py
# (masked_sum, masked_mean); 0.7.1 is identical except that its agg_loss lacks "token-sum".
# Only change: `verl_F.` prefixes dropped and `config.get` replaced by the stub's attribute.
# =============================================================================================

def verl_masked_sum(values, mask, axis=None):
    valid_values = torch.where(mask.bool(), values, 0.0)
    return (valid_values * mask).sum(axis=axis)


def verl_masked_mean(values, mask, axis=None):
    s = verl_masked_sum(values, mask, axis)
    return s / (mask.sum(axis=axis) + 1e-8)


def verl_agg_loss(loss_mat, loss_mask, loss_agg_mode, dp_size=1, batch_num_tokens=None, global_batch_size=None,
                  loss_scale_factor=None):
    if loss_agg_mode == "token-mean":
        if batch_num_tokens is None:
            if dp_size > 1:
                raise ValueError("(global) batch_num_tokens is required when dp_size > 1")
            batch_num_tokens = loss_mask.sum()
        loss = verl_masked_sum(loss_mat, loss_mask) / batch_num_tokens * dp_size
    elif loss_agg_mode == "token-sum":
        loss = verl_masked_sum(loss_mat, loss_mask) * dp_size
    elif loss_agg_mode in ["seq-mean-token-sum", "seq-mean-token-sum-norm"]:
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1)  # token-sum
        seq_mask = (torch.sum(loss_mask, dim=-1) > 0).float()  # exclude fully masked sequences
        if global_batch_size is None:
            if dp_size > 1:
                raise ValueError("global_batch_size is required when dp_size > 1")
            global_batch_size = seq_mask.sum()
        loss = verl_masked_sum(seq_losses, seq_mask) / global_batch_size * dp_size  # seq-mean
        if loss_agg_mode == "seq-mean-token-sum-norm":
            if loss_scale_factor is None:
                horizon = loss_mask.shape[-1]
                loss_scale_factor = horizon
            loss /= loss_scale_factor
    elif loss_agg_mode == "seq-mean-token-mean":
        seq_mask = torch.sum(loss_mask, dim=-1)  # per-sequence token count
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1) / (seq_mask + 1e-8)  # token-mean
        seq_mask = (seq_mask > 0).float()  # exclude fully masked sequences
        if global_batch_size is None:
            if dp_size > 1:
                raise ValueError("global_batch_size is required when dp_size > 1")
            global_batch_size = seq_mask.sum()
        loss = verl_masked_sum(seq_losses, seq_mask) / global_batch_size * dp_size  # seq-mean
    else:
        raise ValueError(f"Invalid loss_agg_mode: {loss_agg_mode}")
    return loss


def verl_compute_policy_loss_vanilla(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                                     config=None, rollout_is_weights=None):
    assert config is not None
    clip_ratio = config.clip_ratio
    clip_ratio_low = config.clip_ratio_low if config.clip_ratio_low is not None else clip_ratio
    clip_ratio_high = config.clip_ratio_high if config.clip_ratio_high is not None else clip_ratio
    clip_ratio_c = config.get("clip_ratio_c", 3.0)

    cliprange = clip_ratio
    cliprange_low = clip_ratio_low
    cliprange_high = clip_ratio_high

    assert clip_ratio_c > 1.0

    negative_approx_kl = log_prob - old_log_prob
    negative_approx_kl = torch.clamp(negative_approx_kl, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    ppo_kl = verl_masked_mean(-negative_approx_kl, response_mask)

    pg_losses1 = -advantages * ratio
    if cliprange_low is None:
        cliprange_low = cliprange
    if cliprange_high is None:
        cliprange_high = cliprange
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - cliprange_low, 1 + cliprange_high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_clipfrac = verl_masked_mean(torch.gt(pg_losses2, pg_losses1).float(), response_mask)

    pg_losses3 = -advantages * clip_ratio_c
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    pg_clipfrac_lower = verl_masked_mean(torch.gt(clip_pg_losses1, pg_losses3) * (advantages < 0).float(),
                                         response_mask)

    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)

    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights

    pg_loss = verl_agg_loss(loss_mat=pg_losses, loss_mask=response_mask, loss_agg_mode=loss_agg_mode,
                            **config.global_batch_info)

    pg_metrics = {
        "actor/pg_clipfrac": pg_clipfrac.detach().item(),
        "actor/ppo_kl": ppo_kl.detach().item(),
        "actor/pg_clipfrac_lower": pg_clipfrac_lower.detach().item(),
    }
    return pg_loss, pg_metrics

# ======================================= end of transcription ================================


class ActorConfigStub:
    """The fields of verl's ActorConfig the two losses read (attribute access plus .get, like BaseConfig)."""

    def __init__(self, clip_ratio=0.2, clip_ratio_low=None, clip_ratio_high=None, clip_ratio_c=3.0,
                 global_batch_info=None):
        self.clip_ratio, self.clip_ratio_low, self.clip_ratio_high = clip_ratio, clip_ratio_low, clip_ratio_high
        self.clip_ratio_c = clip_ratio_c
        self.global_batch_info = dict(global_batch_info or {})

    def get(self, key, default=None):
        return getattr(self, key, default)


# =============================================================================================
# Signature conformance
# =============================================================================================

def test_policy_loss_has_verls_policy_loss_signature():
    assert _params(rv.compute_policy_loss_rwcore) == _params(REF_compute_policy_loss_vanilla)
    assert [name for name, _, _ in _params(rv.compute_policy_loss_rwcore)] == VERL_POLICY_LOSS_KWARGS
    assert rv.POLICY_LOSS_NAME == "rwcore_filtered_dual_clip"


def test_advantage_estimator_has_verls_estimator_signature():
    ours, ref = _params(rv.compute_arise_advantage), _params(REF_compute_gdpo_outcome_advantage)
    # Same names, kinds and order; only epsilon's default differs (rwcore's eps, 1e-9, vs GDPO's 1e-6).
    assert [(n, k) for n, k, _ in ours] == [(n, k) for n, k, _ in ref]
    assert {n: d for n, _, d in ours if n != "epsilon"} == {n: d for n, _, d in ref if n != "epsilon"}
    sig = inspect.signature(rv.compute_arise_advantage)
    sig.bind(**{name: None for name in VERL_ESTIMATOR_KWARGS})  # accepts whatever verl passes
    assert rv.ADV_ESTIMATOR_NAME == "rwcore_arise"


def test_curriculum_sampler_has_abstract_curriculum_sampler_interface():
    cls = rv.RwcoreCurriculumSampler
    init = [(n, k) for n, k, _ in _params(cls.__init__, skip_self=True)][:2]
    assert init == [(n, k) for n, k, _ in _params(REF_AbstractCurriculumSampler.__init__, skip_self=True)]
    assert _params(cls.update, skip_self=True) == _params(REF_AbstractCurriculumSampler.update, skip_self=True)
    assert issubclass(cls, torch.utils.data.Sampler)
    for name in ("state_dict", "load_state_dict", "__iter__", "__len__"):
        assert callable(getattr(cls, name))
    # verl's create_rl_sampler: load_extern_object("pkg://rwcore.integrations.verl", class_name) is getattr.
    assert getattr(rv, "RwcoreCurriculumSampler") is cls


def test_forwarder_keeps_verls_compute_advantage_signature():
    wrapped = rv._forwarding(REF_compute_advantage)
    assert _params(wrapped) == _params(REF_compute_advantage)


@pytest.mark.skipif(VERL_INSTALLED, reason="checks the behaviour without verl")
def test_imports_without_verl_and_register_says_pip_install_verl():
    assert "verl" not in sys.modules  # importing the integration never imports verl
    with pytest.raises(ImportError, match="pip install verl"):
        rv.register()
    with pytest.raises(ImportError, match="pip install verl"):
        rv.install_advantage_forwarding()
    assert "verl" not in sys.modules


# =============================================================================================
# MUST SHOW: rwcore's verl loss == verl's vanilla loss where filtering and clipping coincide
# =============================================================================================
#
# verl vanilla, per token (w = exp(clamp(log_prob - old_log_prob, -20, 20))):
#     A >= 0: max(-w A, -clip(w, 1 - lo, 1 + hi) A)
#     A <  0: min(max(-w A, -clip(w, 1 - lo, 1 + hi) A), clip_ratio_c |A|)
# rwcore (filter (1 - lo, 1 + hi), clip_c = clip_ratio_c): keep * min(-w A, clip_c |A|).
# When every ratio lies strictly inside (1 - lo, 1 + hi), clip(w) = w, so vanilla reduces to
# min(-w A, clip_ratio_c |A|) for A < 0 and -w A for A >= 0 -- and rwcore keeps every token: the two
# are the same function of log_prob (value and gradient). "Wide bounds" (lo = 0.8, hi = 5: the
# interval (0.2, 6)) make that hold while ratios up to 5.5 exercise the dual clip at c = 3.

WIDE = dict(clip_ratio=0.2, clip_ratio_low=0.8, clip_ratio_high=5.0, clip_ratio_c=3.0)


def _inside_case(seed, B=6, T=9, mask_p=0.8, low=0.25, high=5.5, c=3.0, margin=0.02):
    """Ratios in (low, high) and at least `margin` (relative) away from the dual-clip kink at c."""
    g = torch.Generator().manual_seed(seed)
    log_ratio = torch.empty(B, T).uniform_(math.log(low), math.log(high), generator=g)
    near = (log_ratio - math.log(c)).abs() < margin
    log_ratio = torch.where(near, log_ratio + 3 * margin, log_ratio)
    old = -torch.rand(B, T, generator=g) * 3.0
    log_prob = (old + log_ratio).requires_grad_(True)
    advantages = torch.randn(B, 1, generator=g).expand(B, T).clone()
    advantages[:, ::3] = torch.randn(B, (T + 2) // 3, generator=g)  # some per-token variation too
    mask = torch.rand(B, T, generator=g) < mask_p
    mask[0] = False  # an empty sequence (excluded by verl's seq-mean modes)
    mask[1, :] = True
    if high > c * 1.2:  # make sure the dual clip engages somewhere: A < 0 with a ratio above c
        log_prob.data[1, :2] = old[1, :2] + math.log(c * 1.15)
        advantages[1, :2] = -advantages[1, :2].abs() - 0.1
    return old, log_prob, advantages, mask


def _both(old, log_prob, advantages, mask, mode, config, weights=None):
    lp_ours = log_prob.detach().clone().requires_grad_(True)
    lp_verl = log_prob.detach().clone().requires_grad_(True)
    ours, ours_metrics = rv.compute_policy_loss_rwcore(old_log_prob=old, log_prob=lp_ours, advantages=advantages,
                                                       response_mask=mask, loss_agg_mode=mode, config=config,
                                                       rollout_is_weights=weights)
    ref, ref_metrics = verl_compute_policy_loss_vanilla(old_log_prob=old, log_prob=lp_verl, advantages=advantages,
                                                        response_mask=mask, loss_agg_mode=mode, config=config,
                                                        rollout_is_weights=weights)
    ours.backward()
    ref.backward()
    return ours, ours_metrics, lp_ours.grad, ref, ref_metrics, lp_verl.grad


GLOBAL_INFOS = [
    {},
    {"dp_size": 2, "batch_num_tokens": 81, "global_batch_size": 11},
    {"dp_size": 4, "batch_num_tokens": torch.tensor(160.0), "global_batch_size": torch.tensor(20.0),
     "loss_scale_factor": 7},
]


@pytest.mark.parametrize("mode", rv.LOSS_AGG_MODES)
@pytest.mark.parametrize("info", range(len(GLOBAL_INFOS)))
@pytest.mark.parametrize("with_weights", [False, True])
def test_matches_verl_vanilla_when_no_ratio_leaves_the_bounds(mode, info, with_weights):
    old, log_prob, advantages, mask = _inside_case(seed=100 * info + len(mode) + with_weights)
    config = ActorConfigStub(**WIDE, global_batch_info=GLOBAL_INFOS[info])
    weights = None
    if with_weights:
        weights = torch.rand(old.shape, generator=torch.Generator().manual_seed(7)) * 2.0
    ours, ours_m, ours_grad, ref, ref_m, ref_grad = _both(old, log_prob, advantages, mask, mode, config, weights)

    # The regime: verl's PPO clip never engages, and its dual clip does (on some tokens).
    assert ref_m["actor/pg_clipfrac"] == 0.0
    assert ref_m["actor/pg_clipfrac_lower"] > 0.0
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours_grad, ref_grad, rtol=1e-5, atol=1e-7)
    assert ours_m["actor/pg_clipfrac"] == 0.0  # nothing filtered
    assert ours_m["actor/rwcore/kept_fraction"] == pytest.approx(1.0)
    assert ours_m["actor/pg_clipfrac_lower"] == pytest.approx(ref_m["actor/pg_clipfrac_lower"], rel=1e-6)
    assert ours_m["actor/ppo_kl"] == pytest.approx(ref_m["actor/ppo_kl"], rel=1e-5, abs=1e-7)


def test_outside_the_bounds_rwcore_filters_where_verl_clips():
    # Ratios in (0.05, 20) with verl's default-ish bounds (0.8, 1.28): many leave the interval. verl
    # then clips (a constant, or a full-gradient term); rwcore drops the token from the numerator,
    # keeping it in the denominator. So rwcore == vanilla with the out-of-range tokens' losses
    # multiplied by 0 -- which is what vanilla's rollout_is_weights does.
    config = ActorConfigStub(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0)
    old, log_prob, advantages, mask = _inside_case(seed=5, B=8, T=16, low=0.05, high=20.0)
    ratio = torch.exp(log_prob.detach() - old)
    inside = ((ratio > 0.8) & (ratio < 1.28)).float()
    assert 0 < inside[mask].mean() < 1
    for mode in rv.LOSS_AGG_MODES:
        lp_ours = log_prob.detach().clone().requires_grad_(True)
        lp_ref = log_prob.detach().clone().requires_grad_(True)
        ours, metrics = rv.compute_policy_loss_rwcore(old, lp_ours, advantages, mask, mode, config)
        ref, _ = verl_compute_policy_loss_vanilla(old, lp_ref, advantages, mask, mode, config, rollout_is_weights=inside)
        ours.backward()
        ref.backward()
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(lp_ours.grad, lp_ref.grad, rtol=1e-5, atol=1e-7)
        plain, _ = verl_compute_policy_loss_vanilla(old, log_prob.detach(), advantages, mask, mode, config)
        assert not torch.allclose(ours.detach(), plain)  # the semantics really differ here
        assert metrics["actor/pg_clipfrac"] == pytest.approx(1.0 - inside[mask].mean().item(), rel=1e-5)


def test_loss_delegates_to_filtered_dual_clip_loss_with_mapped_bounds():
    old, log_prob, advantages, mask = _inside_case(seed=3, low=0.3, high=8.0)
    config = {"clip_ratio": 0.2, "clip_ratio_low": 0.5, "clip_ratio_high": 4.0, "clip_ratio_c": 2.5}  # a plain dict
    assert rv.loss_params_from_config(config) == (0.5, 5.0, 2.5)
    ours, _ = rv.compute_policy_loss_rwcore(old, log_prob, advantages, mask, "token-mean", config)
    direct, _ = rwcore.kernels.filtered_dual_clip_loss(log_prob, old, advantages, mask, 0.5, 5.0, 2.5)
    torch.testing.assert_close(ours, direct, rtol=0, atol=0)
    # verl's defaults when config is None / fields are None: clip_ratio 0.2 both sides, c = 3.
    assert rv.loss_params_from_config(None) == pytest.approx((0.8, 1.2, 3.0))
    assert rv.loss_params_from_config(ActorConfigStub(clip_ratio=0.3)) == pytest.approx((0.7, 1.3, 3.0))
    assert rv.loss_params_from_config(ActorConfigStub(clip_ratio_low=1.5))[0] == 0.0  # no lower filter


def test_loss_rejects_what_verl_rejects():
    old, log_prob, advantages, mask = _inside_case(seed=4)
    with pytest.raises(ValueError, match="clip_ratio_c"):
        rv.compute_policy_loss_rwcore(old, log_prob, advantages, mask, "token-mean", ActorConfigStub(clip_ratio_c=1.0))
    with pytest.raises(ValueError, match="Invalid loss_agg_mode"):
        rv.compute_policy_loss_rwcore(old, log_prob, advantages, mask, "sum", ActorConfigStub())
    with pytest.raises(ValueError, match="batch_num_tokens is required"):
        rv.compute_policy_loss_rwcore(old, log_prob, advantages, mask, "token-mean",
                                      ActorConfigStub(global_batch_info={"dp_size": 2}))


# =============================================================================================
# Advantage estimator
# =============================================================================================

RUBRICS = ["cites-order-id", "no-duplicate-calls", "asks-before-refund"]


def _estimator_case(seed, groups=5, n=4, T=7):
    rng = np.random.default_rng(seed)
    uids = [str(uuid.UUID(int=int(rng.integers(1 << 62)))) for _ in range(groups)]
    index = np.array([u for u in uids for _ in range(n)], dtype=object)
    order = rng.permutation(len(index))  # verl's balance_batch reorders rows
    index = index[order]
    N = len(index)
    response_mask = torch.from_numpy(rng.random((N, T)) < 0.8)
    response_mask[:, 0] = True
    lengths = response_mask.sum(-1)
    token_level_rewards = torch.zeros(N, T)
    rewards = torch.from_numpy(rng.choice([0.0, 0.5, 1.0], size=N)).float()
    token_level_rewards[torch.arange(N), lengths - 1] = rewards  # verl puts the score on the last token
    choices = [True, False, None, float("nan"), "pass", "fail", Verdict.NA, Verdict.INVALID, 1.0, 0]
    rows = []
    for _ in range(N):
        row = {}
        for rubric in RUBRICS:
            if rng.random() < 0.85:
                row[rubric] = choices[int(rng.integers(len(choices)))]
        rows.append(row)
    return token_level_rewards, response_mask, index, rows


def _expected_matrix(rows):
    matrix = np.full((len(rows), len(RUBRICS)), np.nan)
    for j, row in enumerate(rows):
        for i, rubric in enumerate(RUBRICS):
            value = row.get(rubric, "missing")
            if value is True or value == "pass" or (isinstance(value, float) and value == 1.0):
                matrix[j, i] = 1.0
            elif value is False or value == "fail" or (type(value) is int and value == 0):
                matrix[j, i] = 0.0
            elif value is Verdict.INVALID or value == "missing":
                matrix[j, i] = 0.0  # INVALID (a missing rubric is INVALID) scores as a FAIL: it never pays
    return matrix


def _int_groups(index):
    first = {}
    return np.array([first.setdefault(u, len(first)) for u in index])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_advantage_estimator_is_compute_advantages_broadcast_over_the_mask(seed):
    rewards_tok, mask, index, rows = _estimator_case(seed)
    non_tensor = {"uid": index, "rwcore_verdicts": np.array(rows, dtype=object)}
    config = {"rwcore": {"lam": 0.4}}
    advantages, returns = rv.compute_arise_advantage(token_level_rewards=rewards_tok, response_mask=mask, index=index,
                                                     config=config, non_tensor_batch=non_tensor, batch={})
    matrix = _expected_matrix(rows)
    assert np.isfinite(matrix).any()
    per_response = rwcore.compute_advantages(rewards_tok.sum(-1).numpy(), matrix, _int_groups(index), lam=0.4)
    expected = torch.from_numpy(per_response).float().unsqueeze(-1) * mask
    torch.testing.assert_close(advantages, expected, rtol=1e-6, atol=1e-6)
    assert returns is advantages
    assert advantages.dtype == torch.float32 and advantages.shape == mask.shape
    assert (advantages[~mask] == 0).all()
    # The rubric term matters: lam = 0 gives the task-only advantages.
    task_only, _ = rv.compute_arise_advantage(rewards_tok, mask, index, config={"rwcore": {"lam": 0.0}},
                                              non_tensor_batch=non_tensor)
    assert not torch.allclose(task_only, advantages)


def test_advantage_estimator_reads_per_rubric_keys_and_defaults():
    rewards_tok, mask, index, rows = _estimator_case(7)
    columns = {f"rwcore_verdicts/{r}": np.array([row.get(r, "invalid") for row in rows], dtype=object)
               for r in RUBRICS}
    advantages, _ = rv.compute_arise_advantage(rewards_tok, mask, index, config=None,
                                               non_tensor_batch={"uid": index, **columns})
    # A rubric missing from a mapping row is INVALID, written "invalid" in the per-rubric layout.
    expected, _ = rv.compute_arise_advantage(rewards_tok, mask, index, non_tensor_batch={
        "uid": index, "rwcore_verdicts": np.array(rows, dtype=object)})
    torch.testing.assert_close(advantages, expected)
    per_response = rwcore.compute_advantages(rewards_tok.sum(-1).numpy(), _expected_matrix(rows), _int_groups(index))
    torch.testing.assert_close(advantages, torch.from_numpy(per_response).float().unsqueeze(-1) * mask,
                               rtol=1e-6, atol=1e-6)


def test_advantage_estimator_refuses_to_drop_the_rubric_term_silently():
    rewards_tok, mask, index, rows = _estimator_case(1)
    with pytest.raises(ValueError, match="forwards it only to 'gdpo'"):
        rv.compute_arise_advantage(rewards_tok, mask, index)  # how stock verl calls it
    with pytest.raises(ValueError, match="rwcore_verdicts"):
        rv.compute_arise_advantage(rewards_tok, mask, index, non_tensor_batch={"uid": index})
    with pytest.raises(ValueError, match="unknown keys"):
        rv.compute_arise_advantage(rewards_tok, mask, index, config={"rwcore": {"lamda": 0.3}},
                                   non_tensor_batch={"uid": index})
    with pytest.raises(ValueError, match="not a verdict"):
        rv.compute_arise_advantage(rewards_tok, mask, index, non_tensor_batch={
            "uid": index, "rwcore_verdicts": np.array([{"x": 0.7}] * len(index), dtype=object)})
    # Explicitly task-only: equals compute_advantages with no rubric columns.
    task_only, _ = rv.compute_arise_advantage(rewards_tok, mask, index, config={"rwcore": {"verdicts_key": None}})
    expected = rwcore.compute_advantages(rewards_tok.sum(-1).numpy(), np.zeros((len(index), 0)), _int_groups(index))
    torch.testing.assert_close(task_only, torch.from_numpy(expected).float().unsqueeze(-1) * mask)


def test_apply_and_forwarder_route_non_tensor_batch_to_rwcore_arise():
    rewards_tok, mask, index, rows = _estimator_case(3)
    non_tensor = {"uid": index, "rwcore_verdicts": np.array(rows, dtype=object)}
    data = SimpleNamespace(batch={"token_level_rewards": rewards_tok, "response_mask": mask},
                           non_tensor_batch=non_tensor)
    expected, _ = rv.compute_arise_advantage(rewards_tok, mask, index, non_tensor_batch=non_tensor)

    calls = []

    def verl_compute_advantage(data, adv_estimator, gamma=1.0, lam=1.0, num_repeat=1, norm_adv_by_std_in_grpo=True,
                               config=None):  # stands in for verl's; records what it is asked
        calls.append(adv_estimator)
        return data

    forwarding = rv._forwarding(verl_compute_advantage)
    out = forwarding(data, adv_estimator="rwcore_arise", gamma=1.0, lam=1.0, num_repeat=4,
                     norm_adv_by_std_in_grpo=True, config={"rwcore": {"lam": 0.3}})
    assert out is data and calls == []
    torch.testing.assert_close(data.batch["advantages"], expected)
    torch.testing.assert_close(data.batch["returns"], expected)
    forwarding(data, adv_estimator="grpo", config=None)
    assert calls == ["grpo"]  # every other estimator goes to verl unchanged


# =============================================================================================
# Curriculum sampler
# =============================================================================================

TAGS = ["refund", "search", "bulk_import"]
CAPABILITY = {"cites-order-id": "Verification", "no-duplicate-calls": "Efficiency",
              "asks-before-refund": "Understanding"}


class FakeFrame:
    """The columns of a verl RLHFDataset's `dataframe` (a datasets.Dataset): column_names, frame[name]."""

    def __init__(self, columns):
        self.columns_ = columns
        self.column_names = list(columns)

    def __getitem__(self, name):
        return list(self.columns_[name])


class FakeRLHFDataset:
    def __init__(self, num_tasks):
        ids = [f"task-{i}" for i in range(num_tasks)]
        self.dataframe = FakeFrame({
            "data_source": ["negotiation"] * num_tasks,
            "rwcore_task_id": ids,
            "rwcore_tags": [[TAGS[i % 3]] + (["search"] if i % 4 == 0 else []) for i in range(num_tasks)],
            "prompt": [f"prompt {i}" for i in range(num_tasks)],
        })
        self.ids = ids

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"index": i}


def _data_config(batch_size=4, group_size=3, **extra):
    # What verl hands the sampler: config.data, with the rwcore keys added under data.sampler.
    sampler = {"class_path": "pkg://rwcore.integrations.verl", "class_name": "RwcoreCurriculumSampler",
               "group_size": group_size, "rubrics": dict(CAPABILITY), "seed": 11, **extra}
    return {"train_batch_size": batch_size, "gen_batch_size": None, "seed": None, "dataloader_num_workers": 0,
            "sampler": sampler}


def _judge(task_id, step, k):
    """Deterministic simulated verdicts of response k of task_id at step (a mapping per response)."""
    rng = np.random.default_rng(abs(hash((task_id, step, k))) % (2**32))
    row = {}
    for rubric in CAPABILITY:
        u = rng.random()
        if u < 0.1:
            continue  # not judged
        row[rubric] = None if u < 0.2 else bool(rng.random() < (0.2 + 0.6 * (int(task_id.split("-")[1]) % 3) / 2))
    return row


def _verl_batch(dataset, indices, group_size, step):
    """The DataProto-like batch verl hands update(): rows repeated group_size times (interleaved), shuffled."""
    rows = []
    for index in indices:
        uid = f"uid-{step}-{index}"
        for k in range(group_size):
            rows.append((uid, dataset.ids[index], _judge(dataset.ids[index], step, k)))
    order = np.random.default_rng(step).permutation(len(rows))  # balance_batch reorders
    rows = [rows[i] for i in order]
    return SimpleNamespace(batch={}, meta_info={}, non_tensor_batch={
        "uid": np.array([r[0] for r in rows], dtype=object),
        "rwcore_task_id": np.array([r[1] for r in rows], dtype=object),
        "rwcore_verdicts": np.array([r[2] for r in rows], dtype=object),
    })


def _run(sampler, dataset, loader_iter, steps, first_step, group_size=3):
    batches = []
    for step in range(first_step, first_step + steps):
        indices = next(loader_iter)
        batches.append(list(indices))
        sampler.update(_verl_batch(dataset, indices, group_size, step))
    return batches


def _loader(sampler, dataset, batch_size):
    # verl: StatefulDataLoader(dataset, batch_size=..., num_workers=0, drop_last=True, sampler=sampler);
    # a plain DataLoader has the same index flow (torchdata's BatchSampler draws batch_size indices lazily).
    return DataLoader(list(range(len(dataset))), batch_size=batch_size, sampler=sampler, num_workers=0,
                      drop_last=True, collate_fn=lambda items: items)


def test_sampler_builds_from_verl_config_and_yields_distinct_task_batches():
    dataset = FakeRLHFDataset(12)
    sampler = rv.RwcoreCurriculumSampler(data_source=dataset, data_config=_data_config())
    assert isinstance(sampler.sampler, rwcore.CapabilitySampler)
    assert sampler.sampler.rubrics == CAPABILITY
    assert len(sampler) == (12 // 4) * 4 and sampler.num_batches == 3
    loader = _loader(sampler, dataset, 4)
    assert len(loader) == 3
    batches = _run(sampler, dataset, iter(loader), steps=3, first_step=0)
    for batch in batches:
        assert len(batch) == 4 and len(set(batch)) == 4
    assert sampler.policy_version == 3 and sampler.last_update == {"groups": 4, "skipped_groups": 0}
    attempts = sum(sampler.sampler.task_state(t)["attempts"] for t in dataset.ids)
    assert attempts == 3 * 4
    assert sampler.sampler.coverage() > 0


def test_sampler_state_dict_round_trip_resumes_exactly():
    dataset = FakeRLHFDataset(16)
    config = _data_config(batch_size=4, num_batches=4)
    a = rv.RwcoreCurriculumSampler(dataset, config)
    loader_a = iter(_loader(a, dataset, 4))
    _run(a, dataset, loader_a, steps=2, first_step=0)  # mid-pass: 2 of 4 batches done
    saved = pickle.loads(pickle.dumps(a.state_dict()))  # verl torch.save()s it inside the loader state
    after_a = _run(a, dataset, loader_a, steps=2, first_step=2)
    assert next(loader_a, None) is None  # the pass ends (verl's `for batch_dict in loader` asks once more)
    # the next pass (epoch) continues from the same sampler
    after_a += _run(a, dataset, iter(_loader(a, dataset, 4)), steps=3, first_step=4)

    b = rv.RwcoreCurriculumSampler(dataset, config)
    b.load_state_dict(saved)
    assert b.policy_version == 2
    loader_b = iter(_loader(b, dataset, 4))  # StatefulDataLoader calls iter(sampler) afresh after loading
    after_b = _run(b, dataset, loader_b, steps=2, first_step=2)
    assert next(loader_b, None) is None
    after_b += _run(b, dataset, iter(_loader(b, dataset, 4)), steps=3, first_step=4)
    assert after_b == after_a
    assert normalize(b.state_dict()) == normalize(a.state_dict())

    # A fresh sampler that is not restored draws other batches (the check is not vacuous).
    c = rv.RwcoreCurriculumSampler(dataset, config)
    assert _run(c, dataset, iter(_loader(c, dataset, 4)), steps=2, first_step=2) != after_a[:2]


def test_sampler_update_is_all_or_nothing_and_skips_incomplete_groups():
    dataset = FakeRLHFDataset(8)
    sampler = rv.RwcoreCurriculumSampler(dataset, _data_config(batch_size=2))
    before = normalize(sampler.state_dict())
    good = _verl_batch(dataset, [0, 1], 3, step=0)
    bad = _verl_batch(dataset, [0, 1], 3, step=0)
    bad.non_tensor_batch["rwcore_verdicts"][-1] = {"unknown-rubric": True}
    with pytest.raises(ValueError, match="not in the active pool"):
        sampler.update(bad)
    assert normalize(sampler.state_dict()) == before
    # a group with a missing response is skipped (with a warning), the rest recorded
    partial = _verl_batch(dataset, [0, 1], 3, step=0)
    uids = list(partial.non_tensor_batch["uid"])
    keep = [i for i, uid in enumerate(uids) if uid == "uid-0-0"] + [i for i, uid in enumerate(uids) if uid == "uid-0-1"][:2]
    partial.non_tensor_batch = {k: v[keep] for k, v in partial.non_tensor_batch.items()}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sampler.update(partial)
    assert any("skipped 1 uid group" in str(w.message) for w in caught)
    assert sampler.last_update == {"groups": 1, "skipped_groups": 1}
    assert sampler.sampler.task_state("task-0")["attempts"] == 1
    assert sampler.sampler.task_state("task-1")["attempts"] == 0
    sampler.update(good)
    assert sampler.policy_version == 2


def test_sampler_reads_task_ids_from_extra_info_and_rows_and_accepts_a_ready_sampler():
    rows = [{"data_source": "math", "extra_info": {"rwcore_task_id": i, "index": i}} for i in range(6)]

    class RowsDataset(list):  # no `dataframe`: the rows are read
        pass

    dataset = RowsDataset(rows)
    ready = rwcore.UniformSampler({i: ["math"] for i in range(6)}, batch_size=3, group_size=2, seed=1)
    sampler = rv.RwcoreCurriculumSampler(dataset, {"train_batch_size": 3, "sampler": {}}, sampler=ready)
    assert sampler.sampler is ready and len(sampler) == 6
    batch = next(iter(_loader(sampler, dataset, 3)))
    assert len(set(batch)) == 3
    with pytest.raises(ValueError, match="must agree"):
        rv.RwcoreCurriculumSampler(dataset, {"train_batch_size": 4, "sampler": {}}, sampler=ready)
    with pytest.raises(ValueError, match="group_size is required"):
        rv.RwcoreCurriculumSampler(dataset, {"train_batch_size": 3, "sampler": {}})
    with pytest.raises(ValueError, match="no task id"):
        rv.RwcoreCurriculumSampler(RowsDataset([{"data_source": "x"}]), {"train_batch_size": 1,
                                                                          "sampler": {"group_size": 2}})


# TRANSCRIPTION (not the real class) of torchdata 0.11.0's
# torchdata/stateful_dataloader/sampler.py::_BatchSamplerIterator (the batch iterator
# StatefulDataLoader builds around `sampler=`; its state_dict is what verl saves in data.pt), with
# torchdata's runtime-checkable `Stateful` protocol as a hasattr test. torchdata is not installed here.
class TorchdataBatchSamplerIterator:
    def __init__(self, sampler, batch_size, drop_last):
        self.sampler = sampler
        self.sampler_iter = iter(self.sampler)
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.samples_yielded = 0

    def __next__(self):
        batch = []
        try:
            for _ in range(self.batch_size):
                batch.append(next(self.sampler_iter))
                self.samples_yielded += 1
            return batch
        except StopIteration:
            if self.drop_last or len(batch) == 0:
                raise StopIteration
            return batch

    def state_dict(self):
        sd = {"samples_yielded": self.samples_yielded}
        if _stateful(self.sampler):
            sd["sampler_state"] = self.sampler.state_dict()
        if _stateful(self.sampler_iter):
            sd["sampler_iter_state"] = self.sampler_iter.state_dict()
        return sd

    def load_state_dict(self, state_dict):
        self.samples_yielded = state_dict["samples_yielded"]
        if "sampler_state" in state_dict:
            assert _stateful(self.sampler)
            self.sampler.load_state_dict(state_dict["sampler_state"])
        self.sampler_iter = iter(self.sampler)
        if "sampler_iter_state" in state_dict:
            self.sampler_iter.load_state_dict(state_dict["sampler_iter_state"])
        if not (_stateful(self.sampler) or _stateful(self.sampler_iter)):
            for _ in range(self.samples_yielded):
                next(self.sampler_iter)


def _stateful(obj):
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


def test_sampler_resumes_exactly_through_torchdatas_batch_iterator_state():
    dataset = FakeRLHFDataset(20)
    config = _data_config(batch_size=4, num_batches=5)
    a = rv.RwcoreCurriculumSampler(dataset, config)
    it_a = TorchdataBatchSamplerIterator(a, 4, drop_last=True)
    _run(a, dataset, it_a, steps=3, first_step=0)
    saved = pickle.loads(pickle.dumps(it_a.state_dict()))  # verl: torch.save(train_dataloader.state_dict())
    assert "sampler_state" in saved and "sampler_iter_state" not in saved
    rest_a = _run(a, dataset, it_a, steps=2, first_step=3)

    b = rv.RwcoreCurriculumSampler(dataset, config)
    it_b = TorchdataBatchSamplerIterator(b, 4, drop_last=True)
    it_b.load_state_dict(saved)
    assert _run(b, dataset, it_b, steps=2, first_step=3) == rest_a
    with pytest.raises(StopIteration):  # 5 batches per pass, as len(loader) says
        next(it_b)


# =============================================================================================
# Registration, against a FAKE `verl` package (not verl): its registry functions are transcribed
# from verl 0.9.1 verl/trainer/ppo/core_algos.py l.50-68 and l.113-134 (register_policy_loss,
# register_adv_est, the two registries), its AbstractCurriculumSampler from verl 0.7.1
# verl/experimental/dataset/sampler.py; ray_trainer.compute_advantage is a stub with verl's signature.
# Run in a subprocess so the fake package never meets the rest of the suite.
# =============================================================================================

FAKE_VERL = {
    "verl/__init__.py": "",
    "verl/trainer/__init__.py": "",
    "verl/trainer/ppo/__init__.py": "",
    "verl/trainer/ppo/core_algos.py": '''
from enum import Enum
POLICY_LOSS_REGISTRY = {}
def register_policy_loss(name):
    def decorator(func):
        POLICY_LOSS_REGISTRY[name] = func
        return func
    return decorator
ADV_ESTIMATOR_REGISTRY = {}
def register_adv_est(name_or_enum):
    def decorator(fn):
        name = name_or_enum.value if isinstance(name_or_enum, Enum) else name_or_enum
        if name in ADV_ESTIMATOR_REGISTRY and ADV_ESTIMATOR_REGISTRY[name] != fn:
            raise ValueError(f"Adv estimator {name} has already been registered: {ADV_ESTIMATOR_REGISTRY[name]} vs {fn}")
        ADV_ESTIMATOR_REGISTRY[name] = fn
        return fn
    return decorator
''',
    "verl/trainer/ppo/ray_trainer.py": '''
CALLS = []
def compute_advantage(data, adv_estimator, gamma=1.0, lam=1.0, num_repeat=1, norm_adv_by_std_in_grpo=True, config=None):
    CALLS.append(adv_estimator)
    return data
''',
    "verl/experimental/__init__.py": "",
    "verl/experimental/dataset/__init__.py": "",
    "verl/experimental/dataset/sampler.py": '''
from abc import abstractmethod
from torch.utils.data import Sampler
class AbstractSampler(Sampler[int]):
    @abstractmethod
    def __init__(self, data_source, data_config):
        pass
class AbstractCurriculumSampler(AbstractSampler):
    @abstractmethod
    def update(self, batch) -> None:
        pass
''',
}

REGISTRATION_SCRIPT = '''
import importlib, sys
import verl.trainer.ppo.ray_trainer as rt          # verl's trainer process has its trainer module loaded
import verl.trainer.ppo.core_algos as ca
assert "rwcore.integrations.verl" not in sys.modules
import rwcore.integrations.verl as rv              # what data.sampler.class_path=pkg://... does
assert ca.POLICY_LOSS_REGISTRY["rwcore_filtered_dual_clip"] is rv.compute_policy_loss_rwcore
assert ca.ADV_ESTIMATOR_REGISTRY["rwcore_arise"] is rv.compute_arise_advantage
assert rt.compute_advantage.__rwcore_forwarding__
rv.register()                                     # idempotent
rv.register()
assert rt.compute_advantage.__wrapped__.__module__ == "verl.trainer.ppo.ray_trainer"
from verl.experimental.dataset.sampler import AbstractCurriculumSampler
assert issubclass(rv.RwcoreCurriculumSampler, AbstractCurriculumSampler)
cls = getattr(importlib.import_module("rwcore.integrations.verl"), "RwcoreCurriculumSampler")  # load_extern_object
assert cls is rv.RwcoreCurriculumSampler
data = type("D", (), {})()
data.batch, data.non_tensor_batch = {}, {}
rt.compute_advantage(data, adv_estimator="grpo", config=None)
assert rt.CALLS == ["grpo"]
print("OK")
'''


def test_register_and_autoregistration_with_verls_registry_functions(tmp_path):
    import os
    import subprocess

    for relative, text in FAKE_VERL.items():
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]))
    env.pop("RWCORE_VERL_AUTOREGISTER", None)
    result = subprocess.run([sys.executable, "-c", REGISTRATION_SCRIPT], env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("OK")
