"""Time-boxed fuzzing of the evidence-store and sampler snapshot loaders.

Valid snapshots (several stores and samplers) get seeded random mutations: bit flips, byte
overwrites, truncation, extension, splicing, chunk insertion and deletion -- each both
as is (the checksum catches it) and with the checksum recomputed (so the parser and the
semantic checks must) -- and field-targeted edits through tests/snapshot_format.py:
counts and lengths, cells set to inf / NaN / negative / huge, versions, ids, decay
factors, cell order, generator state zeroed, attempts, record bits, the pool table, the
nested store of a sampler snapshot.

Every load must either raise ValueError naming the snapshot, or give a store / sampler
that satisfies the invariants: finite non-negative cells, non-negative versions, the
snapshot is canonical (it re-serializes to the very bytes loaded), and for a sampler,
sample() returns promptly a batch of distinct tasks. A hang (C++ looping with the GIL
held) cannot be interrupted from inside the process, so the cases run in a worker
subprocess that reports each case as it starts; the test kills it and fails naming the
case if one takes longer than STALL_S.

Deterministic: case i uses random.Random(SEED + i). Bounded by RWCORE_FUZZ_CASES cases
(default 40000) and RWCORE_FUZZ_SECONDS seconds (default 25); at least MIN_CASES must run.
"""

from __future__ import annotations

import math
import os
import queue
import random
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter

HERE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: its helper modules
import rwcore  # noqa: E402,F401 - before tests/ is on sys.path: its rwcore/ test folder would hide the package

if HERE not in sys.path:
    sys.path.insert(0, HERE)

from snapshot_format import SamplerSnapshot, StoreSnapshot, reseal  # noqa: E402

SEED = 20261203
BUDGET_S = float(os.environ.get("RWCORE_FUZZ_SECONDS", "25"))
MAX_CASES = int(os.environ.get("RWCORE_FUZZ_CASES", "40000"))
MIN_CASES = int(os.environ.get("RWCORE_FUZZ_MIN_CASES", "2000"))
STALL_S = 30.0

SPECIAL_FLOATS = [math.inf, -math.inf, math.nan, -1.0, -0.0, 5e-324, 1e308, sys.float_info.max, 0.0, 0.5, 3.0]
SPECIAL_U64 = [0, 1, 2, 7, 2**31, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1]
SPECIAL_I64 = [-1, -(2**63), 0, 1, 2**62, 2**63 - 1]
SAMPLER_TASKS = {f"t{i}": [f"g{i % 3}", f"h{i % 2}"] for i in range(9)}
SAMPLER_KW = dict(batch_size=3, group_size=2, seed=5)


# ----------------------------------------------------------------------------- base snapshots


def base_stores():
    from rwcore import EvidenceStore

    stores = [EvidenceStore()]
    small = EvidenceStore()
    for tag, rubric, s, f, v in [(0, 0, 1.0, 0.5, 0), (0, 3, 0.25, 0.75, 2), (4, 1, 2.0, 0.0, 5), (4, 1, 1.0, 1.0, 3)]:
        small.observe(tag, rubric, s, f, v)
    stores.append(small)
    mixed = EvidenceStore(0.5, 1.0)
    mixed.observe_many(
        [1, 70000, 2**32 - 1, 3],
        [2, 5, 2**32 - 1, 4096],
        [1.0, 2.0, 1e300, 0.0],
        [0.0, 1.0, 5.0, 7.0],
        [1, 2, 3, 2**62],
    )
    stores.append(mixed)
    return [s.to_bytes() for s in stores]


def _trained(rubrics, steps, pool_changes=None):
    from rwcore import CapabilitySampler

    sampler = CapabilitySampler(SAMPLER_TASKS, **SAMPLER_KW)
    sampler.set_rubrics(rubrics)
    rng = random.Random(1)
    for step in range(steps):
        for task in sampler.sample(step):
            verdicts = {r: [rng.random() < 0.5 for _ in range(2)] for r in sampler.rubrics if rng.random() < 0.7}
            sampler.record_group(task, verdicts, max(0, step - rng.randrange(3)))
        if pool_changes and step in pool_changes:
            sampler.set_rubrics(pool_changes[step])
    return sampler


