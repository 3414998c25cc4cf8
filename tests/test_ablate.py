"""`rw ablate` and `rw compare`: argument checks before anything starts, scheduling (parallel limit, thread
share, dependency order), resume, failed runs kept apart, the table's numbers worked out by hand, and one
real end-to-end table with real `rw train` processes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rwcore.trainer import ablate
from rwcore.trainer.ablate import BASELINES, PAPERS, parse_seeds, plan_ablation, run_ablation, steps_to_reach
from rwcore.trainer.cli import main

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
        (["--paper", "grpo"], "--paper must be one of arise, rewardweaver"),
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
    assert {v.name for v in VARIANTS.values() if v.paper_row.startswith("Arise fig. 3(a)")} == set(PAPERS["arise"])


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
            (self.out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        if self.polls == 0:
            FakeProcess.running -= 1
        return self.code

    def terminate(self):
        pass

    def wait(self):
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
    monkeypatch.setattr(ablate.time, "sleep", lambda s: None)
    monkeypatch.setattr(ablate.os, "cpu_count", lambda: 4)
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
    (run / "checkpoints").mkdir()
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
    monkeypatch.setattr(ablate.time, "sleep", lambda s: None)
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
    text = (tmp_path / "o" / "ablation.md").read_text()
    assert "s1: FAILED" in text and "arise seed 1: exit code 3: rw: error: boom" in text
    assert "| arise | Arise fig. 3(a): Arise | 0.600 ± 0.000 |" in text
    assert json.loads((tmp_path / "o" / "ablation.json").read_text())["rows"][0]["variant"] == "arise"


def test_steps_to_reach():
    curve = [(0, 0.0, None), (25, 0.2, None), (50, 0.41, None), (75, 0.3, None)]
    assert steps_to_reach(curve, 0.4) == 50 and steps_to_reach(curve, 0.0) == 0 and steps_to_reach(curve, 0.5) is None


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


def test_compare_draws_many_runs_each_in_a_style_of_its_own(tmp_path, monkeypatch):
    """Matplotlib's colour cycle has ten colours: the 11th run must not look like the 1st."""
    from rwcore.trainer import report

    drawn = {}
    monkeypatch.setattr(report, "_save", lambda fig, path: drawn.setdefault("fig", fig) and path)
    runs = [write_run(tmp_path / f"r{i}", [(0, 0.0), (10, i / 20)]) for i in range(12)]
    ablate.plot_compare(runs, tmp_path / "many.png")
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


# ---------------------------------------------------------------------------- real processes


def test_a_real_table_with_real_rw_train_processes(tmp_path):
    """Two variants x one seed, two real `rw train` processes at a time (tiny settings), then a resume that
    starts nothing; the table's numbers are the runs' own final held-out evaluations."""
    out = tmp_path / "abl"
    small = [
        "model.init=random",
        "env.options.num_train=24",
        "env.options.num_eval=6",
        "rollout.tasks_per_step=2",
        "rollout.group_size=2",
        "train.eval_every=1",
        "train.checkpoint_every=1",
    ]
    command = [
        sys.executable,
        "-m",
        "rwcore.trainer",
        "ablate",
        "--paper",
        "rewardweaver",
        "--variants",
        "rewardweaver,rw_outcome_grpo",
        "--seeds",
        "0",
        "--steps",
        "2",
        "--jobs",
        "2",
        "--quiet",
        "--out",
        str(out),
        *small,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
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
    small = [
        "model.init=random",
        "env.options.num_train=24",
        "env.options.num_eval=6",
        "rollout.tasks_per_step=2",
        "rollout.group_size=2",
        "train.eval_every=2",
        "train.checkpoint_every=1",
    ]
    command = [
        sys.executable,
        "-m",
        "rwcore.trainer",
        "ablate",
        "--paper",
        "rewardweaver",
        "--variants",
        "rw_outcome_grpo",
        "--seeds",
        "0",
        "--steps",
        "40",
        "--jobs",
        "1",
        "--quiet",
        "--out",
        str(out),
        *small,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
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
    steps = [
        json.loads(line)["step"] for line in (run / "metrics.jsonl").open() if json.loads(line).get("kind") == "train"
    ]
    assert steps[-1] == 40 and steps.count(1) == 1  # continued, not started over
    assert json.loads((run / "ablation_status.json").read_text())["status"] == "finished"


def test_resuming_with_other_settings_is_refused_before_anything_starts(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(ablate.time, "sleep", lambda s: None)
    plan = plan_ablation("arise", ["arise", "outcome_only"], [0], 2, 2, tmp_path / "out", ["optim.lr=1e-3"])
    run_ablation(plan, progress=False, launch=fake_launcher([]))
    started = []
    monkeypatch.setattr(ablate.subprocess, "Popen", lambda *a, **k: started.append(a))
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
    assert "steps: 2 then, 3 now" in capsys.readouterr().err
    assert main([*argv, "--steps", "2"]) == 2
    assert "overrides: ['optim.lr=1e-3'] then, [] now" in capsys.readouterr().err
    assert started == []
    # the same settings, one more seed: resumes (the finished runs are not started again)
    calls = []
    run_ablation(
        plan_ablation("arise", ["arise", "outcome_only"], [0, 1], 2, 2, tmp_path / "out", ["optim.lr=1e-3"]),
        progress=False,
        launch=fake_launcher(calls),
    )
    assert sorted((m, s) for m, s, _, _ in calls) == [("arise", 1), ("outcome_only", 1)]
