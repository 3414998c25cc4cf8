"""Rubric verdicts as verl's non_tensor_batch carries them -> rwcore Verdict codes and advantage matrices."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

import numpy as np

from rwcore.verdict import Verdict

from .config import VERDICTS_KEY

_VERDICT_STRINGS = {
    "pass": Verdict.PASS,
    "fail": Verdict.FAIL,
    "na": Verdict.NA,
    "n/a": Verdict.NA,
    "invalid": Verdict.INVALID,
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
    raise ValueError(
        f"{where}: {value!r} is not a verdict (True/False, 1/0, 'pass'/'fail'/'na'/'invalid', "
        "a rwcore.Verdict, or None/NaN for not applicable)"
    )


def verdict_table(
    values, num_rows: int, rubric_order: Sequence[Hashable] | None = None, key: str = VERDICTS_KEY
) -> tuple[list, np.ndarray]:
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
            raise ValueError(
                f"{where} must be a mapping rubric id -> verdict, a sequence of verdicts or None, "
                f"got {type(row).__name__}"
            )
    ids = order if order is not None else sorted(column, key=column.get)
    codes = np.full((num_rows, len(ids)), int(Verdict.INVALID), dtype=np.uint8)
    for j, parsed in enumerate(rows):
        for i, verdict in parsed.items():
            codes[j, i] = int(verdict)
    return ids, codes


def verdicts_from_batch(
    non_tensor_batch: Mapping, num_rows: int, key: str = VERDICTS_KEY, rubric_order: Sequence[Hashable] | None = None
) -> tuple[list, np.ndarray] | None:
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
            raise ValueError(
                f"non_tensor_batch[{name!r}] has {len(non_tensor_batch[name])} entries, "
                f"expected {num_rows} (one per response)"
            )
    rows = [{name[len(prefix) :]: non_tensor_batch[name][j] for name in columns} for j in range(num_rows)]
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
