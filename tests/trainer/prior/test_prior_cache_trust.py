"""The reading prior's cache trusts only its user and survives a full disk (rwcore.trainer.prior).

Whoever can write the cache plants the weights every run starts from, so entries owned by another user, writable
by group or others, or reached through a symbolic link are refused with one line naming the path and the fix, and
left where they are. A lock file that is not a regular file is refused the same way. Too little free space stops
before pretraining; a write that fails anyway leaves no temporary and the run continues with the prior in memory.

Pretraining is replaced by a stand-in where only the cache matters. Another user's ownership is simulated by
reporting another uid for one inode in os.stat / os.lstat / os.fstat (chown needs root); the full disk by
`shutil.disk_usage` reporting little free space and by the writer failing partway through model.pt with ENOSPC
or with the RuntimeError torch's zip writer raises for a failed write.
"""

import contextlib
import errno
import hashlib
import io
import json
import os
import re
import shutil
import signal
import stat
from pathlib import Path

import pytest
import torch
from _util import PRIOR_RUN, TINY_PRIOR, prior_config

from rwcore.trainer import checkpoint as ckpt
from rwcore.trainer import cli, envs
from rwcore.trainer.config import load_config
from rwcore.trainer.prior import ensure_prior, prior_record, prior_spec
from rwcore.trainer.prior import pretrain as pretrain_module

ENV = envs.make("negotiation")
WEIGHTS = {"w": torch.arange(6, dtype=torch.float32)}


def entry_of(cache, *extra) -> Path:
    return Path(cache) / f"negotiation-{pretrain_module._key(prior_spec(prior_config(cache, *extra), ENV))}"


def stand_in(config, env, *, progress=True, log=None):
    """Pretraining's result without the training: fixed weights and a minimal report."""
    report = {"curve": [{"step": 1, "loss": 1.0}], "seconds": 0.0, "threads": 1, "machine": {}, "probe": {}}
    return {k: v.clone() for k, v in WEIGHTS.items()}, report


def no_pretraining(*args, **kwargs):
    raise AssertionError("pretrained although the cache should have been refused or used")


def build(monkeypatch, cache, *extra) -> Path:
    """A cached prior (of the stand-in's weights) in `cache`; returns its entry folder."""
    monkeypatch.setattr(pretrain_module, "pretrain", stand_in)
    prior = ensure_prior(prior_config(cache, *extra), ENV, progress=False, log=lambda line: None)
    assert prior.folder == entry_of(cache, *extra)
    return prior.folder


def snapshot(path: Path) -> dict:
    """Everything under `path` (links not followed): relative path -> (mode, bytes or link target)."""
    found = {}
    for folder, dirs, files in os.walk(path):
        for name in dirs + files:
            full = Path(folder) / name
            info = os.lstat(full)
            if stat.S_ISLNK(info.st_mode):
                found[str(full.relative_to(path))] = ("link", os.readlink(full))
            elif stat.S_ISREG(info.st_mode):
                found[str(full.relative_to(path))] = (stat.S_IMODE(info.st_mode), full.read_bytes())
            else:
                found[str(full.relative_to(path))] = (stat.S_IMODE(info.st_mode), stat.S_IFMT(info.st_mode))
    return found


def one_line_error(call) -> str:
    with pytest.raises(ValueError) as caught:
        call()
    message = str(caught.value)
    assert message and "\n" not in message, message
    return message


def run_cli(capsys, *argv) -> tuple[int, list[str]]:
    code = cli.main(list(argv))
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return code, [line for line in err.splitlines() if line.strip()]


def disguise_owner(monkeypatch, path: Path, uid: int) -> None:
    """os.stat, os.lstat and os.fstat report `uid` as the owner of `path`'s inode, as if another user owned it."""
    target = os.lstat(path)
    ident = (target.st_dev, target.st_ino)

    def wrap(real):
        def fake(*args, **kwargs):
            info = real(*args, **kwargs)
            if (info.st_dev, info.st_ino) != ident:
                return info
            fields = list(info[:10])
            fields[4] = uid
            return os.stat_result(fields)

        return fake

    for name in ("stat", "lstat", "fstat"):
        monkeypatch.setattr(os, name, wrap(getattr(os, name)))


