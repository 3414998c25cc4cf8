"""Per-trajectory rubric verdicts as the sampler and the judges exchange them."""

from __future__ import annotations

import enum

import numpy as np


class Verdict(enum.IntEnum):
    """A rubric's verdict on one trajectory.

    FAIL and PASS are evidence (y = 0 / 1). NA is an explicit "does not apply":
    the rubric counts as evaluated for coverage but adds no evidence. INVALID is
    a judge failure (error, time-out, unparsable output): neither evidence nor
    coverage. The integer values are the codes the C++ core uses.
    """

    FAIL = 0
    PASS = 1
    NA = 2
    INVALID = 3


def verdict_codes(values, argument: str) -> np.ndarray:
    """`values` (bools or Verdicts) -> uint8 codes; ValueError naming `argument` for anything else.

    A bool array takes a fast path; otherwise every element must be a bool,
    numpy bool or Verdict (a plain 0/1 int is refused: it is too easy to pass a
    score where a verdict was meant).
    """
    if isinstance(values, np.ndarray) and values.dtype == np.bool_:
        if values.ndim != 1:
            raise ValueError(f"{argument} must be a 1-D sequence of verdicts, got shape {values.shape}")
        return values.astype(np.uint8)
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise ValueError(
            f"{argument} must be a sequence of verdicts (bool or rwcore.Verdict), got {type(values).__name__}"
        )
    codes = np.empty(len(values), dtype=np.uint8)
    for j, value in enumerate(values):
        if isinstance(value, Verdict):
            codes[j] = int(value)
        elif isinstance(value, (bool, np.bool_)):
            codes[j] = Verdict.PASS if value else Verdict.FAIL
        else:
            raise ValueError(
                f"{argument}[{j}] must be True, False or a rwcore.Verdict, got {value!r} ({type(value).__name__})"
            )
    return codes
