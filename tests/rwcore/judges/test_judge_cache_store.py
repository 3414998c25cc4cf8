"""The judge's verdict cache as one SQLite database: its layout and modes, one transaction per batch, the
size bound with least-recently-used eviction, compactness, concurrent writers (processes and threads), a
locked database, a damaged or foreign file at its path, entries of the old per-file layout, secrets (never
in its bytes, the write-ahead log included) and the config key that bounds it."""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import multiprocessing
import os
import pickle
import sqlite3
import stat
import threading

import pytest
from _util import chat_trajectory
from judge_server import (
    ChatServer,
    Reply,
    all_pass,
    diagnostics_line,
    loopback_without_proxy,  # noqa: F401 - autouse fixture
    verdict_line,
)

from rwcore.judges import OpenAIJudge
from rwcore.judges.cache import JudgmentCache, cache_key
from rwcore.types import RubricJudgment, RubricSpec, Trajectory
from rwcore.verdict import Verdict

KEY_ENV = "RWCORE_TEST_CACHE_STORE_KEY"
SECRET = "sk-cache-store-9Fv3-never-in-a-file"
DB = "verdicts.sqlite3"
EVIDENCE = "turn 3: the agent quoted order #48213 back to the user before calling issue_refund; the refund ran once."
RUBRICS = [
    RubricSpec("cites-order-id", "The agent cites the order id before issuing a refund."),
    RubricSpec("no-duplicate-calls", "The agent never issues the same refund twice."),
    RubricSpec("confirms-amount", "The agent states the refunded amount."),
]


@pytest.fixture
def umask_022():
    # A permissive umask, so that 0600 / 0700 can only come from the cache asking for them.
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def key_of(name, kind: str = "judgment") -> str:
    return cache_key(kind, model="m", rubric=f"r-{name}", trajectory="t")


def judgment(i: int = 0) -> RubricJudgment:
    return RubricJudgment("r", Verdict.PASS, score=0.5, confidence=0.9, evidence=f"{EVIDENCE} #{i}")


def trajectory(name: str = "t1") -> Trajectory:
    """A refund whose request names `name`: the cache keys a judgment on the trajectory's content."""
    return chat_trajectory(name, request=f"Refund order 1234 ({name}).")


def judge_over(server: ChatServer, folder, **options) -> OpenAIJudge:
    return OpenAIJudge(
        "judge-test",
        base_url=server.base_url,
        api_key_env=KEY_ENV,
        timeout=5.0,
        max_retries=0,
        cache_dir=folder,
        **options,
    )


def raw_bytes(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def wal_commits(path) -> int:
    """Commit frames in a write-ahead log (read from its bytes: the WAL header's salt, then frames of 24
    bytes of header and one page, a commit frame carrying the database size after it)."""
    data = path.read_bytes()
    page_size = int.from_bytes(data[8:12], "big")
    salt = data[16:24]
    commits = 0
    for offset in range(32, len(data) - 24 - page_size + 1, 24 + page_size):
        header = data[offset : offset + 24]
        if header[8:16] != salt:
            break
        commits += int.from_bytes(header[4:8], "big") != 0
    return commits


def in_thread(function, timeout: float = 20.0):
    """`function()` on a thread; fails the test when it has not returned within `timeout` seconds."""
    result: list = []
    errors: list = []

    def run():
        try:
            result.append(function())
        except BaseException as error:  # handed to the test
            errors.append(error)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout)
    assert not worker.is_alive(), "the call hung"
    if errors:
        raise errors[0]
    return result[0]


# ---- layout, modes, transactions ----------------------------------------------------------------


def test_the_cache_is_one_sqlite_database_in_wal_mode_created_0600_in_a_0700_folder(tmp_path, umask_022):
    folder = tmp_path / "new" / "cache"
    cache = JudgmentCache(folder)
    assert cache.put_judgment(key_of(0), judgment(0), model="m") is True
    assert cache.get_judgment(key_of(0), "relabelled") == RubricJudgment(
        "relabelled", Verdict.PASS, score=0.5, confidence=0.9, evidence=f"{EVIDENCE} #0"
    )
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    names = sorted(p.name for p in folder.iterdir())
    assert DB in names and set(names) <= {DB, DB + "-wal", DB + "-shm"}, names
    for name in names:
        assert stat.S_IMODE((folder / name).stat().st_mode) == 0o600, name
    with contextlib.closing(sqlite3.connect(folder / DB)) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_judge_stores_one_evaluation_in_one_transaction_and_hits_write_nothing(serve, key, tmp_path):
    server = serve(all_pass)
    folder = tmp_path / "cache"
    judge = judge_over(server, folder, rubrics_per_request=2)
    assert judge.cache.put_judgment(key_of("first"), judgment(), model="m")  # the database and its log exist
    before = wal_commits(folder / (DB + "-wal"))
    trajectories = [trajectory(f"t{i}") for i in range(4)]
    first = judge.evaluate(trajectories, RUBRICS)
    assert server.count == 8  # 4 trajectories x 2 requests of at most 2 rubrics
    assert wal_commits(folder / (DB + "-wal")) == before + 1  # 12 verdicts and 4 diagnostics: one commit
    second = judge.evaluate(trajectories, RUBRICS)
    assert server.count == 8 and [r.judgments for r in second] == [r.judgments for r in first]
    assert [r.uncovered for r in second] == [r.uncovered for r in first]
    assert wal_commits(folder / (DB + "-wal")) == before + 1  # reading is not writing


