"""`rw train` with a judge whose `evaluate` raises: the run goes on, every judgment of those
steps is INVALID (scored as a FAIL, no evidence), the failure is logged once per step, and each metrics
row carries the per-rubric invalid rates `judge/invalid_rate/<rubric id>`."""

from __future__ import annotations

import logging

from _util import SMALL_LOOP, metrics_rows, overrides_with

from rwcore.trainer.config import load_config
from rwcore.trainer.trainer import Trainer

SMALL = overrides_with(
    SMALL_LOOP,
    "train.eval_every=0",
    "train.checkpoint_every=0",
    "pool.delta_pool=2",
    "train.steps=4",
    "train.method=arise",
)


class RaisingJudge:
    """A user-supplied judge that crashes on the policy's text (not RuleJudge, which catches per rule)."""

    def __init__(self) -> None:
        self.calls = 0

    def evaluate(self, trajectories, rubrics):
        self.calls += 1
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "the policy wrote invalid bytes")


def test_a_judge_that_raises_gives_invalid_rows_and_the_run_goes_on(tmp_path, caplog):
    trainer = Trainer(load_config(None, SMALL), tmp_path / "run", quiet=True)
    trainer.setup()
    judge = trainer.judge = RaisingJudge()
    with caplog.at_level(logging.WARNING, logger="rwcore"):
        trainer.train()
    rows = metrics_rows(tmp_path / "run")
    train = [row for row in rows if row["kind"] == "train"]
    assert len(train) == 4
    judged = [row for row in train if row["judgments"]]  # the pool is empty until its first update
    assert judged and judge.calls >= len(judged)
    for row in judged:
        rates = {key: value for key, value in row.items() if key.startswith("judge/invalid_rate/")}
        assert rates and all(value == 1.0 for value in rates.values()) and row["invalid_rate"] == 1.0
    warnings = [r for r in caplog.records if "UnicodeDecodeError" in r.getMessage()]
    assert len(warnings) == len(judged)  # once per judged step
    sampler = trainer.method.sampler
    assert all(sampler.task_state(task)["applicable"] == set() for task in sampler.task_ids)  # no evidence
