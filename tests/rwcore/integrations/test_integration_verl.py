"""rwcore.integrations.verl called through verl 0.9.1's REAL modules (installed with --no-deps; see
scripts/upstream-requirements.txt, `RWCORE_EXTRAS=...,upstream bash scripts/setup.sh`); the tests that
need no V1 trainer or plugin discovery also run on verl 0.8.0 (tests/rwcore/integrations/test_integration_versions.py).

- the policy loss runs through verl's `ppo_loss` (verl/workers/utils/losses.py: the actor's loss with
  `get_policy_loss_fn(loss_mode)` and `no_padding_2_padding`), side by side with verl's `vanilla`, on
  verl's own `FSDPActorConfig`;
- the estimator runs through both `compute_advantage` paths: the legacy trainer's
  (verl.trainer.ppo.ray_trainer.compute_advantage, with rwcore's forwarder) and the V1 trainer's
  (verl.trainer.ppo.v1.utils.compute_advantage_for_multi_trajectories, which hands the estimator only
  `uid`; the verdicts come from `verdicts_in_scope`, as the "rwcore_sync" trainer sets them);
- registration goes through verl's plugin discovery (`import verl` loads rwcore's `verl.plugins` entry
  point) and verl's trainer registry (`get_trainer_cls("rwcore_sync")`);
- the curriculum sampler is checkpointed through torchdata's real `StatefulDataLoader` (verl's data.pt).

The reference for the advantages is `rwcore.compute_advantages` on hand-decoded verdicts (the estimator
must be exactly it, broadcast over the response mask); the reference for the loss is verl's vanilla.
"""

import importlib.util
import inspect
import math
import os
import pickle
import re
import subprocess
import sys
import uuid
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

try:
    import verl  # (verl >= 0.9 loads rwcore's verl.plugins entry point here)
    import verl.trainer.ppo.core_algos as core_algos
    import verl.trainer.ppo.ray_trainer as ray_trainer
    from tensordict import TensorDict
    from verl import DataProto
    from verl.trainer.config import AlgoConfig
    from verl.utils import tensordict_utils as tu
    from verl.workers.config import FSDPActorConfig
    from verl.workers.config.actor import PolicyLossConfig
    from verl.workers.utils.losses import ppo_loss
except ImportError as error:  # a clear message, never a skip: CI installs them
    raise ImportError(
        f"these tests need verl 0.9.1 and its CPU-importable dependencies: "
        f"RWCORE_EXTRAS=test,bench,vllm,upstream bash scripts/setup.sh ({error})"
    ) from error

from _util import ROOT, normalize

import rwcore
import rwcore.integrations.verl as rv
from rwcore import Verdict
from rwcore.integrations.verl.advantage import verdicts_in_scope
from rwcore.integrations.verl.trainer_v1 import check_v1_config
from rwcore.kernels import LossSettings

# The environment's verl is 0.9.1; tests/rwcore/integrations/test_integration_versions.py runs the tests that exist on
# the low end of the range (verl 0.8.0: no V1 trainer, no plugin discovery) again with RWCORE_EXPECT_VERL=0.8.0.
assert verl.__version__ == os.environ.get("RWCORE_EXPECT_VERL", "0.9.1"), verl.__version__
HAS_V1 = importlib.util.find_spec("verl.trainer.ppo.v1") is not None
if HAS_V1:
    import verl.trainer.ppo.v1.utils as v1_utils
if "rwcore.integrations.verl.plugin" not in sys.modules:
    # verl 0.8 loads no verl.plugins entry points: the explicit call docs/integrations.md gives for it
    assert not HAS_V1, "verl >= 0.9 should have loaded rwcore's verl.plugins entry point"
    rv.register()


def _verl_aggregates(mode):
    try:
        core_algos.agg_loss(torch.ones(1, 2), torch.ones(1, 2), mode)
    except ValueError:  # "Invalid loss_agg_mode" (verl 0.8 has no token-sum; its ActorConfig refuses it too)
        return False
    return True


# the modes of rwcore's aggregation that this verl has (all of them on 0.9.1, checked by the assert)
VERL_AGG_MODES = [mode for mode in rv.LOSS_AGG_MODES if _verl_aggregates(mode)]
assert VERL_AGG_MODES == (list(rv.LOSS_AGG_MODES) if HAS_V1 else [m for m in rv.LOSS_AGG_MODES if m != "token-sum"])


# =============================================================================================
# Policy loss, through verl's real ppo_loss
# =============================================================================================


def through_ppo_loss(
    loss_mode,
    old,
    log_prob,
    advantages,
    mask,
    agg,
    clip,
    dp_size=1,
    batch_num_tokens=None,
    global_batch_size=None,
    loss_scale_factor=None,
    weights=None,
    prompt_len=3,
):
    """verl's actor loss (`ppo_loss`) on a padded batch; returns (loss, metrics, d loss / d log_prob [B, T]).

    The model output is what verl's engines produce: log-probs of the unpadded token stream (prompt +
    response per sequence), which `ppo_loss` slices back to [B, T] with `no_padding_2_padding`.
    """
    B, T = old.shape
    config = FSDPActorConfig(
        strategy="fsdp",
        ppo_mini_batch_size=B,
        ppo_micro_batch_size_per_gpu=1,
        rollout_n=1,
        loss_agg_mode=agg,
        loss_scale_factor=loss_scale_factor,
        policy_loss=PolicyLossConfig(loss_mode=loss_mode),
        **clip,
    )
    leaf = log_prob.detach().clone().requires_grad_(True)
    stream = []
    for b in range(B):
        r = int(mask[b].sum())
        assert bool(mask[b, :r].all()), "verl's response masks are prefixes"
        stream.append(torch.cat([torch.zeros(prompt_len - 1), leaf[b, :r], torch.zeros(1)]))
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
    for key, value in (
        ("dp_size", dp_size),
        ("batch_num_tokens", batch_num_tokens),
        ("global_batch_size", global_batch_size),
    ):
        tu.assign_non_tensor_data(data, key, value)
    loss, metrics = ppo_loss(config, {"log_probs": torch.cat(stream)}, data)
    loss.backward()
    return loss.detach(), metrics, leaf.grad


