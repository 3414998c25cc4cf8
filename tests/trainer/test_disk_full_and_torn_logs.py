"""A full disk and a torn log end or resume a run with one line, never a traceback.

The full disk is real: `rw train` runs on a small tmpfs mounted in a user and mount namespace of its own
(`unshare -rm`), so the kernel answers ENOSPC (torch's zip writer turns it into
`RuntimeError: [enforce fail at inline_container.cc:...]`). A file-size limit (RLIMIT_FSIZE) gives the
same for one file with EFBIG. A torn log line is what a kill -9 or a power cut leaves mid-append."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _util import SMALL_LOOP, checkpoint_folder, metrics_rows, overrides_with, train_in_process, without_timing

from rwcore.trainer import cli

SMALL = overrides_with(
    SMALL_LOOP, "env.options.num_eval=4", "train.checkpoint_every=1", "train.method=rw_outcome_grpo", "train.steps=2"
)
PAGE = 4096


@pytest.fixture(scope="module")
def source_run(tmp_path_factory) -> Path:
    """A finished two-step run with checkpoints at steps 1 and 2 (tests copy it)."""
    folder = tmp_path_factory.mktemp("source") / "run"
    train_in_process(folder, SMALL)
    return folder


@pytest.fixture
def killed_after_step_1(source_run, tmp_path) -> Path:
    """The run as a kill during step 2 leaves it: step 1's checkpoint, step 2's rows already logged."""
    copy = tmp_path / "run"
    shutil.copytree(source_run, copy)
    shutil.rmtree(checkpoint_folder(copy, 2))
    (copy / "checkpoints" / "latest").write_text("step_000001")
    return copy


def _resume(run: Path, capsys) -> tuple[int, list[str]]:
    code = cli.main(["train", "--resume", str(run), "--quiet"])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, [line for line in err.splitlines() if line.strip()]


# ------------------------------------------------------------------------------------- torn logs

TORN = {
    "half a row, no newline": lambda row: row[: len(row) // 2],
    "half a row, then a newline": lambda row: row[: len(row) // 2] + "\n",
    "a JSON list": lambda row: "[1, 2]\n",
    "a JSON string": lambda row: '"step"\n',
    "null": lambda row: "null",
    "an object whose step is text": lambda row: '{"step": "2", "kind": "train"}\n',
    "bytes that are not UTF-8": lambda row: "\udcff\udcfe{",
}


@pytest.mark.parametrize("log", ["metrics.jsonl", "sampling.jsonl"])
@pytest.mark.parametrize("torn", sorted(TORN))
def test_a_torn_last_line_is_dropped_with_one_line_and_the_run_resumes_exactly(
    killed_after_step_1, source_run, capsys, log, torn
):
    path = killed_after_step_1 / log
    existing = path.read_text()
    last = (existing.splitlines() or ['{"step": 2, "kind": "train", "loss": 0.5}'])[-1]
    with open(path, "a", encoding="utf-8", errors="surrogateescape") as stream:
        stream.write(TORN[torn](last))
    code, lines = _resume(killed_after_step_1, capsys)
    assert code == 0, lines
    assert len(lines) == 1, lines
    assert str(path) in lines[0] and "last line" in lines[0] and "step 1" in lines[0]
    # resumed at step 1, step 2 trained again: the same rows as the uninterrupted run, no torn one
    assert without_timing(metrics_rows(killed_after_step_1)) == without_timing(metrics_rows(source_run))
    assert (killed_after_step_1 / log).read_text().count("\n") == (source_run / log).read_text().count("\n")


@pytest.mark.parametrize("damage", ["half a row, then a newline", "a JSON list", "an object whose step is text"])
def test_a_damaged_line_before_the_last_is_refused_naming_it_and_nothing_changes(killed_after_step_1, capsys, damage):
    metrics = killed_after_step_1 / "metrics.jsonl"
    lines = metrics.read_text().splitlines(keepends=True)
    lines.insert(1, TORN[damage](lines[0]).rstrip("\n") + "\n")
    metrics.write_text("".join(lines))
    before = {p.name: p.read_bytes() for p in killed_after_step_1.iterdir() if p.is_file()}
    code, err = _resume(killed_after_step_1, capsys)
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("rw: error:") and str(metrics) in err[0] and "line 2" in err[0]
    assert {p.name: p.read_bytes() for p in killed_after_step_1.iterdir() if p.is_file()} == before


# ------------------------------------------------------------------------------------- full disk


def _on_disk(folder: Path) -> int:
    """What the files under `folder` take on a tmpfs (each file rounded up to whole pages)."""
    return sum(-(-p.stat().st_size // PAGE) * PAGE for p in folder.rglob("*") if p.is_file())


def _train_in_namespace(out: Path, mount: Path, size: int, steps: int, limit: int | None = None):
    """`rw train` run as a user would, with `mount` a tmpfs of `size` bytes (or, with `limit`, no tmpfs
    and a file-size limit of `limit` bytes), in namespaces of its own: nothing is mounted on the host."""
    script = (
        "import os, resource, signal, subprocess, sys\n"
        f"limit = {limit!r}\n"
        "if limit is None:\n"
        f"    subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size={size}', 'tmpfs', {str(mount)!r}], check=True)\n"
        "else:\n"
        "    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))\n"
        "from rwcore.trainer.cli import main\n"
        f"sys.exit(main(['train', '--out', {str(out)!r}, '--quiet', *{[*SMALL[:-1], f'train.steps={steps}']!r}]))\n"
    )
    return subprocess.run(
        ["unshare", "-rm", sys.executable, "-c", script],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_real_full_disk_while_checkpointing_gives_one_line_naming_what_was_kept(source_run, tmp_path):
    """The tmpfs holds the run up to step 1 and half of step 2's checkpoint: step 2's write fails with a
    real ENOSPC, the run stops with one line naming the file, step 1 stays intact and resumes."""
    one_checkpoint = _on_disk(checkpoint_folder(source_run, 1))
    # what the run holds once step 1 is checkpointed, plus room for logs, then half a checkpoint more
    size = _on_disk(source_run) - _on_disk(checkpoint_folder(source_run, 2)) + 16 * PAGE + one_checkpoint // 2
    mount = tmp_path / "disk"
    mount.mkdir()
    out = mount / "run"
    done = _train_in_namespace(out, mount, size, steps=3)
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 1 and len(lines) == 1, done.stderr[-3000:]
    assert lines[0].startswith("rw: error: cannot write ") and "No space left on device" in lines[0]
    assert str(out / "checkpoints") in lines[0] and f"train --resume {out}" in lines[0]
    assert "step 2's checkpoint was not written; the latest checkpoint, step_000001, is intact" in lines[0]
    # the tmpfs is gone with the namespace; nothing was written on the host's folder
    assert not out.exists()


def test_a_file_size_limit_on_any_run_file_gives_one_line_naming_it(tmp_path):
    """EFBIG (the kernel's other answer to a write that cannot grow a file), at a limit below one
    checkpoint's model.pt: the run stops at its first write past the limit, naming that file."""
    out = tmp_path / "run"
    done = _train_in_namespace(out, tmp_path, 0, steps=2, limit=20_000)
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 1 and len(lines) == 1, done.stderr[-3000:]
    assert lines[0].startswith("rw: error: cannot write ") and "File too large" in lines[0]
    assert f"{out}/checkpoints/.step_000001.tmp/model.pt" in lines[0] and "the run has no checkpoint yet" in lines[0]
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]


@pytest.mark.parametrize("raised", [KeyboardInterrupt, SystemExit])
def test_an_interrupt_inside_torch_save_stays_an_interrupt(tmp_path, monkeypatch, raised):
    """Ctrl-C landing in the stream's write reaches torch's zip writer, which turns it into a RuntimeError;
    it must stay an interrupt (the run stops as interrupted), not become a 'cannot write' failure."""
    import io

    import torch

    from rwcore.trainer import checkpoint as ckpt

    class Interrupted(io.BytesIO):
        writes = 0

        def write(self, data):
            Interrupted.writes += 1
            if Interrupted.writes == 3:
                raise raised()
            return super().write(data)

    monkeypatch.setattr(ckpt, "open", lambda *args, **kwargs: Interrupted(), raising=False)
    with pytest.raises(raised):
        ckpt.save({"weight": torch.zeros(10_000)}, tmp_path / "model.pt", encoded=False)
