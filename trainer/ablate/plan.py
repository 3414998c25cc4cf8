"""What a table is and which runs it makes: the tables (`PAPERS`, `BASELINES`), the seeds, and an `AblationPlan`
checked before anything starts (every variant's config is loaded, so a bad key or value fails first).

`arise_frozen_rubrics` freezes the pool of the same seed's `arise` run (pool.frozen_from): the
scheduler starts it only after that run finished, and the arise run is part of every Arise table.

An override a variant cannot apply (`rwcore.method.inapplicable_settings`, e.g. advantage.process_gate for
outcome_only, which has no process credit to gate) is dropped for that variant only: without it the run is
the same run. ablation.md says which.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rwcore.method import VARIANTS
from rwcore.trainer.ablate.statistics import BOOTSTRAP_REPS

__all__ = [
    "PAPERS",
    "BASELINES",
    "DEPENDS",
    "Job",
    "AblationPlan",
    "parse_grid",
    "parse_seeds",
    "plan_ablation",
    "plan_grid",
    "inapplicable_overrides",
]

PAPERS: dict[str, tuple[str, ...]] = {
    # Arise fig. 3(a): the full method, its ablations and outcome-only RL.
    "arise": (
        "arise",
        "arise_retire_while_shown",
        "arise_frozen_rubrics",
        "arise_no_skills",
        "arise_no_adaptive_sampling",
        "arise_vade_sampling",
        "outcome_only",
    ),
    # RewardWeaver table 2: the full method and every alternative process-reward construction.
    "rewardweaver": (
        "rewardweaver",
        "rw_outcome_grpo",
        "rw_static_topk",
        "rw_random_active_set",
        "rw_failure_frequency",
        "rw_random_trajectory",
        "rw_success_failure",
        "rw_open_vocabulary",
        "rw_instance_specific",
    ),
    # The rows the papers' main claim rests on: each paper's full method, its two strongest alternatives or
    # ablations, both composed, and outcome-only RL.
    "claim": (
        "rewardweaver",
        "rw_static_topk",
        "rw_random_active_set",
        "arise",
        "arise_no_skills",
        "combined",
        "outcome_only",
    ),
}
"""Each table, in its row order (every name is a `rwcore.method.VARIANTS` key): the two papers' and `claim`."""

BASELINES = {"arise": "outcome_only", "rewardweaver": "rw_outcome_grpo", "claim": "outcome_only"}
"""Each table's outcome-only row: what 'steps to baseline' / 'steps to reach' measure against (Arise fig. 3(b))
and what the probability of improvement and the IQM difference compare with."""

DEPENDS = {"arise_frozen_rubrics": "arise"}
"""variant -> the variant whose same-seed run it reads (pool.frozen_from)."""


def parse_seeds(text: str) -> list[int]:
    """'0,1,2' -> [0, 1, 2]; a malformed, negative or repeated seed is a ValueError naming --seeds."""
    parts = [part.strip() for part in str(text).split(",")]
    if not parts or any(not part for part in parts):
        raise ValueError(f"--seeds must be comma-separated integers such as 0,1,2, got {text!r}")
    try:
        seeds = [int(part) for part in parts]
    except ValueError:
        raise ValueError(f"--seeds must be comma-separated integers such as 0,1,2, got {text!r}") from None
    if any(seed < 0 for seed in seeds):
        raise ValueError(f"--seeds must be non-negative, got {text!r}")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds repeats a seed: {text!r}")
    return seeds


@dataclass(frozen=True)
class Job:
    """One run of the table."""

    variant: str
    seed: int
    overrides: tuple[str, ...]
    after: str | None = None  # name of the job that must finish first

    @property
    def name(self) -> str:
        return f"{self.variant}-s{self.seed}"