def _metric(metrics, name):
    """One value of verl's metrics dict (`ppo_loss` wraps each in a `verl.utils.metric.Metric`)."""
    value = metrics[name]
    values = getattr(value, "values", None)
    if values is not None:
        assert len(values) == 1, values
        value = values[0]
    return float(value.item() if isinstance(value, torch.Tensor) else value)


# Inside the bounds -- no ratio leaves (1 - clip_ratio_low, 1 + clip_ratio_high) -- verl's PPO clip is
# inactive and both dual-clip negative advantages at clip_ratio_c |A|: the same function of log_prob.
WIDE = dict(clip_ratio=0.2, clip_ratio_low=0.8, clip_ratio_high=5.0, clip_ratio_c=3.0)


def _inside_case(seed, B=6, T=9, low=0.25, high=5.5, c=3.0, margin=0.02):
    """Ratios in (low, high), away from the dual-clip kink at c; prefix masks of varied length (one empty)."""
    g = torch.Generator().manual_seed(seed)
    log_ratio = torch.empty(B, T).uniform_(math.log(low), math.log(high), generator=g)
    near = (log_ratio - math.log(c)).abs() < margin
    log_ratio = torch.where(near, log_ratio + 3 * margin, log_ratio)
    old = -torch.rand(B, T, generator=g) * 3.0
    log_prob = old + log_ratio
    advantages = torch.randn(B, 1, generator=g).expand(B, T).clone()
    advantages[:, ::3] = torch.randn(B, (T + 2) // 3, generator=g)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[1] = T
    mask = torch.arange(T)[None, :] < lengths[:, None]
    log_prob[1, :2] = old[1, :2] + math.log(c * 1.15)  # the dual clip engages: A < 0 with a ratio above c
    advantages[1, :2] = -advantages[1, :2].abs() - 0.1
    return old, log_prob, advantages, mask


GLOBAL_INFOS = [
    {},
    {"dp_size": 2, "batch_num_tokens": 81, "global_batch_size": 11},
    {"dp_size": 4, "batch_num_tokens": 160, "global_batch_size": 20, "loss_scale_factor": 7},
]


@pytest.mark.parametrize("mode", VERL_AGG_MODES)
@pytest.mark.parametrize("info", range(len(GLOBAL_INFOS)))
@pytest.mark.parametrize("with_weights", [False, True])
def test_ppo_loss_with_rwcore_equals_ppo_loss_with_vanilla_inside_the_bounds(mode, info, with_weights):
    old, log_prob, advantages, mask = _inside_case(seed=100 * info + len(mode) + with_weights)
    weights = torch.rand(old.shape, generator=torch.Generator().manual_seed(7)) * 2.0 if with_weights else None
    kwargs = dict(GLOBAL_INFOS[info], weights=weights)
    ours, ours_m, ours_grad = through_ppo_loss(
        rv.POLICY_LOSS_NAME, old, log_prob, advantages, mask, mode, WIDE, **kwargs
    )
    ref, ref_m, ref_grad = through_ppo_loss("vanilla", old, log_prob, advantages, mask, mode, WIDE, **kwargs)
    assert _metric(ref_m, "actor/pg_clipfrac") == 0.0  # the regime: verl's PPO clip never engages ...
    assert _metric(ref_m, "actor/pg_clipfrac_lower") > 0.0  # ... and its dual clip does
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours_grad, ref_grad, rtol=1e-5, atol=1e-7)
    assert _metric(ours_m, "actor/pg_clipfrac") == 0.0
    assert _metric(ours_m, "actor/pg_clipfrac_lower") == pytest.approx(_metric(ref_m, "actor/pg_clipfrac_lower"))
    assert _metric(ours_m, "actor/ppo_kl") == pytest.approx(_metric(ref_m, "actor/ppo_kl"), rel=1e-5, abs=1e-7)


def test_outside_the_bounds_rwcore_filters_where_verl_clips():
    # verl clips the ratio; rwcore drops the token from the numerator (it stays in the denominator):
    # rwcore == vanilla with the out-of-range tokens' losses weighted 0 through rollout_is_weights.
    clip = dict(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0)
    old, log_prob, advantages, mask = _inside_case(seed=5, B=8, T=16, low=0.05, high=20.0)
    ratio = torch.exp(log_prob - old)
    inside = ((ratio > 0.8) & (ratio < 1.28)).float()
    assert 0 < inside[mask].mean() < 1
    for mode in VERL_AGG_MODES:
        ours, metrics, ours_grad = through_ppo_loss(rv.POLICY_LOSS_NAME, old, log_prob, advantages, mask, mode, clip)
        ref, _, ref_grad = through_ppo_loss("vanilla", old, log_prob, advantages, mask, mode, clip, weights=inside)
        plain, _, _ = through_ppo_loss("vanilla", old, log_prob, advantages, mask, mode, clip)
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(ours_grad, ref_grad, rtol=1e-5, atol=1e-7)
        assert not torch.allclose(ours, plain)  # the semantics really differ here
        assert _metric(metrics, "actor/pg_clipfrac") == pytest.approx(1.0 - inside[mask].mean().item(), rel=1e-5)