def base_samplers():
    """(rubric table, state_dict) pairs: fresh, trained, trained over 70 slots (two bit words) with pool changes."""
    caps = ["Understanding", "Execution", "Verification", "Debugging", "Efficiency"]
    wide = {f"r{i}": caps[i % 5] for i in range(70)}
    narrowed = {f"r{i}": caps[i % 5] for i in range(0, 70, 3)}
    samplers = [
        _trained({"r1": "Understanding"}, 0),
        _trained({"r1": "Understanding", "r2": "Execution", "r3": "Understanding"}, 6),
        _trained(wide, 4, pool_changes={1: narrowed, 2: {**narrowed, "x": "Debugging"}}),
    ]
    return [s.state_dict() for s in samplers]


# ----------------------------------------------------------------------------- raw mutations


def bit_flip(rng, data, other):
    data = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        i = rng.randrange(len(data))
        data[i] ^= 1 << rng.randrange(8)
    return bytes(data)


def byte_overwrite(rng, data, other):
    data = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        data[rng.randrange(len(data))] = rng.choice([0, 0xFF, 0x7F, 0x80, rng.randrange(256)])
    return bytes(data)


def truncate(rng, data, other):
    return data[: rng.randrange(len(data))]


def extend(rng, data, other):
    return data + bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))


def splice(rng, data, other):
    return data[: rng.randrange(len(data) + 1)] + other[rng.randrange(len(other) + 1) :]


def insert_chunk(rng, data, other):
    i = rng.randrange(len(data) + 1)
    return data[:i] + bytes(rng.randrange(256) for _ in range(rng.choice([1, 4, 8, 24]))) + data[i:]


def delete_chunk(rng, data, other):
    i = rng.randrange(len(data))
    return data[:i] + data[i + rng.choice([1, 4, 8, 24]) :]


def duplicate_chunk(rng, data, other):
    i = rng.randrange(len(data))
    size = rng.choice([8, 24, 32, 40])
    return data[:i] + data[i : i + size] + data[i:]


RAW = [bit_flip, byte_overwrite, truncate, extend, splice, insert_chunk, delete_chunk, duplicate_chunk]


# ----------------------------------------------------------------------------- field-targeted mutations


def store_field_edit(rng, data):
    """One edit of a parsed store snapshot; returns (name, resealed bytes)."""
    snap = StoreSnapshot.parse(data)
    count = None
    choice = rng.choice(
        ["cell_float", "cell_version", "cell_id", "count", "gamma", "order", "drop", "duplicate", "format"]
        if snap.cells
        else ["count", "gamma", "format", "add_cell"]
    )
    if choice == "cell_float":
        cell = rng.choice(snap.cells)
        cell[rng.choice([2, 3])] = rng.choice(SPECIAL_FLOATS + [rng.uniform(0, 10)])
    elif choice == "cell_version":
        rng.choice(snap.cells)[4] = rng.choice(SPECIAL_I64 + [rng.randrange(-5, 5)])
    elif choice == "cell_id":
        cell = rng.choice(snap.cells)
        cell[rng.choice([0, 1])] = rng.choice([0, 1, 4095, 4096, 65536, 2**32 - 1, rng.randrange(2**32)])
    elif choice == "count":
        count = rng.choice([len(snap.cells) + d for d in (-2, -1, 1, 2)] + [0, 2**31, 2**64 - 1])
        count = max(0, count)
    elif choice == "gamma":
        value = rng.choice([0.0, -0.2, 1.0, 1.0000001, math.nan, math.inf, 0.5, 5e-324])
        if rng.random() < 0.5:
            snap.gamma_obs = value
        else:
            snap.gamma_unobs = value
    elif choice == "order":
        rng.shuffle(snap.cells)
    elif choice == "drop":
        snap.cells.pop(rng.randrange(len(snap.cells)))
    elif choice == "duplicate":
        snap.cells.insert(rng.randrange(len(snap.cells) + 1), list(rng.choice(snap.cells)))
    elif choice == "format":
        snap.format = rng.choice([0, 2, 2**32 - 1])
    elif choice == "add_cell":
        snap.cells.append([rng.randrange(8), rng.randrange(8), rng.uniform(0, 3), rng.uniform(0, 3), rng.randrange(4)])
    return "store." + choice, snap.to_bytes(count=count)


