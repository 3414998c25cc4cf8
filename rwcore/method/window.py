"""Arise's rollout evidence between pool updates (appendix B.3).

"Pool updates aggregate evidence over the preceding ten training steps. Each generation call
selects up to 256 records containing diagnostic evidence, without stratifying by task outcome."

`ReflectionWindow` keeps, for the steps since the last pool update:

- two uniform reservoir samples of at most `max_records` records each (Algorithm R, seeded):
  one over the records that carry judge diagnostics (uncovered-behaviour notes), one over all
  records. Generation reads the first when the window has any diagnostics, else the second
  (the empty pool's first window: the reflector analyses those trajectories itself,
  Algorithm 1 line 9). Memory stays bounded whatever the batch size.
- the rollouts that failed a pool rubric, by trajectory id, where skill refinement looks up the
  failures the pool recorded for a rubric.

Records reach the reflection model without outcomes or rewards: the diagnostics text holds
task ids, tags and the judge's notes only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import numpy as np

from rwcore.types import Trajectory
from rwcore.validation import check_int

_FORMAT = "rwcore.reflection_window"


class _Reservoir:
    """A uniform sample of at most `size` items of a stream (Algorithm R)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.items: list[tuple[Trajectory, tuple[str, ...]]] = []
        self.seen = 0

    def offer(self, item: tuple[Trajectory, tuple[str, ...]], rng: np.random.Generator) -> None:
        self.seen += 1
        if len(self.items) < self.size:
            self.items.append(item)
            return
        slot = int(rng.integers(0, self.seen))
        if slot < self.size:
            self.items[slot] = item

    def state(self) -> dict:
        return {"seen": self.seen, "items": [[t.to_dict(), list(notes)] for t, notes in self.items]}

    @classmethod
    def from_state(cls, size: int, state: Mapping, argument: str) -> _Reservoir:
        reservoir = cls(size)
        try:
            reservoir.seen = check_int(state["seen"], f"{argument}['seen']", low=0)
            reservoir.items = [(Trajectory.from_dict(t), tuple(str(n) for n in notes)) for t, notes in state["items"]]
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"{argument} is malformed: {error}") from None
        if len(reservoir.items) > size or len(reservoir.items) > reservoir.seen:
            raise ValueError(f"{argument} holds more records than its size or than it has seen")
        return reservoir


class ReflectionWindow:
    """The evidence Arise's reflection and refinement read at a pool update (see the module docstring).

    max_records: records one generation call receives at most [256].
    seed: seeds the reservoir sampling (its generator is part of the state).
    """

    def __init__(self, max_records: int = 256, seed: int = 0) -> None:
        self.max_records = check_int(max_records, "max_records", low=1)
        self._seed = check_int(seed, "seed", low=0)
        self._rng = np.random.default_rng([self._seed, 0xA815E])
        self._with_notes = _Reservoir(self.max_records)
        self._all = _Reservoir(self.max_records)
        self._failed: dict[str, Trajectory] = {}

    def __len__(self) -> int:
        """Records seen since the last update."""
        return self._all.seen

    def add(self, trajectories: Sequence[Trajectory], uncovered: Sequence[Sequence[str]], failed_ids: set[str]) -> None:
        """One step's rollouts, their judge notes (one tuple per trajectory) and the ids of those
        that failed a pool rubric (kept for refinement)."""
        if len(uncovered) != len(trajectories):
            raise ValueError(f"uncovered holds {len(uncovered)} entries for {len(trajectories)} trajectories")
        for trajectory, notes in zip(trajectories, uncovered):
            record = (trajectory, tuple(notes))
            self._all.offer(record, self._rng)
            if record[1]:
                self._with_notes.offer(record, self._rng)
            if trajectory.trajectory_id in failed_ids:
                self._failed[trajectory.trajectory_id] = trajectory

    def failures(self) -> list[Trajectory]:
        """The window's rollouts that failed some pool rubric (refinement looks its failures up here)."""
        return list(self._failed.values())

    def evidence(self) -> tuple[list[Trajectory], str | None]:
        """(records for generation, diagnostics text or None).

        With judge diagnostics in the window: up to `max_records` of the records that carry them and
        a JSON-lines text of their notes, one line per record ({"record", "task_id", "tags",
        "uncovered"}; no outcomes or rewards). Without: up to `max_records` of all records and None
        (the reflector analyses the trajectories itself).
        """
        if self._with_notes.items:
            records = self._with_notes.items
            lines = [
                json.dumps(
                    {"record": f"R{i}", "task_id": t.task_id, "tags": list(t.tags), "uncovered": list(notes)},
                    ensure_ascii=False,
                )
                for i, (t, notes) in enumerate(records)
            ]
            return [t for t, _ in records], "\n".join(lines)
        return [t for t, _ in self._all.items], None

    def clear(self) -> None:
        """Starts the next window (after a pool update consumed this one)."""
        self._with_notes = _Reservoir(self.max_records)
        self._all = _Reservoir(self.max_records)
        self._failed = {}

    def state_dict(self) -> dict:
        return {
            "format": _FORMAT,
            "max_records": self.max_records,
            "seed": self._seed,
            "rng": json.loads(json.dumps(self._rng.bit_generator.state)),
            "with_notes": self._with_notes.state(),
            "all": self._all.state(),
            "failed": [t.to_dict() for t in self._failed.values()],
        }

    def load_state_dict(self, state: Mapping) -> None:
        if not isinstance(state, Mapping) or state.get("format") != _FORMAT:
            raise ValueError(f"state must be a {_FORMAT!r} mapping")
        for key, mine in (("max_records", self.max_records), ("seed", self._seed)):
            if state.get(key) != mine:
                raise ValueError(f"state {key!r} is {state.get(key)!r} but this window has {mine!r}")
        with_notes = _Reservoir.from_state(self.max_records, state.get("with_notes", {}), "state['with_notes']")
        every = _Reservoir.from_state(self.max_records, state.get("all", {}), "state['all']")
        try:
            failed = {t.trajectory_id: t for t in (Trajectory.from_dict(d) for d in state["failed"])}
            rng = np.random.default_rng()
            rng.bit_generator.state = dict(state["rng"])
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"state is malformed: {error}") from None
        self._with_notes, self._all, self._failed, self._rng = with_notes, every, failed, rng
