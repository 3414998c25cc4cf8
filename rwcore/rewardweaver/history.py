"""The reward specification history S_k (RewardWeaver §2.4): what was active when, and why.

One `StageRecord` per stage k: the active set A_k and the frozen content hash
of each active capability (the exact semantics rewarded), the strategy and
reason that produced it, the failure modes behind it, the diagnosis numbers of
the batch it was chosen from, its step range [start_step, end_step), and y_k,
the stage-level performance summary of the batch that closed it. Everything is
JSON-serializable.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from rwcore.rewardweaver._util import read_document, write_document
from rwcore.validation import check_ids, check_int, check_str

_FORMAT = "rwcore.reward_history"
_VERSION = 1


@dataclass(frozen=True)
class StageRecord:
    """One stage of the reward specification.

    stage: k (0, 1, ...).
    active: A_k in priority order; active_hashes: capability id -> content hash.
    strategy, reason: what chose A_k and why (e.g. which failure modes).
    failure_modes: the aggregated modes it was chosen from (id, support, frequency, candidates, deficit rate,
        mean confidence; histories written before the rate was recorded lack candidates and rate).
    diagnosis: numbers of the batch it was chosen from (cohort size, attributed
        failure rates F_fail / F_succ per capability, rejection counts, ...).
    admitted: capabilities admitted by controlled expansion at this update.
    start_step, end_step: the optimizer steps it covers, [start, end); end None while open.
    performance: y_k, summary of the batch that closed it (None while open).
    """

    stage: int
    active: tuple[str, ...]
    active_hashes: Mapping[str, str]
    strategy: str
    reason: str
    start_step: int
    end_step: int | None = None
    failure_modes: tuple[Mapping, ...] = ()
    diagnosis: Mapping = field(default_factory=dict)
    admitted: tuple[str, ...] = ()
    performance: Mapping | None = None

    def to_dict(self) -> dict:
        return {
            "stage": self.stage,
            "active": list(self.active),
            "active_hashes": dict(self.active_hashes),
            "strategy": self.strategy,
            "reason": self.reason,
            "start_step": self.start_step,
            "end_step": self.end_step,
            "failure_modes": [dict(m) for m in self.failure_modes],
            "diagnosis": _plain(self.diagnosis),
            "admitted": list(self.admitted),
            "performance": None if self.performance is None else _plain(self.performance),
        }

    @classmethod
    def from_dict(cls, data: Mapping, argument: str = "stage") -> StageRecord:
        if not isinstance(data, Mapping):
            raise ValueError(f"{argument} must be a mapping")
        required = {"stage", "active", "active_hashes", "strategy", "reason", "start_step"}
        missing = required - set(data)
        if missing:
            raise ValueError(f"{argument} lacks {sorted(missing)}")
        unknown = set(data) - required - {"end_step", "failure_modes", "diagnosis", "admitted", "performance"}
        if unknown:
            raise ValueError(f"{argument} has unknown field(s) {sorted(unknown)}")
        active = check_ids(data["active"], f"{argument}.active")
        hashes = data["active_hashes"]
        if not isinstance(hashes, Mapping) or set(hashes) != set(active):
            raise ValueError(f"{argument}.active_hashes must map exactly the active ids to hashes")
        end = data.get("end_step")
        modes = data.get("failure_modes", ())
        if not isinstance(modes, (list, tuple)) or not all(isinstance(m, Mapping) for m in modes):
            raise ValueError(f"{argument}.failure_modes must be a list of mappings")
        for name in ("diagnosis", "performance"):
            if data.get(name) is not None and not isinstance(data[name], Mapping):
                raise ValueError(f"{argument}.{name} must be a mapping")
        if not isinstance(hashes, Mapping) or not all(isinstance(h, str) for h in hashes.values()):
            raise ValueError(f"{argument}.active_hashes must map capability ids to hash strings")
        record = cls(
            stage=check_int(data["stage"], f"{argument}.stage", low=0),
            active=active,
            active_hashes=dict(hashes),
            strategy=check_str(data["strategy"], f"{argument}.strategy"),
            reason=check_str(data["reason"], f"{argument}.reason", allow_empty=True),
            start_step=check_int(data["start_step"], f"{argument}.start_step", low=0),
            end_step=None if end is None else check_int(end, f"{argument}.end_step", low=0),
            failure_modes=tuple(dict(m) for m in modes),
            diagnosis=dict(data.get("diagnosis", {})),
            admitted=check_ids(data.get("admitted", ()), f"{argument}.admitted"),
            performance=None if data.get("performance") is None else dict(data["performance"]),
        )
        if record.end_step is not None and record.end_step < record.start_step:
            raise ValueError(f"{argument}.end_step {record.end_step} is before start_step {record.start_step}")
        return record


class RewardHistory:
    """S_k: the ordered stage records; the last one is the deployed specification while open."""

    def __init__(self) -> None:
        self._stages: list[StageRecord] = []

    def __len__(self) -> int:
        return len(self._stages)

    @property
    def stages(self) -> tuple[StageRecord, ...]:
        return tuple(self._stages)

    @property
    def current(self) -> StageRecord | None:
        return self._stages[-1] if self._stages else None

    def open_stage(self, record: StageRecord) -> None:
        """Appends the next stage; the previous one must be closed and end where this starts."""
        if not isinstance(record, StageRecord):
            raise ValueError(f"record must be a StageRecord, got {type(record).__name__}")
        if record.stage != len(self._stages):
            raise ValueError(f"record.stage must be {len(self._stages)}, got {record.stage}")
        if self._stages:
            last = self._stages[-1]
            if last.end_step is None:
                raise ValueError(f"stage {last.stage} is still open")
            if record.start_step != last.end_step:
                raise ValueError(f"record.start_step must be {last.end_step}, where stage {last.stage} ended")
        self._stages.append(record)

    def close_stage(self, end_step: int, performance: Mapping) -> StageRecord:
        """Closes the open stage at `end_step` with its performance summary y_k."""
        last = self.current
        if last is None or last.end_step is not None:
            raise ValueError("there is no open stage to close")
        end_step = check_int(end_step, "step", low=0)
        if end_step < last.start_step:
            raise ValueError(f"step {end_step} is before the current stage's start_step {last.start_step}")
        closed = replace(last, end_step=end_step, performance=_plain(performance))
        self._stages[-1] = closed
        return closed

    def active_matrix(self, capability_ids: Sequence[str]) -> np.ndarray:
        """bool [K, D]: whether capability d was active at stage k (for retention analysis)."""
        ids = check_ids(capability_ids, "capability_ids")
        out = np.zeros((len(self._stages), len(ids)), dtype=bool)
        for k, record in enumerate(self._stages):
            active = set(record.active)
            out[k] = [cid in active for cid in ids]
        return out

    def diagnosis_matrix(self, key: str, capability_ids: Sequence[str]) -> np.ndarray:
        """float [K, D]: stage k's `diagnosis[key][d]` (e.g. "failure_rates"), NaN where absent.

        Note the diagnosis of stage k comes from the batch that opened it, i.e. the policy
        at the end of stage k-1; see `RewardWeaver` for which rates are stored.
        """
        ids = check_ids(capability_ids, "capability_ids")
        out = np.full((len(self._stages), len(ids)), np.nan)
        for k, record in enumerate(self._stages):
            table = record.diagnosis.get(key)
            if isinstance(table, Mapping):
                for j, cid in enumerate(ids):
                    value = table.get(cid)
                    if isinstance(value, (int, float)) and not isinstance(value, bool):
                        out[k, j] = float(value)
        return out

    def state_dict(self) -> dict:
        return {"format": _FORMAT, "version": _VERSION, "stages": [r.to_dict() for r in self._stages]}

    def load_state_dict(self, state: Mapping) -> None:
        self._stages = _parse(state)

    @classmethod
    def from_state_dict(cls, state: Mapping) -> RewardHistory:
        history = cls()
        history.load_state_dict(state)
        return history

    def save(self, path: str | os.PathLike) -> None:
        """Writes the history to `path` (.json or .yaml/.yml), atomically."""
        write_document(path, self.state_dict())

    @classmethod
    def load(cls, path: str | os.PathLike) -> RewardHistory:
        return cls.from_state_dict(read_document(path))


def _parse(state) -> list[StageRecord]:
    if not isinstance(state, Mapping) or state.get("format") != _FORMAT or state.get("version") != _VERSION:
        raise ValueError(f"history state must be a {_FORMAT!r} version {_VERSION} mapping")
    raw = state.get("stages")
    if not isinstance(raw, list):
        raise ValueError("history stages must be a list")
    history = RewardHistory()
    for k, item in enumerate(raw):
        record = StageRecord.from_dict(item, f"stages[{k}]")
        if k < len(raw) - 1 and record.end_step is None:
            raise ValueError(f"stages[{k}] is not closed but is not the last stage")
        history.open_stage(record)
    return history._stages


def _plain(value):
    """A JSON round trip: plain dicts/lists/finite numbers, or a ValueError for anything else (NaN included)."""
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as error:
        raise ValueError(f"stage data must be JSON-serializable: {error}") from None
