"""Evidence store and capability sampler vs a pure-Python implementation, in one process.

    .venv/bin/python bench/bench_sampler.py                 # issue-sized: 100k tasks, 82 tags, 64 rubrics
    .venv/bin/python bench/bench_sampler.py --quick         # small sizes, a few seconds
    .venv/bin/python bench/bench_sampler.py --out bench/results/sampler.json

The peer is `tests/reference_sampler.py`: a readable dict-and-set model of the
same semantics that the test suite checks the C++ against. Both are fed the
same observations and rollout groups; every figure is reported as a ratio
measured in this run, with the machine noted. Single-threaded throughout.

Measured:
- `observe_many` throughput (observations / s) vs the peer's `observe` loop;
- `sample()` latency for one batch in two regimes: a discovery phase (a fifth
  of the tasks judged on a quarter of the rubrics) and an adaptive phase (every
  task judged on every rubric, so coverage is 1 and rho = rho_min).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from _report import machine, publish  # noqa: E402
from reference_sampler import RefCapabilitySampler, RefEvidenceStore  # noqa: E402
from reference_sampler import Verdict as RefVerdict  # noqa: E402

import rwcore  # noqa: E402

CAPABILITIES = rwcore.DEFAULT_CAPABILITIES


def timed(function, repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return times


def bench_observe(num_observations: int, peer_observations: int, tags: int, rubrics: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    tag_ids = rng.integers(0, tags, num_observations)
    rubric_ids = rng.integers(0, rubrics, num_observations)
    successes = rng.random(num_observations) * 8
    failures = 8 - successes
    # Versions advance in steps, with a few late groups from older policies.
    versions = np.arange(num_observations) // max(1, num_observations // 200)
    late = rng.random(num_observations) < 0.05
    versions = np.where(late, np.maximum(0, versions - rng.integers(1, 4, num_observations)), versions)

    def run_native():
        store = rwcore.EvidenceStore()
        store.observe_many(tag_ids, rubric_ids, successes, failures, versions)

    lists = [a[:peer_observations].tolist() for a in (tag_ids, rubric_ids, successes, failures, versions)]

    def run_peer():
        store = RefEvidenceStore()
        for tag, rubric, s, f, v in zip(*lists):
            store.observe(tag, rubric, s, f, v)

    native = min(timed(run_native, 5))
    peer = min(timed(run_peer, 3))
    native_rate = num_observations / native
    peer_rate = peer_observations / peer
    return {
        "native_obs_per_s": native_rate,
        "peer_obs_per_s": peer_rate,
        "speedup": native_rate / peer_rate,
        "native_observations": num_observations,
        "peer_observations": peer_observations,
    }


def make_tasks(num_tasks: int, num_tags: int, rng: random.Random) -> dict:
    return {f"task{i}": [f"tag{t}" for t in rng.sample(range(num_tags), rng.randint(1, 3))] for i in range(num_tasks)}


def feed(samplers, groups) -> None:
    for task_id, native_verdicts, peer_verdicts, version in groups:
        samplers[0].record_group(task_id, native_verdicts, version)
        samplers[1].record_group(task_id, peer_verdicts, version)


def make_groups(task_ids, rubric_ids, rubrics_per_group, judged_per_group, group_size, rng):
    """One group per task: `rubrics_per_group` rubrics, `judged_per_group` of them pass/fail, the rest NA."""
    groups = []
    for k, task_id in enumerate(task_ids):
        chosen = rng.sample(rubric_ids, rubrics_per_group)
        native, peer = {}, {}
        for n, rubric_id in enumerate(chosen):
            if n < judged_per_group:
                outcome = np.array([rng.random() < 0.4 for _ in range(group_size)])
                native[rubric_id] = outcome
                peer[rubric_id] = outcome.tolist()
            else:
                native[rubric_id] = [rwcore.Verdict.NA] * group_size
                peer[rubric_id] = [RefVerdict.NA] * group_size
        groups.append((task_id, native, peer, k * 40 // len(task_ids)))
    return groups


def bench_sample(args, rng: random.Random) -> dict:
    tasks = make_tasks(args.tasks, args.tags, rng)
    rubrics = {f"rubric{i}": CAPABILITIES[i % len(CAPABILITIES)] for i in range(args.rubrics)}
    rubric_ids = list(rubrics)
    config = dict(batch_size=args.batch_size, group_size=args.group_size, seed=args.seed)
    samplers = (rwcore.CapabilitySampler(tasks, **config), RefCapabilitySampler(tasks, **config))
    for sampler in samplers:
        sampler.set_rubrics(rubrics)
    task_ids = list(tasks)
    results = {}

    print(f"  discovery phase: judging {len(task_ids) // 5} tasks on {args.rubrics // 4} rubrics each ...", flush=True)
    feed(
        samplers,
        make_groups(rng.sample(task_ids, len(task_ids) // 5), rubric_ids, args.rubrics // 4, 4, args.group_size, rng),
    )
    results["discovery"] = measure_sample(samplers, version=41, args=args)

    print(f"  adaptive phase: judging every task on all {args.rubrics} rubrics ...", flush=True)
    feed(samplers, make_groups(task_ids, rubric_ids, args.rubrics, 6, args.group_size, rng))
    results["adaptive"] = measure_sample(samplers, version=42, args=args)
    return results


def measure_sample(samplers, version: int, args) -> dict:
    native, peer = samplers
    coverage = native.coverage()
    native_times = timed(lambda: native.sample(version), args.native_repeat)
    peer_times = timed(lambda: peer.sample(version), args.peer_repeat)
    native_ms = statistics.median(native_times) * 1e3
    peer_ms = statistics.median(peer_times) * 1e3
    return {
        "coverage": coverage,
        "native_ms_per_batch": native_ms,
        "peer_ms_per_batch": peer_ms,
        "speedup": peer_ms / native_ms,
    }


def render(report: dict) -> str:
    m = report["machine"]
    c = report["config"]
    obs = report["observe_many"]
    lines = [
        "# Evidence store and capability sampler vs pure Python",
        "",
        f"Machine: {m.get('cpu', '?')}, {m['cpus']} logical CPUs, {m['platform']}, Python {m['python']} "
        f"(single-threaded; one run of `bench/bench_sampler.py`, rwcore {m['rwcore']}).",
        f"Sizes: {c['tasks']} tasks, {c['tags']} tags, {c['rubrics']} rubrics, {len(CAPABILITIES)} capabilities, "
        f"batch {c['batch_size']} x group {c['group_size']}.",
        "Peer: tests/reference_sampler.py (dicts and sets, the model the tests check the C++ against), same inputs, "
        "same process.",
        "",
        "| measurement | rwcore (C++) | pure Python | ratio |",
        "|---|---:|---:|---:|",
        f"| observe_many throughput | {obs['native_obs_per_s'] / 1e6:.2f} M obs/s | {obs['peer_obs_per_s'] / 1e6:.3f} "
        f"M obs/s | {obs['speedup']:.0f}x |",
    ]
    for regime, row in report["sample"].items():
        lines.append(
            f"| sample() one batch, {regime} phase (coverage {row['coverage']:.2f}) | {row['native_ms_per_batch']:.3f} "
            "ms "
            f"| {row['peer_ms_per_batch']:.1f} ms | {row['speedup']:.0f}x |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--tags", type=int, default=82)
    parser.add_argument("--rubrics", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--observations", type=int, default=2_000_000, help="observations for observe_many")
    parser.add_argument("--peer-observations", type=int, default=200_000, help="observations for the Python peer")
    parser.add_argument("--native-repeat", type=int, default=200)
    parser.add_argument("--peer-repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    parser.add_argument("--out", type=Path, help="write the report as JSON here and as Markdown beside it (.md)")
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--quick" in argv:  # smaller defaults; explicit options still win
        parser.set_defaults(tasks=2000, observations=50_000, peer_observations=20_000, native_repeat=20, peer_repeat=2)
    args = parser.parse_args(argv)

    print("observe_many ...", flush=True)
    observe = bench_observe(args.observations, args.peer_observations, args.tags, args.rubrics, args.seed)
    print("sample() ...", flush=True)
    sample = bench_sample(args, random.Random(args.seed))
    report = {
        "machine": machine(rwcore=rwcore.__version__, numpy=np.__version__),
        "config": {k: getattr(args, k) for k in ("tasks", "tags", "rubrics", "batch_size", "group_size", "seed")},
        "observe_many": observe,
        "sample": sample,
    }
    publish(report, render(report), args.out)
    return report


if __name__ == "__main__":
    main()