@contextlib.contextmanager
def deadline(seconds: int):
    """Fails the test instead of hanging (a FIFO opened for writing blocks until a reader comes)."""

    def expire(signum, frame):
        pytest.fail(f"still blocked after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


# ---------------------------------------------------------------------------------------- created private


def test_the_cache_is_created_private_whatever_the_umask(tmp_path, monkeypatch):
    cache = tmp_path / "made" / "by" / "rw"
    previous = os.umask(0)
    try:
        entry = build(monkeypatch, cache)
    finally:
        os.umask(previous)
    for folder in (tmp_path / "made", tmp_path / "made" / "by", cache, entry):
        assert mode(folder) == 0o700, (folder, oct(mode(folder)))
    files = sorted(entry.iterdir()) + sorted(cache.glob(".*.lock"))
    assert [p.name for p in files][:3] == ["manifest.json", "model.pt", "prior.json"] and len(files) == 4
    for file in files:
        assert mode(file) == 0o600, (file, oct(mode(file)))


# ---------------------------------------------------------------------------------------- modes


@pytest.mark.parametrize(
    "where, bits",
    [
        ("root", 0o777),
        ("root", 0o775),
        ("root", 0o757),
        ("entry", 0o777),
        ("entry", 0o775),
        ("model.pt", 0o666),
        ("model.pt", 0o664),
        ("prior.json", 0o646),
        ("manifest.json", 0o664),
    ],
)
def test_a_group_or_other_writable_cache_is_refused_and_left_alone(tmp_path, monkeypatch, capsys, where, bits):
    cache = tmp_path / "cache"
    entry = build(monkeypatch, cache)
    # what anyone could do to a writable entry: other weights, and a manifest recomputed to match them
    torch.save({"w": torch.full((6,), 7.0)}, entry / "model.pt")
    (entry / ckpt.MANIFEST).unlink()
    ckpt.write_manifest(entry, 12)
    target = {"root": cache, "entry": entry}.get(where, entry / where)
    os.chmod(target, bits)
    before = snapshot(cache)
    monkeypatch.setattr(pretrain_module, "pretrain", no_pretraining)
    message = one_line_error(lambda: ensure_prior(prior_config(cache), ENV, progress=False, log=print))
    assert f"chmod go-w {target}" in message and f"{bits:04o}" in message, message
    code, lines = run_cli(capsys, "pretrain", "--quiet", *TINY_PRIOR, f"prior.cache_dir={cache}")
    assert code == 2 and len(lines) == 1 and lines[0] == f"rw: error: {message}", lines
    assert snapshot(cache) == before


@pytest.mark.parametrize("folders, files", [(0o700, 0o600), (0o755, 0o644), (0o750, 0o640), (0o500, 0o400)])
def test_a_cache_only_its_user_can_write_is_used(tmp_path, monkeypatch, folders, files):
    """Readable by others is fine (the weights are no secret, as a public key is not); writable is not."""
    cache = tmp_path / "cache"
    entry = build(monkeypatch, cache)
    for file in entry.iterdir():
        os.chmod(file, files)
    os.chmod(entry, folders)
    os.chmod(cache, folders | 0o200)  # the lock file is created in the root: its user writes it
    monkeypatch.setattr(pretrain_module, "pretrain", no_pretraining)
    prior = ensure_prior(prior_config(cache), ENV, progress=False, log=print)
    assert prior.folder == entry and torch.equal(prior.state_dict["w"], WEIGHTS["w"])
    os.chmod(entry, 0o700)


# ---------------------------------------------------------------------------------------- owners


@pytest.mark.parametrize("where", ["root", "entry", "model.pt", "manifest.json"])
def test_a_cache_owned_by_another_user_is_refused_and_left_alone(tmp_path, monkeypatch, capsys, where):
    cache = tmp_path / "cache"
    entry = build(monkeypatch, cache)
    target = {"root": cache, "entry": entry}.get(where, entry / where)
    other = os.geteuid() + 4242
    before = snapshot(cache)
    disguise_owner(monkeypatch, target, other)
    monkeypatch.setattr(pretrain_module, "pretrain", no_pretraining)
    for rebuild in (False, True):
        message = one_line_error(
            lambda: ensure_prior(prior_config(cache), ENV, rebuild=rebuild, progress=False, log=print)
        )
        assert str(target) in message and f"uid {other}" in message, message
        assert "RWCORE_CACHE" in message and "prior.cache_dir" in message, message
    code, lines = run_cli(capsys, "pretrain", "--quiet", *TINY_PRIOR, f"prior.cache_dir={cache}")
    assert code == 2 and len(lines) == 1 and lines[0] == f"rw: error: {message}", lines
    monkeypatch.undo()
    assert snapshot(cache) == before


# ---------------------------------------------------------------------------------------- links


@pytest.mark.parametrize("damaged", [False, True])
def test_a_symlinked_entry_is_refused_and_not_followed(tmp_path, monkeypatch, capsys, damaged):
    cache = tmp_path / "cache"
    entry = build(monkeypatch, cache)
    elsewhere = tmp_path / "elsewhere"
    entry.rename(elsewhere)
    if damaged:
        data = bytearray((elsewhere / "model.pt").read_bytes())
        data[len(data) // 2] ^= 0xFF
        (elsewhere / "model.pt").write_bytes(bytes(data))
    entry.symlink_to(elsewhere, target_is_directory=True)
    before, outside = snapshot(cache), snapshot(elsewhere)
    monkeypatch.setattr(pretrain_module, "pretrain", no_pretraining)
    for rebuild in (False, True):
        message = one_line_error(
            lambda: ensure_prior(prior_config(cache), ENV, rebuild=rebuild, progress=False, log=print)
        )
        assert str(entry) in message and "symbolic link" in message, message
    code, lines = run_cli(capsys, "pretrain", "--quiet", *TINY_PRIOR, f"prior.cache_dir={cache}")
    assert code == 2 and len(lines) == 1 and lines[0] == f"rw: error: {message}", lines
    assert snapshot(cache) == before and snapshot(elsewhere) == outside


def test_a_symlinked_root_is_refused_but_a_linked_folder_above_it_is_not(tmp_path, monkeypatch):
    real = tmp_path / "real" / "cache"
    entry = build(monkeypatch, real)
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    before = snapshot(real)
    monkeypatch.setattr(pretrain_module, "pretrain", no_pretraining)
    message = one_line_error(lambda: ensure_prior(prior_config(link), ENV, progress=False, log=print))
    assert str(link) in message and "symbolic link" in message, message
    assert snapshot(real) == before
    # a link above the root (macOS's /tmp is one) is followed: the root itself is checked
    (tmp_path / "alias").symlink_to(tmp_path / "real", target_is_directory=True)
    prior = ensure_prior(prior_config(tmp_path / "alias" / "cache"), ENV, progress=False, log=print)
    assert torch.equal(prior.state_dict["w"], WEIGHTS["w"]) and prior.folder.name == entry.name


# ---------------------------------------------------------------------------------------- lock file


@pytest.mark.parametrize("kind", ["fifo", "symlink", "directory"])
def test_a_lock_file_that_is_not_a_regular_file_is_refused(tmp_path, monkeypatch, capsys, kind):
    cache = tmp_path / "cache"
    entry = build(monkeypatch, cache)
    lock = cache / f".{entry.name}.lock"
    lock.unlink()
    through = tmp_path / "created-through-the-link"
    if kind == "fifo":
        os.mkfifo(lock, 0o600)
    elif kind == "symlink":
        lock.symlink_to(through)
    else:
        lock.mkdir(mode=0o700)
    before = snapshot(cache)
    monkeypatch.setattr(pretrain_module, "pretrain", no_pretraining)
    with deadline(60):
        message = one_line_error(lambda: ensure_prior(prior_config(cache), ENV, progress=False, log=print))
        code, lines = run_cli(capsys, "pretrain", "--quiet", *TINY_PRIOR, f"prior.cache_dir={cache}")
    assert str(lock) in message, message
    assert code == 2 and len(lines) == 1 and lines[0] == f"rw: error: {message}", lines
    assert snapshot(cache) == before and not through.exists()


# ---------------------------------------------------------------------------------------- not a folder


@pytest.mark.parametrize("where", ["cache_dir", "above"])
def test_a_cache_dir_that_is_a_file_is_one_line(tmp_path, monkeypatch, capsys, where):
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"mine")
    cache = blocker if where == "cache_dir" else blocker / "priors"
    monkeypatch.setattr(pretrain_module, "pretrain", no_pretraining)
    code, lines = run_cli(capsys, "pretrain", "--quiet", *TINY_PRIOR, f"prior.cache_dir={cache}")
    assert code == 2 and len(lines) == 1 and lines[0].startswith("rw: error: ") and str(cache) in lines[0], lines
    assert blocker.read_bytes() == b"mine"


def test_stale_temporaries_that_are_not_ours_are_left_alone(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    name = entry_of(cache).name
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_bytes(b"keep")
    (cache / f".{name}.111.tmp").symlink_to(victim, target_is_directory=True)
    foreign = cache / f".{name}.222.tmp"
    foreign.mkdir()
    (foreign / "theirs").write_bytes(b"theirs")
    (cache / f".{name}.333.tmp").mkdir()  # ours: what a killed build left
    disguise_owner(monkeypatch, foreign, os.geteuid() + 4242)
    build(monkeypatch, cache)
    assert (victim / "precious").read_bytes() == b"keep" and (cache / f".{name}.111.tmp").is_symlink()
    assert (foreign / "theirs").read_bytes() == b"theirs"
    assert not (cache / f".{name}.333.tmp").exists()


# ---------------------------------------------------------------------------------------- full disk


def free_space(monkeypatch, free: int) -> None:
    def usage(path):
        assert os.path.exists(path), path
        return shutil._ntuple_diskusage(10**12, 10**12 - free, free)

    monkeypatch.setattr(shutil, "disk_usage", usage)


def needed_bytes(message: str, root: Path, free: int) -> int:
    assert str(root) in message and f"{free} bytes free" in message, message
    assert "RWCORE_CACHE" in message and "prior.cache_dir" in message, message
    return int(re.search(r"needs (?:about )?(\d+) bytes", message).group(1))


def test_too_little_free_space_stops_before_pretraining(tmp_path, monkeypatch, capsys):
    measured = tmp_path / "measured"  # a real tiny prior, to see what an entry of this config weighs on disk
    ensure_prior(prior_config(measured), ENV, progress=False, log=lambda line: None)
    size = sum(f.stat().st_size for f in next(measured.glob("negotiation-*")).iterdir())
    cache = tmp_path / "cache"
    free_space(monkeypatch, 4096)
    monkeypatch.setattr(pretrain_module, "pretrain", no_pretraining)
    message = one_line_error(lambda: ensure_prior(prior_config(cache), ENV, progress=False, log=print))
    assert needed_bytes(message, cache, 4096) >= 2 * size
    code, lines = run_cli(capsys, "pretrain", "--quiet", *TINY_PRIOR, f"prior.cache_dir={cache}")
    assert code == 2 and len(lines) == 1 and lines[0] == f"rw: error: {message}", lines
    assert not list(cache.glob("negotiation-*")) and not list(cache.glob("*.tmp"))
    free_space(monkeypatch, 10**11)  # with room, the same call builds
    assert build(monkeypatch, cache).is_dir()


def test_the_free_space_needed_covers_the_default_model_twice(tmp_path, monkeypatch):
    from rwcore.trainer.policy import WordCodec, build_model

    # another seed than the default's, whose prior ships (and so needs no space): the same model
    default = load_config(None, ["prior.seed=1", f"prior.cache_dir={tmp_path / 'cache'}"])
    m = default.model
    model = build_model(
        len(WordCodec(ENV.vocabulary())),
        m.hidden_size,
        m.num_layers,
        m.num_heads,
        m.intermediate_size,
        m.max_length,
        0,
        m.tie_embeddings,
        m.head_dim,
    )
    weights = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    free_space(monkeypatch, 0)
    monkeypatch.setattr(pretrain_module, "pretrain", no_pretraining)
    message = one_line_error(lambda: ensure_prior(default, ENV, progress=False, log=print))
    assert needed_bytes(message, tmp_path / "cache", 0) >= 2 * weights


DISK_FULL = [
    OSError(errno.ENOSPC, "No space left on device"),
    RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"),
]


def fail_writing_into(monkeypatch, cache: Path, error: BaseException) -> None:
    """torch.save into the cache writes a part of the file, then fails as on a full disk (elsewhere it works)."""
    real = torch.save

    def save(obj, f, *args, **kwargs):
        name = str(getattr(f, "name", f))
        if not name.startswith(str(cache)):
            return real(obj, f, *args, **kwargs)
        f.write(b"PK\x03\x04" + bytes(600))
        raise error

    monkeypatch.setattr(torch, "save", save)


@pytest.mark.parametrize("error", DISK_FULL, ids=["ENOSPC", "torch-RuntimeError"])
def test_a_write_that_fails_keeps_the_prior_in_memory_and_leaves_no_temporary(tmp_path, monkeypatch, capsys, error):
    cache = tmp_path / "cache"
    sibling = build(monkeypatch, cache, "prior.seed=1")  # another key's entry: must stay as it is
    before = snapshot(sibling)
    expected = io.BytesIO()
    torch.save(WEIGHTS, expected)
    fail_writing_into(monkeypatch, cache, error)
    lines = []
    prior = ensure_prior(prior_config(cache), ENV, progress=False, log=lines.append)
    building, *lines = lines  # the line that says why the prior is built, then the failure's one line
    assert building.startswith("rw: building the reading prior ")
    assert prior.folder is None and torch.equal(prior.state_dict["w"], WEIGHTS["w"])
    assert len(lines) == 1 and "could not cache" in lines[0] and str(cache) in lines[0], lines
    assert "\n" not in lines[0] and "RWCORE_CACHE" in lines[0], lines
    record = prior_record(prior)
    assert record["folder"] is None and record["model_sha256"] == hashlib.sha256(expected.getvalue()).hexdigest()
    names = sorted(p.name for p in cache.iterdir())
    assert names == sorted([sibling.name, f".{sibling.name}.lock", f".{entry_of(cache).name}.lock"]), names
    assert snapshot(sibling) == before
    # rw pretrain exists to cache the prior: there the failed write is the error, one line
    code, err = run_cli(capsys, "pretrain", "--quiet", *TINY_PRIOR, f"prior.cache_dir={cache}")
    assert code == 2 and len(err) == 2 and err[0].startswith("rw: building the reading prior "), err
    assert err[1].startswith("rw: error: ") and str(cache) in err[1], err
    assert sorted(p.name for p in cache.iterdir()) == names


def test_a_failed_manifest_write_leaves_no_temporary(tmp_path, monkeypatch):
    cache = tmp_path / "cache"

    def full(folder, step):
        (Path(folder) / ckpt.MANIFEST).write_bytes(b"{")
        raise OSError(errno.ENOSPC, "No space left on device", str(Path(folder) / ckpt.MANIFEST))

    monkeypatch.setattr(pretrain_module, "pretrain", stand_in)
    monkeypatch.setattr(ckpt, "write_manifest", full)
    lines = []
    prior = ensure_prior(prior_config(cache), ENV, progress=False, log=lines.append)
    building, *lines = lines  # the line that says why the prior is built, then the failure's one line
    assert building.startswith("rw: building the reading prior ")
    assert prior.folder is None and torch.equal(prior.state_dict["w"], WEIGHTS["w"])
    assert len(lines) == 1 and "No space left on device" in lines[0] and str(cache) in lines[0], lines
    assert [p.name for p in cache.iterdir()] == [f".{entry_of(cache).name}.lock"]


def test_rw_train_continues_with_the_prior_in_memory_when_the_cache_is_full(tmp_path, monkeypatch, capsys):
    cache = tmp_path / "cache"
    fail_writing_into(monkeypatch, cache, DISK_FULL[0])
    run = tmp_path / "run"
    small_run = [*PRIOR_RUN, "train.method=outcome_only"]
    code = cli.main(["train", "--out", str(run), "--quiet", *TINY_PRIOR, f"prior.cache_dir={cache}", *small_run])
    err = capsys.readouterr().err
    assert code == 0 and "Traceback" not in err, err
    warned = [line for line in err.splitlines() if "could not cache" in line]
    assert len(warned) == 1 and str(cache) in warned[0], err
    record = json.loads((run / "prior.json").read_text())
    assert record["folder"] is None and re.fullmatch(r"[0-9a-f]{64}", record["model_sha256"])
    assert not list(cache.glob("negotiation-*")) and not list(cache.glob("*.tmp"))