def test_loss_reads_verls_actor_config_and_refuses_a_disabled_dual_clip():
    config = FSDPActorConfig(
        strategy="fsdp",
        ppo_mini_batch_size=2,
        ppo_micro_batch_size_per_gpu=1,
        rollout_n=1,
        clip_ratio_low=0.5,
        clip_ratio_high=4.0,
        clip_ratio_c=2.5,
    )
    assert rv.loss_params_from_config(config) == LossSettings(0.5, 5.0, 2.5)
    old, log_prob, advantages, mask = _inside_case(seed=3, low=0.3, high=8.0)
    ours, _ = rv.compute_policy_loss_rwcore(old, log_prob, advantages, mask, "token-mean", config)
    direct, _ = rwcore.kernels.filtered_dual_clip_loss(log_prob, old, advantages, mask, 0.5, 5.0, 2.5)
    torch.testing.assert_close(ours, direct, rtol=0, atol=0)
    no_dual = dict(WIDE, clip_ratio_c=1.0)
    with pytest.raises(ValueError, match="clip_ratio_c"):
        through_ppo_loss(rv.POLICY_LOSS_NAME, old, log_prob, advantages, mask, "token-mean", no_dual)
    # ... and at start, naming the key, before any step (the V1 trainer's check).
    cfg = OmegaConf.create(
        {"actor_rollout_ref": {"actor": {**no_dual, "policy_loss": {"loss_mode": rv.POLICY_LOSS_NAME}}}}
    )
    with pytest.raises(ValueError, match=r"actor_rollout_ref.actor: .*clip_ratio_c"):
        check_v1_config(cfg)


def test_verl_finds_rwcore_through_its_registries():
    assert core_algos.get_policy_loss_fn(rv.POLICY_LOSS_NAME) is rv.compute_policy_loss_rwcore
    assert core_algos.get_adv_estimator_fn(rv.ADV_ESTIMATOR_NAME) is rv.compute_arise_advantage


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
    advantages, returns = rv.compute_arise_advantage(
        token_level_rewards=rewards_tok,
        response_mask=mask,
        index=index,
        config=config,
        non_tensor_batch=non_tensor,
        batch={},
    )
    matrix = _expected_matrix(rows)
    assert np.isfinite(matrix).any()
    per_response = rwcore.compute_advantages(rewards_tok.sum(-1).numpy(), matrix, _int_groups(index), lam=0.4)
    expected = torch.from_numpy(per_response).float().unsqueeze(-1) * mask
    torch.testing.assert_close(advantages, expected, rtol=1e-6, atol=1e-6)
    assert returns is advantages
    assert advantages.dtype == torch.float32 and advantages.shape == mask.shape
    assert (advantages[~mask] == 0).all()
    # The rubric term matters: lam = 0 gives the task-only advantages.
    task_only, _ = rv.compute_arise_advantage(
        rewards_tok, mask, index, config={"rwcore": {"lam": 0.0}}, non_tensor_batch=non_tensor
    )
    assert not torch.allclose(task_only, advantages)


def test_advantage_estimator_reads_per_rubric_keys_and_defaults():
    rewards_tok, mask, index, rows = _estimator_case(7)
    columns = {f"rwcore_verdicts/{r}": np.array([row.get(r, "invalid") for row in rows], dtype=object) for r in RUBRICS}
    advantages, _ = rv.compute_arise_advantage(
        rewards_tok, mask, index, config=None, non_tensor_batch={"uid": index, **columns}
    )
    # A rubric missing from a mapping row is INVALID, written "invalid" in the per-rubric layout.
    expected, _ = rv.compute_arise_advantage(
        rewards_tok, mask, index, non_tensor_batch={"uid": index, "rwcore_verdicts": np.array(rows, dtype=object)}
    )
    torch.testing.assert_close(advantages, expected)
    per_response = rwcore.compute_advantages(rewards_tok.sum(-1).numpy(), _expected_matrix(rows), _int_groups(index))
    torch.testing.assert_close(
        advantages, torch.from_numpy(per_response).float().unsqueeze(-1) * mask, rtol=1e-6, atol=1e-6
    )


def test_advantage_estimator_refuses_to_drop_the_rubric_term_silently():
    rewards_tok, mask, index, rows = _estimator_case(1)
    with pytest.raises(ValueError, match="forwards it only to 'gdpo'"):
        rv.compute_arise_advantage(rewards_tok, mask, index)  # how stock verl calls it
    with pytest.raises(ValueError, match="rwcore_verdicts"):
        rv.compute_arise_advantage(rewards_tok, mask, index, non_tensor_batch={"uid": index})
    with pytest.raises(ValueError, match="unknown keys"):
        rv.compute_arise_advantage(
            rewards_tok, mask, index, config={"rwcore": {"lamda": 0.3}}, non_tensor_batch={"uid": index}
        )
    with pytest.raises(ValueError, match="not a verdict"):
        rv.compute_arise_advantage(
            rewards_tok,
            mask,
            index,
            non_tensor_batch={"uid": index, "rwcore_verdicts": np.array([{"x": 0.7}] * len(index), dtype=object)},
        )
    # Explicitly task-only: equals compute_advantages with no rubric columns.
    task_only, _ = rv.compute_arise_advantage(rewards_tok, mask, index, config={"rwcore": {"verdicts_key": None}})
    expected = rwcore.compute_advantages(rewards_tok.sum(-1).numpy(), np.zeros((len(index), 0)), _int_groups(index))
    torch.testing.assert_close(task_only, torch.from_numpy(expected).float().unsqueeze(-1) * mask)


def _data_proto(rewards_tok, mask, index, non_tensor):
    return DataProto.from_dict(
        tensors={"token_level_rewards": rewards_tok, "response_mask": mask.long()},
        non_tensors={"uid": index, **{k: v for k, v in non_tensor.items() if k != "uid"}},
    )


def _reference(rewards_tok, mask, index, rows, lam):
    per_response = rwcore.compute_advantages(
        rewards_tok.sum(-1).numpy(), _expected_matrix(rows), _int_groups(index), lam=lam
    )
    return torch.from_numpy(per_response).float().unsqueeze(-1) * mask


