"""One `claim` table from several `rw ablate` grids: python merge.py --out DIR --seeds 5,...,14 SOURCE [SOURCE ...]

Each SOURCE is an `rw ablate` folder (its runs/ read as `rw ablate` reads them; a grid still going is read as it
stands, unfinished runs as not run) or an earlier grid's ablation.json (its stored per-seed entries: final, curve,
AUC, ceiling). For every row of the claim table and every seed, the first SOURCE that holds a finished run of it
gives the entry (each entry records which); the figures over seeds (IQM, intervals, probability of improvement,
AUC, steps to reach) are then computed exactly as `rw ablate` computes them
(`rwcore.trainer.ablate.summary.summarize_runs`). Writes DIR/ablation.{json,md,png}. Merge only grids run on one
CPU kind with the same code for the rows they share (say how that was checked)."""

import argparse
import json
import pathlib

from rwcore._io import atomic_write_bytes
from rwcore.trainer.ablate.plan import PAPERS, parse_seeds
from rwcore.trainer.ablate.statistics import BOOTSTRAP_REPS
from rwcore.trainer.ablate.summary import _run_entry, machine_note, summarize_runs
from rwcore.trainer.ablate.table import plot_runs, render_markdown


def entries_of(source: pathlib.Path) -> tuple[dict, dict | None]:
    """(variant -> seed -> finished entry, the source's machine note) of an ablate folder or an ablation.json."""
    found: dict = {}
    if source.is_dir():
        for run in sorted((source / "runs").glob("*-s*")):
            variant, seed = run.name.rsplit("-s", 1)
            entry = _run_entry(run)
            if "final" in entry:
                found.setdefault(variant, {})[int(seed)] = entry
        table = source / "ablation.json"
        machine = json.loads(table.read_text()).get("machine") if table.is_file() else None
        return found, machine
    stored = json.loads(source.read_text())
    for row in stored["rows"]:
        for seed, entry in row["seeds"].items():
            if "final" in entry:
                found.setdefault(row["variant"], {})[int(seed)] = entry
    return found, stored.get("machine")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=pathlib.Path)
    parser.add_argument("--seeds", required=True)
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time (machine note of a grid still going)")
    parser.add_argument("sources", nargs="+", type=pathlib.Path)
    args = parser.parse_args()
    seeds = parse_seeds(args.seeds)
    sources = [(source, *entries_of(source)) for source in args.sources]
    runs, missing = {}, []
    for variant in PAPERS["claim"]:
        runs[variant] = {}
        for seed in seeds:
            hit = next(
                ((path, found[variant][seed]) for path, found, _ in sources if seed in found.get(variant, {})), None
            )
            if hit is None:
                runs[variant][seed] = {"status": "not run"}
                missing.append(f"{variant}-s{seed}")
                continue
            path, entry = hit
            runs[variant][seed] = {**entry, "source": str(path)}
    summary = summarize_runs("claim", runs, BOOTSTRAP_REPS)
    machines = [machine for _, _, machine in sources if machine]
    # a grid still going has written no ablation.json yet: this machine, as rw ablate would note it
    machine = machines[0] if machines else machine_note(args.jobs)
    summary.update(seeds=seeds, machine=machine, sources=[str(s) for s in args.sources])
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(args.out / "ablation.json", json.dumps(summary, indent=1).encode())
    atomic_write_bytes(args.out / "ablation.md", render_markdown(summary).encode())
    plot_runs(summary, args.out / "ablation.png")
    print(f"wrote {args.out}/ablation.{{json,md,png}}; not run: {', '.join(missing) or 'none'}")


if __name__ == "__main__":
    main()
