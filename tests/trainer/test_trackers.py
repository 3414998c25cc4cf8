"""`train.loggers`: the experiment trackers of `rw train` (rwcore/trainer/trackers.py, docs/trackers.md).

Every value a tracker stored is read back with that package's own reader and compared with metrics.jsonl
(tests/tracker_readers.py): TensorBoard's event accumulator and a real `tensorboard` server on loopback with its
default loader, MLflow's client, the records of wandb's offline run file (decoded with wandb's own protobuf
messages) and trackio's SQLite storage. The name each tracker shows is the row's key, prefixed with the row's kind
unless it already starts with it (`train/loss`, `eval/success_rate`); MLflow, which refuses some characters in
names, gets `_` in their place. Only finite numbers reach a tracker, and only the keys that apply to the run's
settings; TensorBoard keeps float32. Every evaluation's sampled transcripts reach each tracker in its own form.

Nothing here touches the network: the `rw train` run happens in a child process whose sockets refuse any address
but loopback, and which reports afterwards what tried (wandb's service is a separate Go process, outside that
guard: offline mode is what keeps it off the network). The child's environment has no PYTEST_CURRENT_TEST or CI,
which MLflow takes as a reason to skip its telemetry: the guard would catch a telemetry report if `rw` let one go.
"""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from _util import ROOT, SMALL_RUN, metrics_rows, overrides_with
from tracker_readers import (
    CHILD_ENV_DROPPED,
    GUARDED_RW,
    TRACKER_ENV,
    TensorBoardServer,
    expected_values,
    flat_config,
    float32,
    mlflow_artifact,
    mlflow_named,
    mlflow_runs,
    mlflow_values,
    tensorboard_hparams,
    tensorboard_values,
    trackio_store,
    trackio_tables,
    trackio_values,
    wandb_run,
    wandb_tables,
)

from rwcore.trainer import cli
from rwcore.trainer.config import load_config
from rwcore.trainer.trainer import Trainer

SMALL = overrides_with(
    SMALL_RUN,
    "train.start_pass_k=2",  # an exploration row: its `pass@2` names hold a character MLflow refuses
)
EVAL_TASKS = 8  # SMALL_RUN's env.options.num_eval
ALL_FOUR = "train.loggers=[console,tensorboard,wandb,mlflow,trackio]"

# What SMALL's train rows hold that does not apply to its settings (RewardWeaver alone, no rollout correction,
# synchronous rollouts from the trained weights), as docs/trackers.md lists it: metrics.jsonl keeps these keys,
# the trackers do not get them.
NOT_SENT = re.compile(
    r"train/(rollout_corr/.+|rollout/version_lag|evidence/late_groups|rubrics/advantage|rubrics/shared)"
)


def sent(values: dict[tuple[str, int], float]) -> dict[tuple[str, int], float]:
    return {(name, step): value for (name, step), value in values.items() if not NOT_SENT.fullmatch(name)}


# ------------------------------------------------------------------------------------------ the run


