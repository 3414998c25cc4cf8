"""`rw ablate --grid key=v1,v2`: settings of one's own crossed with seeds, on the paper tables' executor, resume
and statistics. Bad grids are refused by name before anything starts; run names say the settings; one real grid
of two learning rates x one seed with real `rw train` processes, then a resume that starts nothing."""

from __future__ import annotations

import json

import pytest
from _util import ABLATE_RUN, metrics_rows

from rwcore.trainer import ablate
from rwcore.trainer.ablate.plan import grid_points, parse_grid
from rwcore.trainer.cli import main
from rwcore.trainer.config import load_config


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--grid", "optim.lr=1e-4,-1"], "optim.lr"),
        (["--grid", "optim.lrr=1e-4,1e-3"], "optim.lrr"),
        (["--grid", "train.method=arise,nope"], "train.method"),
        (["--grid", "train.seed=1,2"], "rw ablate sets train.seed itself"),
        (["--grid", "train.steps=1,2"], "rw ablate sets train.steps itself"),
        (["--grid", "optim.lr=1e-4,1e-4"], "repeats a value"),
        (["--grid", "optim.lr=1e-4,,1e-3"], "an empty value"),
        (["--grid", "lr=1e-4"], "expected section.key=v1,v2"),
        (["--grid", "optim.lr=1e-4", "--grid", "optim.lr=1e-3"], "--grid names optim.lr twice"),
        (["--grid", "optim.lr=1e-4,1e-3", "optim.lr=3e-4"], "optim.lr is a --grid key"),
        (["--grid", "optim.lr=1e-4", "--paper", "arise"], "--paper and --grid: give one"),
        (["--grid", "optim.lr=1e-4", "--variants", "arise"], "--variants selects rows of a --paper table"),
        ([], "one of --paper (a paper's table) or --grid"),
    ],
)
def test_a_bad_grid_is_refused_by_name_before_anything_starts(tmp_path, capsys, monkeypatch, argv, message):
    def no_launch(*args, **kwargs):
        raise AssertionError("nothing may start")

    monkeypatch.setattr(ablate, "run_ablation", no_launch)
    out = tmp_path / "out"
    assert main(["ablate", *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("rw: error:") and err.count("\n") == 1
    assert not out.exists()


def test_grid_points_are_every_combination_named_by_their_settings():
    grid = parse_grid(["optim.lr=1e-4, 3e-4", "train.method=arise,outcome_only"])
    assert grid == {"optim.lr": ["1e-4", "3e-4"], "train.method": ["arise", "outcome_only"]}
    assert grid_points(grid) == {
        "lr=1e-4+method=arise": ("optim.lr=1e-4", "train.method=arise"),
        "lr=1e-4+method=outcome_only": ("optim.lr=1e-4", "train.method=outcome_only"),
        "lr=3e-4+method=arise": ("optim.lr=3e-4", "train.method=arise"),
        "lr=3e-4+method=outcome_only": ("optim.lr=3e-4", "train.method=outcome_only"),
    }
    # two keys that end alike keep their whole names; characters a folder name should not hold become _
    points = grid_points(parse_grid(["pool.max_new=4", "rewardweaver.max_new=1,2", "env.name=a/b"]))
    assert list(points) == [
        "pool.max_new=4+rewardweaver.max_new=1+name=a_b",
        "pool.max_new=4+rewardweaver.max_new=2+name=a_b",
    ]
    with pytest.raises(ValueError, match="share the run name 'name=a_b'"):
        grid_points(parse_grid(["env.name=a/b,a:b"]))


def test_a_real_grid_of_two_learning_rates(tmp_path, capsys):
    """Two learning rates x one seed, two real `rw train` processes at a time (rw ablate itself in this process);
    each run's config holds its point's value, the table's rows are the points with the runs' own final held-out
    evaluations, the first point is the baseline; the same command again starts nothing."""
    out = tmp_path / "grid"
    argv = ["ablate", "--grid", "optim.lr=1e-4,3e-3", "--seeds", "0", "--steps", "2", "--jobs", "2", "--quiet"]
    argv += ["--out", str(out), *ABLATE_RUN, "train.method=rw_outcome_grpo"]
    assert main(argv) == 0, capsys.readouterr().err
    assert "rw ablate: grid, 2 points x 1 seeds = 2 runs" in capsys.readouterr().err
    assert sorted(p.name for p in (out / "runs").iterdir()) == ["lr=1e-4-s0", "lr=3e-3-s0"]
    summary = json.loads((out / "ablation.json").read_text())
    assert summary["paper"] == "grid" and summary["baseline"] == "lr=1e-4"
    assert summary["grid"] == {"optim.lr": ["1e-4", "3e-3"]}
    for row, lr in zip(summary["rows"], (1e-4, 3e-3)):
        run = out / "runs" / f"{row['variant']}-s0"
        config = load_config(str(run / "config.yaml"))
        assert config.optim.lr == lr and config.train.method == "rw_outcome_grpo" and config.train.steps == 2
        assert row["paper_row"] == f"optim.lr={'1e-4' if lr == 1e-4 else '3e-3'}"
        entry = row["seeds"]["0"]
        assert entry["status"] == "finished" and entry["final"] == metrics_rows(run, "eval")[-1]["eval/success_rate"]
    assert summary["rows"][0]["vs_baseline"] is None and summary["rows"][1]["vs_baseline"] is not None
    table = (out / "ablation.md").read_text()
    assert "# Grid: optim.lr" in table and "| grid point | settings |" in table
    assert "| lr=3e-3 | optim.lr=3e-3 |" in table

    def no_launch(*args, **kwargs):
        raise AssertionError("a finished grid starts nothing")

    plan = ablate.plan_grid(["optim.lr=1e-4,3e-3"], [0], 2, 2, out, [*ABLATE_RUN, "train.method=rw_outcome_grpo"])
    ablate.check_resume(plan)  # the same settings: accepted
    again = ablate.run_ablation(plan, progress=False, launch=no_launch)
    assert again["rows"] == summary["rows"]
    other = ablate.plan_grid(["optim.lr=1e-4,3e-3"], [0], 2, 2, out, [*ABLATE_RUN, "train.method=rw_static_topk"])
    with pytest.raises(ValueError, match="train.method: 'rw_outcome_grpo' then, 'rw_static_topk' now"):
        ablate.check_resume(other)