def test_legacy_compute_advantage_routes_the_verdicts_to_rwcore_arise():
    rewards_tok, mask, index, rows = _estimator_case(3)
    verdicts = {"rwcore_verdicts": np.array(rows, dtype=object)}
    config = AlgoConfig(adv_estimator=rv.ADV_ESTIMATOR_NAME)
    config_lam = OmegaConf.create({"adv_estimator": rv.ADV_ESTIMATOR_NAME, "rwcore": {"lam": 0.4}})
    stock = getattr(ray_trainer.compute_advantage, "__wrapped__", ray_trainer.compute_advantage)
    # verl's own compute_advantage passes non_tensor_batch only to "gdpo": without the forwarder, refused.
    with pytest.raises(ValueError, match="forwards it only to 'gdpo'"):
        stock(_data_proto(rewards_tok, mask, index, verdicts), rv.ADV_ESTIMATOR_NAME, config=config)
    assert "verl.trainer.ppo.ray_trainer" in rv.install_advantage_forwarding() or getattr(
        ray_trainer.compute_advantage, "__rwcore_forwarding__", False
    )
    for cfg, lam in ((config, 0.3), (config_lam, 0.4)):
        data = ray_trainer.compute_advantage(
            _data_proto(rewards_tok, mask, index, verdicts), rv.ADV_ESTIMATOR_NAME, num_repeat=4, config=cfg
        )
        torch.testing.assert_close(
            data.batch["advantages"], _reference(rewards_tok, mask, index, rows, lam), rtol=1e-6, atol=1e-6
        )
    # every other estimator still goes to verl's own code: GRPO's advantages are verl's
    grpo = ray_trainer.compute_advantage(_data_proto(rewards_tok, mask, index, verdicts), "grpo", config=config)
    ref = stock(_data_proto(rewards_tok, mask, index, verdicts), "grpo", config=config)
    torch.testing.assert_close(grpo.batch["advantages"], ref.batch["advantages"])


def test_v1_compute_advantage_gets_the_verdicts_from_the_trainers_scope():
    # verl 0.9's V1 _compute_advantage builds a DataProto with ONLY uid in non_tensor_batch and calls
    # compute_advantage_for_multi_trajectories; "rwcore_sync" fetches the verdicts by the same keys and
    # runs it inside verdicts_in_scope.
    rewards_tok, mask, index, rows = _estimator_case(4)
    keys = [f"{uid}_0_{i}" for i, uid in enumerate(index)]
    config = OmegaConf.create({"adv_estimator": rv.ADV_ESTIMATOR_NAME, "rwcore": {"lam": 0.25}})
    with pytest.raises(ValueError, match="rwcore_verdicts|trainer.v1.trainer_mode=rwcore_sync"):
        v1_utils.compute_advantage_for_multi_trajectories(
            _data_proto(rewards_tok, mask, index, {}), keys, rv.ADV_ESTIMATOR_NAME, num_repeat=4, config=config
        )
    with verdicts_in_scope({"rwcore_verdicts": np.array(rows, dtype=object)}):
        data = v1_utils.compute_advantage_for_multi_trajectories(
            _data_proto(rewards_tok, mask, index, {}), keys, rv.ADV_ESTIMATOR_NAME, num_repeat=4, config=config
        )
    torch.testing.assert_close(
        data.batch["advantages"], _reference(rewards_tok, mask, index, rows, 0.25), rtol=1e-6, atol=1e-6
    )
    with pytest.raises(ValueError, match="entries, expected"):  # a scope from another batch is refused
        with verdicts_in_scope({"rwcore_verdicts": np.array(rows[:-1], dtype=object)}):
            v1_utils.compute_advantage_for_multi_trajectories(
                _data_proto(rewards_tok, mask, index, {}), keys, rv.ADV_ESTIMATOR_NAME, num_repeat=4, config=config
            )


def test_v1_trainer_mode_is_registered_with_verls_trainer_registry():
    import verl.trainer.ppo.v1 as v1  # the plugin's post-import hook registers "rwcore_sync" here

    cls = v1.get_trainer_cls("rwcore_sync")
    assert issubclass(cls, v1.PPOTrainerSync)
    assert cls._compute_advantage is not v1.PPOTrainerSync._compute_advantage
    assert cls._init_dataloader is not v1.PPOTrainerSync._init_dataloader


def _v1_config(**over):
    base = {
        "actor_rollout_ref": {
            "actor": {
                "clip_ratio_low": 0.5,
                "clip_ratio_high": 4.0,
                "clip_ratio_c": 3.0,
                "policy_loss": {"loss_mode": rv.POLICY_LOSS_NAME},
            },
            "rollout": {"n": 3},
        },
        "algorithm": {"adv_estimator": rv.ADV_ESTIMATOR_NAME, "filter_groups": {"enable": False}},
        "data": {
            "train_batch_size": 4,
            "gen_batch_size": None,
            "dataloader_num_workers": 0,
            "rwcore_sampler": {"rubrics": dict(CAPABILITY)},
        },
        "trainer": {"v1": {"trainer_mode": "rwcore_sync", "sampler": {"sync_refill_failed_groups": False}}},
    }
    return OmegaConf.merge(OmegaConf.create(base), OmegaConf.create(over))