@pytest.fixture(scope="module")
def four_trackers(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """`rw train` of two steps with all four trackers, evaluated at steps 0 and 2, every held-out episode's
    transcript sent (train.tracker_transcripts = the 8 held-out tasks), in the guarded child process."""
    folder = tmp_path_factory.mktemp("four-trackers")
    run = folder / "run"
    env = {k: v for k, v in os.environ.items() if not CHILD_ENV_DROPPED.match(k)}
    env["WANDB_CACHE_DIR"] = str(folder / "wandb-cache")  # wandb-core's own debug log, out of the home folder
    env.setdefault("OMP_NUM_THREADS", "1")
    done = subprocess.run(
        [sys.executable, "-c", GUARDED_RW, "train", "--out", str(run), "--quiet", *SMALL, "train.steps=2", ALL_FOUR]
        + [f"train.tracker_transcripts={EVAL_TASKS}"],
        capture_output=True,
        text=True,
        env=env,
        cwd=folder,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return run, done


def test_a_run_with_all_four_trackers_stores_what_metrics_jsonl_holds(four_trackers):
    run, done = four_trackers
    assert "failed" not in done.stderr and "warns" not in done.stderr, done.stderr
    after = json.loads(done.stdout.split("AFTER=", 1)[1].splitlines()[0])
    assert after == {"network": [], "children": [], "threads": []}, after  # no service, thread or socket outlives

    rows = metrics_rows(run)
    assert {row["kind"] for row in rows} == {"eval", "exploration", "train"}
    expected = sent(expected_values(rows))
    assert any("@" in name for name, _ in expected)  # MLflow's renaming is exercised
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["train"]["loggers"] == ["console", "tensorboard", "wandb", "mlflow", "trackio"]
    flat = flat_config(config)

    # TensorBoard: one float32 scalar per (name, step), and the config as the session's hyperparameters
    assert tensorboard_values(run / "tensorboard") == float32(expected)
    numbers_as_floats = {k: float(v) if isinstance(v, int) else v for k, v in flat.items()}
    assert tensorboard_hparams(run / "tensorboard") == numbers_as_floats
    # the classic reader (EventAccumulator.Scalars) sees the same curves
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    classic = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    classic.Reload()
    scalars = {(tag, event.step): event.value for tag in classic.Tags()["scalars"] for event in classic.Scalars(tag)}
    assert scalars == float32(expected)

    # wandb: one offline run under RUN/wandb, named after the run folder, with the whole config
    values, wandb_config, wandb_record = wandb_run(run)
    assert values == expected
    assert wandb_config == config
    assert (wandb_record.display_name, wandb_record.project, wandb_record.run_group) == ("run", "rw", "run")

    # MLflow: a local sqlite store under RUN/mlflow, experiment "rw", the config as (text) parameters and as the
    # run folder's config.yaml, byte for byte
    ((client, mlflow_run),) = mlflow_runs(run)
    assert mlflow_values(client, mlflow_run) == mlflow_named(expected)
    assert mlflow_run.data.params == {k: v if isinstance(v, str) else json.dumps(v) for k, v in flat.items()}
    assert (mlflow_run.info.run_name, mlflow_run.info.status) == ("run", "FINISHED")
    assert mlflow_artifact(client, mlflow_run, "config.yaml") == (run / "config.yaml").read_bytes()

    # trackio: a local store under RUN/trackio, project "rw"
    logs, trackio_config = trackio_store(run, "rw", "run")
    assert trackio_values(logs) == expected
    assert {k: v for k, v in trackio_config.items() if not k.startswith("_")} == config

    # the tracker folders sit beside what rw report reads: it draws the same plots
    assert cli.main(["report", str(run)]) == 0
    assert (run / "report" / "success_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_tensorboard_shows_every_curve_with_its_default_loader_over_http(four_trackers):
    """The command docs/trackers.md gives, a real server on loopback: its scalars API lists every train/* and
    eval/* name of metrics.jsonl that applies (none of rollout_corr/*), each curve equal to metrics.jsonl in
    float32, and its Time Series tab gets the same names."""
    run, _ = four_trackers
    expected = float32(sent(expected_values(metrics_rows(run))))
    names = {name for name, _ in expected}
    wanted = {name for name in names if name.startswith(("train/", "eval/"))}
    assert len(wanted) > 40 and not any(name.startswith("train/rollout_corr/") for name in names)
    with TensorBoardServer(run / "tensorboard") as server:
        tags = server.poll("/data/plugin/scalars/tags", lambda answer: set(answer.get(".", {})) >= names)
        shown = time.monotonic() - server.started
        assert set(tags) == {"."} and set(tags["."]) == names  # all of them, and nothing else
        assert any("fast data loading" in line for line in server.stderr), server.stderr  # the Rust data server
        served = {}
        for name in sorted(names):
            for _, step, value in server.get("/data/plugin/scalars/scalars", run=".", tag=name):
                assert (name, step) not in served
                served[(name, step)] = value
        assert served == expected
        series = server.get("/data/plugin/timeseries/tags")["scalars"]["runTagInfo"]
        assert set(series["."]) == names
    print(f"TensorBoard listed every curve {shown:.1f} s after it started")


def _code_blocks(rendered: str) -> list[str]:
    """The texts of the <pre><code> blocks of TensorBoard's rendered markdown, unescaped."""
    blocks = re.findall(r"<pre><code>(.*?)</code></pre>", rendered, flags=re.DOTALL)
    return [html.unescape(block).removesuffix("\n") for block in blocks]


def test_every_evaluation_sends_its_transcripts_to_each_tracker(four_trackers):
    """At each evaluation (steps 0 and 2) every tracker gets the transcripts of the held-out episodes in its own
    form: TensorBoard text (served by the real server), a wandb table, an MLflow JSON artifact, a trackio table.
    They agree with each other, and their outcomes give the eval row's success rate and mean outcome."""
    run, _ = four_trackers
    evals = {row["step"]: row for row in metrics_rows(run, "eval")}
    assert sorted(evals) == [0, 2]

    ((client, mlflow_run),) = mlflow_runs(run)
    documents = {
        step: json.loads(mlflow_artifact(client, mlflow_run, f"transcripts/eval-step-{step:06d}.json"))
        for step in evals
    }
    wandb = wandb_tables(run, "eval/transcripts")
    logs, _ = trackio_store(run, "rw", "run")
    trackio = trackio_tables(logs, "eval/transcripts")
    assert sorted(wandb) == sorted(trackio) == sorted(evals)

    with TensorBoardServer(run / "tensorboard") as server:
        server.poll("/data/plugin/text/tags", lambda answer: answer.get(".") == ["eval/transcripts"])
        text = server.get("/data/plugin/text/text", run=".", tag="eval/transcripts")
    assert sorted(entry["step"] for entry in text) == sorted(evals)
    rendered = {entry["step"]: entry["text"] for entry in text}

    for step, row in evals.items():
        document = documents[step]
        assert (document["evaluation"], document["step"]) == ("eval", step)
        transcripts = document["transcripts"]
        # every held-out task, in order; the outcomes are those the eval row aggregates
        assert [t["episode"] for t in transcripts] == list(range(EVAL_TASKS))
        assert [t["task_id"] for t in transcripts] == [f"neg-eval-{i:04d}" for i in range(EVAL_TASKS)]
        assert np.mean([t["success"] for t in transcripts]) == pytest.approx(row["eval/success_rate"], abs=1e-12)
        assert np.mean([t["outcome"] for t in transcripts]) == pytest.approx(row["eval/outcome_mean"], abs=1e-12)
        for t in transcripts:  # the episode: the base prompt, the partner's and the policy's turns
            roles = [turn["role"] for turn in t["turns"]]
            assert roles[0] == "system" and {"partner", "assistant"} <= set(roles), roles
            assert t["transcript"] == "\n\n".join(f"[{turn['role']}] {turn['content']}" for turn in t["turns"])
        # wandb's and trackio's tables: one row per transcript, the same cells
        columns = ["episode", "task", "tags", "success", "outcome", "reason", "transcript"]
        cells = [
            [t["episode"], t["task_id"], ", ".join(t["tags"]), t["success"], t["outcome"], t["reason"], t["transcript"]]
            for t in transcripts
        ]
        assert wandb[step]["columns"] == columns and wandb[step]["data"] == cells
        assert trackio[step] == [dict(zip(columns, row)) for row in cells]
        # TensorBoard: one code block per transcript, shown verbatim (its header line, then the episode)
        blocks = _code_blocks(rendered[step])
        assert len(blocks) == EVAL_TASKS
        for block, t in zip(blocks, transcripts):
            header, _, body = block.partition("\n\n")
            assert header.startswith(f"episode {t['episode']}: task {t['task_id']} ") and body == t["transcript"]


def test_keys_that_do_not_apply_stay_in_metrics_jsonl_and_measure_nothing(four_trackers):
    """What NOT_SENT leaves out of the trackers is in every train row of metrics.jsonl (its schema does not change
    with the settings), and under these settings measures nothing: ratios of 1 up to float rounding, zeros."""
    run, _ = four_trackers
    for row in metrics_rows(run, "train"):
        left_out = {key: value for key, value in row.items() if NOT_SENT.fullmatch(f"train/{key}")}
        assert len([key for key in left_out if key.startswith("rollout_corr/")]) == 17
        assert {"rollout/version_lag", "evidence/late_groups", "rubrics/advantage", "rubrics/shared"} <= set(left_out)
        for key, value in left_out.items():
            if key.endswith(("ratio_mean", "ratio_min", "ratio_max", "ppl_ratio", "eff_sample_size")):
                assert value == pytest.approx(1.0, abs=1e-5), (key, value)
            elif key.endswith(("_ppl", "log_ppl")) and "diff" not in key:
                continue  # a perplexity: the same under behaviour and current weights (checked by ppl_ratio)
            else:
                assert abs(value) < 1e-5, (key, value)


def test_which_keys_apply_follows_the_settings():
    from rwcore.trainer.metrics import declared
    from rwcore.trainer.tracker_rows import NOT_APPLICABLE, not_applicable

    def omitted(*overrides: str) -> set[str]:
        omit = not_applicable(load_config(None, list(overrides)))
        keys = ("rollout_corr/kl", "rollout/version_lag", "judgments", "rubrics/process", "rubrics/advantage")
        return {key for key in (*keys, "rubrics/shared", "loss", "success_rate") if omit("train", key)}

    every = {"rollout_corr/kl", "rollout/version_lag", "rubrics/advantage", "rubrics/shared"}
    assert omitted() == every  # RewardWeaver (the default), synchronous, no correction
    assert omitted("loss.rollout_correction=decoupled_token_is") == every - {"rollout_corr/kl"}
    assert omitted("rollout.max_lag=1") == every - {"rollout_corr/kl", "rollout/version_lag"}
    assert omitted("rollout.engine=vllm") == every - {"rollout_corr/kl"}
    assert omitted("rollout.engine=vllm", "rollout.behavior_logprobs=trainer") == every  # every ratio starts at 1
    assert omitted("train.method=combined") == {"rollout_corr/kl", "rollout/version_lag"}
    assert omitted("train.method=arise") == {
        "rollout_corr/kl",
        "rollout/version_lag",
        "rubrics/process",
        "rubrics/shared",
    }
    assert omitted("train.method=rw_outcome_grpo") == every | {"judgments", "rubrics/process"}
    # an eval row is never filtered; every key named is one metrics.jsonl declares
    assert not not_applicable(load_config(None, ["train.method=rw_outcome_grpo"]))("eval", "judgments")
    for rule in NOT_APPLICABLE:
        for key in rule.keys:
            assert declared(rule.kind, key + "kl" if key.endswith("/") else key) is not None, key


def test_a_transcript_is_shown_verbatim_by_tensorboards_markdown():
    """Transcript text is data: markdown, HTML and fences inside it render as the text itself, in TensorBoard's own
    renderer (what its text plugin serves)."""
    from tensorboard.plugin_util import markdown_to_safe_html

    from rwcore.trainer.transcripts import Transcript, transcripts_markdown

    hostile = (
        "# not a heading\n```\n![pixel](http://example.invalid/p.png) <script>alert(1)</script>\n`````\n"
        "| a | b |\n|---|---|\n~~~\n<b>bold</b> &amp; *em* [link](http://example.invalid)"
    )
    made = [
        Transcript(0, "t0", ("x",), True, 1.0, "", hostile, (("assistant", hostile),)),
        Transcript(1, "t1", (), False, 0.0, "walkout", "[assistant] fine", (("assistant", "fine"),)),
    ]
    rendered = markdown_to_safe_html(transcripts_markdown(made))
    assert _code_blocks(rendered) == [f"{t.header()}\n\n{t.text}" for t in made]
    outside = re.sub(r"<pre><code>.*?</code></pre>", "", rendered, flags=re.DOTALL)
    assert re.findall(r"<(\w+)", outside) == ["p", "strong", "p", "strong"], outside  # rw's own two headings


# ------------------------------------------------------------------------------------------ resume, failure


def train_in_process(folder: Path, *overrides: str, steps: int) -> Trainer:
    trainer = Trainer(load_config(None, [*SMALL, f"train.steps={steps}", *overrides]), folder, quiet=True)
    trainer.setup()
    return trainer


@pytest.fixture
def no_tracker_env():
    """No tracker settings from the environment; the environment as it was afterwards (the trackers set a few
    defaults, MLFLOW_DISABLE_TELEMETRY and WANDB_ERROR_REPORTING, for the process)."""
    saved = dict(os.environ)
    for name in list(os.environ):
        if TRACKER_ENV.match(name):
            del os.environ[name]
    yield
    os.environ.clear()
    os.environ.update(saved)


def test_a_resumed_run_continues_each_tracker_as_docs_say(tmp_path, no_tracker_env):
    run = tmp_path / "run"
    trainer = train_in_process(run, "train.loggers=[tensorboard,mlflow]", "train.start_pass_k=0", steps=3)
    trainer.config.train.steps = 2
    trainer.train()  # checkpoint at step 2
    trainer._log(trainer.train_step())  # step 3 reaches the trackers, then the run is killed before its checkpoint
    trainer.cleanup()
    before = metrics_rows(run)
    assert max(row["step"] for row in before) == 3

    resumed = Trainer.resume(run, quiet=True)
    resumed.setup()
    assert resumed.step == 2
    resumed.train()
    resumed.cleanup()
    after = metrics_rows(run)
    assert [row for row in after if row["step"] <= 2] == [row for row in before if row["step"] <= 2]

    # TensorBoard: a second event file; its reader drops what the killed run wrote after the checkpoint
    assert len(list((run / "tensorboard").glob("events.out.tfevents.*"))) == 2
    assert tensorboard_values(run / "tensorboard") == float32(sent(expected_values(after)))

    # MLflow: a second run in the experiment, holding the rows after the checkpoint; the first keeps its own
    (first_client, first), (second_client, second) = mlflow_runs(run)
    assert mlflow_values(first_client, first) == mlflow_named(sent(expected_values(before)))
    assert mlflow_values(second_client, second) == mlflow_named(
        sent(expected_values([r for r in after if r["step"] > 2]))
    )
    assert (first.info.run_name, second.info.run_name) == ("run", "run-resumed-at-step-2")
    assert second.data.tags["rw.resumed_at_step"] == "2"


def test_a_tracker_failing_mid_run_is_named_once_and_dropped_while_training_goes_on(
    tmp_path, no_tracker_env, monkeypatch, capsys
):
    from mlflow.tracking import MlflowClient

    calls = []
    log_batch = MlflowClient.log_batch

    def disk_full_on_the_third_row(self, run_id, metrics=(), params=(), tags=(), **kwargs):
        if metrics:
            calls.append(len(metrics))
            if len(calls) == 3:
                raise OSError(28, "No space left on device")
        return log_batch(self, run_id, metrics=metrics, params=params, tags=tags, **kwargs)

    monkeypatch.setattr(MlflowClient, "log_batch", disk_full_on_the_third_row)
    run = tmp_path / "run"
    trainer = train_in_process(run, "train.loggers=[mlflow,tensorboard]", steps=2)
    trainer.train()
    trainer.cleanup()
    rows = metrics_rows(run)
    assert [row["kind"] for row in rows] == ["eval", "exploration", "train", "train", "eval"]
    assert len(calls) == 3  # dropped: never called again
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("rw: tracker")]
    assert len(err) == 1 and "mlflow" in err[0] and "No space left on device" in err[0] and "dropped" in err[0], err
    assert tensorboard_values(run / "tensorboard") == float32(sent(expected_values(rows)))
    ((client, mlflow_run),) = mlflow_runs(run)
    assert mlflow_values(client, mlflow_run) == mlflow_named(sent(expected_values(rows[:2])))


def test_overwrite_replaces_a_run_with_tracker_folders_and_keeps_a_foreign_file_refused(tmp_path, no_tracker_env):
    """--overwrite removes what rw wrote, the trackers' folders included; a file rw did not write still stops it."""
    run = tmp_path / "run"
    first = train_in_process(run, "train.loggers=[tensorboard,mlflow]", "train.start_pass_k=0", steps=1)
    first.train()
    first.cleanup()
    assert (run / "tensorboard").is_dir() and (run / "mlflow").is_dir()
    for name in ("wandb", "trackio"):  # the other two trackers' folders, as they leave them
        (run / name / "inner").mkdir(parents=True)
        (run / name / "inner" / "data").write_bytes(b"x")
    (run / "notes.txt").write_text("mine")
    args = ["train", "--out", str(run), "--overwrite", "--quiet", *SMALL, "train.steps=1", "train.start_pass_k=0"]
    assert cli.main(args) == 2
    assert (run / "notes.txt").read_text() == "mine" and (run / "wandb" / "inner" / "data").exists()
    (run / "notes.txt").unlink()
    assert cli.main(args) == 0
    assert not any((run / name).exists() for name in ("tensorboard", "mlflow", "wandb", "trackio"))
    assert [row["step"] for row in metrics_rows(run) if row["kind"] == "train"] == [1]


# ------------------------------------------------------------------------------------------ refusals


def test_a_tracker_that_is_not_installed_is_one_line_before_the_run_folder_is_written(
    tmp_path, no_tracker_env, monkeypatch, capsys
):
    monkeypatch.setitem(sys.modules, "wandb", None)  # what importlib finds when the package is absent
    run = tmp_path / "run"
    assert cli.main(["train", "--out", str(run), "--quiet", *SMALL, "train.loggers=[tensorboard,wandb]"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "train.loggers" in err[0] and "wandb" in err[0] and "rwcore[trackers]" in err[0], err
    assert not (run / "config.yaml").exists() and not (run / "metrics.jsonl").exists()
    assert not (run / "tensorboard").exists()


@pytest.mark.parametrize(
    "override, words",
    [
        ("train.loggers=[console,neptune]", ["train.loggers", "neptune", "tensorboard", "wandb", "mlflow", "trackio"]),
        ("train.loggers=wandb", ["train.loggers", "list"]),
        ("train.loggers=[wandb,wandb]", ["train.loggers", "wandb", "twice"]),
        ("train.tracker_project=a/b", ["train.tracker_project", "a/b"]),
        ("train.tracker_project=", ["train.tracker_project"]),
    ],
)
def test_bad_tracker_settings_are_refused_naming_the_key(override, words):
    with pytest.raises(ValueError) as caught:
        load_config(None, [override])
    for word in words:
        assert word in str(caught.value), (word, str(caught.value))


def test_the_default_is_the_console_alone_and_imports_no_tracker(tmp_path):
    assert load_config(None, []).train.loggers == ["console"]
    code = (
        "import sys, rwcore\n"
        "from rwcore.trainer.config import load_config\n"
        "from rwcore.trainer.trainer import Trainer\n"
        "from rwcore.trainer import trackers\n"
        "trackers.Trackers(['console'], 'rw').start({}, sys.argv[1])\n"
        "print(sorted(m for m in ('wandb', 'mlflow', 'trackio', 'tensorboard') if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
    assert list(tmp_path.iterdir()) == []


def test_only_finite_numbers_reach_a_tracker_under_the_kind_prefixed_name():
    from rwcore.trainer.trackers import metric_values

    row = {
        "step": 7,
        "kind": "train",
        "loss": 0.5,
        "grad_norm": float("nan"),
        "lr": float("inf"),
        "active_rubrics": 3,
        "note": "text",
        "flag": True,
        "nested": {"a": 1.0},
        "judge/requests": 2,
    }
    assert metric_values(row) == (7, {"train/loss": 0.5, "train/active_rubrics": 3.0, "train/judge/requests": 2.0})
    assert metric_values({"step": 2, "kind": "eval", "eval/success_rate": 0.25, "time/probe": 1.5}) == (
        2,
        {"eval/success_rate": 0.25, "eval/time/probe": 1.5},
    )
