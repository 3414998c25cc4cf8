"""The validated capability space D (RewardWeaver §2.2): admitted, immutable entries.

Entries enter only through `CapabilityLibrary.admit` (a passing
`admission.acceptance_test`) or by loading a saved library whose hashes all
verify. The library offers no way to change an entry: a revised capability is
admitted under a new id (the old one may be withdrawn from candidacy, which
leaves its entry untouched). Files are JSON or YAML by suffix, written atomically.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence

from rwcore.rewardweaver._util import read_document, write_document
from rwcore.rewardweaver.admission import AdmissionConfig, LabelledCase, acceptance_test
from rwcore.rewardweaver.capability import AdmissionReport, AdmittedCapability, Capability
from rwcore.types import Judge, RubricSpec
from rwcore.validation import check_ids, check_str

_FORMAT = "rwcore.capability_library"
_VERSION = 1


class CapabilityLibrary:
    """The validated capability space D_k: admitted, immutable entries in admission order.

    Args:
        config: the acceptance criteria every admission uses.

    Entries are only added by `admit` (after a passing acceptance test) or by
    loading a saved library whose hashes all verify. `withdraw` takes a
    capability out of candidacy (e.g. superseded by a revision admitted under a
    new id) without touching its entry. Capability ids are never reused.
    """

    def __init__(self, config: AdmissionConfig | None = None) -> None:
        config = config if config is not None else AdmissionConfig()
        if not isinstance(config, AdmissionConfig):
            raise ValueError(f"config must be an AdmissionConfig, got {type(config).__name__}")
        self._config = config
        self._entries: dict[str, AdmittedCapability] = {}
        self._withdrawn: dict[str, str] = {}

    # -- reading ---------------------------------------------------------------

    @property
    def config(self) -> AdmissionConfig:
        return self._config

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[AdmittedCapability]:
        return iter(tuple(self._entries.values()))

    def __contains__(self, capability_id) -> bool:
        return capability_id in self._entries

    def __getitem__(self, capability_id: str) -> AdmittedCapability:
        return self.get(capability_id)

    def get(self, capability_id: str, argument: str = "capability_id") -> AdmittedCapability:
        """The entry of `capability_id`; ValueError naming `argument` when the library lacks it."""
        entry = self._entries.get(capability_id) if isinstance(capability_id, str) else None
        if entry is None:
            raise ValueError(f"{argument} {capability_id!r} is not in the capability library")
        return entry

    def ids(self, include_withdrawn: bool = False) -> tuple[str, ...]:
        """Capability ids in admission order (withdrawn ones only when asked)."""
        return tuple(cid for cid in self._entries if include_withdrawn or cid not in self._withdrawn)

    @property
    def withdrawn(self) -> dict[str, str]:
        """Withdrawn capability id -> reason (a copy)."""
        return dict(self._withdrawn)

    def rubrics(self, capability_ids: Sequence[str] | None = None) -> list[RubricSpec]:
        """RubricSpecs for `capability_ids` (default: every available capability), for a Judge."""
        ids = self.ids() if capability_ids is None else self.check_ids(capability_ids, "capability_ids")
        return [self._entries[cid].rubric for cid in ids]

    def families(self) -> dict[str, tuple[str, ...]]:
        """Family -> its available capability ids, families in first-admission order."""
        out: dict[str, list[str]] = {}
        for cid in self.ids():
            out.setdefault(self._entries[cid].family, []).append(cid)
        return {family: tuple(ids) for family, ids in out.items()}

    def check_ids(self, capability_ids, argument: str, *, allow_withdrawn: bool = False) -> tuple[str, ...]:
        """`capability_ids` as a tuple of distinct known ids; ValueError naming `argument` otherwise."""
        ids = check_ids(capability_ids, argument)
        for j, cid in enumerate(ids):
            if cid not in self._entries:
                raise ValueError(f"{argument}[{j}] {cid!r} is not in the capability library")
            if not allow_withdrawn and cid in self._withdrawn:
                raise ValueError(f"{argument}[{j}] {cid!r} has been withdrawn from the capability library")
        return ids

    # -- changing ----------------------------------------------------------------

    def admit(
        self,
        candidate: Capability | RubricSpec,
        evaluator: Judge,
        cases: Sequence[LabelledCase] | None = None,
        *,
        dev_cases: Sequence[LabelledCase] | None = None,
        heldout_cases: Sequence[LabelledCase] | None = None,
        heldout_sources: Sequence[str] | None = None,
        evaluator_id: str | None = None,
        reviser=None,
        max_revisions: int = 1,
    ) -> AdmissionReport:
        """Runs `acceptance_test` with this library's config; adds the entry when it passes.

        reviser / max_revisions: evaluator revision on the development partition before a
        rejected candidate is re-tested on the held-out partition (see `acceptance_test`).

        A candidate whose id the library already holds (admitted or withdrawn) is
        refused with a ValueError: an admitted capability is never modified;
        admit the revision under a new id.
        """
        if isinstance(candidate, RubricSpec):
            candidate = Capability.from_rubric(candidate)
        if isinstance(candidate, Capability) and candidate.capability_id in self._entries:
            raise ValueError(
                f"candidate.capability_id {candidate.capability_id!r} is already in the library; admitted capabilities "
                "are immutable, admit a revision under a new id"
            )
        report, entry = acceptance_test(
            candidate,
            evaluator,
            cases,
            dev_cases=dev_cases,
            heldout_cases=heldout_cases,
            heldout_sources=heldout_sources,
            config=self._config,
            evaluator_id=evaluator_id,
            reviser=reviser,
            max_revisions=max_revisions,
        )
        if entry is not None:
            self.add_admitted([entry])
        return report

    def withdraw(self, capability_id: str, reason: str) -> None:
        """Takes `capability_id` out of candidacy (its entry stays, unchanged, and its id stays taken)."""
        self.get(capability_id)
        check_str(reason, "reason")
        self._withdrawn[capability_id] = reason

    def add_admitted(self, entries: Sequence[AdmittedCapability]) -> None:
        """Adds entries that already hold an admission report (all or none): what `admit` produced, what
        controlled expansion admitted, or entries admitted without the acceptance test whose report says
        so (an environment with no labelled cases). An entry's content hash is checked when it is built; an
        entry whose report did not admit it is refused."""
        fresh: dict[str, AdmittedCapability] = {}
        for entry in entries:
            if not isinstance(entry, AdmittedCapability):
                raise ValueError(f"entries must be AdmittedCapability, got {type(entry).__name__}")
            if entry.capability_id in self._entries or entry.capability_id in fresh:
                raise ValueError(f"capability {entry.capability_id!r} is already in the library")
            if not entry.admission.admitted:
                raise ValueError(f"capability {entry.capability_id!r}: its admission report did not admit it")
            fresh[entry.capability_id] = entry
        self._entries.update(fresh)

    # -- persistence ---------------------------------------------------------------

    def state_dict(self) -> dict:
        """JSON-serializable snapshot: config, entries (with hashes) in admission order, withdrawals."""
        return {
            "format": _FORMAT,
            "version": _VERSION,
            "config": self._config.to_dict(),
            "entries": [entry.to_dict() for entry in self._entries.values()],
            "withdrawn": dict(self._withdrawn),
        }

    def load_state_dict(self, state: Mapping) -> None:
        """Replaces the content with `state` after verifying every entry's hash (all or nothing)."""
        config, entries, withdrawn = _parse_state(state)
        self._config = config
        self._entries = {entry.capability_id: entry for entry in entries}
        self._withdrawn = withdrawn

    @classmethod
    def from_state_dict(cls, state: Mapping) -> CapabilityLibrary:
        library = cls()
        library.load_state_dict(state)
        return library

    def save(self, path: str | os.PathLike) -> None:
        """Writes the library to `path` (.json, or .yaml/.yml), atomically."""
        write_document(path, self.state_dict())

    @classmethod
    def load(cls, path: str | os.PathLike) -> CapabilityLibrary:
        """Reads a saved library; ValueError naming the capability whose frozen hash does not match."""
        return cls.from_state_dict(read_document(path))


