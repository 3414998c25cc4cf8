"""loss.adaptive_entropy: TRL's adaptive entropy control (use_adaptive_entropy, Skywork-OR1) in `rw train`.

TRL 1.16's documented rule (GRPOConfig: "entropy_coef is incremented by entropy_coef_delta when the current
entropy is below entropy_target, and decremented otherwise ... only applied when entropy is at or below
entropy_target"; GRPOTrainer._compute_loss: the step applies the coefficient from the end of the previous
step, gated by the last measured entropy, which starts at +inf; the update clamps to [entropy_coef_min,
entropy_coef_max]) is worked by hand below for a sequence of entropies, then checked in short CPU runs:
the coefficient the metrics rows report, a gated-off bonus that leaves the update exactly as without one,
and a resumed run that continues the controller exactly.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from _util import SMALL_RUN, metrics_rows, overrides_with, without_timing

from rwcore.trainer import checkpoint as ckpt
from rwcore.trainer.config import load_config
from rwcore.trainer.entropy_control import AdaptiveEntropyControl
from rwcore.trainer.trainer import Trainer

SMALL = overrides_with(
    SMALL_RUN,
    "train.method=rewardweaver",  # a process reward from the first step: the advantages are not all 0
    drop=["pool.delta_pool"],
)
ADAPTIVE = ["loss.adaptive_entropy=true", "loss.entropy_coef=0.01", "loss.entropy_coef_delta=0.005"]


def test_the_controller_follows_trls_rule_on_a_hand_worked_sequence():
    control = AdaptiveEntropyControl(coef=0.01, target=0.5, delta=0.005, coef_min=0.0, coef_max=0.02)
    # (step's mean entropy, coefficient applied during that step, coefficient after it)
    steps = [
        (0.8, 0.0, 0.005),  # nothing measured yet: no bonus; 0.8 > 0.5: down by delta
        (0.5, 0.0, 0.010),  # last entropy 0.8 > target: no bonus; 0.5 <= 0.5 (at the target): up
        (0.3, 0.010, 0.015),  # last 0.5 <= target: the bonus is the coefficient from the end of the previous step
        (0.2, 0.015, 0.020),
        (0.1, 0.020, 0.020),  # clamped at entropy_coef_max
        (0.9, 0.020, 0.015),  # applied before the step's entropy is known
        (1.0, 0.0, 0.010),  # last 0.9 > target: gated off while the coefficient keeps falling
        (1.0, 0.0, 0.005),
        (1.0, 0.0, 0.0),
        (1.0, 0.0, 0.0),  # clamped at entropy_coef_min
        (0.4, 0.0, 0.005),
        (0.4, 0.005, 0.010),
    ]
    for entropy, applied, after in steps:
        assert control.applied() == pytest.approx(applied, abs=1e-15)
        tokens = 8.0
        assert control.update(entropy * tokens, tokens) == pytest.approx(entropy)  # the token-weighted mean
        assert control.coef == pytest.approx(after, abs=1e-15) and control.last_entropy == pytest.approx(entropy)
    # no token at all: the mean is 0 (TRL's sum / max(count, 1)), at or below any target
    control.update(0.0, 0.0)
    assert control.last_entropy == 0.0 and control.coef == pytest.approx(0.015)
    state = control.state_dict()
    twin = AdaptiveEntropyControl(coef=0.01, target=0.5, delta=0.005, coef_min=0.0, coef_max=0.02)
    assert twin.last_entropy == math.inf and twin.applied() == 0.0
    twin.load_state_dict(state)
    assert (twin.coef, twin.last_entropy, twin.applied()) == (control.coef, 0.0, control.coef)
    with pytest.raises(ValueError, match="rwcore.adaptive_entropy"):
        twin.load_state_dict({"coef": 1.0})


def test_config_keys_and_their_bounds():
    loss = load_config(None).loss
    assert (loss.adaptive_entropy, loss.entropy_target, loss.entropy_coef_delta) == (False, 0.2, 0.005)
    assert (loss.entropy_coef_min, loss.entropy_coef_max) == (0.0, 1.0)  # TRL's defaults
    with pytest.raises(ValueError, match="'loss.entropy_coef_min' and 'loss.entropy_coef_max'"):
        load_config(None, ["loss.entropy_coef_min=0.5", "loss.entropy_coef_max=0.1"])
    with pytest.raises(ValueError, match="loss.entropy_target"):
        load_config(None, ["loss.entropy_target=-1"])


def _run(folder: Path, *overrides: str, steps: int) -> list[dict]:
    trainer = Trainer(load_config(None, [*SMALL, f"train.steps={steps}", *overrides]), folder, quiet=True)
    trainer.setup()
    trainer.train()
    trainer.cleanup()
    return _train_rows(folder)


def _train_rows(folder: Path) -> list[dict]:
    return without_timing(metrics_rows(folder, "train"))


def test_the_rows_report_the_coefficient_applied_and_an_unapplied_bonus_changes_nothing(tmp_path):
    plain = _run(tmp_path / "plain", "loss.entropy_coef=0", steps=3)
    assert all("entropy_coef" not in row and "entropy" not in row for row in plain)  # off: the row as before
    # a target above any entropy: every step's entropy is at or below it, so the coefficient grows by delta
    # after each step (0.01 -> 0.015 -> 0.02, capped at 0.02); the first step has no measurement yet: no bonus
    always = _run(tmp_path / "always", *ADAPTIVE, "loss.entropy_target=1000", "loss.entropy_coef_max=0.02", steps=3)
    assert [row["entropy_coef"] for row in always] == pytest.approx([0.0, 0.015, 0.02])
    assert all(row["entropy"] > 0 for row in always)
    assert always[0]["loss"] == plain[0]["loss"] and always[0]["grad_norm"] == plain[0]["grad_norm"]
    assert always[1]["loss"] != plain[1]["loss"]  # the bonus applied from the second step on
    # a target of 0 nats: no entropy is at or below it, so the bonus is never applied and the run is the
    # plain one, number for number (the controller only measures)
    never = _run(tmp_path / "never", *ADAPTIVE, "loss.entropy_target=0", steps=3)
    assert [row["entropy_coef"] for row in never] == [0.0, 0.0, 0.0]
    assert [{k: v for k, v in row.items() if k not in ("entropy", "entropy_coef")} for row in never] == plain


def test_a_resumed_run_continues_the_controller_exactly(tmp_path):
    settings = [*ADAPTIVE, "loss.entropy_target=1000"]
    straight = _run(tmp_path / "straight", *settings, steps=6)
    assert [row["entropy_coef"] for row in straight] == pytest.approx([0.0, 0.015, 0.02, 0.025, 0.03, 0.035])
    interrupted = Trainer(load_config(None, [*SMALL, "train.steps=6", *settings]), tmp_path / "cut", quiet=True)
    interrupted.setup()
    interrupted.config.train.steps = 4
    interrupted.train()  # checkpoint at step 4
    interrupted._log(interrupted.train_step())  # a step whose checkpoint never happened: killed here
    interrupted.cleanup()
    state = ckpt.load(tmp_path / "cut" / "checkpoints" / "step_000004" / "state.pt")
    assert state["entropy_control"]["coef"] == pytest.approx(0.03)  # the coefficient step 5 applies
    assert state["entropy_control"]["last_entropy"] == pytest.approx(straight[3]["entropy"], rel=1e-5)
    resumed = Trainer.resume(tmp_path / "cut", quiet=True)
    resumed.setup()
    assert resumed.step == 4
    resumed.train()
    resumed.cleanup()
    assert _train_rows(tmp_path / "cut") == straight


def test_a_run_without_the_controller_writes_no_state_for_it(tmp_path):
    _run(tmp_path / "run", steps=2)
    assert "entropy_control" not in ckpt.load(tmp_path / "run" / "checkpoints" / "step_000002" / "state.pt")


def test_every_optimizer_step_moves_the_coefficient(tmp_path):
    # optim.epochs=2: two optimizer steps per training step, each applying the coefficient left by the one
    # before (step 1: 0 then 0.015 -> after 0.02; step 2: 0.02 then 0.025 -> after 0.03); the row reports
    # the mean of the two applied
    rows = _run(tmp_path / "run", *ADAPTIVE, "loss.entropy_target=1000", "optim.epochs=2", steps=2)
    assert [row["entropy_coef"] for row in rows] == pytest.approx([0.0075, 0.0225])