def test_v1_config_errors_name_the_key_at_start():
    settings = check_v1_config(_v1_config())
    assert settings["group_size"] == 3  # defaults to actor_rollout_ref.rollout.n
    bad = [
        ({"algorithm": {"adv_estimator": "grpo"}}, "algorithm.adv_estimator"),
        ({"algorithm": {"rwcore": {"verdicts_key": None}}}, "algorithm.rwcore.verdicts_key"),
        ({"data": {"dataloader_num_workers": 8}}, "data.dataloader_num_workers=0"),
        ({"algorithm": {"filter_groups": {"enable": True}}}, "algorithm.filter_groups.enable"),
        ({"data": {"rwcore_sampler": {"group_size": 4}}}, "actor_rollout_ref.rollout.n"),
        ({"actor_rollout_ref": {"actor": {"clip_ratio_c": 0.9}}}, "clip_ratio_c"),
        ({"algorithm": {"rwcore": {"lamda": 0.3}}}, "unknown keys"),
    ]
    for over, key in bad:
        with pytest.raises(ValueError, match=key.replace(".", r"\.")):
            check_v1_config(_v1_config(**over))


PLUGIN_SCRIPT = """
import sys
import verl                                         # verl's plugin discovery imports rwcore's entry point
assert "rwcore.integrations.verl.plugin" in sys.modules, "verl did not load rwcore's verl.plugins entry point"
import verl.trainer.ppo.core_algos as ca
from rwcore.integrations.verl import compute_arise_advantage, compute_policy_loss_rwcore
assert ca.get_policy_loss_fn("rwcore_filtered_dual_clip") is compute_policy_loss_rwcore
assert ca.get_adv_estimator_fn("rwcore_arise") is compute_arise_advantage
assert "verl.trainer.ppo.v1" not in sys.modules     # the heavy V1 trainer is not imported by the plugin
hooks = [f for f in sys.meta_path if type(f).__name__ == "_RegisterAfterImport"]
print(len(hooks))                                   # ... it registers "rwcore_sync" when that module loads
"""


def test_import_verl_loads_rwcore_as_a_verl_plugin():
    result = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", PLUGIN_SCRIPT], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "1"
    # In this process verl was imported the same way (top of this file), and importing verl.trainer.ppo.v1
    # (v1_utils) ran the hook: test_v1_trainer_mode_is_registered_with_verls_trainer_registry checks it.


# =============================================================================================
# Curriculum sampler
# =============================================================================================

TAGS = ["refund", "search", "bulk_import"]
CAPABILITY = {
    "cites-order-id": "Verification",
    "no-duplicate-calls": "Efficiency",
    "asks-before-refund": "Understanding",
}


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
        self.dataframe = FakeFrame(
            {
                "data_source": ["negotiation"] * num_tasks,
                "rwcore_task_id": ids,
                "rwcore_tags": [[TAGS[i % 3]] + (["search"] if i % 4 == 0 else []) for i in range(num_tasks)],
                "prompt": [f"prompt {i}" for i in range(num_tasks)],
            }
        )
        self.ids = ids

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"index": i}


def _data_config(batch_size=4, group_size=3, **extra):
    # What verl hands the sampler: config.data, with the rwcore keys added under data.sampler.
    sampler = {
        "class_path": "pkg://rwcore.integrations.verl",
        "class_name": "RwcoreCurriculumSampler",
        "group_size": group_size,
        "rubrics": dict(CAPABILITY),
        "seed": 11,
        **extra,
    }
    return {
        "train_batch_size": batch_size,
        "gen_batch_size": None,
        "seed": None,
        "dataloader_num_workers": 0,
        "sampler": sampler,
    }


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
    return SimpleNamespace(
        batch={},
        meta_info={},
        non_tensor_batch={
            "uid": np.array([r[0] for r in rows], dtype=object),
            "rwcore_task_id": np.array([r[1] for r in rows], dtype=object),
            "rwcore_verdicts": np.array([r[2] for r in rows], dtype=object),
        },
    )


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
    return DataLoader(
        list(range(len(dataset))),
        batch_size=batch_size,
        sampler=sampler,
        num_workers=0,
        drop_last=True,
        collate_fn=lambda items: items,
    )


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
    keep = [i for i, uid in enumerate(uids) if uid == "uid-0-0"] + [
        i for i, uid in enumerate(uids) if uid == "uid-0-1"
    ][:2]
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
        rv.RwcoreCurriculumSampler(
            RowsDataset([{"data_source": "x"}]), {"train_batch_size": 1, "sampler": {"group_size": 2}}
        )


def test_sampler_resumes_exactly_through_torchdatas_stateful_dataloader():
    # verl saves torch.save(train_dataloader.state_dict()) in data.pt and loads it on resume.
    dataset = FakeRLHFDataset(20)
    config = _data_config(batch_size=4, num_batches=5)

    def loader(sampler):
        return StatefulDataLoader(
            list(range(len(dataset))),
            batch_size=4,
            sampler=sampler,
            num_workers=0,
            drop_last=True,
            collate_fn=lambda items: items,
        )

    a = rv.RwcoreCurriculumSampler(dataset, config)
    loader_a = loader(a)
    it_a = iter(loader_a)
    _run(a, dataset, it_a, steps=3, first_step=0)
    saved = pickle.loads(pickle.dumps(loader_a.state_dict()))
    rest_a = _run(a, dataset, it_a, steps=2, first_step=3)

    b = rv.RwcoreCurriculumSampler(dataset, config)
    loader_b = loader(b)
    loader_b.load_state_dict(saved)
    it_b = iter(loader_b)
    assert _run(b, dataset, it_b, steps=2, first_step=3) == rest_a
    with pytest.raises(StopIteration):  # 5 batches per pass, as len(loader) says
        next(it_b)


# =============================================================================================
# The configuration docs/integrations.md gives, composed with verl 0.9.1's own Hydra config
# =============================================================================================


def _documented_overrides(heading="### Configuration (verl 0.9.1, V1 trainer, Hydra overrides)"):

    text = (ROOT / "docs" / "integrations.md").read_text()
    block = text.split(heading, 1)[1].split("```bash", 1)[1]
    block = block.split("```", 1)[0]
    overrides = []
    for line in block.splitlines():
        match = re.match(r"^\s+(\+?[a-z_][\w.]*=.*?)\s*\\$", line)
        if match:
            key, _, value = match.group(1).partition("=")
            overrides.append(f"{key}={value.strip(chr(39))}")
    return overrides