def _vector_offsets(snap: SamplerSnapshot) -> dict:
    offsets, offset = {}, 8 + 4 + 8
    offsets["slot_capability"] = offset
    offset += 8 + 4 * len(snap.slot_capability)
    offsets["words"] = offset
    offset += 8
    for name in ("evaluated", "applicable", "attempts"):
        offsets[name] = offset
        offset += 8 + 8 * len(getattr(snap, name))
    offsets["rng"] = offset
    offsets["store"] = offset + 32
    return offsets


def sampler_field_edit(rng, data):
    snap = SamplerSnapshot.parse(data)
    choice = rng.choice(
        [
            "rng_zero",
            "rng_one_word",
            "rng_random",
            "attempts",
            "bits",
            "words",
            "slot_table",
            "length_lie",
            "store_length_lie",
            "fingerprint",
            "inner_store",
            "inner_store_raw",
        ]
    )
    lie = None
    if choice == "rng_zero":
        snap.rng = [0, 0, 0, 0]
    elif choice == "rng_one_word":
        snap.rng = [0, 0, 0, 0]
        snap.rng[rng.randrange(4)] = rng.choice([1, 2**63, rng.randrange(1, 2**64)])
    elif choice == "rng_random":
        snap.rng = [rng.randrange(2**64) for _ in range(4)]
    elif choice == "attempts":
        snap.attempts[rng.randrange(len(snap.attempts))] = rng.choice(SPECIAL_I64)
    elif choice == "bits":
        name = rng.choice(["evaluated", "applicable"])
        words = getattr(snap, name)
        i = rng.randrange(len(words))
        words[i] = rng.choice([0, 2**64 - 1, words[i] ^ (1 << rng.randrange(64)), rng.randrange(2**64)])
    elif choice == "words":
        snap.words = rng.choice([0, 1, 2, 3, snap.words + 1, 1025, 2**64 - 1])
    elif choice == "slot_table":
        table = snap.slot_capability
        if table and rng.random() < 0.7:
            table[rng.randrange(len(table))] = rng.choice([-2, -1, 0, 1, 4, 5, 63, 64, 2**31 - 1])
        else:
            table.append(rng.choice([-1, 0, 3]))
    elif choice == "length_lie":
        lie = (
            rng.choice(["slot_capability", "evaluated", "applicable", "attempts"]),
            rng.choice([0, 1, 2, 17, 2**32, 2**64 - 1]),
        )
    elif choice == "store_length_lie":
        lie = ("store", rng.choice([0, 8, len(snap.store) - 1, len(snap.store) + 1, 2**63]))
    elif choice == "fingerprint":
        snap.fingerprint ^= 1 << rng.randrange(64)
    elif choice == "inner_store":
        _, snap.store = store_field_edit(rng, snap.store)
    elif choice == "inner_store_raw":
        snap.store = reseal(rng.choice(RAW)(rng, snap.store, snap.store)) if len(snap.store) > 8 else snap.store
    out = snap.to_bytes()
    if lie is not None:
        offset = _vector_offsets(snap)[lie[0]]
        out = reseal(out[:offset] + struct.pack("<Q", lie[1]) + out[offset + 8 :])
    return "sampler." + choice, out


# ----------------------------------------------------------------------------- checks


def check_store(data: bytes, what: str):
    from rwcore import EvidenceStore

    try:
        store = EvidenceStore.from_bytes(data, what=what)
    except ValueError as error:
        assert what in str(error), f"error does not name the snapshot: {error}"
        return "refused"
    for tag, rubric, s, f, version in store.cells():
        assert 0 <= tag < 2**32 and 0 <= rubric < 2**32
        assert math.isfinite(s) and math.isfinite(f) and s >= 0 and f >= 0, (s, f)
        assert version >= 0
        got = store.query(tag, rubric, min(version + 3, 2**63 - 1))
        assert all(math.isfinite(x) and x >= 0 for x in got)
    assert 0 < store.gamma_obs <= 1 and 0 < store.gamma_unobs <= 1
    assert store.to_bytes() == data, "an accepted snapshot must be canonical"
    store.observe(0, 0, 1.0, 1.0, 1)  # still usable
    return "loaded"


