"""Evidence store and sampler faults found by probing.

- Finite observations whose sum overflows to inf used to be accepted, and the store's
  snapshot was then unloadable. Now refused, naming the argument, with the store
  unchanged (all or nothing for observe_many).
- A snapshot whose checksum is right but whose content is not a state the sampler can
  reach (generator state all zero, evidence for tags or rubric slots outside the pool,
  records that disagree with the evidence) used to load; with a zero generator state
  sample() then looped forever holding the GIL. Now refused on load, naming the snapshot.
Snapshots are edited with tests/snapshot_format.py, an independent reading of the format,
and re-sealed with a valid checksum so that only the semantic checks can catch them.
"""

import math
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from _util import TESTS
from snapshot_format import SamplerSnapshot, StoreSnapshot

from rwcore import CapabilitySampler, EvidenceStore

BIG = 1e308  # 2 * BIG = inf in float64; BIG + BIG / 2 = 1.5e308 is still finite
HANG_TIMEOUT_S = 30


def store_state(store: EvidenceStore):
    return store.cells(), store.to_bytes()


# ----------------------------------------------------------------------------- overflow on observe

OVERFLOWING_OBSERVE = {
    # name: (gamma_obs, gamma_unobs, first observation, second observation, named argument)
    "same_version_success": (0.2, 0.999, (0, 0, BIG, 0.0, 3), (0, 0, BIG, 0.0, 3), "success"),
    "same_version_failure": (0.2, 0.999, (4, 9, 1.0, BIG, 0), (4, 9, 0.0, BIG, 0), "failure"),
    # gamma_obs = gamma_unobs = 1: a newer version keeps everything, so the sum overflows
    "newer_version_no_decay": (1.0, 1.0, (1, 1, BIG, 1.0, 0), (1, 1, BIG, 1.0, 7), "success"),
    # a late group (dv < 0) with gamma_obs = 1 is added undiscounted
    "late_group_no_decay": (1.0, 1.0, (2, 3, 0.0, BIG, 9), (2, 3, 0.0, BIG, 2), "failure"),
    # ids beyond the dense grid live in the hash table: same rule
    "sparse_cell": (0.2, 0.999, (2**32 - 1, 2**31, BIG, 0.0, 1), (2**32 - 1, 2**31, BIG, 0.0, 1), "success"),
}


@pytest.mark.parametrize("case", sorted(OVERFLOWING_OBSERVE))
def test_observe_that_would_overflow_is_refused_and_changes_nothing(case):
    g_obs, g_unobs, first, second, argument = OVERFLOWING_OBSERVE[case]
    store = EvidenceStore(g_obs, g_unobs)
    store.observe(5, 5, 1.0, 2.0, 0)  # an unrelated cell
    store.observe(*first)
    before = store_state(store)
    with pytest.raises(ValueError) as info:
        store.observe(*second)
    assert argument in str(info.value) and "overflow" in str(info.value), str(info.value)
    assert store_state(store) == before
    # the snapshot still loads, and equals the store
    assert EvidenceStore.from_bytes(store.to_bytes()).cells() == before[0]


def test_observe_many_overflow_is_all_or_nothing():
    store = EvidenceStore()
    store.observe(7, 7, 2.0, 3.0, 1)
    before = store_state(store)
    # element 0 is fine and names a new cell; elements 1 and 2 hit one cell whose sum overflows
    with pytest.raises(ValueError) as info:
        store.observe_many([1, 0, 0], [1, 0, 0], [1.0, BIG, BIG], [0.0, 0.0, 0.0], [0, 0, 0])
    message = str(info.value)
    assert "successes[2]" in message and "overflow" in message, message
    assert store_state(store) == before  # the new cell (1, 1) was not created either
    assert len(store) == 1

    # overflow against a cell already in the store, from the failure side
    store.observe(0, 0, 0.0, BIG, 4)
    before = store_state(store)
    with pytest.raises(ValueError) as info:
        store.observe_many(
            np.array([3, 0]), np.array([3, 0]), np.array([1.0, 0.0]), np.array([1.0, BIG]), np.array([4, 4])
        )
    assert "failures[1]" in str(info.value), str(info.value)
    assert store_state(store) == before