def test_documented_configuration_composes_with_verls_config_and_passes_the_start_checks():
    import os

    from hydra import compose, initialize_config_dir

    overrides = _documented_overrides()
    assert "trainer.v1.trainer_mode=rwcore_sync" in overrides and len(overrides) >= 9
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        cfg = compose("ppo_trainer", overrides=overrides + ["actor_rollout_ref.rollout.n=4"])
        assert cfg.trainer.use_v1 is True  # verl 0.9.1's default trainer is V1
        settings = check_v1_config(cfg)
        assert settings["group_size"] == 4 and settings["rubrics"]["cites-order-id"] == "Verification"
        assert rv.loss_params_from_config(cfg.actor_rollout_ref.actor) == LossSettings(0.5, 5.0, 3.0)
        # the 0.7-era sampler override no longer exists in verl 0.9.1's config
        with pytest.raises(Exception, match="sampler"):
            compose("ppo_trainer", overrides=["data.sampler.class_path=pkg://rwcore.integrations.verl"])


# =============================================================================================
# rwcore_sync's _compute_advantage: verl's REAL V1 _compute_advantage, TransferQueue replaced by an
# in-memory key-value store (TransferQueue needs its Ray controller and storage actors). The store keeps,
# per sample key, the fields verl writes (response_mask / rm_scores as 1-D tensors, read back as jagged
# nested tensors; uid and the reward extra info as Python values) and returns only fields it has.
# =============================================================================================


class KVStore:
    def __init__(self):
        self.rows = {}

    def kv_batch_put(self, keys, partition_id=None, fields=None, tags=None):
        from transfer_queue import KVBatchMeta

        for i, key in enumerate(keys):
            for name in fields.keys():
                self.rows.setdefault(key, {})[name] = fields[name][i]
        return KVBatchMeta(keys=list(keys), tags=[{} for _ in keys], partition_id=partition_id)

    def kv_batch_get(self, keys, partition_id=None, select_fields=None):
        out = {}
        for name in select_fields:
            if all(name in self.rows[key] for key in keys):
                values = [self.rows[key][name] for key in keys]
                out[name] = (
                    torch.nested.as_nested_tensor(values, layout=torch.jagged)
                    if isinstance(values[0], torch.Tensor)
                    else values
                )
        return tu.get_tensordict(out)


def test_rwcore_sync_hands_the_verdicts_to_the_estimator_and_feeds_the_sampler(monkeypatch):
    import transfer_queue
    from transfer_queue import KVBatchMeta

    from rwcore.integrations.verl.trainer_v1 import trainer_class

    store = KVStore()
    monkeypatch.setattr(transfer_queue, "kv_batch_put", store.kv_batch_put)
    monkeypatch.setattr(transfer_queue, "kv_batch_get", store.kv_batch_get)
    cls = trainer_class()
    trainer = cls.__new__(cls)  # the hooks only; __init__ would start Ray workers
    trainer.config = OmegaConf.create(
        {
            "algorithm": {
                "adv_estimator": rv.ADV_ESTIMATOR_NAME,
                "use_kl_in_reward": False,
                "gamma": 1.0,
                "lam": 1.0,
                "norm_adv_by_std_in_grpo": True,
                "rwcore": {"lam": 0.4},
            },
            "actor_rollout_ref": {"rollout": {"n": 3}},
        }
    )
    dataset = FakeRLHFDataset(8)
    trainer.rwcore_sampler = rv.RwcoreCurriculumSampler(dataset, _data_config(batch_size=4, group_size=3))
    rewards_tok, mask, index, rows = _estimator_case(5, groups=4, n=3, T=6)
    mask[:, 0] = True
    mask = torch.cumprod(mask.long(), dim=1).bool()  # TransferQueue stores responses unpadded: prefix masks
    rewards_tok = rewards_tok * mask
    task_of = {uid: dataset.ids[i] for i, uid in enumerate(dict.fromkeys(index))}
    keys = [f"{uid}_0_{i}" for i, uid in enumerate(index)]
    for i, key in enumerate(keys):
        n = int(mask[i].sum())
        store.rows[key] = {
            "uid": index[i],
            "response_mask": torch.ones(n, dtype=torch.long),
            "rm_scores": rewards_tok[i, :n].clone(),
            "rwcore_verdicts": rows[i],
            "rwcore_task_id": task_of[index[i]],
        }
    metrics = {}
    trainer._compute_advantage(KVBatchMeta(keys=keys, tags=[{} for _ in keys], partition_id="train"), metrics)
    expected = _reference(rewards_tok, mask, index, rows, 0.4)
    for i, key in enumerate(keys):
        n = int(mask[i].sum())
        torch.testing.assert_close(store.rows[key]["advantages"], expected[i, :n], rtol=1e-6, atol=1e-6)
    assert trainer.rwcore_sampler.policy_version == 1  # fed once, all four groups
    assert metrics["rwcore/sampler/groups"] == 4 and metrics["rwcore/sampler/skipped_groups"] == 0
    attempts = sum(trainer.rwcore_sampler.sampler.task_state(t)["attempts"] for t in task_of.values())
    assert attempts == 4


def test_rwcore_sync_refused_where_verl_has_no_trainer_registry(monkeypatch):
    from rwcore.integrations.verl import trainer_v1

    if HAS_V1:  # verl 0.9: hide its V1 package (on verl 0.8.0, run by test_integration_versions.py, it is absent)
        monkeypatch.setattr(trainer_v1, "_registered", lambda: None)  # as if nothing were registered yet
        real = importlib.util.find_spec
        monkeypatch.setattr(
            trainer_v1.importlib.util,
            "find_spec",
            lambda name, *args: None if name == "verl.trainer.ppo.v1" else real(name, *args),
        )
    with pytest.raises(RuntimeError, match=r"trainer\.v1\.trainer_mode=rwcore_sync needs .*verl >= 0\.9.*legacy"):
        trainer_v1.trainer_class()