@dataclass
class AblationPlan:
    paper: str
    variants: list[str]
    seeds: list[int]
    steps: int | None
    jobs: int
    out: Path
    overrides: list[str] = field(default_factory=list)
    config: str | None = None
    inapplicable: dict[str, list[dict]] = field(default_factory=dict)
    """variant -> the overrides it cannot apply: [{"key", "dropped": [override, ..], "replaced_with": str | None,
    "note": sentence}] (`inapplicable_overrides`)."""
    bootstrap_reps: int = BOOTSTRAP_REPS
    points: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """A grid (`rw ablate --grid`, paper "grid"): row name -> the `key=value` settings of that grid point; `variants`
    then holds the point names. Empty for a paper's table, whose rows are variants (train.method)."""

    def row_overrides(self, row: str) -> tuple[str, ...]:
        """What makes `row` the row it is: its grid point's settings, or `train.method=<variant>`."""
        return self.points[row] if self.points else (f"train.method={row}",)

    @property
    def baseline(self) -> str:
        """The row the others are compared with: the table's outcome-only row, or a grid's first point."""
        return BASELINES[self.paper] if self.paper in BASELINES else self.variants[0]

    def variant_overrides(self, variant: str) -> list[str]:
        """The overrides `variant`'s runs get: every override, less those it cannot apply (plus a reset to the
        default of a setting it cannot apply that the --config file sets)."""
        dropped = {o for cell in self.inapplicable.get(variant, ()) for o in cell["dropped"]}
        added = [cell["replaced_with"] for cell in self.inapplicable.get(variant, ()) if cell["replaced_with"]]
        return [o for o in self.overrides if o not in dropped] + added

    @property
    def runs_dir(self) -> Path:
        return self.out / "runs"

    def run_jobs(self) -> list[Job]:
        """Every run, dependencies before the runs that read them."""
        listed = []
        for seed in self.seeds:
            for variant in self.variants:
                extra = [*self.row_overrides(variant), f"train.seed={seed}"]
                if self.steps is not None:
                    extra.append(f"train.steps={self.steps}")
                after = None
                if variant in DEPENDS and not self.points:
                    after = f"{DEPENDS[variant]}-s{seed}"
                    extra.append(f"pool.frozen_from={self.runs_dir / after}")
                listed.append(Job(variant, seed, tuple(self.variant_overrides(variant)) + tuple(extra), after))
        order = {name: i for i, name in enumerate(PAPERS.get(self.paper, self.variants))}
        return sorted(listed, key=lambda job: (job.after is not None, job.seed, order.get(job.variant, 99)))


def plan_ablation(
    paper: str,
    variants: Sequence[str] | None,
    seeds: Sequence[int],
    steps: int | None,
    jobs: int | None,
    out: str | os.PathLike,
    overrides: Sequence[str] = (),
    config: str | None = None,
    bootstrap_reps: int = BOOTSTRAP_REPS,
) -> AblationPlan:
    """Checks every argument before anything starts (the config of every variant included); ValueError names the
    bad one."""
    if paper not in PAPERS:
        raise ValueError(f"--paper must be one of {', '.join(PAPERS)}, got {paper!r}")
    table = PAPERS[paper]
    chosen = list(table) if not variants else list(variants)
    unknown = [v for v in chosen if v not in table]
    if unknown:
        hint = " (a variant of another table)" if all(v in VARIANTS for v in unknown) else ""
        raise ValueError(
            f"--variants: {', '.join(map(repr, unknown))} not in the {paper} table{hint}; "
            f"choose from {', '.join(table)}"
        )
    if len(set(chosen)) != len(chosen):
        raise ValueError(f"--variants repeats a variant: {','.join(chosen)}")
    for variant, needed in DEPENDS.items():
        if variant in chosen and needed not in chosen:
            raise ValueError(
                f"--variants: {variant} freezes the pool of the same seed's {needed} run; add {needed} to --variants"
            )
    if not seeds:
        raise ValueError("--seeds is empty")
    if steps is not None and steps <= 0:
        raise ValueError(f"--steps must be a positive integer, got {steps}")
    jobs = jobs or os.cpu_count() or 1
    if jobs <= 0:
        raise ValueError(f"--jobs must be a positive integer, got {jobs}")
    for override in overrides:
        if "=" not in override or override.startswith("="):
            raise ValueError(f"override {override!r} is not section.key=value")
        if override.split("=", 1)[0] in ("train.method", "train.seed", "train.steps", "pool.frozen_from"):
            raise ValueError(f"override {override!r}: rw ablate sets {override.split('=', 1)[0]} itself")
    if isinstance(bootstrap_reps, bool) or not isinstance(bootstrap_reps, int) or bootstrap_reps < 1:
        raise ValueError(f"--bootstrap-reps must be a positive integer, got {bootstrap_reps!r}")
    ordered = [v for v in table if v in chosen]  # the paper's row order
    # the pool a frozen-rubrics run reads is named by rw ablate (`AblationPlan.run_jobs`); its config needs one
    frozen = {v: [f"pool.frozen_from={Path(out) / 'runs' / f'{DEPENDS[v]}-s{seeds[0]}'}"] for v in DEPENDS}
    inapplicable = inapplicable_overrides(config, list(overrides), ordered, frozen)
    return AblationPlan(
        paper, ordered, list(seeds), steps, jobs, Path(out), list(overrides), config, inapplicable, bootstrap_reps
    )


