"""Run hygiene: `rw train --resume RUN train.steps=N` extends a run as if it had been started with N steps (keys
that would change the steps already trained are refused by name, nothing written); `train.keep_checkpoints=N`
keeps the newest N and the best held-out checkpoint; the resume line names the checkpoint; run_info.json records
every invocation (command line with secrets redacted, versions, commit, machine)."""

from __future__ import annotations

import json
import os
import subprocess
from importlib import metadata
from pathlib import Path

import pytest
import torch
from _util import TINY_RUN, metrics_rows, overrides_with, without_timing

from rwcore.trainer.checkpoint_retention import prune_checkpoints
from rwcore.trainer.cli import main
from rwcore.trainer.config import load_config, save_config
from rwcore.trainer.resume_overrides import resume_config
from rwcore.trainer.run_info import redact_argv

# four steps, evaluated every other step (so the end of a 4-step run is an evaluation a 6-step run has too)
RUN = overrides_with(TINY_RUN, "train.eval_every=2", "train.steps=4", "train.start_pass_k=0")


def _train(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["train", "--quiet", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _steps(run: Path) -> list[int]:
    return sorted(int(p.name[5:]) for p in (run / "checkpoints").iterdir() if p.name.startswith("step_"))


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The same run started with train.steps=6: what an extension to 6 must reproduce."""
    folder = tmp_path_factory.mktemp("straight") / "run"
    assert main(["train", "--quiet", "--out", str(folder), *RUN, "train.steps=6"]) == 0
    return folder


def test_a_finished_run_extends_as_if_started_with_the_new_steps(tmp_path, capsys, straight, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-never-recorded-1234")
    run = tmp_path / "run"
    code, _, err = _train(capsys, "--out", str(run), *RUN, "judge.api_key_env=MY_JUDGE_KEY")
    assert code == 0, err
    config_before = (run / "config.yaml").read_bytes()
    # keys that would change the past are refused by name, and nothing in the folder changes
    code, _, err = _train(capsys, "--resume", str(run), "train.steps=6", "optim.lr=1e-2")
    assert code == 2 and "optim.lr cannot change on resume" in err and "train.steps" in err
    code, _, err = _train(capsys, "--resume", str(run), "train.steps=4", "train.eval_every=3")
    assert code == 0  # an unchanged train.steps is no extension; a cadence may change
    code, _, err = _train(capsys, "--resume", str(run), "train.steps=3")
    assert code == 2 and "train.steps=3: the checkpoint to resume from has 4 steps trained already" in err
    assert (run / "config.yaml").read_bytes() == config_before.replace(b"eval_every: 2", b"eval_every: 3")

    code, out, err = _train(capsys, "--resume", str(run), "train.steps=6", "train.eval_every=2")
    assert code == 0, err
    checkpoint = run / "checkpoints" / "step_000004"
    assert f"resuming {run} from checkpoint {checkpoint} (step 4); training to step 6; train.steps extended from 4" in (
        out
    )
    assert load_config(str(run / "config.yaml")).train.steps == 6
    assert without_timing(metrics_rows(run)) == without_timing(metrics_rows(straight))
    # a second extension continues from the first one's end
    code, out, err = _train(capsys, "--resume", str(run), "train.steps=7")
    assert code == 0, err
    assert f"from checkpoint {run / 'checkpoints' / 'step_000006'} (step 6)" in out
    assert [r["step"] for r in metrics_rows(run, "train")] == [1, 2, 3, 4, 5, 6, 7]
    assert load_config(str(run / "config.yaml")).train.steps == 7

    records = json.loads((run / "run_info.json").read_text())
    assert [r["kind"] for r in records] == ["start", "resume", "resume", "resume"]  # the refused ones wrote nothing
    assert [r["steps"] for r in records] == [4, 4, 6, 7]
    assert records[2]["resumed_from"] == {"checkpoint": "checkpoints/step_000004", "step": 4, "steps_before": 4}
    assert records[3]["resumed_from"]["step"] == 6
    first = records[0]
    assert first["argv"][:4] == ["rw", "train", "--quiet", "--out"] and "judge.api_key_env=<redacted>" in first["argv"]
    assert records[2]["argv"] == ["rw", "train", "--quiet", "--resume", str(run), "train.steps=6", "train.eval_every=2"]
    text = (run / "run_info.json").read_text()
    assert "MY_JUDGE_KEY" not in text and "sk-never-recorded" not in text
    assert first["versions"]["torch"] == torch.__version__
    assert first["versions"]["rwcore"] == metadata.version("rwcore")
    assert first["machine"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert first["machine"]["cpu_count"] == os.cpu_count() and first["machine"]["torch_threads"] >= 1
    root = Path(__file__).resolve().parents[2]
    if (root / ".git").exists():  # a checkout: the commit git itself names
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True)
        assert first["git"]["commit"] == head.stdout.strip()


def test_a_decaying_schedule_the_seed_and_the_trackers_cannot_change_on_resume(tmp_path):
    config = load_config(None, [*RUN, "optim.schedule=cosine"])
    save_config(config, tmp_path / "config.yaml")
    with pytest.raises(ValueError, match=r"decays to 0 at train.steps=4 \(optim.schedule=cosine\)"):
        resume_config(tmp_path / "config.yaml", ["train.steps=6"])
    for override in ("train.seed=1", "train.loggers=[tensorboard]", "model.lora.rank=8"):
        key = override.split("=")[0]
        with pytest.raises(ValueError, match=f"^{key} cannot change on resume"):
            resume_config(tmp_path / "config.yaml", ["train.steps=4", override])
    changed, before = resume_config(tmp_path / "config.yaml", ["train.checkpoint_every=2", "train.keep_checkpoints=1"])
    assert (changed.train.checkpoint_every, changed.train.keep_checkpoints, before) == (2, 1, 4)


def test_keep_checkpoints_keeps_the_newest_and_the_best_held_out(tmp_path, capsys):
    run = tmp_path / "run"
    code, _, err = _train(capsys, "--out", str(run), *RUN, "train.steps=5", "train.keep_checkpoints=2")
    assert code == 0, err
    evaluated = {r["step"]: r["eval/success_rate"] for r in metrics_rows(run, "eval") if 1 <= r["step"] <= 5}
    best = max(sorted(evaluated), key=lambda step: evaluated[step])  # the earliest of the highest
    assert _steps(run) == sorted({4, 5, best})
    assert (run / "checkpoints" / "latest").read_text() == "step_000005"
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.endswith(".tmp")]


def test_pruning_keeps_later_steps_links_and_staging_folders(tmp_path):
    """Hand-made folder: evaluations 0.5 at step 2, 0.25 at 4, 0.5 at 6 -> the best is step 2 (the earlier of a
    tie); keep 2 of the steps up to 6 -> 5 and 6; step 8 (a later, skipped one), a link and a staging folder stay."""
    checkpoints = tmp_path / "checkpoints"
    for step in (1, 2, 3, 4, 5, 6, 8):
        (checkpoints / f"step_{step:06d}").mkdir(parents=True)
        (checkpoints / f"step_{step:06d}" / "model.pt").write_bytes(b"x")
    (checkpoints / ".step_000007.tmp").mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (checkpoints / "step_000003_link").symlink_to(elsewhere)
    (checkpoints / "step_000000").symlink_to(elsewhere)
    rows = [{"kind": "eval", "step": s, "eval/success_rate": v} for s, v in ((2, 0.5), (4, 0.25), (6, 0.5))]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"torn')
    removed = prune_checkpoints(tmp_path, 2, 6)
    assert sorted(p.name for p in removed) == ["step_000001", "step_000003", "step_000004"]
    assert sorted(p.name for p in checkpoints.iterdir()) == [
        ".step_000007.tmp",
        "step_000000",
        "step_000002",
        "step_000003_link",
        "step_000005",
        "step_000006",
        "step_000008",
    ]
    assert elsewhere.is_dir()
    assert prune_checkpoints(tmp_path, 0, 6) == [] and prune_checkpoints(tmp_path, 1, 7) == []  # 0 = all; 7 missing


@pytest.mark.parametrize(
    "argv, shown",
    [
        (["judge.api_key=sk-1", "optim.lr=1e-3"], ["judge.api_key=<redacted>", "optim.lr=1e-3"]),
        (["--api-key", "sk-2", "--out", "x"], ["--api-key", "<redacted>", "--out", "x"]),
        (["--hf-token=hf_3"], ["--hf-token=<redacted>"]),
        (["env.options.partner_api_key_env=PARTNER"], ["env.options.partner_api_key_env=<redacted>"]),
        (["judge.base_url=http://alice:pw@127.0.0.1:9/v1"], ["judge.base_url=http://<redacted>@127.0.0.1:9/v1"]),
        (["OPENAI_PASSWORD=x", "train.steps=4"], ["OPENAI_PASSWORD=<redacted>", "train.steps=4"]),
    ],
)
def test_secrets_in_a_command_line_are_redacted(argv, shown):
    assert redact_argv(argv) == shown