def test_legacy_task_runner_hands_verl_the_curriculum_sampler_and_feeds_it(monkeypatch):
    # verl 0.8's trainer (and 0.9's legacy one): no plugins, no trainer registry. RwcoreTaskRunner.run relies
    # on what verl's own TaskRunner.run does -- build the sampler with the module's create_rl_sampler and hand
    # it to RayPPOTrainer -- checked in verl's source here.
    from rwcore.integrations.verl import legacy

    module = legacy.legacy_module()
    base = getattr(module.TaskRunner, "__ray_actor_class__", module.TaskRunner)
    source = inspect.getsource(base.run)
    assert "create_rl_sampler(config.data, train_dataset)" in source and "train_sampler=train_sampler" in source
    cls = legacy.task_runner_class()
    assert issubclass(cls, base) and legacy.RwcoreTaskRunner is cls  # Ray finds it by reference
    original = module.create_rl_sampler
    dataset = FakeRLHFDataset(12)
    steps = []

    def verls_run(self, config):
        # verl's run needs Ray and GPUs: in its place the two calls its run and RayPPOTrainer.fit make
        sampler = module.create_rl_sampler(config.data, dataset)
        loader = iter(_loader(sampler, dataset, 4))
        for step in range(2):
            indices = next(loader)
            batch = _verl_batch(dataset, indices, 3, step)
            n = len(batch.non_tensor_batch["uid"])
            g = torch.Generator().manual_seed(step)
            rewards_tok = torch.zeros(n, 5)
            rewards_tok[:, -1] = torch.randint(0, 2, (n,), generator=g).float()
            mask = torch.ones(n, 5, dtype=torch.bool)
            data = ray_trainer.compute_advantage(
                _data_proto(rewards_tok, mask, batch.non_tensor_batch["uid"], batch.non_tensor_batch),
                config.algorithm.adv_estimator,
                num_repeat=3,
                config=config.algorithm,
            )
            rows = list(batch.non_tensor_batch["rwcore_verdicts"])
            torch.testing.assert_close(
                data.batch["advantages"],
                _reference(rewards_tok, mask, batch.non_tensor_batch["uid"], rows, 0.3),
                rtol=1e-6,
                atol=1e-6,
            )
            steps.append((list(indices), sampler.policy_version, dict(sampler.last_update)))
        return sampler

    monkeypatch.setattr(base, "run", verls_run)
    config = OmegaConf.create(
        {
            "actor_rollout_ref": {
                "actor": {
                    "clip_ratio_low": 0.5,
                    "clip_ratio_high": 4.0,
                    "clip_ratio_c": 3.0,
                    "policy_loss": {"loss_mode": rv.POLICY_LOSS_NAME},
                },
                "rollout": {"n": 3},
            },
            "algorithm": {"adv_estimator": rv.ADV_ESTIMATOR_NAME},
            "data": {
                "train_batch_size": 4,
                "gen_batch_size": None,
                "dataloader_num_workers": 0,
                "seed": None,
                "rwcore_sampler": {"rubrics": dict(CAPABILITY), "seed": 11},
            },
        }
    )
    sampler = cls().run(config)
    assert isinstance(sampler, rv.RwcoreCurriculumSampler) and sampler.sampler.rubrics == CAPABILITY
    assert sampler.sampler.group_size == 3  # data.rwcore_sampler.group_size defaults to rollout.n
    # fed once per step, by the forwarded compute_advantage, with every uid group of the step
    assert [(version, update) for _, version, update in steps] == [
        (1, {"groups": 4, "skipped_groups": 0}),
        (2, {"groups": 4, "skipped_groups": 0}),
    ]
    assert sum(sampler.sampler.task_state(t)["attempts"] for t in dataset.ids) == 8
    assert all(len(set(indices)) == 4 for indices, _, _ in steps)
    assert module.create_rl_sampler is original  # nothing left behind
    assert getattr(ray_trainer.compute_advantage, "rwcore_after_arise", None) is None
    # bad settings are refused at start, naming the key, before verl builds anything
    steps.clear()
    for key, value, named in (
        ("dataloader_num_workers", 2, "data.dataloader_num_workers=0"),
        ("rwcore_sampler", {"group_size": 4}, "actor_rollout_ref.rollout.n"),
    ):
        bad = OmegaConf.merge(config, OmegaConf.create({"data": {key: value}}))
        with pytest.raises(ValueError, match=re.escape(named)):
            cls().run(bad)
    assert not steps and module.create_rl_sampler is original