# ---- the bound, eviction, compactness -----------------------------------------------------------


def test_the_files_stay_under_the_bound_and_the_least_recently_used_entries_go_first(tmp_path):
    bound = 1 << 20
    cache = JudgmentCache(tmp_path, max_bytes=bound)
    keep, drop = key_of("keep"), key_of("drop")
    assert cache.put_batch(judgments=[(keep, judgment(-1)), (drop, judgment(-2))], model="m")
    inserted: list[str] = []
    largest = 0
    for batch in range(100):
        keys = [key_of(f"{batch}-{i}") for i in range(50)]
        assert cache.put_batch(judgments=[(k, judgment(i)) for i, k in enumerate(keys)], model="m")
        inserted += keys
        assert cache.get_judgment(keep, "r") is not None  # used again: the most recent entry now
        largest = max(largest, sum(p.stat().st_size for p in tmp_path.iterdir() if p.is_file()))
    assert largest <= bound, f"{largest} bytes on disk over a bound of {bound}"
    present = [k for k in inserted if cache.get_judgment(k, "r") is not None]
    assert cache.get_judgment(keep, "r") == judgment(-1)
    assert cache.get_judgment(drop, "r") is None  # the oldest entry, never used again: evicted
    assert 1500 <= len(present) < len(inserted)  # evicted, but in batches, not the whole cache
    assert present == inserted[-len(present) :]  # what went is the oldest


def test_an_entry_takes_a_small_multiple_of_its_data_on_disk(tmp_path):
    count = 2000
    cache = JudgmentCache(tmp_path)
    for i in range(count):
        cache.put_judgment(key_of(i), judgment(i), model="m")
    del cache
    gc.collect()  # the last connection closes: the log is folded into the database
    on_disk = sum(os.lstat(p).st_blocks * 512 for p in tmp_path.rglob("*"))
    # What an entry says: its 32-byte hash and its fields as compact JSON.
    data = 32 + len(
        json.dumps(
            {"verdict": "PASS", "score": 0.5, "confidence": 0.9, "evidence": f"{EVIDENCE} #1000", "model": "m"},
            separators=(",", ":"),
        )
    )
    assert on_disk / count <= 2.0 * data, f"{on_disk / count:.0f} bytes on disk per entry of {data} bytes"


def test_the_bound_is_checked(tmp_path):
    for bad in (0, -1, (1 << 20) - 1, 1.5, "256M", True):
        with pytest.raises(ValueError, match="max_bytes"):
            JudgmentCache(tmp_path, max_bytes=bad)
    assert JudgmentCache(tmp_path, max_bytes=1 << 20).max_bytes == 1 << 20


# ---- several writers -----------------------------------------------------------------------------


def _write_rounds(cache: JudgmentCache, tag: str, rounds: int, committed: list, errors: list, lock) -> None:
    for r in range(rounds):
        keys = [key_of(f"{tag}-{r}-{i}") for i in range(8)] + [key_of(f"shared-{r}")]
        try:
            stored = cache.put_batch(judgments=[(k, judgment(r)) for k in keys], model="m")
            cache.get_judgments([(k, "r") for k in keys])
        except BaseException as error:  # reported to the test
            with lock:
                errors.append(repr(error))
            return
        if stored:
            with lock:
                committed.extend(keys)


def _writers(cache: JudgmentCache, tag: str, threads: int, rounds: int) -> tuple[list, list]:
    committed: list = []
    errors: list = []
    lock = threading.Lock()
    workers = [
        threading.Thread(target=_write_rounds, args=(cache, f"{tag}-{t}", rounds, committed, errors, lock))
        for t in range(threads)
    ]
    _write_rounds(cache, f"{tag}-main", rounds, committed, errors, lock)  # the inherited connection's thread too
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return committed, errors


def _writer_process(cache: JudgmentCache, tag: str, out: str) -> None:
    committed, errors = _writers(cache, tag, threads=3, rounds=40)
    with open(out, "w") as stream:
        json.dump({"committed": committed, "errors": errors}, stream)


