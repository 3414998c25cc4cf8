"""`EvidenceStore`: decayed Beta evidence per (task-type tag, rubric), Arise eq. 20.

The arithmetic, locking and snapshot format live in C++ (`rwcore._evidence`);
this module converts arguments, names them in errors and does the file I/O.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from rwcore import _evidence
from rwcore._io import atomic_write_bytes
from rwcore.tasks import check_int


def as_int_array(values, argument: str) -> np.ndarray:
    """1-D int64 view of `values`; ValueError naming `argument` for floats, 2-D input and the like."""
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"{argument} must be a 1-D array, got shape {array.shape}")
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"{argument} must hold integers, got dtype {array.dtype}")
    return np.ascontiguousarray(array, dtype=np.int64)


def as_float_array(values, argument: str) -> np.ndarray:
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"{argument} must be a 1-D array, got shape {array.shape}")
    if array.size and not (np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)):
        raise ValueError(f"{argument} must hold real numbers, got dtype {array.dtype}")
    return np.ascontiguousarray(array, dtype=np.float64)


def _real(value, argument: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{argument} must be a real number, got {value!r}") from None


def _check_same_length(**arrays: np.ndarray) -> None:
    lengths = {name: len(array) for name, array in arrays.items()}
    if len(set(lengths.values())) > 1:
        listed = ", ".join(f"{name}={length}" for name, length in lengths.items())
        raise ValueError(f"array length mismatch: {listed}")


MAX_ID = 2**32 - 1
MAX_VERSION = 2**63 - 1


def _id(value, argument: str) -> int:
    return check_int(value, argument, low=0, high=MAX_ID)


def _version(value, argument: str = "version") -> int:
    return check_int(value, argument, low=0, high=MAX_VERSION)


class EvidenceStore:
    """Success/failure accumulators (S, F) per (tag, rubric) with Arise's two-scale decay.

    Ids are integers in [0, 2**32); versions are non-negative policy versions.
    An observation (dS, dF) from policy version v on a cell last updated at
    v_last does, with dv = v - v_last:

    - dv > 0: (S, F) <- gamma_obs * gamma_unobs**(dv - 1) * (S, F) + (dS, dF); v_last = v
    - dv = 0: (S, F) += (dS, dF)
    - dv < 0 (a late group from an older policy): (S, F) += gamma_obs *
      gamma_unobs**(|dv| - 1) * (dS, dF); v_last is kept.

    A query at version v returns (S, F) * gamma_unobs**(v - v_last); a query
    from before the last update (v < v_last) sees the cell undecayed. Every call
    validates all of its input before changing anything -- evidence whose sum with
    a cell would overflow to infinity included: it is refused with a ValueError
    naming the argument (for `observe_many`, the whole call) -- and the store is safe
    to use from several threads (`observe_many` and `query_many` release the GIL).
    """

    def __init__(self, gamma_obs: float = 0.2, gamma_unobs: float = 0.999) -> None:
        self._core = _evidence.EvidenceStore(float(gamma_obs), float(gamma_unobs))

    @classmethod
    def _wrap(cls, core: _evidence.EvidenceStore) -> EvidenceStore:
        store = cls.__new__(cls)
        store._core = core
        return store

    @property
    def gamma_obs(self) -> float:
        return self._core.gamma_obs

    @property
    def gamma_unobs(self) -> float:
        return self._core.gamma_unobs

    def observe(self, tag: int, rubric: int, success: float, failure: float, version: int) -> None:
        """Adds one observation (success, failure) made by policy `version` to cell (tag, rubric)."""
        self._core.observe(
            _id(tag, "tag"),
            _id(rubric, "rubric"),
            _real(success, "success"),
            _real(failure, "failure"),
            _version(version),
        )

    def observe_many(self, tags, rubrics, successes, failures, versions) -> None:
        """`observe` for each index in order; 1-D arrays of one length, validated as a whole first."""
        arrays = dict(
            tags=as_int_array(tags, "tags"),
            rubrics=as_int_array(rubrics, "rubrics"),
            successes=as_float_array(successes, "successes"),
            failures=as_float_array(failures, "failures"),
            versions=as_int_array(versions, "versions"),
        )
        _check_same_length(**arrays)
        self._core.observe_many(**arrays)

    def query(self, tag: int, rubric: int, version: int) -> tuple[float, float]:
        """(S, F) of cell (tag, rubric) as seen at policy `version`; (0.0, 0.0) if never observed."""
        return self._core.query(_id(tag, "tag"), _id(rubric, "rubric"), _version(version))

    def query_sum(self, tag: int, rubrics: Sequence[int], version: int) -> tuple[float, float]:
        """Summed (S, F) over `rubrics` for one tag, e.g. S_{d,c} over the rubrics of a capability."""
        return self._core.query_sum(_id(tag, "tag"), as_int_array(rubrics, "rubrics"), _version(version))

    def query_many(self, tags, rubrics, version: int) -> tuple[np.ndarray, np.ndarray]:
        """Element-wise query: int arrays `tags`, `rubrics` of one length -> float64 arrays (S, F)."""
        tag_array, rubric_array = as_int_array(tags, "tags"), as_int_array(rubrics, "rubrics")
        _check_same_length(tags=tag_array, rubrics=rubric_array)
        return self._core.query_many(tag_array, rubric_array, _version(version))

    def remove_rubric(self, rubric: int) -> int:
        """Deletes every cell of `rubric` (nothing else is renormalized); returns how many were removed."""
        return self._core.remove_rubric(_id(rubric, "rubric"))

    def cells(self) -> list[tuple[int, int, float, float, int]]:
        """Every cell as (tag, rubric, S, F, last_version), undecayed, sorted by (tag, rubric)."""
        return self._core.cells()

    def __len__(self) -> int:
        return len(self._core)

    def __repr__(self) -> str:
        return f"EvidenceStore(gamma_obs={self.gamma_obs}, gamma_unobs={self.gamma_unobs}, cells={len(self)})"

    def to_bytes(self) -> bytes:
        """A versioned snapshot with a checksum; identical stores give identical bytes."""
        return self._core.serialize()

    @classmethod
    def from_bytes(cls, data: bytes, *, what: str = "evidence snapshot") -> EvidenceStore:
        """The store saved by `to_bytes`; ValueError naming `what` if `data` is truncated, corrupted, of
        another format, or not a store `to_bytes` writes (cells non-finite, negative, duplicated or out of
        their canonical order; decay factors outside (0, 1]), even when its checksum is right."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise ValueError(f"data must be bytes, got {type(data).__name__}")
        return cls._wrap(_evidence.EvidenceStore.deserialize(bytes(data), what))

    def save(self, path: str | os.PathLike) -> None:
        """Writes the snapshot atomically (temporary file, fsync, rename)."""
        atomic_write_bytes(path, self.to_bytes())

    @classmethod
    def load(cls, path: str | os.PathLike) -> EvidenceStore:
        """Reads a snapshot written by `save`; ValueError naming `path` if it is corrupted or truncated."""
        data = open(path, "rb").read()
        return cls.from_bytes(data, what=f"evidence snapshot {os.fspath(path)!r}")
