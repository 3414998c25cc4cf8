"""Evidence windows (Arise appendix B.3): per-rubric verdict counts and failed trajectories, by step.

Counts are kept per (rubric, step) so that an update at step k reads exactly
the window of the preceding `delta_pool` steps, k - delta_pool + 1 .. k, and
evidence recorded for a later step (a trainer that records iteration k + 1
before running the update of iteration k) is kept for the next window.
After an update everything up to its step is dropped: windows do not overlap.
"""

from __future__ import annotations

import numbers
from collections.abc import Collection, Mapping, Sequence

import numpy as np

from rwcore.types import JudgeReport, RubricJudgment
from rwcore.verdict import Verdict

_POSITION = {Verdict.PASS: 0, Verdict.FAIL: 1, Verdict.NA: 2, Verdict.INVALID: 3}  # in a count row


class WindowEvidence:
    """Per (rubric, step): [passes, fails, not applicable, invalid] and failed trajectory ids.

    At most `max_failures` failed trajectory ids are kept per (rubric, step), the latest ones;
    `failure_ids` returns at most `max_failures` over a window, again the latest.
    """

    def __init__(self, max_failures: int) -> None:
        self.max_failures = max_failures
        self.counts: dict[str, dict[int, list[int]]] = {}
        self.failures: dict[str, dict[int, list[str]]] = {}

    # -- reading -----------------------------------------------------------------------------
    def totals(self, rubric_id: str, low: int | None = None, high: int | None = None) -> list[int]:
        """Summed [passes, fails, na, invalid] over steps low..high (inclusive; None: unbounded)."""
        total = [0, 0, 0, 0]
        for step, row in self.counts.get(rubric_id, {}).items():
            if (low is None or step >= low) and (high is None or step <= high):
                for position in range(4):
                    total[position] += row[position]
        return total

    def failure_ids(self, rubric_id: str, low: int, high: int) -> list[str]:
        """Failed trajectory ids recorded for steps low..high, oldest first, the latest `max_failures`."""
        ids: list[str] = []
        for step in sorted(self.failures.get(rubric_id, {})):
            if low <= step <= high:
                ids.extend(self.failures[rubric_id][step])
        return ids[-self.max_failures :] if self.max_failures else []

    # -- writing (callers validate first; these cannot fail half-way) ----------------------------
    def add(self, step: int, counts: Mapping[str, Sequence[int]], failures: Mapping[str, Sequence[str]]) -> None:
        for rubric_id, row in counts.items():
            if not any(row):
                continue
            cell = self.counts.setdefault(rubric_id, {}).setdefault(step, [0, 0, 0, 0])
            for position in range(4):
                cell[position] += int(row[position])
        if self.max_failures:
            for rubric_id, ids in failures.items():
                if ids:
                    kept = self.failures.setdefault(rubric_id, {}).setdefault(step, [])
                    kept.extend(ids)
                    del kept[: -self.max_failures]

    def drop_through(self, step: int) -> None:
        """Forgets every step <= `step` (the window an update consumed, and anything older)."""
        for table in (self.counts, self.failures):
            for rubric_id in list(table):
                cells = {s: v for s, v in table[rubric_id].items() if s > step}
                if cells:
                    table[rubric_id] = cells
                else:
                    del table[rubric_id]

    def remove(self, rubric_id: str) -> None:
        self.counts.pop(rubric_id, None)
        self.failures.pop(rubric_id, None)

    def copy(self) -> WindowEvidence:
        other = WindowEvidence(self.max_failures)
        other.counts = {r: {s: list(v) for s, v in cells.items()} for r, cells in self.counts.items()}
        other.failures = {r: {s: list(v) for s, v in cells.items()} for r, cells in self.failures.items()}
        return other

    # -- state ---------------------------------------------------------------------------------
    def rubric_state(self, rubric_id: str) -> dict:
        return {
            "evidence": [[step, *row] for step, row in sorted(self.counts.get(rubric_id, {}).items())],
            "failures": [[step, list(ids)] for step, ids in sorted(self.failures.get(rubric_id, {}).items())],
        }

    def load_rubric(self, rubric_id: str, data: Mapping, after_step: int, argument: str) -> None:
        """Restores one rubric's `rubric_state`; every step must be > `after_step` (the last update)."""
        evidence, failed = data.get("evidence"), data.get("failures")
        if not isinstance(evidence, list) or not isinstance(failed, list):
            raise ValueError(f"{argument} must hold 'evidence' and 'failures' lists")
        counts: dict[int, list[int]] = {}
        failures: dict[int, list[str]] = {}
        for n, entry in enumerate(evidence):
            if not isinstance(entry, list) or len(entry) != 5 or not all(_is_count(x) for x in entry):
                raise ValueError(
                    f"{argument}['evidence'][{n}] must be [step, passes, fails, na, invalid], integers >= 0"
                )
            if entry[0] <= after_step or entry[0] in counts:
                raise ValueError(f"{argument}['evidence'][{n}]: step {entry[0]} is repeated or in a closed window")
            counts[int(entry[0])] = [int(x) for x in entry[1:]]
        for n, entry in enumerate(failed):
            if not isinstance(entry, list) or len(entry) != 2 or not _is_count(entry[0]):
                raise ValueError(f"{argument}['failures'][{n}] must be [step, [trajectory ids]]")
            step, ids = entry
            if step <= after_step or step in failures:
                raise ValueError(f"{argument}['failures'][{n}]: step {step} is repeated or in a closed window")
            if (
                not isinstance(ids, list)
                or not all(isinstance(x, str) and x for x in ids)
                or len(ids) > self.max_failures
            ):
                raise ValueError(f"{argument}['failures'][{n}] must list at most {self.max_failures} trajectory ids")
            failures[step] = list(ids)
        if counts:
            self.counts[rubric_id] = counts
        if failures:
            self.failures[rubric_id] = failures