GRID_RESERVED = ("train.seed", "train.steps", "pool.frozen_from")
"""Keys a grid cannot vary: rw ablate sets them itself (--seeds, --steps, a frozen-rubrics run's source)."""
_NAME_CHARACTERS = re.compile(r"[^A-Za-z0-9._+=-]")


def parse_grid(specs: Sequence[str]) -> dict[str, list[str]]:
    """`--grid key=v1,v2` options -> {key: [v1, v2]} in the order given; a malformed one, an empty or repeated
    value, a key given twice or one rw ablate sets itself is a ValueError naming it."""
    grid: dict[str, list[str]] = {}
    for spec in specs:
        key, equals, values = str(spec).partition("=")
        key = key.strip()
        if not equals or not key or "." not in key:
            raise ValueError(f"--grid {spec!r}: expected section.key=v1,v2,... (e.g. optim.lr=1e-4,3e-4)")
        if key in GRID_RESERVED:
            raise ValueError(f"--grid {spec!r}: rw ablate sets {key} itself (--seeds, --steps)")
        if key in grid:
            raise ValueError(f"--grid names {key} twice; give all its values in one --grid {key}=v1,v2")
        parts = [part.strip() for part in values.split(",")]
        if any(not part for part in parts):
            raise ValueError(f"--grid {spec!r}: an empty value (values are comma-separated)")
        if len(set(parts)) != len(parts):
            raise ValueError(f"--grid {spec!r} repeats a value")
        grid[key] = parts
    if not grid:
        raise ValueError("--grid is empty")
    return grid


def grid_points(grid: dict[str, list[str]]) -> dict[str, tuple[str, ...]]:
    """Every combination of the grid's values (the first key varies slowest), by a readable name: each key by its
    last part (`optim.lr=1e-4` -> `lr=1e-4`; the whole key where two keys end alike), joined by '+', characters
    other than letters, digits and `._+=-` as '_'. The first point is the grid's baseline."""
    shorts = [key.rsplit(".", 1)[-1] for key in grid]
    names = [short if shorts.count(short) == 1 else key for key, short in zip(grid, shorts)]
    points: dict[str, tuple[str, ...]] = {}
    for values in itertools.product(*grid.values()):
        name = "+".join(_NAME_CHARACTERS.sub("_", f"{n}={v}") for n, v in zip(names, values))
        if name in points:
            raise ValueError(
                f"--grid: two points would share the run name {name!r}; give values that differ in letters"
            )
        points[name] = tuple(f"{key}={value}" for key, value in zip(grid, values))
    return points


