"""`CapabilitySampler`: Arise's capability-based adaptive task sampling (eq. 9-14, appendix B.5).

Batch construction, evidence, coverage and attempts run in C++
(`rwcore._evidence.SamplerCore`); this class maps task, tag, rubric and
capability ids onto dense integers and validates every argument before the
core sees it, so a rejected call changes nothing.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

from rwcore import _evidence
from rwcore.tasks import (
    DEFAULT_CAPABILITIES,
    TaskSamplerBase,
    check_fraction,
    check_gamma,
    check_int,
    check_rubrics,
    check_state,
    check_version,
    parse_group,
    parse_outcomes,
)

_STATE_FORMAT = 1


class CapabilitySampler(TaskSamplerBase):
    """Chooses training tasks where specific capabilities are neither mastered nor hopeless.

    Args:
        tasks: task id -> task-type tags (several per task allowed).
        batch_size: tasks per batch B (each is rolled out `group_size` times).
        group_size: rollouts per task G; every recorded group must have G verdicts per rubric.
        rho_min: minimum discovery probability (eq. 12).
        quota_fraction: b; a (tag, capability) pair is adaptively targeted at most
            max(1, ceil(b * B)) times per batch.
        gamma_obs, gamma_unobs: evidence decay per observed / unobserved policy version (eq. 20).
        seed: seeds the sampler's generator; the same seed and calls give the same batches.
        capabilities: the capability names rubrics are assigned to (Arise table 3).

    Per batch position: with probability rho = max(rho_min, 1 - coverage) a
    discovery draw among tasks with outstanding rubric evaluations (weight
    1 / (1 + attempts)); otherwise an adaptive draw: a fresh
    p ~ Beta(1 + S_dc, 1 + F_dc) for every eligible (tag, capability) pair,
    a pair in proportion to p (1 - p)^2, then a uniform free task of that pair
    with prior applicable evidence for the capability. When neither is
    possible, tasks are drawn by 1 / (1 + attempts), discovery candidates first.
    No task appears twice in a batch. Not thread-safe: call from one thread.
    """

    def __init__(
        self,
        tasks: Mapping[Hashable, Sequence[Hashable]],
        batch_size: int = 32,
        group_size: int = 8,
        rho_min: float = 0.1,
        quota_fraction: float = 0.25,
        gamma_obs: float = 0.2,
        gamma_unobs: float = 0.999,
        seed: int = 0,
        capabilities: Sequence[str] = DEFAULT_CAPABILITIES,
    ) -> None:
        self._init_base(tasks, batch_size, group_size, seed, capabilities)
        self._capability_index = {name: i for i, name in enumerate(self._capabilities)}
        self._config.update(
            rho_min=check_fraction(rho_min, "rho_min"),
            quota_fraction=check_fraction(quota_fraction, "quota_fraction"),
            gamma_obs=check_gamma(gamma_obs, "gamma_obs"),
            gamma_unobs=check_gamma(gamma_unobs, "gamma_unobs"),
        )
        self._core = _evidence.SamplerCore(
            self._tasks.task_tags,
            len(self._tasks.tags),
            len(self._capabilities),
            self._config["batch_size"],
            self._config["group_size"],
            self._config["rho_min"],
            self._config["quota_fraction"],
            self._config["gamma_obs"],
            self._config["gamma_unobs"],
            self._config["seed"],
        )
        self._rubric_capability: dict = {}
        self._rubric_slot: dict = {}

    @property
    def rubrics(self) -> dict:
        """The active pool, rubric id -> capability (a copy)."""
        return dict(self._rubric_capability)

    # -- updates -------------------------------------------------------------

    def set_rubrics(self, rubrics: Mapping[Hashable, str]) -> None:
        """Replaces the active pool with `rubrics` (rubric id -> capability).

        Rubrics that leave the pool, or whose capability changes, drop their
        evidence and coverage records; new ones start with outstanding
        evaluations on every task; unchanged ones keep everything.
        """
        pool = check_rubrics(rubrics, self._capabilities)
        kept = {
            rubric_id: slot
            for rubric_id, slot in self._rubric_slot.items()
            if rubric_id in pool and pool[rubric_id] == self._rubric_capability[rubric_id]
        }
        used = set(kept.values())
        slots = dict(kept)
        fresh = []
        next_slot = 0
        for rubric_id in pool:
            if rubric_id in kept:
                continue
            while next_slot in used:
                next_slot += 1
            slots[rubric_id] = next_slot
            used.add(next_slot)
            fresh.append(next_slot)
        slot_capability = self._slot_table(pool, slots)
        self._core.set_rubrics(slot_capability, fresh)
        self._rubric_capability = pool
        self._rubric_slot = slots

    def _slot_table(self, pool: Mapping, slots: Mapping) -> list[int]:
        table = [-1] * (max(slots.values(), default=-1) + 1)
        for rubric_id, slot in slots.items():
            table[slot] = self._capability_index[pool[rubric_id]]
        return table

    def record_group(
        self,
        task_id: Hashable,
        verdicts: Mapping[Hashable, Sequence],
        policy_version: int,
        outcomes: Sequence[float] | None = None,
    ) -> None:
        """Adds the rubric verdicts of one complete rollout group of `task_id`.

        Args:
            verdicts: rubric id -> `group_size` verdicts, each True/False (pass/fail),
                `Verdict.NA` (does not apply: counts for coverage, no evidence) or
                `Verdict.INVALID` (judge failure: neither). Rubrics left out were
                not evaluated on this group.
            policy_version: version of the policy that produced the rollouts; a
                group older than the newest evidence is discounted, not dropped.
            outcomes: accepted for interface parity with `OutcomeSampler`; unused.
        """
        task = self._tasks.lookup(task_id)
        version = check_version(policy_version)
        rubrics, codes = parse_group(verdicts, self._rubric_slot, self.group_size)
        parse_outcomes(outcomes, self.group_size, required=False)
        self._core.record_group(task, [self._rubric_slot[r] for r in rubrics], codes, version)

    # -- sampling ------------------------------------------------------------

    def sample(self, policy_version: int) -> list:
        """One batch of `batch_size` distinct task ids for the policy at `policy_version`."""
        version = check_version(policy_version)
        return [self._tasks.ids[i] for i in self._core.sample(version)]

    # -- inspection ----------------------------------------------------------

    def coverage(self) -> float:
        """Eq. 11: mean over tasks and represented capabilities of the evaluated share of active rubrics."""
        return self._core.coverage()

    def evidence(self, tag: Hashable, capability: str, policy_version: int) -> tuple[float, float]:
        """(S_dc, F_dc): decayed evidence of `tag` summed over the active rubrics of `capability`."""
        return self._core.pair_evidence(
            self._tasks.lookup_tag(tag), self._lookup_capability(capability), check_version(policy_version)
        )

    def rubric_evidence(self, tag: Hashable, rubric_id: Hashable, policy_version: int) -> tuple[float, float]:
        """(S, F) of one (tag, rubric) accumulator as seen at `policy_version`."""
        if rubric_id not in self._rubric_slot:
            raise ValueError(f"rubric_id {rubric_id!r} is not in the active pool")
        return self._core.rubric_evidence(
            self._tasks.lookup_tag(tag), self._rubric_slot[rubric_id], check_version(policy_version)
        )

    def task_state(self, task_id: Hashable) -> dict:
        """{"attempts": a_x, "evaluated": E(x) as rubric ids, "applicable": rubrics with pass/fail evidence}."""
        attempts, evaluated, applicable = self._core.task_state(self._tasks.lookup(task_id))
        rubric_at = {slot: rubric_id for rubric_id, slot in self._rubric_slot.items()}
        return {
            "attempts": attempts,
            "evaluated": {rubric_at[s] for s in evaluated},
            "applicable": {rubric_at[s] for s in applicable},
        }

    def pair_probabilities(self, policy_version: int, num_draws: int = 2000, seed: int = 0) -> dict:
        """{(tag, capability): E[w_dc / sum w]} over the pairs eligible at the start of a batch.

        The probability that an adaptive draw targets each pair (eq. 14), by a
        Monte Carlo of `num_draws` Beta draws on a generator of its own: calling
        it never changes the batches `sample` returns. Empty when no pair has
        evidence yet (the sampler then runs on discovery only).
        """
        version = check_version(policy_version)
        draws = check_int(num_draws, "num_draws", low=1)
        probability, members = self._core.pair_probabilities(
            version, draws, check_int(seed, "seed", low=0, high=2**64 - 1)
        )
        num_capabilities = len(self._capabilities)
        return {
            (self._tasks.tags[p // num_capabilities], self._capabilities[p % num_capabilities]): probability[p]
            for p in range(len(probability))
            if members[p] > 0
        }

    def _lookup_capability(self, capability: str) -> int:
        try:
            return self._capability_index[capability]
        except (KeyError, TypeError):
            raise ValueError(f"capability {capability!r} is not one of {self._capabilities!r}") from None

    # -- checkpointing -------------------------------------------------------

    def state_dict(self) -> dict:
        """Everything needed for an exact resume (pool, records, evidence, generator), picklable."""
        return {
            "kind": "CapabilitySampler",
            "format": _STATE_FORMAT,
            "config": dict(self._config),
            "rubrics": [
                [rubric_id, self._rubric_capability[rubric_id], slot] for rubric_id, slot in self._rubric_slot.items()
            ],
            "core": self._core.serialize(),
        }

    def load_state_dict(self, state: Mapping) -> None:
        """Restores `state_dict()` output of a sampler with the same tasks and settings; all or nothing.

        Beyond its checksum the snapshot must hold a state the sampler can reach: a valid generator
        state (not all zero), records and evidence only on rubrics of its pool and tags of its tasks,
        every applicability record backed by evidence and every evidence cell by a record, attempts
        behind every record; otherwise ValueError naming the sampler state.
        """
        check_state(state, "CapabilitySampler", _STATE_FORMAT, self._config)
        try:
            entries = [(rubric_id, capability, slot) for rubric_id, capability, slot in state["rubrics"]]
        except (KeyError, TypeError, ValueError):
            raise ValueError("state_dict['rubrics'] is missing or malformed") from None
        for rubric_id, capability, slot in entries:
            try:
                hash(rubric_id)
            except TypeError:
                rubric_id = None
            if (
                rubric_id is None
                or not isinstance(capability, str)
                or isinstance(slot, bool)
                or not isinstance(slot, int)
                or not 0 <= slot < 2**31
            ):
                raise ValueError(
                    f"state_dict['rubrics'] holds a malformed entry {[rubric_id, capability, slot]!r:.200} "
                    "(want [rubric id, capability, slot 0..2**31-1])"
                )
        pool = check_rubrics({rubric_id: capability for rubric_id, capability, _ in entries}, self._capabilities)
        slots = {rubric_id: slot for rubric_id, _, slot in entries}
        if len(pool) != len(entries) or len(set(slots.values())) != len(slots) or min(slots.values(), default=0) < 0:
            raise ValueError("state_dict['rubrics'] repeats a rubric or a slot")
        if not isinstance(state.get("core"), (bytes, bytearray)):
            raise ValueError("state_dict['core'] is missing or not the store's snapshot bytes")
        try:
            self._core.restore(state["core"], self._slot_table(pool, slots))
        except (KeyError, TypeError, OverflowError, IndexError, AttributeError) as error:
            # The C++ store checks its snapshot before changing anything; what pybind11 reports as a type
            # or range error is the same refusal.
            raise ValueError(f"state_dict['core'] is malformed ({type(error).__name__}: {str(error)[:200]})") from None
        self._rubric_capability = pool
        self._rubric_slot = slots