def test_large_but_finite_sums_are_still_exact():
    """No false alarm near the top of the range: BIG + BIG/2 is finite, and the slow exact
    check must give the very value the update formula gives (dv = 0: plain addition)."""
    store = EvidenceStore()
    store.observe_many([0, 0, 1], [0, 0, 1], [BIG, BIG / 2, 1.0], [0.0, 0.0, BIG], [3, 3, 0])
    assert store.query(0, 0, 3) == (BIG + BIG / 2, 0.0)
    store.observe(1, 1, 0.0, BIG / 4, 0)
    assert store.query(1, 1, 0) == (1.0, BIG + BIG / 4)
    # dv > 0 decays first: 0.2 * 1.5e308 + 1e308 is finite
    store.observe(0, 0, BIG, 0.0, 4)
    assert store.query(0, 0, 4) == (0.2 * (BIG + BIG / 2) + BIG, 0.0)
    assert all(math.isfinite(c[2]) and math.isfinite(c[3]) for c in store.cells())
    assert EvidenceStore.from_bytes(store.to_bytes()).cells() == store.cells()


# ----------------------------------------------------------------------------- snapshot invariants

TASKS = {"a": ["X"], "b": ["X"], "c": ["Y"]}
SAMPLER_KW = dict(batch_size=2, group_size=2, rho_min=0.1, seed=3)


def trained_sampler(record=("a", "b", "c")) -> CapabilitySampler:
    sampler = CapabilitySampler(TASKS, **SAMPLER_KW)
    sampler.set_rubrics({"r1": "Understanding"})
    for task in record:
        sampler.record_group(task, {"r1": [True, False]}, 0)
    return sampler


def edited(state: dict, edit) -> dict:
    snapshot = SamplerSnapshot.parse(state["core"])
    edit(snapshot)
    return dict(state, core=snapshot.to_bytes())


def _store_edit(edit):
    def apply(snapshot: SamplerSnapshot):
        store = StoreSnapshot.parse(snapshot.store)
        edit(store)
        snapshot.store = store.to_bytes()

    return apply


def _clear_bits(snapshot):
    snapshot.evaluated = [0] * len(snapshot.evaluated)
    snapshot.applicable = [0] * len(snapshot.applicable)


SAMPLER_EDITS = {
    "generator_state_all_zero": lambda s: setattr(s, "rng", [0, 0, 0, 0]),
    "evidence_for_a_tag_out_of_range": _store_edit(lambda st: st.cells.append([7, 0, 1.0, 1.0, 0])),
    "evidence_for_a_slot_outside_the_pool": _store_edit(lambda st: st.cells.append([1, 3, 1.0, 1.0, 0])),
    "evaluated_bit_on_a_slot_outside_the_pool": lambda s: s.evaluated.__setitem__(0, s.evaluated[0] | 1 << 5),
    "applicable_bit_on_a_slot_outside_the_pool": lambda s: s.applicable.__setitem__(1, s.applicable[1] | 1 << 63),
    "applicable_record_without_evidence": _store_edit(lambda st: st.cells.pop(0)),
    "evidence_without_an_applicable_record": _clear_bits,
    "records_of_a_task_never_attempted": lambda s: s.attempts.__setitem__(0, 0),
}


@pytest.mark.parametrize("case", sorted(SAMPLER_EDITS))
def test_sampler_snapshot_semantic_checks(case):
    state = trained_sampler().state_dict()
    bad = edited(state, SAMPLER_EDITS[case])
    target = CapabilitySampler(TASKS, **SAMPLER_KW)
    target.set_rubrics({"r1": "Understanding"})
    before = target.state_dict()["core"]
    with pytest.raises(ValueError) as info:
        target.load_state_dict(bad)
    assert "sampler state" in str(info.value), str(info.value)
    assert target.state_dict()["core"] == before  # all or nothing
    # the unedited state still loads into the same sampler
    target.load_state_dict(state)
    assert target.state_dict()["core"] == state["core"]