def plan_grid(
    grid: Sequence[str],
    seeds: Sequence[int],
    steps: int | None,
    jobs: int | None,
    out: str | os.PathLike,
    overrides: Sequence[str] = (),
    config: str | None = None,
    bootstrap_reps: int = BOOTSTRAP_REPS,
) -> AblationPlan:
    """A grid's plan (`rw ablate --grid`): every point of the grid x every seed, with the paper tables' executors,
    resume and statistics (the first point is the baseline). Every point's config is loaded first, so a bad key or
    value fails, named, before anything starts."""
    points = grid_points(parse_grid(grid))
    for override in overrides:
        key = override.split("=", 1)[0].strip()
        if "=" not in override or override.startswith("="):
            raise ValueError(f"override {override!r} is not section.key=value")
        if key in GRID_RESERVED:
            raise ValueError(f"override {override!r}: rw ablate sets {key} itself")
        if any(o.split("=", 1)[0] == key for o in next(iter(points.values()))):
            raise ValueError(f"override {override!r}: {key} is a --grid key; give its values there")
    if not seeds:
        raise ValueError("--seeds is empty")
    if steps is not None and steps <= 0:
        raise ValueError(f"--steps must be a positive integer, got {steps}")
    jobs = jobs or os.cpu_count() or 1
    if isinstance(bootstrap_reps, bool) or not isinstance(bootstrap_reps, int) or bootstrap_reps < 1:
        raise ValueError(f"--bootstrap-reps must be a positive integer, got {bootstrap_reps!r}")
    rows = list(points)
    inapplicable = inapplicable_overrides(config, list(overrides), rows, rows=points)  # a bad key or value: named
    return AblationPlan(
        "grid", rows, list(seeds), steps, jobs, Path(out), list(overrides), config, inapplicable, bootstrap_reps, points
    )


def _inapplicable_settings():
    """`rwcore.method.inapplicable_settings`, or None where this rwcore predates it (every override applies)."""
    try:
        from rwcore.method import inapplicable_settings
    except ImportError:
        return None
    return inapplicable_settings


def inapplicable_overrides(
    config: str | None,
    overrides: Sequence[str],
    variants: Sequence[str],
    extra: dict[str, Sequence[str]] | None = None,
    rows: dict[str, Sequence[str]] | None = None,
) -> dict:
    """Loads every variant's config (a bad key or value is a ValueError naming it, before anything starts) and
    finds the settings a variant cannot apply (`rwcore.method.inapplicable_settings`).

    Such a setting changes nothing for that variant (outcome-only has no process credit for
    advantage.process_gate to gate), but building the variant refuses it: its overrides are dropped for that
    variant; set by the --config file instead, it is reset to its default for that variant.
    extra: variant -> overrides rw ablate adds to that variant's runs (pool.frozen_from).
    rows: a grid's point name -> its settings (`variants` then names the points; each point's train.method is
    the variant checked).
    Returns row -> [{"key", "dropped": [override, ..], "replaced_with": "key=default" | None, "note"}]."""
    import dataclasses

    from rwcore.method import MethodSettings
    from rwcore.trainer.config import load_config
    from rwcore.trainer.method_setup import method_settings

    check = _inapplicable_settings()
    defaults = {f.metadata.get("config"): f.default for f in dataclasses.fields(MethodSettings)}
    found: dict[str, list[dict]] = {}
    for row in variants:
        own = [*(extra or {}).get(row, ()), *((rows or {}).get(row) or [f"train.method={row}"])]
        cfg = load_config(config, [*overrides, *own])
        if check is None:
            continue
        variant = cfg.train.method
        who = variant if rows is None else f"{row} ({variant})"
        cells = []
        for key in check(variant, method_settings(cfg)):
            dropped = [o for o in overrides if o.split("=", 1)[0].strip() == key]
            if dropped:
                note = f"{' and '.join(dropped)} does not apply to {who}: run without it, which is the same run"
                cells.append({"key": key, "dropped": dropped, "replaced_with": None, "note": note})
        kept = [o for o in overrides if not any(o in cell["dropped"] for cell in cells)]
        cfg = load_config(config, [*kept, *own])
        for key in check(variant, method_settings(cfg)):  # what is left comes from the --config file
            section, _, name = key.partition(".")
            reset = f"{key}={defaults[key]}"
            note = (
                f"{key}={getattr(getattr(cfg, section), name)} (from --config) does not apply to {who}: run "
                f"with {reset}, which is the same run"
            )
            cells.append({"key": key, "dropped": [], "replaced_with": reset, "note": note})
        if not cells:
            continue
        found[row] = cells
        resets = [cell["replaced_with"] for cell in cells if cell["replaced_with"]]
        still = check(variant, method_settings(load_config(config, [*kept, *resets, *own])))
        if still:
            raise ValueError(
                f"{', '.join(still)}: {who} cannot apply this setting even at its default; "
                + (f"leave {variant} out of --variants" if rows is None else "leave that point out of --grid")
            )
    return found