def test_two_processes_and_their_threads_lose_no_committed_entry_and_never_raise(tmp_path):
    folder = tmp_path / "cache"
    cache = JudgmentCache(folder, busy_timeout=30.0)
    assert cache.put_judgment(key_of("parent"), judgment(), model="m")  # an open connection the children inherit
    context = multiprocessing.get_context("fork")
    outs = [tmp_path / f"child{n}.json" for n in range(2)]
    children = [context.Process(target=_writer_process, args=(cache, f"p{n}", str(out))) for n, out in enumerate(outs)]
    for child in children:
        child.start()
    committed, errors = _writers(cache, "parent", threads=2, rounds=40)
    for child in children:
        child.join(120)
        assert child.exitcode == 0
    for out in outs:
        report = json.loads(out.read_text())
        committed += report["committed"]
        errors += report["errors"]
    assert errors == []
    attempted = (2 * 4 + 3) * 40 * 9  # (2 processes x (3 threads + main) + parent's 2 threads + main) x rounds x keys
    assert len(committed) == attempted
    fresh = JudgmentCache(folder)
    found = fresh.get_judgments([(k, "r") for k in set(committed)])
    assert set(found) == set(committed)
    assert all(j.verdict == Verdict.PASS and j.evidence.startswith(EVIDENCE) for j in found.values())
    with contextlib.closing(sqlite3.connect(folder / DB)) as raw:
        assert raw.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_a_locked_database_is_a_logged_skip_and_the_judge_goes_on(serve, key, tmp_path, caplog):
    folder = tmp_path / "cache"
    cache = JudgmentCache(folder, busy_timeout=0.2)
    assert cache.put_judgment(key_of(0), judgment(0), model="m")
    blocker = sqlite3.connect(folder / DB, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # another writer holds the write lock
    try:
        with caplog.at_level(logging.WARNING, logger="rwcore.judges"):
            assert in_thread(lambda: cache.put_judgment(key_of(1), judgment(1), model="m")) is False
        assert any("locked" in r.getMessage() for r in caplog.records)
        assert cache.get_judgment(key_of(0), "r") == judgment(0)  # readers do not wait for the writer
        server = serve(all_pass)
        judge = judge_over(server, folder, cache_busy_timeout=0.2)
        [report] = in_thread(lambda: judge.evaluate([trajectory()], RUBRICS[:1]))
        assert report.judgments[RUBRICS[0].rubric_id].verdict == Verdict.PASS and server.count == 1
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert cache.put_judgment(key_of(1), judgment(1), model="m") is True
    assert cache.get_judgment(key_of(1), "r") == judgment(1)


# ---- what can be found at the cache's path ---------------------------------------------------------


def _good_database(folder) -> None:
    cache = JudgmentCache(folder)
    assert cache.put_batch(judgments=[(key_of(i), judgment(i)) for i in range(400)], model="m")
    del cache
    gc.collect()


PATH_KINDS = [
    "not-a-database",
    "damaged-pages",
    "truncated",
    "symlink-to-good-database",
    "symlink-to-fifo",
    "fifo",
    "directory",
    "dev-zero",
    "wal-symlink",
    "wal-fifo",
]


@pytest.mark.parametrize("kind", PATH_KINDS)
def test_a_foreign_or_damaged_file_at_the_cache_path_is_one_logged_line_and_the_judge_asks(
    serve, key, tmp_path, caplog, kind
):
    folder = tmp_path / "cache"
    folder.mkdir()
    path = folder / DB
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    if kind == "not-a-database":
        path.write_bytes(b"a file someone keeps here\n" * 400)
    elif kind in ("damaged-pages", "truncated"):
        _good_database(folder)
        data = path.read_bytes()
        page = int.from_bytes(data[16:18], "big")
        assert len(data) >= 4 * page
        if kind == "damaged-pages":
            path.write_bytes(data[:page] + bytes(range(256)) * ((len(data) - page) // 256))
        else:
            path.write_bytes(data[: len(data) // 2])
    elif kind == "symlink-to-good-database":
        _good_database(elsewhere)
        path.symlink_to(elsewhere / DB)
    elif kind == "symlink-to-fifo":
        os.mkfifo(elsewhere / "pipe")
        path.symlink_to(elsewhere / "pipe")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "wal-symlink":
        (elsewhere / "log").write_bytes(b"")
        (folder / (DB + "-wal")).symlink_to(elsewhere / "log")
    elif kind == "wal-fifo":
        os.mkfifo(folder / (DB + "-wal"))
    before = {
        p.name: p.read_bytes() for p in elsewhere.iterdir() if p.is_file() and not stat.S_ISFIFO(p.stat().st_mode)
    }
    server = serve(all_pass)
    judge = judge_over(server, folder, diagnostics=False)
    with caplog.at_level(logging.WARNING, logger="rwcore.judges"):
        for round_ in (1, 2):
            [report] = in_thread(lambda: judge.evaluate([trajectory()], RUBRICS[:1]))
            assert report.judgments[RUBRICS[0].rubric_id].verdict == Verdict.PASS
            assert server.count == round_  # asked each time: the run goes on uncached
    lines = [r.getMessage() for r in caplog.records if "judge cache" in r.getMessage()]
    assert len(lines) == 1, lines
    assert str(folder) in lines[0] and SECRET not in lines[0]
    after = {p.name: p.read_bytes() for p in elsewhere.iterdir() if p.is_file() and not stat.S_ISFIFO(p.stat().st_mode)}
    assert after == before  # what a link points to is neither read into the cache nor written
    if kind == "not-a-database":
        assert path.read_bytes() == b"a file someone keeps here\n" * 400  # someone's file is left alone


def test_entries_of_the_per_file_layout_are_not_read_and_are_named_once(tmp_path, caplog):
    key_ = key_of("old")
    old = tmp_path / key_[:2] / f"{key_}.json"
    old.parent.mkdir()
    entry = {"format": 1, "key": key_, "kind": "judgment", "verdict": "FAIL", "score": None, "confidence": 0.9}
    old.write_text(json.dumps({**entry, "evidence": "from the old layout", "model": "m"}))
    with caplog.at_level(logging.WARNING, logger="rwcore.judges"):
        cache = JudgmentCache(tmp_path)
        assert cache.get_judgment(key_, "r") is None
        assert cache.put_judgment(key_, judgment(3), model="m")
        assert cache.get_judgment(key_, "r") == judgment(3)
    lines = [r.getMessage() for r in caplog.records if "per-file" in r.getMessage()]
    assert len(lines) == 1 and str(tmp_path) in lines[0], lines
    assert json.loads(old.read_text())["evidence"] == "from the old layout"  # left for the user to delete


# ---- secrets ---------------------------------------------------------------------------------------


def test_an_echoed_key_is_in_no_byte_of_the_database_or_its_log(serve, key, tmp_path):
    def script(request):
        lines = [
            verdict_line(request, rubric_id, evidence=f"turn 1: the header said {SECRET} for {rubric_id}")
            for rubric_id in request.rubric_ids
        ]
        if request.wants_diagnostics:
            lines.append(diagnostics_line(request, [f"turn 0: key {SECRET} seen"]))
        return Reply("\n".join(lines))

    server = serve(script)
    folder = tmp_path / "cache"
    judge = judge_over(server, folder)
    reports = judge.evaluate([trajectory(f"t{i}") for i in range(3)], RUBRICS)
    assert all("***" in j.evidence and SECRET not in j.evidence for r in reports for j in r.judgments.values())
    files = raw_bytes(folder)
    assert DB + "-wal" in files  # the entries are in the log now: it is read too
    assert all(SECRET.encode() not in data for data in files.values())
    assert b"***" in b"".join(files.values())
    judge.cache.close()
    files = raw_bytes(folder)
    assert files and all(SECRET.encode() not in data for data in files.values())


# ---- pickling and config ---------------------------------------------------------------------------


def test_a_used_cache_pickles_and_the_copy_reads_the_same_entries(tmp_path):
    cache = JudgmentCache(tmp_path, max_bytes=8 << 20)
    assert cache.put_judgment(key_of(0), judgment(0), model="m")
    copy = pickle.loads(pickle.dumps(cache))
    assert copy.max_bytes == 8 << 20 and copy.get_judgment(key_of(0), "r") == judgment(0)
    assert in_thread(lambda: copy.get_judgment(key_of(0), "r")) == judgment(0)


def test_the_config_key_bounds_the_judges_cache():
    from rwcore.trainer.config import load_config
    from rwcore.trainer.method_setup import build_judge

    base = ["judge.kind=openai", "judge.model=judge-test", "judge.base_url=http://127.0.0.1:9/v1"]
    cfg = load_config(None, [*base, "judge.cache_dir=/nonexistent/rw-cache"])
    assert cfg.judge.cache_max_bytes == 256 << 20
    assert build_judge(cfg, None).cache.max_bytes == 256 << 20
    judge = build_judge(
        load_config(None, [*base, "judge.cache_dir=/nonexistent/rw-cache", "judge.cache_max_bytes=8388608"]), None
    )
    assert judge.cache.max_bytes == 8 << 20
    assert build_judge(load_config(None, base), None).cache is None
    with pytest.raises(ValueError, match="judge.cache_max_bytes"):
        load_config(None, [*base, "judge.cache_max_bytes=0"])