def test_zero_generator_state_is_refused_not_a_hang():
    """Before: the snapshot loaded and sample() never returned (xoshiro256** with an all-zero
    state yields only zeros; Marsaglia's polar method then rejects forever, holding the GIL).
    Run in a subprocess with a timeout so a regression fails instead of hanging the suite."""
    script = textwrap.dedent(f"""
        import sys
        import rwcore  # before tests/ is on sys.path: its rwcore/ test folder would hide the installed package
        sys.path[:0] = [{str(Path(__file__).resolve().parent)!r}, {str(TESTS)!r}]
        from test_store_invariants import trained_sampler, edited, SAMPLER_EDITS, TASKS, SAMPLER_KW
        from rwcore import CapabilitySampler
        bad = edited(trained_sampler().state_dict(), SAMPLER_EDITS["generator_state_all_zero"])
        target = CapabilitySampler(TASKS, **SAMPLER_KW)
        try:
            target.load_state_dict(bad)
        except ValueError as error:
            print("REFUSED:", error)
            sys.exit(0)
        print("LOADED; sampling", flush=True)
        print("SAMPLED:", target.sample(1))
    """)
    try:
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=HANG_TIMEOUT_S)
    except subprocess.TimeoutExpired as timeout:
        pytest.fail(
            f"sample() after loading a zero generator state did not return in {HANG_TIMEOUT_S} s "
            f"(stdout: {timeout.stdout!r})"
        )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("REFUSED:"), done.stdout
    assert "generator" in done.stdout and "sampler state" in done.stdout, done.stdout


def test_store_snapshot_cells_out_of_canonical_order_refused():
    store = EvidenceStore()
    store.observe(0, 1, 1.0, 0.0, 0)
    store.observe(2, 0, 0.0, 1.0, 0)
    snapshot = StoreSnapshot.parse(store.to_bytes())
    snapshot.cells.reverse()
    with pytest.raises(ValueError) as info:
        EvidenceStore.from_bytes(snapshot.to_bytes(), what="evidence snapshot 'x.bin'")
    assert "evidence snapshot 'x.bin'" in str(info.value) and "order" in str(info.value), str(info.value)


def test_reachable_states_all_load():
    """The checks refuse nothing a sampler can reach: states after pool changes, resets and
    late groups round-trip exactly (a property the edits above must not share)."""
    sampler = CapabilitySampler(
        {f"t{i}": [f"g{i % 3}", f"h{i % 2}"] for i in range(9)}, batch_size=3, group_size=2, seed=11
    )
    sampler.set_rubrics({"r1": "Understanding", "r2": "Execution", "r3": "Understanding"})
    rng = np.random.default_rng(0)
    for step in range(12):
        for task in sampler.sample(step):
            verdicts = {r: [bool(v) for v in rng.integers(0, 2, 2)] for r in sampler.rubrics if rng.random() < 0.8}
            sampler.record_group(task, verdicts, max(0, step - int(rng.integers(0, 3))))
        if step == 5:
            sampler.set_rubrics({"r2": "Execution", "r4": "Debugging"})  # r1, r3 leave; r4 new
        if step == 8:
            sampler.set_rubrics({"r2": "Verification", "r4": "Debugging", "r5": "Efficiency"})  # r2 moves
        state = sampler.state_dict()
        copy = CapabilitySampler(
            {f"t{i}": [f"g{i % 3}", f"h{i % 2}"] for i in range(9)}, batch_size=3, group_size=2, seed=99
        )
        copy.load_state_dict(state)
        assert copy.state_dict()["core"] == state["core"]
        assert copy.sample(step + 1) == sampler.sample(step + 1)