def _parse_state(state) -> tuple[AdmissionConfig, list[AdmittedCapability], dict[str, str]]:
    if not isinstance(state, Mapping):
        raise ValueError(f"library state must be a mapping, got {type(state).__name__}")
    if state.get("format") != _FORMAT or state.get("version") != _VERSION:
        raise ValueError(
            f"library state has format {state.get('format')!r} version {state.get('version')!r}, "
            f"expected {_FORMAT!r} version {_VERSION}"
        )
    config = AdmissionConfig.from_dict(state.get("config", {}), "library config")
    raw_entries = state.get("entries")
    if not isinstance(raw_entries, list):
        raise ValueError("library entries must be a list")
    entries = []
    seen = set()
    for i, raw in enumerate(raw_entries):
        entry = AdmittedCapability.from_dict(raw, f"entries[{i}]")
        if entry.capability_id in seen:
            raise ValueError(f"entries[{i}]: capability {entry.capability_id!r} appears twice")
        seen.add(entry.capability_id)
        entries.append(entry)
    withdrawn = state.get("withdrawn", {})
    if not isinstance(withdrawn, Mapping):
        raise ValueError("library withdrawn must be a mapping of capability id -> reason")
    for cid, reason in withdrawn.items():
        if cid not in seen:
            raise ValueError(f"withdrawn lists {cid!r}, which is not in the library")
        check_str(reason, f"withdrawn[{cid!r}]")
    return config, entries, dict(withdrawn)