def _is_count(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)) and value >= 0


def parse_reports(
    reports: Sequence[JudgeReport], known: Collection[str], retired: Mapping[str, int], argument: str = "reports"
) -> tuple[dict[str, list[int]], dict[str, list[str]]]:
    """Validated per-rubric counts [passes, fails, na, invalid] and failed trajectory ids of `reports`.

    Every judgment must name a rubric in `known` (the pool); a retired one is
    refused with the step it retired at. A report without a trajectory id still
    counts, but cannot be handed to skill refinement as a failure.
    """
    if isinstance(reports, (str, bytes, JudgeReport)) or not isinstance(reports, Sequence):
        raise ValueError(f"{argument} must be a sequence of rwcore.types.JudgeReport, got {type(reports).__name__}")
    counts: dict[str, list[int]] = {}
    failures: dict[str, list[str]] = {}
    for n, report in enumerate(reports):
        where = f"{argument}[{n}]"
        if not isinstance(report, JudgeReport):
            raise ValueError(f"{where} must be a rwcore.types.JudgeReport, got {type(report).__name__}")
        if not isinstance(report.judgments, Mapping):
            raise ValueError(f"{where}.judgments must be a mapping of rubric id -> RubricJudgment")
        for key, judgment in report.judgments.items():
            at = f"{where}.judgments[{key!r}]"
            if not isinstance(judgment, RubricJudgment):
                raise ValueError(f"{at} must be a rwcore.types.RubricJudgment, got {type(judgment).__name__}")
            if judgment.rubric_id != key:
                raise ValueError(f"{at} holds a judgment of rubric {judgment.rubric_id!r}")
            if key not in known:
                if key in retired:
                    raise ValueError(f"{at}: rubric {key!r} was retired at step {retired[key]} and takes no evidence")
                raise ValueError(f"{at}: rubric {key!r} is not in the pool")
            if not isinstance(judgment.verdict, Verdict):
                raise ValueError(f"{at}.verdict must be a rwcore.Verdict, got {judgment.verdict!r}")
            row = counts.setdefault(key, [0, 0, 0, 0])
            row[_POSITION[judgment.verdict]] += 1
            if judgment.verdict == Verdict.FAIL and isinstance(report.trajectory_id, str) and report.trajectory_id:
                failures.setdefault(key, []).append(report.trajectory_id)
    return counts, failures


def parse_counts(
    counts: Mapping, known: Collection[str], retired: Mapping[str, int], argument: str = "counts"
) -> dict[str, list[int]]:
    """Validated {rubric id: (passes, fails)} -> rows [passes, fails, 0, 0]."""
    if not isinstance(counts, Mapping):
        raise ValueError(f"{argument} must be a mapping of rubric id -> (passes, fails), got {type(counts).__name__}")
    rows: dict[str, list[int]] = {}
    for key, value in counts.items():
        at = f"{argument}[{key!r}]"
        if key not in known:
            if key in retired:
                raise ValueError(f"{at}: rubric {key!r} was retired at step {retired[key]} and takes no evidence")
            raise ValueError(f"{at}: rubric {key!r} is not in the pool")
        if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) != 2:
            raise ValueError(f"{at} must be a pair (passes, fails), got {value!r}")
        for part in value:
            if not _is_count(part):
                # NaN, floats and negatives all land here
                raise ValueError(f"{at} must hold non-negative integer counts, got {value!r}")
        rows[key] = [int(value[0]), int(value[1]), 0, 0]
    return rows
