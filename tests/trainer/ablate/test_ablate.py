"""`rw ablate` and `rw compare`: argument checks before anything starts, scheduling (parallel limit, thread
share, dependency order), resume, failed runs kept apart, the table's numbers worked out by hand (normalized AUC,
steps to reach, the IQM and the comparison with the baseline over five seeds, no interval from fewer), the claim
table, overrides a variant cannot apply, `rw compare`'s groups, and one real end-to-end table with real `rw train`
processes. The statistics themselves are checked in tests/trainer/ablate/test_ablate_statistics.py."""

import json
import subprocess
from pathlib import Path

import pytest
from _util import ABLATE_RUN, ablate_command, child_env, overrides_with, train_steps

from rwcore.trainer import ablate
from rwcore.trainer.ablate import BASELINES, PAPERS, parse_seeds, plan_ablation, run_ablation, steps_to_reach
from rwcore.trainer.cli import main
from rwcore.trainer.compare import compare_groups, group_runs, plot_compare

# ---------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("text, seeds", [("0,1,2", [0, 1, 2]), ("7", [7]), (" 3, 4 ", [3, 4])])
def test_parse_seeds(text, seeds):
    assert parse_seeds(text) == seeds


@pytest.mark.parametrize("text", ["", "0,,1", "a", "0,1.5", "-1", "1,1"])
def test_parse_seeds_rejects(text):
    with pytest.raises(ValueError, match="--seeds"):
        parse_seeds(text)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--paper", "grpo"], "--paper must be one of arise, rewardweaver, claim"),
        (["--paper", "claim", "--variants", "arise,arise_vade_sampling"], "'arise_vade_sampling' not in the claim"),
        (["--paper", "claim", "--bootstrap-reps", "0"], "argument --bootstrap-reps: expected a positive integer"),
        (["--paper", "claim", "advantage.process_gate=sometimes"], "advantage.process_gate"),
        (["--paper", "arise", "--variants", "arise,rw_static_topk"], "'rw_static_topk' not in the arise table"),
        (["--paper", "arise", "--variants", "arise,nope"], "'nope' not in the arise table"),
        (["--paper", "arise", "--variants", "arise_frozen_rubrics"], "add arise to --variants"),
        (["--paper", "arise", "--variants", "arise,arise"], "repeats"),
        (["--paper", "arise", "--seeds", "0,x"], "--seeds"),
        (["--paper", "rewardweaver", "train.seed=3"], "rw ablate sets train.seed itself"),
        (["--paper", "rewardweaver", "optim.lrr=1"], "optim.lrr"),
    ],
)
def test_bad_input_fails_before_starting_anything(tmp_path, capsys, monkeypatch, argv, message):
    def no_launch(*args, **kwargs):
        raise AssertionError("nothing may start")

    monkeypatch.setattr(ablate, "run_ablation", no_launch)
    out = tmp_path / "out"
    assert main(["ablate", *argv, "--out", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_tables_hold_each_papers_rows_and_baseline():
    from rwcore.method import VARIANTS

    for paper, rows in PAPERS.items():
        assert set(rows) <= set(VARIANTS) and BASELINES[paper] in rows
    assert {v.name for v in VARIANTS.values() if v.paper_row.startswith("RewardWeaver table 2")} == set(
        PAPERS["rewardweaver"]
    )
    # the Arise table: fig. 3(a)'s rows, and eq. 5 read alone (a pair retired while its skill is shown) beside them
    figure = {v.name for v in VARIANTS.values() if v.paper_row.startswith("Arise fig. 3(a)")}
    assert figure | {"arise_retire_while_shown"} == set(PAPERS["arise"])
    assert VARIANTS["arise_retire_while_shown"].paper_row.startswith("Arise eq. 5 as written")


# ---------------------------------------------------------------------------- scheduling with a stand-in


class FakeProcess:
    """Writes a run's metrics as `rw train` would, after `polls` polls; exit code `code`."""

    running = 0
    peak = 0

    def __init__(self, command, stdout=None, stderr=None, env=None, curve=(0.0, 0.5), code=0, polls=2):
        self.command, self.env, self.code, self.polls = command, env, code, polls
        self.out = Path(
            command[command.index("--out") + 1] if "--out" in command else command[command.index("--resume") + 1]
        )
        self.curve = curve
        FakeProcess.running += 1
        FakeProcess.peak = max(FakeProcess.peak, FakeProcess.running)
        if stdout is not None:
            stdout.write(b"step 1/2\nrw: error: boom\n" if code else b"ok\n")
            stdout.flush()

    def poll(self):
        self.polls -= 1
        if self.polls > 0:
            return None
        if self.code == 0:
            rows = [
                {"step": 2 * i, "kind": "eval", "eval/success_rate": v, "eval/success_se": 0.01}
                for i, v in enumerate(self.curve)
            ]
            # and, as a whole run has, each training step once and the last step's checkpoint
            steps = next((int(a.split("=", 1)[1]) for a in self.command if a.startswith("train.steps=")), 0)
            rows += [{"step": step, "kind": "train"} for step in range(1, steps + 1)]
            (self.out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            (self.out / "checkpoints" / f"step_{steps:06d}").mkdir(parents=True, exist_ok=True)
            (self.out / "checkpoints" / f"step_{steps:06d}" / "manifest.json").write_text("{}")
            (self.out / "checkpoints" / "latest").write_text(f"step_{steps:06d}")
        if self.polls == 0:
            FakeProcess.running -= 1
        return self.code

    def terminate(self):
        pass

    def wait(self, timeout=None):
        return self.code


def fake_launcher(calls, curves=None, failing=()):
    def launch(command, **kwargs):
        method = next((a.split("=", 1)[1] for a in command if a.startswith("train.method=")), None)
        seed = next((int(a.split("=", 1)[1]) for a in command if a.startswith("train.seed=")), None)
        calls.append((method, seed, command, kwargs["env"]))
        name = f"{method}-s{seed}"
        return FakeProcess(
            command,
            stdout=kwargs.get("stdout"),
            env=kwargs["env"],
            curve=(curves or {}).get(name, (0.0, 0.5)),
            code=3 if name in failing else 0,
        )

    return launch


def test_runs_in_parallel_with_a_thread_share_in_dependency_order_and_resumes(tmp_path, monkeypatch):
    monkeypatch.setattr(ablate.runner.time, "sleep", lambda s: None)
    monkeypatch.setattr(ablate.local_executor.os, "cpu_count", lambda: 4)
    FakeProcess.running = FakeProcess.peak = 0
    plan = plan_ablation("arise", ["arise", "arise_frozen_rubrics", "outcome_only"], [0, 1], 2, 2, tmp_path / "out")
    calls = []
    run_ablation(plan, progress=False, launch=fake_launcher(calls))
    assert FakeProcess.peak <= 2 and len(calls) == 6
    assert all(env["OMP_NUM_THREADS"] == "2" and env["MKL_NUM_THREADS"] == "2" for *_, env in calls)  # 4 cores / 2
    order = [(m, s) for m, s, _, _ in calls]
    for seed in (0, 1):  # the frozen-rubrics run starts after its seed's arise run, and reads its folder
        assert order.index(("arise_frozen_rubrics", seed)) > order.index(("arise", seed))
        command = next(c for m, s, c, _ in calls if (m, s) == ("arise_frozen_rubrics", seed))
        assert f"pool.frozen_from={tmp_path / 'out' / 'runs' / f'arise-s{seed}'}" in command
    assert all("train.steps=2" in c for _, _, c, _ in calls)
    for name in ("ablation.md", "ablation.json", "ablation.png"):
        assert (tmp_path / "out" / name).stat().st_size > 0
    # a second call finds every run finished and starts nothing
    again = []
    run_ablation(plan, progress=False, launch=fake_launcher(again))
    assert again == []
    # a killed run (no status, a checkpoint) continues with --resume; an unfinished one without checkpoint restarts
    run = tmp_path / "out" / "runs" / "arise-s1"
    (run / "ablation_status.json").unlink()
    (run / "checkpoints").mkdir(exist_ok=True)
    (run / "checkpoints" / "latest").write_text("step_1")
    (run / "config.yaml").write_text("train: {}\n")
    (tmp_path / "out" / "runs" / "outcome_only-s0" / "ablation_status.json").unlink()
    resumed = []

    def launch(command, **kwargs):
        resumed.append(command)
        return FakeProcess(command, stdout=kwargs.get("stdout"))

    run_ablation(plan, progress=False, launch=launch)
    assert len(resumed) == 2
    assert any(c[c.index("--resume") + 1] == str(run) for c in resumed if "--resume" in c)
    assert any("--out" in c and "train.method=outcome_only" in c for c in resumed)


def test_a_failed_run_is_reported_with_its_error_and_not_averaged_in(tmp_path, monkeypatch):
    monkeypatch.setattr(ablate.runner.time, "sleep", lambda s: None)
    plan = plan_ablation("arise", ["arise", "arise_frozen_rubrics", "outcome_only"], [0, 1], 4, 2, tmp_path / "o")
    curves = {
        "arise-s0": (0.1, 0.6),
        "arise-s1": (0.1, 0.3, 0.8),
        "outcome_only-s0": (0.0, 0.2, 0.5),
        "outcome_only-s1": (0.0, 0.3),
    }
    summary = run_ablation(plan, progress=False, launch=fake_launcher([], curves, failing={"arise-s1"}))
    rows = {row["variant"]: row for row in summary["rows"]}
    # arise: only seed 0 finished (final 0.6, best 0.6); seed 1 failed with its last log line
    assert rows["arise"]["final"] == {"mean": 0.6, "sd": 0.0, "n": 1} and rows["arise"]["failed"] == 1
    assert rows["arise"]["seeds"]["1"]["status"] == "failed"
    assert rows["arise"]["seeds"]["1"]["error"] == "exit code 3: rw: error: boom"
    # frozen rubrics of seed 1 needed the failed arise run: failed too, never started
    assert rows["arise_frozen_rubrics"]["seeds"]["1"]["error"] == "needs arise-s1, which failed"
    # outcome_only: finals 0.5 and 0.3 -> mean 0.4, sd (ddof 1) sqrt(0.02) = 0.141421..
    assert abs(rows["outcome_only"]["final"]["mean"] - 0.4) < 1e-12
    assert abs(rows["outcome_only"]["final"]["sd"] - 0.02**0.5) < 1e-12
    assert summary["baseline_final_mean"] == pytest.approx(0.4)
    # steps to 0.4: arise-s0 reaches it at step 2 (0.6); outcome_only-s0 at step 4 (0.5), s1 never (0.3)
    assert rows["arise"]["seeds"]["0"]["steps_to_baseline"] == 2
    assert rows["outcome_only"]["steps_to_baseline"] == {"mean": 4.0, "reached": 1, "of": 2}
    # normalized AUC (steps 0, 2, 4, ceiling 1): arise-s0 (0.1 + 0.6)/2 x 2 / 2 = 0.35; outcome_only-s0
    # (0 + 0.2)/2 x 2 + (0.2 + 0.5)/2 x 2 = 0.9 over 4 -> 0.225, s1 (0 + 0.3)/2 x 2 / 2 = 0.15
    assert rows["arise"]["seeds"]["0"]["auc"] == pytest.approx(0.35)
    assert rows["outcome_only"]["auc"]["mean"] == pytest.approx((0.225 + 0.15) / 2)
    assert rows["arise"]["seeds"]["0"]["ceiling"] == 1.0 and rows["arise"]["seeds"]["0"]["ceiling_source"] == "default"
    # no step 150 in these short runs: each baseline seed's last evaluation (0.5 at step 4, 0.3 at step 2) -> 0.4
    assert summary["reach_target"] == {"value": pytest.approx(0.4), "at_step": 150, "steps": [4, 2], "seeds": 2,
                                       "exact": False, "baseline_value": pytest.approx(0.4),
                                       "rule": "baseline"}  # fmt: skip
    assert rows["arise"]["seeds"]["0"]["steps_to_reach"] == 2
    # two seeds (one for arise): point estimates, no interval
    assert rows["arise"]["iqm"]["final"] == {
        "point": 0.6,
        "low": None,
        "high": None,
        "n": 1,
        "note": "needs >= 5 seeds",
    }
    versus = rows["arise"]["vs_baseline"]["final"]
    assert versus["probability_of_improvement"]["point"] == 1.0 and versus["probability_of_improvement"]["low"] is None
    assert versus["iqm_difference"]["point"] == pytest.approx(0.6 - 0.4)  # two baseline seeds: IQM = their mean
    assert rows["outcome_only"]["vs_baseline"] is None
    text = (tmp_path / "o" / "ablation.md").read_text()
    assert "s1: FAILED" in text and "arise seed 1: exit code 3: rw: error: boom" in text
    assert "| arise | Arise fig. 3(a): Arise | 0.600 ± 0.000 |" in text
    assert "| arise | 1 | 0.600 (needs >= 5 seeds) | 0.350 (needs >= 5 seeds) | 1.000 (needs >= 5 seeds) |" in text
    assert "at steps 2, 4 (the last evaluation at or before step 150, which was not evaluated)" in text
    assert json.loads((tmp_path / "o" / "ablation.json").read_text())["rows"][0]["variant"] == "arise"


def test_steps_to_reach():
    curve = [(0, 0.0, None), (25, 0.2, None), (50, 0.41, None), (75, 0.3, None)]
    assert steps_to_reach(curve, 0.4) == 50 and steps_to_reach(curve, 0.0) == 0 and steps_to_reach(curve, 0.5) is None


def test_five_seeds_give_the_iqm_and_the_comparison_with_intervals(tmp_path, monkeypatch):
    monkeypatch.setattr(ablate.runner.time, "sleep", lambda s: None)
    seeds = [0, 1, 2, 3, 4]
    plan = plan_ablation("arise", ["arise", "outcome_only"], seeds, 4, 2, tmp_path / "o", bootstrap_reps=500)
    curves = {f"arise-s{k}": (0.0, 0.5 + 0.05 * k) for k in seeds}
    curves.update({f"outcome_only-s{k}": (0.0, 0.2, 0.3 + 0.02 * k) for k in seeds})
    summary = run_ablation(plan, progress=False, launch=fake_launcher([], curves))
    rows = {row["variant"]: row for row in summary["rows"]}
    arise, base = rows["arise"], rows["outcome_only"]
    # normalized AUC: arise (0 + v)/2 x 2 / 2 = v / 2; outcome_only ((0 + 0.2) + (0.2 + v)) / 4 = (0.4 + v) / 4
    for k in seeds:
        assert arise["seeds"][str(k)]["auc"] == pytest.approx((0.5 + 0.05 * k) / 2)
        assert base["seeds"][str(k)]["auc"] == pytest.approx((0.4 + 0.3 + 0.02 * k) / 4)
    # IQM of five values = the mean of the middle three: arise 0.55, 0.6, 0.65 -> 0.6; baseline 0.32 .. 0.36 -> 0.34
    assert arise["iqm"]["final"]["point"] == pytest.approx(0.6) and base["iqm"]["final"]["point"] == pytest.approx(0.34)
    for estimate in (arise["iqm"]["final"], arise["iqm"]["auc"], base["iqm"]["final"]):
        assert estimate["low"] <= estimate["point"] <= estimate["high"] and estimate["note"] is None
    versus = arise["vs_baseline"]["final"]
    # every arise seed beats every baseline seed: P = 1, and every resample says so
    assert versus["probability_of_improvement"] == {"point": 1.0, "low": 1.0, "high": 1.0, "n": 5, "n_baseline": 5,
                                                    "note": None}  # fmt: skip
    assert versus["iqm_difference"]["point"] == pytest.approx(0.6 - 0.34)
    assert 0 < versus["iqm_difference"]["low"] <= 0.26 <= versus["iqm_difference"]["high"]
    # steps to reach the baseline's success at its last evaluation before step 150 (step 4): mean 0.34; outcome_only
    # seeds 2, 3, 4 (0.34, 0.36, 0.38) reach it at step 4, seeds 0 and 1 never
    assert summary["reach_target"]["value"] == pytest.approx(0.34)
    assert base["steps_to_reach"] == {"mean": 4.0, "reached": 3, "of": 5}
    assert arise["steps_to_reach"] == {"mean": 2.0, "reached": 5, "of": 5}
    assert summary["bootstrap"]["reps"] == 500 and summary["bootstrap"]["min_seeds"] == 5
    # the keys other code and committed tables read are all still there
    stored = json.loads((tmp_path / "o" / "ablation.json").read_text())
    assert {"paper", "baseline", "baseline_final_mean", "seeds", "steps", "rows", "machine", "written"} <= set(stored)
    assert {"variant", "paper_row", "final", "best", "steps_to_baseline", "failed", "seeds"} <= set(stored["rows"][0])
    assert {"final", "final_se", "final_step", "best", "start", "curve", "steps_to_baseline"} <= set(
        stored["rows"][0]["seeds"]["0"]
    )
    text = (tmp_path / "o" / "ablation.md").read_text()
    low, high = arise["iqm"]["final"]["low"], arise["iqm"]["final"]["high"]
    assert f"| arise | 5 | 0.600 [{low:.3f}, {high:.3f}] |" in text
    assert "| outcome_only | 5 | 0.340 [" in text and "(baseline) |" in text
    assert not [line for line in text.splitlines() if line.startswith("| ") and "needs >= 5 seeds" in line]
    for sentence in summary["notes"].values():
        assert f"- {sentence}" in text
    assert (tmp_path / "o" / "ablation.png").read_bytes()[:4] == b"\x89PNG"


def write_finished(folder: Path, curve, ceiling=None) -> Path:
    """A finished run of a table: its metrics.jsonl with evaluation rows at the given (step, success) points."""
    folder.mkdir(parents=True)
    rows = []
    for step, value in curve:
        rows.append({"step": step, "kind": "train", "success_rate": value})
        rows.append({"step": step, "kind": "eval", "eval/success_rate": value, "eval/success_se": 0.01})
        if ceiling is not None:
            rows[-1]["eval/ceiling"] = ceiling
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "ablation_status.json").write_text(json.dumps({"status": "finished"}))
    return folder


def test_steps_to_reach_uses_the_baselines_success_at_step_150_and_the_auc_its_ceiling(tmp_path):
    plan = plan_ablation("claim", ["arise", "outcome_only"], [0, 1], None, 1, tmp_path / "o")
    steps = [0, 50, 100, 150, 200]
    write_finished(plan.runs_dir / "outcome_only-s0", zip(steps, [0.0, 0.1, 0.2, 0.3, 0.6]))
    write_finished(plan.runs_dir / "outcome_only-s1", zip(steps, [0.0, 0.1, 0.3, 0.5, 0.7]))
    write_finished(plan.runs_dir / "arise-s0", zip(steps, [0.0, 0.2, 0.45, 0.5, 0.8]), ceiling=0.8)
    write_finished(plan.runs_dir / "arise-s1", zip(steps, [0.0, 0.1, 0.2, 0.3, 0.35]))
    summary = ablate.summarize(plan)
    rows = {row["variant"]: row for row in summary["rows"]}
    # target: outcome_only at step 150, (0.3 + 0.5) / 2 = 0.4; its final mean (0.6 + 0.7) / 2 = 0.65 stays the
    # 'steps to baseline' level
    assert summary["reach_target"]["value"] == pytest.approx(0.4) and summary["reach_target"]["exact"] is True
    assert summary["baseline_final_mean"] == pytest.approx(0.65)
    s0, s1 = rows["arise"]["seeds"]["0"], rows["arise"]["seeds"]["1"]
    assert (s0["steps_to_reach"], s0["steps_to_baseline"]) == (100, 200)  # 0.45 >= 0.4 at 100; 0.8 >= 0.65 at 200
    assert (s1["steps_to_reach"], s1["steps_to_baseline"]) == (None, None)  # 0.35 at best
    assert rows["arise"]["steps_to_reach"] == {"mean": 100.0, "reached": 1, "of": 2}
    # arise-s0 logs a ceiling of 0.8: trapezoids 5 + 16.25 + 23.75 + 32.5 = 77.5 over 200 steps x 0.8
    assert (s0["ceiling"], s0["ceiling_source"]) == (0.8, "eval/ceiling")
    assert s0["auc"] == pytest.approx(77.5 / 160)
    # arise-s1 does not: ceiling 1; 2.5 + 7.5 + 12.5 + 16.25 = 38.75 over 200
    assert (s1["ceiling"], s1["ceiling_source"]) == (1.0, "default") and s1["auc"] == pytest.approx(38.75 / 200)
    text = ablate.render_markdown(summary)
    assert "'Steps to reach' measures against outcome_only's mean held-out success at step 150, 0.400 over 2" in text
    assert "0.8 for 1 run(s) (logged as eval/ceiling); 1 for 3 run(s) (not logged: the default)" in text
    # final and best: 0.8 and 0.35 (their curves peak at the end), sd |0.8 - 0.35| / sqrt(2); AUC 0.484 and 0.194
    assert (
        "| arise | Arise fig. 3(a): Arise | 0.575 ± 0.318 | 0.575 ± 0.318 | 0.339 ± 0.206 | 200 (1/2) | 100 (1/2) |"
        in text
    )


@pytest.fixture
def planned(monkeypatch) -> dict:
    """`rw ablate` through the CLI with nothing run: the plan it would run lands in the returned dict."""
    planned = {}

    def fake_run(plan, progress=True):
        planned["plan"] = plan
        return {"rows": [{"failed": 0}]}

    monkeypatch.setattr(ablate, "run_ablation", fake_run)
    monkeypatch.setattr(ablate, "prepare_prior", lambda plan, progress=True: None)
    return planned


def test_the_claim_table_plans_its_seven_variants(tmp_path, planned, capsys):
    claim = ["rewardweaver", "rw_static_topk", "rw_random_active_set", "arise", "arise_no_skills", "combined",
             "outcome_only"]  # fmt: skip
    assert list(PAPERS["claim"]) == claim and BASELINES["claim"] == "outcome_only"
    plan = plan_ablation("claim", None, [0, 1], 3, 2, tmp_path / "o")
    assert plan.variants == claim
    methods = sorted(next(a for a in job.overrides if a.startswith("train.method=")) for job in plan.run_jobs())
    assert methods == sorted(f"train.method={v}" for v in claim for _ in (0, 1))
    assert main(["ablate", "--paper", "claim", "--seeds", "0", "--quiet", "--out", str(tmp_path / "c")]) == 0
    assert planned["plan"].variants == claim and planned["plan"].bootstrap_reps == 5000
    assert "rw ablate: claim, 7 variants x 1 seeds = 7 runs" in capsys.readouterr().err


def test_an_override_a_variant_cannot_apply_is_dropped_for_that_variant_only(tmp_path, monkeypatch):
    monkeypatch.setattr(ablate.runner.time, "sleep", lambda s: None)
    overrides = ["advantage.process_gate=success_groups", "optim.lr=0.001"]
    plan = plan_ablation("claim", ["arise", "outcome_only"], [0], 2, 1, tmp_path / "o", overrides)
    jobs = {job.variant: job.overrides for job in plan.run_jobs()}
    assert "advantage.process_gate=success_groups" in jobs["arise"] and "optim.lr=0.001" in jobs["arise"]
    assert (
        "advantage.process_gate=success_groups" not in jobs["outcome_only"] and "optim.lr=0.001" in jobs["outcome_only"]
    )
    sentence = (
        "advantage.process_gate=success_groups does not apply to outcome_only: run without it, which is the same run"
    )
    assert [cell["note"] for cell in plan.inapplicable["outcome_only"]] == [
        sentence
    ] and "arise" not in plan.inapplicable
    calls = []
    summary = run_ablation(plan, progress=False, launch=fake_launcher(calls))
    launched = {method: command for method, _, command, _ in calls}
    assert "advantage.process_gate=success_groups" not in launched["outcome_only"]
    assert "advantage.process_gate=success_groups" in launched["arise"]
    assert summary["inapplicable"][0]["variant"] == "outcome_only"
    assert f"- {sentence}." in (tmp_path / "o" / "ablation.md").read_text()
    # set by the --config file instead: reset to its default for that variant
    config = tmp_path / "gate.yaml"
    config.write_text("advantage:\n  process_gate: success_groups\n")
    plan = plan_ablation("claim", ["arise", "outcome_only"], [0], 2, 1, tmp_path / "p", [], str(config))
    jobs = {job.variant: job.overrides for job in plan.run_jobs()}
    assert "advantage.process_gate=off" in jobs["outcome_only"] and "advantage.process_gate=off" not in jobs["arise"]
    assert plan.inapplicable["outcome_only"][0]["note"] == (
        "advantage.process_gate=success_groups (from --config) does not apply to outcome_only: run with "
        "advantage.process_gate=off, which is the same run"
    )
    # set in both: the override is dropped and the file's value reset
    plan = plan_ablation(
        "claim", ["outcome_only"], [0], 2, 1, tmp_path / "q", ["advantage.process_gate=success_only"], str(config)
    )
    overrides = plan.run_jobs()[0].overrides
    assert "advantage.process_gate=success_only" not in overrides and "advantage.process_gate=off" in overrides
    assert [cell["key"] for cell in plan.inapplicable["outcome_only"]] == ["advantage.process_gate"] * 2


def test_without_inapplicable_settings_every_override_applies(tmp_path, monkeypatch):
    monkeypatch.setattr(ablate.plan, "_inapplicable_settings", lambda: None)
    plan = plan_ablation("claim", ["arise", "outcome_only"], [0], 2, 1, tmp_path / "o", ["advantage.process_gate=off"])
    assert plan.inapplicable == {}
    plan = plan_ablation(
        "claim", ["arise", "outcome_only"], [0], 2, 1, tmp_path / "o", ["advantage.process_gate=success_groups"]
    )
    assert plan.inapplicable == {}
    assert all("advantage.process_gate=success_groups" in job.overrides for job in plan.run_jobs())


# ---------------------------------------------------------------------------- compare


def write_run(folder: Path, curve) -> Path:
    folder.mkdir(parents=True)
    rows = [{"step": 0, "kind": "train", "success_rate": 0.0}]
    rows += [{"step": s, "kind": "eval", "eval/success_rate": v, "eval/success_se": 0.02} for s, v in curve]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_compare_plots_every_run_and_prints_their_figures(tmp_path, capsys):
    a = write_run(tmp_path / "a", [(0, 0.1), (10, 0.4), (20, 0.3)])
    b = write_run(tmp_path / "b", [(0, 0.0), (20, 0.6)])
    out = tmp_path / "cmp.png"
    assert main(["compare", str(a), str(b), "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    printed = capsys.readouterr().out
    assert "a: held-out success 0.100 -> 0.300 (best 0.400, step 20)" in printed
    assert "b: held-out success 0.000 -> 0.600 (best 0.600, step 20)" in printed
    # no config.yaml: each run is a group of its own; a's AUC (0.1 + 0.4)/2 x 10 + (0.4 + 0.3)/2 x 10 = 6 over 20
    assert "  a: 1 run(s), seeds ?; final 0.300 ± 0.000 sd; normalized AUC 0.300 ± 0.000 sd" in printed
    assert "IQM final 0.300 (needs >= 5 seeds)" in printed


def test_compare_draws_many_runs_each_in_a_style_of_its_own(tmp_path, monkeypatch):
    """Matplotlib's colour cycle has ten colours: the 11th run must not look like the 1st."""
    from rwcore.trainer import report

    drawn = {}
    monkeypatch.setattr(report, "_save", lambda fig, path: drawn.setdefault("fig", fig) and path)
    runs = [write_run(tmp_path / f"r{i}", [(0, 0.0), (10, i / 20)]) for i in range(12)]
    plot_compare(runs, tmp_path / "many.png")
    lines = drawn["fig"].axes[0].get_lines()
    assert len(lines) == 12
    styles = {(line.get_color(), line.get_linestyle()) for line in lines}
    assert len(styles) == 12


def test_compare_bad_input(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "metrics.jsonl").write_text(json.dumps({"step": 1, "success_rate": 0.1}) + "\n")
    assert main(["compare", str(empty), "--out", str(tmp_path / "x.png")]) == 2
    assert "no held-out evaluation rows" in capsys.readouterr().err
    assert main(["compare", str(tmp_path / "missing"), "--out", str(tmp_path / "x.png")]) == 2
    assert "is not a folder" in capsys.readouterr().err
    assert main(["compare", str(empty), "--out", str(tmp_path / "x.jpg")]) == 2
    assert not (tmp_path / "x.png").exists()


def write_seeded_run(folder: Path, curve, seed: int, method: str, lr: float = 0.001, frozen_from: str = "") -> Path:
    """A run folder as rw train leaves it, for grouping: metrics.jsonl and a config.yaml."""
    write_run(folder, curve)
    (folder / "config.yaml").write_text(
        f"env:\n  name: negotiation\n  options: {{}}\noptim:\n  lr: {lr}\npool:\n  frozen_from: '{frozen_from}'\n"
        f"train:\n  method: {method}\n  seed: {seed}\n  steps: 20\n"
    )
    return folder


def five_seeds_each(tmp_path):
    """arise: finals 0.5 .. 0.7; outcome_only: finals 0.30 .. 0.38 (steps 0, 10, 20, starting at 0)."""
    runs = []
    for k in range(5):
        runs.append(write_seeded_run(tmp_path / f"arise-s{k}", [(0, 0.0), (10, 0.3), (20, 0.5 + 0.05 * k)], k, "arise"))
    for k in range(5):
        curve = [(0, 0.0), (10, 0.2), (20, 0.3 + 0.02 * k)]
        runs.append(write_seeded_run(tmp_path / f"outcome_only-s{k}", curve, k, "outcome_only"))
    return runs


def test_compare_groups_runs_by_config_and_compares_with_a_baseline(tmp_path, capsys):
    runs = five_seeds_each(tmp_path)
    argv = ["compare", *map(str, runs), "--out", str(tmp_path / "c.png"), "--bootstrap-reps", "500"]
    assert main([*argv, "--baseline", "outcome_only"]) == 0
    printed = capsys.readouterr().out
    assert "arise-s0: held-out success 0.000 -> 0.500 (best 0.500, step 20)" in printed  # today's line per run
    # arise: finals 0.5, 0.55, 0.6, 0.65, 0.7 -> mean 0.6, IQM (middle three) 0.6; AUC (0 + 0.3)/2 x 10 +
    # (0.3 + v)/2 x 10 over 20 = (0.6 + v) / 4 -> mean 0.3
    arise_line = next(line for line in printed.splitlines() if line.startswith("  train.method=arise:"))
    assert "5 run(s), seeds 0,1,2,3,4; final 0.600 ± 0.079 sd; normalized AUC 0.300 ± 0.020 sd" in arise_line
    assert "(ceiling 1.0 (default)); IQM final 0.600 [" in arise_line
    assert "  train.method=outcome_only [baseline]: 5 run(s)" in printed
    versus = next(line for line in printed.splitlines() if line.startswith("    vs train.method=outcome_only:"))
    # every arise run beats every baseline run; IQM difference 0.6 - 0.34
    assert "P(improvement) final 1.000 [1.000, 1.000]" in versus and "IQM difference final +0.260 [" in versus
    assert printed.rstrip().endswith(str(tmp_path / "c.png"))
    # the baseline as a RUN_DIR or a glob pattern of its runs: the same group
    found = compare_groups(runs, str(runs[5]), reps=200)
    assert found["baseline"] == "train.method=outcome_only"
    assert compare_groups(runs, str(tmp_path / "outcome_only-s*"), reps=200)["baseline"] == found["baseline"]
    assert compare_groups(runs, "train.method=outcome_only", reps=200)["baseline"] == found["baseline"]
    groups = {g["name"]: g for g in found["groups"]}
    assert groups["train.method=arise"]["vs_baseline"]["final"]["iqm_difference"]["point"] == pytest.approx(0.26)
    assert (
        groups["train.method=outcome_only"]["vs_baseline"] is None and groups["train.method=outcome_only"]["baseline"]
    )


@pytest.mark.parametrize(
    "baseline, message",
    [
        ("rw_static_topk", "--baseline 'rw_static_topk' names no group and matches no RUN_DIR"),
        ("*-s1", "--baseline '*-s1' matches runs of 2 groups"),
    ],
)
def test_compare_refuses_a_baseline_it_cannot_place(tmp_path, capsys, baseline, message):
    runs = five_seeds_each(tmp_path)
    out = tmp_path / "c.png"
    assert main(["compare", *map(str, runs), "--out", str(out), "--baseline", baseline]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()  # refused before drawing anything


def test_compare_refuses_bad_bootstrap_reps(tmp_path, capsys):
    run = write_run(tmp_path / "a", [(0, 0.1), (10, 0.2)])
    assert main(["compare", str(run), "--out", str(tmp_path / "c.png"), "--bootstrap-reps", "-1"]) == 2
    assert "argument --bootstrap-reps" in capsys.readouterr().err


def test_compare_names_groups_by_what_differs_and_keeps_frozen_seeds_together(tmp_path):
    low = [write_seeded_run(tmp_path / f"lo{k}", [(0, 0.0), (10, 0.1 * k)], k, "arise", lr=0.001) for k in range(2)]
    high = [write_seeded_run(tmp_path / f"hi{k}", [(0, 0.0), (10, 0.2)], k, "arise", lr=0.0001) for k in range(2)]
    frozen = [
        write_seeded_run(
            tmp_path / f"fr{k}",
            [(0, 0.0), (10, 0.3)],
            k,
            "arise_frozen_rubrics",
            frozen_from=f"/tables/runs/arise-s{k}",
        )
        for k in range(2)
    ]
    bare = write_run(tmp_path / "bare", [(0, 0.0), (10, 0.4)])  # no config.yaml: a group of its own
    groups = group_runs([*low, *high, *frozen, bare])
    assert [(g["name"], len(g["runs"]), g["seeds"]) for g in groups] == [
        # the keys that differ between groups, train.method first; the frozen runs' pool.frozen_from names the
        # same seed's run, so their seeds are one group
        ("train.method=arise, optim.lr=0.001, pool.frozen_from=''", 2, [0, 1]),
        ("train.method=arise, optim.lr=0.0001, pool.frozen_from=''", 2, [0, 1]),
        ("train.method=arise_frozen_rubrics, optim.lr=0.001, pool.frozen_from=/tables/runs/arise-s<seed>", 2, [0, 1]),
        ("bare", 1, [None]),
    ]
    # one config only: named by its method
    assert [g["name"] for g in group_runs(low)] == ["train.method=arise"]


# ---------------------------------------------------------------------------- real processes


def test_a_real_table_with_real_rw_train_processes(tmp_path):
    """Two variants x one seed, two real `rw train` processes at a time (tiny settings), then a resume that
    starts nothing; the table's numbers are the runs' own final held-out evaluations."""
    out = tmp_path / "abl"
    command = ablate_command(out, *ABLATE_RUN, variants="rewardweaver,rw_outcome_grpo", seeds="0", steps=2, jobs=2)
    env = child_env()
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "ablation.json").read_text())
    for row in summary["rows"]:
        entry = row["seeds"]["0"]
        assert entry["status"] == "finished" and entry["final_step"] == 2
        metrics = [json.loads(line) for line in (out / "runs" / f"{row['variant']}-s0" / "metrics.jsonl").open()]
        final = [m for m in metrics if m.get("kind") == "eval"][-1]
        assert entry["final"] == final["eval/success_rate"] and final["eval/episodes"] == 6
        assert 0.0 <= final["eval/success_se"] <= 0.5
    again = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert again.returncode == 0 and "run rewardweaver-s0" not in again.stderr
    assert json.loads((out / "ablation.json").read_text())["rows"] == summary["rows"]


def test_the_machine_note_names_the_cpu_and_the_isa_torchs_kernels_use(tmp_path):
    """Runs from one seed are chaotic in float rounding, which torch's CPU dispatch (AVX2 vs AVX512) changes:
    the table must say which the machine used. A table written before these were recorded still renders."""
    import torch

    note = ablate.machine_note(2)
    assert note["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert note["cpu_capability"] in ("DEFAULT", "VSX", "ZVECTOR", "AVX2", "AVX512", "SVE256")
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():  # Linux: the first "model name" line, as lscpu prints it
        names = [
            line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if line.startswith("model name")
        ]
        assert note["cpu"] == (names[0] if names else None)
    summary = {
        "paper": "rewardweaver",
        "seeds": [0],
        "baseline": "rw_outcome_grpo",
        "baseline_final_mean": 0.5,
        "rows": [],
        "machine": {**note, "cpu": "Some CPU", "cpu_capability": "AVX512"},
    }
    text = ablate.render_markdown(summary)
    assert f"Machine: {note['processor']} (Some CPU, torch kernels AVX512), {note['cpu_count']} cores" in text
    older = {key: value for key, value in summary["machine"].items() if key not in ("cpu", "cpu_capability")}
    assert f"Machine: {note['processor']}, {note['cpu_count']} cores" in ablate.render_markdown(
        {**summary, "machine": older}
    )


def test_a_killed_table_stops_its_runs_and_resumes_where_it_stopped(tmp_path):
    """SIGTERM mid-run: the running `rw train` processes stop with it; the same command again continues the
    killed runs from their checkpoints (resumed, not restarted) and finishes the table."""
    import signal
    import time

    out = tmp_path / "abl"
    small = overrides_with(ABLATE_RUN, "train.eval_every=2")
    command = ablate_command(out, *small, variants="rw_outcome_grpo", seeds="0", steps=40, jobs=1)
    env = child_env()
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    run = out / "runs" / "rw_outcome_grpo-s0"
    deadline = time.time() + 300
    while time.time() < deadline and not (run / "checkpoints" / "step_000003").exists():
        time.sleep(0.2)
    assert (run / "checkpoints" / "step_000003").exists()
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=60)
    stopped_at = (run / "metrics.jsonl").stat().st_size
    time.sleep(2)
    assert (run / "metrics.jsonl").stat().st_size == stopped_at  # the child stopped too
    assert not (run / "ablation_status.json").exists()
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    assert f"--resume {run}" in (run / "ablation.log").read_text()
    steps = train_steps(run)
    assert steps[-1] == 40 and steps.count(1) == 1  # continued, not started over
    assert json.loads((run / "ablation_status.json").read_text())["status"] == "finished"


def test_resuming_with_other_settings_is_refused_before_anything_starts(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(ablate.runner.time, "sleep", lambda s: None)
    plan = plan_ablation("arise", ["arise", "outcome_only"], [0], 2, 2, tmp_path / "out", ["optim.lr=1e-3"])
    run_ablation(plan, progress=False, launch=fake_launcher([]))
    started = []
    monkeypatch.setattr(ablate.runner.subprocess, "Popen", lambda *a, **k: started.append(a))
    argv = [
        "ablate",
        "--paper",
        "arise",
        "--variants",
        "arise,outcome_only",
        "--seeds",
        "0",
        "--out",
        str(tmp_path / "out"),
        "--quiet",
    ]
    assert main([*argv, "--steps", "3", "optim.lr=1e-3"]) == 2
    assert "train.steps: 2 then, 3 now" in capsys.readouterr().err
    assert main([*argv, "--steps", "2"]) == 2
    assert "optim.lr: 0.001 then, 0.0003 now" in capsys.readouterr().err  # 3e-4: the default
    assert started == []
    # the same settings, one more seed: resumes (the finished runs are not started again)
    calls = []
    run_ablation(
        plan_ablation("arise", ["arise", "outcome_only"], [0, 1], 2, 2, tmp_path / "out", ["optim.lr=1e-3"]),
        progress=False,
        launch=fake_launcher(calls),
    )
    assert sorted((m, s) for m, s, _, _ in calls) == [("arise", 1), ("outcome_only", 1)]


def test_an_edited_config_file_is_refused_on_resume_naming_the_key_a_moved_one_is_not(tmp_path, monkeypatch, capsys):
    """What makes runs one table is the settings they resolve to, not the --config file's path: a file edited
    between two calls (optim.lr 0.002 -> 0.9) is refused naming optim.lr; the same content at another path, or
    the same value given as an override, resumes."""
    monkeypatch.setattr(ablate.runner.time, "sleep", lambda s: None)
    config = tmp_path / "abl.yaml"
    config.write_text("optim:\n  lr: 0.002\n")
    out = tmp_path / "out"

    def call(seeds, config_path, overrides=()):
        calls = []
        path = str(config_path) if config_path else None
        plan = plan_ablation("arise", ["arise", "outcome_only"], seeds, 2, 2, out, list(overrides), path)
        run_ablation(plan, progress=False, launch=fake_launcher(calls))
        return sorted((m, s) for m, s, _, _ in calls)

    assert call([0], config) == [("arise", 0), ("outcome_only", 0)]
    config.write_text("optim:\n  lr: 0.9\n")
    argv = ["ablate", "--paper", "arise", "--variants", "arise,outcome_only", "--seeds", "0,1", "--steps", "2"]
    assert main([*argv, "--out", str(out), "--config", str(config), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "optim.lr: 0.002 then, 0.9 now" in err and err.count("\n") == 1
    assert not (out / "runs" / "arise-s1").exists()  # nothing started
    moved = tmp_path / "elsewhere.yaml"
    moved.write_text("optim:\n  lr: 0.002\n")
    assert call([0, 1], moved) == [("arise", 1), ("outcome_only", 1)]
    assert call([0, 1, 2], None, ["optim.lr=0.002"]) == [("arise", 2), ("outcome_only", 2)]


def test_a_baseline_that_never_left_its_start_is_measured_against_half_the_ceiling(tmp_path):
    """Outcome-only at 0.0 throughout (the hard tier): its level is held by every run from step 0, so both 'steps
    to' columns measure against half the ceiling (0.85 / 2 = 0.425) instead, and the table says so."""
    plan = plan_ablation("claim", ["arise", "outcome_only"], [0, 1], None, 1, tmp_path / "o")
    steps = [0, 50, 100, 150, 200]
    for seed in (0, 1):
        write_finished(plan.runs_dir / f"outcome_only-s{seed}", zip(steps, [0.0] * 5), ceiling=0.85)
    write_finished(plan.runs_dir / "arise-s0", zip(steps, [0.0, 0.0, 0.3, 0.45, 0.85]), ceiling=0.85)
    write_finished(plan.runs_dir / "arise-s1", zip(steps, [0.0, 0.0, 0.0, 0.0, 0.4]), ceiling=0.85)
    summary = ablate.summarize(plan)
    assert summary["baseline_final_mean"] == 0.0
    assert summary["baseline_target"] == {"value": pytest.approx(0.425), "rule": "half the ceiling"}
    reach = summary["reach_target"]
    assert (reach["value"], reach["baseline_value"], reach["rule"]) == (pytest.approx(0.425), 0.0, "half the ceiling")
    rows = {row["variant"]: row for row in summary["rows"]}
    s0, s1 = rows["arise"]["seeds"]["0"], rows["arise"]["seeds"]["1"]
    assert (s0["steps_to_reach"], s0["steps_to_baseline"]) == (150, 150)  # 0.45 >= 0.425 first at step 150
    assert (s1["steps_to_reach"], s1["steps_to_baseline"]) == (None, None)  # 0.4 at best
    assert rows["outcome_only"]["steps_to_reach"] == {"mean": None, "reached": 0, "of": 2}
    text = ablate.render_markdown(summary)
    assert "so half the ceiling instead: 0.425" in text


def test_overrides_may_follow_options_and_anything_else_is_the_subcommands_usage_error(tmp_path, planned, capsys):
    """`rw ablate ... --out DIR optim.lr=0.002 --quiet` (an override after an option) gave the top-level
    `usage: rw ...` and 'unrecognized arguments'; now it applies, in command-line order. An unknown option after
    the overrides is `rw ablate`'s usage error, and an override without a key is refused naming the form."""
    argv = ["ablate", "--paper", "arise", "--seeds", "0", "optim.lr=0.001", "--out", str(tmp_path / "o")]
    assert main([*argv, "optim.lr=0.002", "--quiet", "env.options.seed=3"]) == 0
    assert list(planned["plan"].overrides) == ["optim.lr=0.001", "optim.lr=0.002", "env.options.seed=3"]
    capsys.readouterr()
    assert main([*argv, "optim.lr=0.002", "--bogus"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: rw ablate") and "unrecognized arguments: optim.lr=0.002 --bogus" in err
    assert main([*argv, "=3"]) == 2
    assert "expected section.key=value" in capsys.readouterr().err
