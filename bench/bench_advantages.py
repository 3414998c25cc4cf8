"""compute_advantages and length_regularize vs a per-group Python/NumPy loop, in one process.

    .venv/bin/python bench/bench_advantages.py                  # 1M and 16k trajectories x 16 rubrics, groups of 8
    .venv/bin/python bench/bench_advantages.py --quick          # 64k and 4k trajectories, a few seconds
    .venv/bin/python bench/bench_advantages.py --out bench/results/advantages.json

The peer (`peer_compute_advantages`, `peer_length_regularize` below) is what a straightforward
implementation does: sort the trajectories by group once, then loop over the groups in Python and
compute each group's statistics with NumPy (vectorized over the group's rows and rubrics). rwcore
computes every group at once with segment reductions. Both get identical inputs (groups stored
contiguously, as trainers emit them; 16 rubrics with 20 % not applicable); the benchmark checks that
they agree before it reports the time ratio. Single-threaded throughout.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from _report import machine, publish  # noqa: E402

import rwcore  # noqa: E402

DEFAULT_SIZES = ((1_000_000, 16), (16_384, 16))  # (trajectories N, rubrics R)
QUICK_SIZES = ((65_536, 16), (4_096, 16))


# --------------------------------------------------------------------------- the peer


def _group_slices(group_ids: np.ndarray):
    """(order, [slice of `order` for each group]): one stable sort, then one slice per group."""
    order = np.argsort(group_ids, kind="stable")
    sorted_ids = group_ids[order]
    bounds = np.concatenate(([0], np.flatnonzero(sorted_ids[1:] != sorted_ids[:-1]) + 1, [len(order)]))
    return order, [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


def peer_length_regularize(rewards, lengths, group_ids, alpha=0.5, threshold=16384, eps=1e-9) -> np.ndarray:
    """Arise B.4, one group at a time (NumPy within a group)."""
    rewards = np.asarray(rewards, dtype=np.float64)
    lengths = np.asarray(lengths, dtype=np.float64)
    out = rewards.copy()
    order, slices = _group_slices(np.asarray(group_ids))
    for rows in slices:
        index = order[rows]
        r, length = rewards[index], lengths[index]
        positive = r > 0
        l_min, l_max = length.min(), length.max()
        if positive.any() and not positive.all() and l_max > threshold and l_max != l_min:
            factor = 1.0 + alpha * (1.0 - 2.0 * (length - l_min) / (l_max - l_min + eps))
            out[index] = np.where(positive, r * factor, r)
    return out


def peer_compute_advantages(task_rewards, verdicts, group_ids, lam=0.3, eps=1e-9, ddof=1) -> np.ndarray:
    """Arise eq. 15-16, one group at a time (NumPy within a group, over its rows and rubrics)."""
    rewards = np.asarray(task_rewards, dtype=np.float64)
    verdicts = np.asarray(verdicts, dtype=np.float64)
    out = np.empty_like(rewards)
    order, slices = _group_slices(np.asarray(group_ids))
    for rows in slices:
        index = order[rows]
        r = rewards[index]
        deviation = r - r.mean()
        std = np.sqrt((deviation * deviation).sum() / max(len(r) - ddof, 1))
        a_task = deviation / (std + eps)
        if verdicts.shape[1] == 0 or lam == 0.0:
            out[index] = a_task
            continue
        v = verdicts[index]  # [g, R]
        applicable = ~np.isnan(v)
        y = np.where(applicable, v, 0.0)
        count = applicable.sum(axis=0)  # [R]
        passes = y.sum(axis=0)
        centred = np.where(applicable, y - passes / np.maximum(count, 1), 0.0)
        rubric_std = np.sqrt((centred * centred).sum(axis=0) / np.maximum(count - ddof, 1))
        a_rubric = centred / (rubric_std + eps)
        varies = (passes > 0) & (passes < count)  # eq. 16's I
        usable = (applicable & varies).any(axis=1)
        rubric_term = (a_rubric * varies).sum(axis=1) / max(int(varies.sum()), 1)
        out[index] = np.where(usable, (1.0 - lam) * a_task + lam * rubric_term, a_task)
    return out


# --------------------------------------------------------------------------- inputs and timing


def make_inputs(num: int, rubrics: int, group_size: int, seed: int) -> dict:
    """Contiguous groups; rewards about half positive; lengths straddling the 16384 threshold; 20 % n/a verdicts."""
    rng = np.random.default_rng(seed)
    verdicts = (rng.random((num, rubrics)) < 0.5).astype(np.float64)
    verdicts[rng.random((num, rubrics)) < 0.2] = np.nan
    return {
        "rewards": rng.normal(size=num),
        "lengths": rng.integers(100, 32_768, num).astype(np.float64),
        "verdicts": verdicts,
        "group_ids": np.arange(num, dtype=np.int64) // group_size,
    }


def best_time(function, repeat: int) -> tuple[float, object]:
    """(fastest of `repeat` runs in seconds, the last result)."""
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        result = function()
        best = min(best, time.perf_counter() - start)
    return best, result


def bench_size(num: int, rubrics: int, group_size: int, repeat: int, peer_repeat: int, seed: int) -> dict:
    data = make_inputs(num, rubrics, group_size, seed)
    cases = {
        "compute_advantages": (
            lambda: rwcore.compute_advantages(data["rewards"], data["verdicts"], data["group_ids"]),
            lambda: peer_compute_advantages(data["rewards"], data["verdicts"], data["group_ids"]),
        ),
        "length_regularize": (
            lambda: rwcore.length_regularize(data["rewards"], data["lengths"], data["group_ids"]),
            lambda: peer_length_regularize(data["rewards"], data["lengths"], data["group_ids"]),
        ),
    }
    rows = {}
    for name, (native, peer) in cases.items():
        print(f"  {name}: N={num} R={rubrics} group={group_size} ...", flush=True)
        native_s, native_out = best_time(native, repeat)
        peer_s, peer_out = best_time(peer, peer_repeat)
        max_diff = float(np.max(np.abs(np.asarray(native_out) - peer_out))) if num else 0.0
        if not max_diff <= 1e-6:
            raise AssertionError(f"{name}: rwcore and the per-group peer disagree (max |diff| {max_diff:.3g})")
        rows[name] = {
            "native_ms": native_s * 1e3,
            "peer_ms": peer_s * 1e3,
            "speedup": peer_s / native_s,
            "native_traj_per_s": num / native_s,
            "max_abs_diff": max_diff,
        }
    return {"trajectories": num, "rubrics": rubrics, "group_size": group_size, "groups": -(-num // group_size), **rows}


def render(report: dict) -> str:
    m = report["machine"]
    lines = [
        "# compute_advantages and length_regularize vs a per-group Python/NumPy loop",
        "",
        f"Machine: {m.get('cpu', '?')}, {m['cpus']} logical CPUs, {m['platform']}, Python {m['python']}, "
        f"NumPy {m['numpy']} (single-threaded; one run of `bench/bench_advantages.py`, rwcore {m['rwcore']}).",
        "Peer: one stable sort by group, then a Python loop over groups with NumPy inside each group "
        "(bench/bench_advantages.py); same inputs, same process, results checked equal (max |diff| below).",
        "Time: fastest of the repeats. Inputs: contiguous groups, 20 % of verdicts not applicable.",
        "",
        "| function | N x R, group | groups | rwcore | per-group loop | ratio | max abs diff |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for row in report["rows"]:
        for name in ("compute_advantages", "length_regularize"):
            r = row[name]
            shape = (
                f"{row['trajectories']:,} x {row['rubrics']}"
                if name == "compute_advantages"
                else f"{row['trajectories']:,}"
            )
            lines.append(
                f"| {name} | {shape}, {row['group_size']} | {row['groups']:,} | {r['native_ms']:.1f} ms "
                f"| {r['peer_ms']:.1f} ms | {r['speedup']:.0f}x | {r['max_abs_diff']:.1e} |"
            )
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--size",
        action="append",
        nargs=2,
        type=int,
        metavar=("N", "R"),
        help="trajectories and rubrics (repeatable; default: 1M x 16 and 16k x 16)",
    )
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3, help="timed runs of rwcore (fastest kept)")
    parser.add_argument("--peer-repeat", type=int, default=1, help="timed runs of the peer (fastest kept)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="64k and 4k trajectories, a few seconds")
    parser.add_argument("--out", type=Path, help="write the report as JSON here and as Markdown beside it (.md)")
    args = parser.parse_args(argv)
    if args.group_size < 1:
        parser.error("--group-size must be positive")
    sizes = [tuple(s) for s in args.size] if args.size else list(QUICK_SIZES if args.quick else DEFAULT_SIZES)
    rows = [bench_size(n, r, args.group_size, args.repeat, args.peer_repeat, args.seed) for n, r in sizes]
    report = {
        "machine": machine(rwcore=rwcore.__version__, numpy=np.__version__),
        "config": {
            "group_size": args.group_size,
            "repeat": args.repeat,
            "peer_repeat": args.peer_repeat,
            "seed": args.seed,
            "quick": args.quick,
        },
        "rows": rows,
    }
    publish(report, render(report), args.out)
    return report


if __name__ == "__main__":
    main()
