"""`rw train loss.rollout_correction=...`: the mismatch metrics in every row, the decoupled form's proximal pass,
staleness under rollout.max_lag, and config errors that name the keys."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from _util import SMALL_LOOP, metrics_rows, overrides_with

from rwcore.trainer import cli
from rwcore.trainer.config import load_config

SMALL = overrides_with(
    SMALL_LOOP,
    "rollout.tasks_per_step=3",
    "train.eval_every=100",
    "train.checkpoint_every=100",
    "train.method=outcome_only",
    "optim.lr=3e-3",
)


def train_rows(out: Path, *overrides: str) -> list[dict]:
    code = cli.main(["train", "--out", str(out), "--quiet", *SMALL, *overrides])
    assert code == 0
    rows = metrics_rows(out)
    return [row for row in rows if "loss" in row]


def test_staleness_shows_in_the_metrics_and_the_correction_weights_it(tmp_path):
    """rollout.max_lag=1: step 1 trains on rollouts of the current weights (no mismatch), later steps on rollouts
    one update old; the decoupled correction measures proximal (the trainer's weights now) vs behaviour."""
    rows = train_rows(
        tmp_path / "run", "train.steps=4", "rollout.max_lag=1", "loss.rollout_correction=decoupled_token_icepop"
    )
    assert len(rows) == 4
    first, later = rows[0], rows[1:]
    assert abs(first["rollout_corr/kl"]) < 1e-5 and abs(first["rollout_corr/ratio_max"] - 1) < 1e-4
    for row in later:
        assert row["rollout/version_lag"] == 1
        assert row["rollout_corr/log_ppl_abs_diff"] > 1e-4  # an optimizer step apart (lr 3e-3)
        assert row["rollout_corr/ratio_min"] < 1 < row["rollout_corr/ratio_max"]
        for key in ("rollout_is_oob_ratio", "masked_fraction", "rollout_is_ratio_fraction_high"):
            assert 0.0 <= row[f"rollout_corr/{key}"] <= 1.0
        assert 0.0 < row["rollout_corr/rollout_is_eff_sample_size"] <= 1.0 + 1e-6
        assert all(math.isfinite(v) for k, v in row.items() if k.startswith("rollout_corr/"))


def test_the_proximal_pass_reproduces_the_trainers_behaviour_logprobs(tmp_path):
    """rollout.behavior_logprobs=trainer scores the behaviour log-probs with the training model just before the
    update (score_behavior); the decoupled form's proximal pass computes the same log-probs another way. So the
    mismatch is zero, every weight 1, and the losses are those of the run without a correction."""
    common = ["train.steps=3", "rollout.behavior_logprobs=trainer"]
    plain = train_rows(tmp_path / "plain", *common)
    corrected = train_rows(tmp_path / "corrected", *common, "loss.rollout_correction=decoupled_seq_is")
    for a, b in zip(plain, corrected):
        assert abs(b["rollout_corr/kl"]) < 1e-6 and abs(b["rollout_corr/chi2_seq"]) < 1e-4
        assert b["rollout_corr/rollout_is_mean"] == pytest.approx(1.0, abs=1e-4)
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4, abs=1e-6)
        # without a correction the metrics are logged all the same: the current policy vs behaviour
        assert abs(a["rollout_corr/kl"]) < 1e-6 and "rollout_corr/masked_fraction" not in a


def test_a_bypass_form_runs_without_a_proximal_pass(tmp_path):
    rows = train_rows(
        tmp_path / "run",
        "train.steps=3",
        "rollout.max_lag=1",
        "loss.rollout_correction=bypass_ppo_clip_k3_rs",
        "loss.rollout_rs_threshold=1e-4",
    )
    later = rows[1:]
    assert all(0.0 <= row["rollout_corr/rollout_rs_masked_fraction"] <= 1.0 for row in later)
    assert any(row["rollout_corr/rollout_rs_seq_masked_fraction"] > 0 for row in later)  # a tight K3 bound bites


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["loss.rollout_correction=decoupled_geo_rs", "loss.rollout_is_threshold=3"], "no importance weight"),
        (["loss.rollout_correction=decoupled_token_is", "loss.rollout_is_threshold=2_1"], "rollout_is_threshold"),
        (["loss.rollout_correction=bypass_ppo_clip_k3_rs", "loss.rollout_rs_threshold=0.1_1"], "upper bound only"),
        (["loss.rollout_correction=decoupled_everything"], "loss.rollout_correction"),
    ],
)
def test_bad_settings_name_the_config_keys(overrides, message):
    with pytest.raises(ValueError, match=message) as error:
        load_config(None, overrides)
    assert "loss.rollout_" in str(error.value)