def check_sampler(state: dict, data: bytes):
    from rwcore import CapabilitySampler

    sampler = CapabilitySampler(SAMPLER_TASKS, **SAMPLER_KW)
    try:
        sampler.load_state_dict(dict(state, core=data))
    except ValueError as error:
        assert "sampler state" in str(error) or "state_dict" in str(error), f"error names no snapshot: {error}"
        return "refused"
    assert sampler.state_dict()["core"] == data, "an accepted snapshot must be canonical"
    coverage = sampler.coverage()
    assert 0.0 <= coverage <= 1.0
    for step in (0, 7):
        batch = sampler.sample(step)  # must return: the worker is watched for stalls
        assert len(batch) == SAMPLER_KW["batch_size"] == len(set(batch)) and set(batch) <= set(SAMPLER_TASKS)
    probabilities = sampler.pair_probabilities(3, num_draws=20)
    assert all(math.isfinite(p) and 0 <= p <= 1 for p in probabilities.values())
    return "loaded"


# ----------------------------------------------------------------------------- worker and test


def worker(budget_s: float, max_cases: int) -> int:
    stores = base_stores()
    samplers = base_samplers()
    sampler_bytes = [s["core"] for s in samplers]
    start = time.monotonic()
    outcomes = Counter()
    cases = 0
    for i in range(max_cases):
        if time.monotonic() - start > budget_s:
            break
        rng = random.Random(SEED + i)
        on_sampler = rng.random() < 0.5
        pool = sampler_bytes if on_sampler else stores
        index = rng.randrange(len(pool))
        base, other = pool[index], rng.choice(stores + sampler_bytes)
        mode = rng.random()
        if mode < 0.3:
            mutation = rng.choice(RAW)
            name, data = mutation.__name__, mutation(rng, base, other)
        elif mode < 0.6:
            mutation = rng.choice(RAW)
            name, data = mutation.__name__ + "+reseal", mutation(rng, base, other)
            data = reseal(data) if len(data) >= 8 else data
        else:
            name, data = (sampler_field_edit if on_sampler else store_field_edit)(rng, base)
        kind = "sampler" if on_sampler else "store"
        print(f"start {i} {kind}[{index}] {name}", flush=True)
        try:
            outcome = check_sampler(samplers[index], data) if on_sampler else check_store(data, "fuzzed snapshot")
        except Exception as error:  # - any other outcome is a finding
            print(f"FAIL {i} {kind}[{index}] {name}: {type(error).__name__}: {error}", flush=True)
            return 1
        outcomes[(kind, name, outcome)] += 1
        cases += 1
    elapsed = time.monotonic() - start
    refused = sum(n for (_, _, o), n in outcomes.items() if o == "refused")
    print(f"done {cases} cases in {elapsed:.1f} s: {refused} refused, {cases - refused} loaded and checked", flush=True)
    for key in sorted(outcomes):
        print("count", *key, outcomes[key], flush=True)
    return 0


def test_fuzz_snapshot_loaders():
    with tempfile.TemporaryFile(mode="w+") as stderr:
        proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--worker", str(BUDGET_S), str(MAX_CASES)],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            cwd=HERE,
        )
        lines: queue.Queue = queue.Queue()
        threading.Thread(
            target=lambda: [lines.put(line) for line in proc.stdout] + [lines.put(None)], daemon=True
        ).start()
        started, log = None, []
        while True:
            try:
                line = lines.get(timeout=STALL_S + 60 if started is None else STALL_S)  # first: imports
            except queue.Empty:
                proc.kill()
                proc.wait()
                raise AssertionError(f"fuzz case hung for more than {STALL_S} s: {started}") from None
            if line is None:
                break
            log.append(line.rstrip())
            if line.startswith("start "):
                started = line.strip()
        proc.wait(timeout=60)
        stderr.seek(0)
        err = stderr.read()
    failures = [line for line in log if line.startswith("FAIL")]
    assert not failures, f"{failures[0]}\n{err[-3000:]}"
    assert proc.returncode == 0, f"fuzz worker exited with {proc.returncode} after {started}\n{err[-3000:]}"
    summary = [line for line in log if line.startswith(("done", "count"))]
    print("\n".join(summary))
    cases = int(summary[0].split()[1])
    assert cases >= MIN_CASES, f"only {cases} fuzz cases ran in the time budget"
    counts = Counter()
    for line in summary[1:]:
        *_, outcome, number = line.split()
        counts[outcome] += int(number)
    # both outcomes occur: the fuzz reaches past the checksum into loads that succeed
    assert counts["refused"] > 0 and counts["loaded"] > 0, counts


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "--worker":
    sys.exit(worker(float(sys.argv[2]), int(sys.argv[3])))
