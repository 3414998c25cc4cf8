"""`rw ablate`: a paper's ablation table (its variants x seeds), or a grid of settings x seeds (`--grid`), as
parallel `rw train` runs.

Layout of the output folder OUT:
  OUT/ablation.md, OUT/ablation.json, OUT/ablation.png   the table, its data and one point per seed
  OUT/runs/<variant>-s<seed>/                            each run's folder (rw train --out; a grid's: <point>-s<seed>)
  OUT/runs/<variant>-s<seed>/ablation_status.json        {"status": "finished"|"failed", ...}

The modules, one concern each:
  plan.py            the tables, the seeds and the checked `AblationPlan`: which runs, with which overrides
  runner.py          running the unfinished runs, resuming a table, the progress bar
  local_executor.py  each run a child process that dies with `rw ablate` (the default executor)
  ray_executor.py    each run a Ray task on the nodes of a Ray cluster (`--executor ray`)
  status.py          a run folder's status file and whether a run counts as finished
  summary.py         ablation.json: per-run figures, statistics over seeds, the machine
  statistics.py      normalized AUC, steps to reach, IQM, probability of improvement, bootstrap intervals
                     (`rw compare`, trainer/compare.py, reports the same ones for any runs grouped by config)
  table.py           ablation.md and ablation.png
"""

from rwcore.trainer.ablate.local_executor import LocalExecutor
from rwcore.trainer.ablate.plan import (
    BASELINES,
    PAPERS,
    AblationPlan,
    inapplicable_overrides,
    parse_grid,
    parse_seeds,
    plan_ablation,
    plan_grid,
)
from rwcore.trainer.ablate.runner import check_resume, prepare_prior, run_ablation
from rwcore.trainer.ablate.statistics import eval_ceiling, eval_curve, steps_to_reach
from rwcore.trainer.ablate.summary import machine_note, summarize
from rwcore.trainer.ablate.table import plot_runs, render_markdown, write_table

__all__ = [
    "PAPERS",
    "BASELINES",
    "AblationPlan",
    "LocalExecutor",
    "plan_ablation",
    "plan_grid",
    "parse_grid",
    "run_ablation",
    "prepare_prior",
    "summarize",
    "machine_note",
    "parse_seeds",
    "render_markdown",
    "write_table",
    "plot_runs",
    "check_resume",
    "eval_curve",
    "eval_ceiling",
    "steps_to_reach",
    "inapplicable_overrides",
]