def test_documented_legacy_configuration_composes_with_verls_config_and_passes_the_start_checks():
    # docs/integrations.md's verl 0.8.0 block (python -m rwcore.integrations.verl.legacy), composed with the
    # legacy trainer's Hydra config of this verl (0.8.0 in test_integration_versions.py; 0.9.1 here, with
    # trainer.use_v1=false, the legacy trainer's switch there)
    from hydra import compose, initialize_config_dir

    from rwcore.integrations.verl import legacy

    overrides = _documented_overrides("### verl 0.8.0 (and 0.9's legacy trainer)")
    assert (
        "actor_rollout_ref.model.external_lib=rwcore.integrations.verl.autoregister" in overrides
        and len(overrides) >= 10
    )
    import verl.trainer.main_ppo as main_ppo

    config_dir = os.path.join(os.path.dirname(main_ppo.__file__), "config")  # what legacy.main() composes
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        extra = ["trainer.use_v1=false"] if HAS_V1 else []
        cfg = compose("ppo_trainer", overrides=overrides + extra + ["actor_rollout_ref.rollout.n=4"])
    assert "v1" not in cfg.trainer or cfg.trainer.use_v1 is False
    import verl.trainer.ppo.core_algos as core_algos

    core_algos.POLICY_LOSS_REGISTRY.pop(rv.POLICY_LOSS_NAME, None)  # what a fresh worker process has
    sys.modules.pop(cfg.actor_rollout_ref.model.external_lib, None)
    importlib.import_module(cfg.actor_rollout_ref.model.external_lib)  # what verl's worker does with it: registers
    assert core_algos.get_policy_loss_fn(rv.POLICY_LOSS_NAME) is rv.compute_policy_loss_rwcore
    settings = check_v1_config(cfg)
    assert settings["group_size"] == 4 and settings["rubrics"]["no-duplicate-calls"] == "Efficiency"
    assert rv.loss_params_from_config(cfg.actor_rollout_ref.actor) == LossSettings(0.5, 5.0, 3.0)
    assert legacy.legacy_module().__name__ == ("verl.trainer.main_ppo_v0" if HAS_V1 else "verl.trainer.main_ppo")


# ---------------------------------------------------------------- credit settings: verl's own key, algorithm.rwcore


def test_norm_adv_by_std_in_grpo_false_is_scale_rewards_none_as_verls_grpo():
    """verl's algorithm.norm_adv_by_std_in_grpo=False (which verl hands registered estimators inside `config`):
    task advantages equal verl's own GRPO estimator with the same flag (the real upstream code), and with
    verdicts the rubric term is rwcore.compute_advantages(scale_rewards="none")."""
    rewards_tok, mask, index, rows = _estimator_case(8)
    task_only = {"verdicts_key": None, "length_regularize": False, "eps": 1e-6}  # verl's GRPO epsilon
    for norm in (True, False):
        config = OmegaConf.create({"adv_estimator": rv.ADV_ESTIMATOR_NAME, "norm_adv_by_std_in_grpo": norm})
        ours, _ = rv.compute_arise_advantage(rewards_tok, mask, index, config={**config, "rwcore": task_only})
        verls, _ = core_algos.compute_grpo_outcome_advantage(rewards_tok, mask, index, norm_adv_by_std_in_grpo=norm)
        torch.testing.assert_close(ours, verls, rtol=1e-5, atol=1e-6)
    # through verl's legacy compute_advantage (the forwarder), with the rubric verdicts
    rv.install_advantage_forwarding()
    config = OmegaConf.create({"adv_estimator": rv.ADV_ESTIMATOR_NAME, "norm_adv_by_std_in_grpo": False})
    verdicts = {"rwcore_verdicts": np.array(rows, dtype=object)}
    data = ray_trainer.compute_advantage(
        _data_proto(rewards_tok, mask, index, verdicts), rv.ADV_ESTIMATOR_NAME, num_repeat=4, config=config
    )
    per_response = rwcore.compute_advantages(
        rewards_tok.sum(-1).numpy(), _expected_matrix(rows), _int_groups(index), scale_rewards="none"
    )
    expected = torch.from_numpy(per_response).float().unsqueeze(-1) * mask
    torch.testing.assert_close(data.batch["advantages"], expected, rtol=1e-6, atol=1e-6)
    assert not torch.allclose(data.batch["advantages"], _reference(rewards_tok, mask, index, rows, 0.3))
    # the argument verl's GRPO takes works the same
    direct, _ = rv.compute_arise_advantage(
        rewards_tok, mask, index, norm_adv_by_std_in_grpo=False, non_tensor_batch={"uid": index, **verdicts}
    )
    torch.testing.assert_close(direct, expected, rtol=1e-6, atol=1e-6)


def test_rwcore_arise_reads_the_credit_settings_as_a_validated_method_settings():
    from advantage_reference import ref_credit_advantages

    rewards_tok, mask, index, rows = _estimator_case(9)
    non_tensor = {"uid": index, "rwcore_verdicts": np.array(rows, dtype=object)}
    section = {"scale_rewards": "batch", "process_gate": "success_only", "low_outcome": 0.75, "lam": 0.5}
    got, _ = rv.compute_arise_advantage(
        rewards_tok, mask, index, config={"rwcore": section}, non_tensor_batch=non_tensor
    )
    scores = rewards_tok.sum(-1).numpy().astype(np.float64)
    expected = ref_credit_advantages(
        scores,
        _expected_matrix(rows),
        _int_groups(index),
        lam=0.5,
        scale_rewards="batch",
        process_gate="success_only",
        successes=scores >= 0.75,
    )
    torch.testing.assert_close(got, torch.from_numpy(expected).float().unsqueeze(-1) * mask, rtol=1e-5, atol=1e-6)
    settings = rv._arise_settings({"rwcore": section})
    assert (settings.method.scale_rewards, settings.method.process_gate, settings.method.lam) == (
        "batch",
        "success_only",
        0.5,
    )
    refused = [
        ({"rwcore": {"aggregation": "normalize_then_sum"}}, "algorithm.rwcore.aggregation"),
        ({"rwcore": {"verdicts_key": None, "process_gate": "success_groups"}}, "algorithm.rwcore.process_gate"),
        ({"rwcore": {"scale_rewards": "batch"}, "norm_adv_by_std_in_grpo": False}, "norm_adv_by_std_in_grpo=False"),
        ({"rwcore": {"scale_rewards": "std"}}, "algorithm.rwcore: scale_rewards must be one of"),
        ({"rwcore": {"lam": 1.5}}, "algorithm.rwcore: lam"),
    ]
    for config, message in refused:
        with pytest.raises(ValueError, match=re.escape(message)):
            rv.compute_arise_advantage(rewards_tok, mask, index, config=config, non_tensor_batch=non_tensor)
