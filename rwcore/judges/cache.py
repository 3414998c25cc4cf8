"""On-disk cache of judgments, keyed by (model, rubric content, trajectory content, prompt).

One SQLite database, `<dir>/verdicts.sqlite3`, in WAL mode (`synchronous=NORMAL`: a commit is not
synced, a power cut may lose the last commits but never damages the database). A row holds the key's
32-byte hash, the entry as compact JSON, its size and when it was last used. An entry holds only the
judgment (or the diagnostics) and the model's name — no prompt text, no server address, no key (the
judge redacts answers before they are stored). Only PASS / FAIL / NA are stored: INVALID is a failure of
this attempt, and the next evaluation should try again.

Batches: `get_judgments` / `get_uncovered_many` read many keys in one query, `put_batch` writes many
entries in one transaction (the judge stores all the verdicts of one `evaluate` at once).

Size: `max_bytes` (at least 1 MiB; there is no unbounded setting) bounds the cache's files (database,
write-ahead log, shared-memory index) between writes. A write that leaves the log over 1/16 of the bound
(64 KiB to 4 MiB) folds it into the database and empties it; the database is kept under what is left:
when a write would pass that, it first deletes the least recently used entries, in one go, down to about
1% of the bound below it, and their pages are reused by later entries. While a write is under way the log
also holds the pages it changes (about one per entry added or evicted: some 2 MB for 288 verdicts), which
the bound does not cover. A hit counts as a use; uses are written with the next write (or every 4096
hits), not on every read. An entry takes about 340 bytes on disk.

Concurrency: each thread and process opens its own connection (a connection inherited over fork is
never used); writers wait for each other up to `busy_timeout` seconds. A database that stays locked
longer, a full disk or another passing error is logged and costs only this lookup (a miss) or this write
(skipped).

A cache is a cache. An entry that cannot be read (not JSON, not UTF-8, nested too deep, larger than
`MAX_ENTRY_BYTES`, not an object), of another format or kind, or holding a value out of range (a score
or confidence outside [0, 1] or not finite, an unknown verdict, text that is not text) is a miss, logged
once per lookup; the next result for its key replaces it. What is at the database's path (or its `-wal`
/ `-shm` companions) is checked before SQLite opens it: anything but a regular file (a symlink, FIFO,
directory, device) is refused, as is a file that is not one of these databases (not SQLite, another
schema, a damaged page found later): one logged line, and this cache object answers every lookup with a
miss from then on (the run goes on uncached; the file is left as it is).

Entries of the earlier layout (one JSON file per entry in two-character folders) are not read; their
folders are named once in the log so they can be deleted.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import sqlite3
import stat
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from urllib.parse import quote

from rwcore.types import RubricJudgment
from rwcore.verdict import Verdict

logger = logging.getLogger("rwcore.judges")

CACHE_FORMAT = 2
"""Of the keys and the entries; 1 was the per-file layout."""
DATABASE_NAME = "verdicts.sqlite3"
DEFAULT_MAX_BYTES = 256 << 20
MIN_MAX_BYTES = 1 << 20
MAX_ENTRY_BYTES = 256 << 10
"""An entry is a verdict and a short evidence string, or at most 32 notes of 1,000 characters; anything
larger is not one of ours."""

_SCHEMA_VERSION = 1
_SCHEMA = (
    "CREATE TABLE verdicts (id INTEGER PRIMARY KEY, key BLOB NOT NULL UNIQUE, used INTEGER NOT NULL, "
    "size INTEGER NOT NULL, value BLOB NOT NULL)",
    "CREATE INDEX verdicts_used ON verdicts (used)",
)
_OBJECTS = {("table", "verdicts"), ("index", "sqlite_autoindex_verdicts_1"), ("index", "verdicts_used")}
_TOUCH_FLUSH = 4096
_CHUNK = 500  # keys per statement, well under SQLite's limit on bound parameters
_HEX_KEY = re.compile(r"[0-9a-f]{64}")
_OLD_FOLDER = re.compile(r"[0-9a-f]{2}")
# Errors after which the file is not worth asking again; anything else (locked, full, I/O) may pass.
_PERMANENT = ("SQLITE_CORRUPT", "SQLITE_NOTADB")
# Connections inherited over fork: closing one in the child could disturb the parent's locks and log,
# so they are kept here, unused, for the life of the child.
_INHERITED: list[sqlite3.Connection] = []


class _Refused(Exception):
    """The file at the cache's path is not a database this cache may use."""


def cache_key(kind: str, **parts: str) -> str:
    """sha256 over `kind` and the named parts (sorted), e.g. model, rubric hash, trajectory hash."""
    payload = json.dumps({"format": CACHE_FORMAT, "kind": kind, **parts}, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(payload.encode()).hexdigest()


def _key_bytes(key: str) -> bytes:
    # A cache_key is 64 hex digits: stored as its 32 bytes (every row holds it twice, table and index).
    return bytes.fromhex(key) if _HEX_KEY.fullmatch(key) else key.encode()


def _unit_or_none(value) -> bool:
    return value is None or (
        isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and 0.0 <= value <= 1.0
    )


def _judgment_problem(entry: dict) -> str | None:
    """Why a stored judgment cannot be used as one, or None when it can."""
    verdict = entry.get("verdict")
    if verdict not in ("PASS", "FAIL", "NA"):
        return f"verdict {verdict!r} is not PASS, FAIL or NA"
    if not _unit_or_none(entry.get("score")):
        return f"score {entry.get('score')!r} is not a number in [0, 1]"
    if verdict == "NA" and entry.get("score") is not None:
        return "an NA verdict with a score"
    if not _unit_or_none(entry.get("confidence")):
        return f"confidence {entry.get('confidence')!r} is not a number in [0, 1]"
    if not isinstance(entry.get("evidence", ""), str):
        return "evidence is not text"
    return None


def _check_max_bytes(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < MIN_MAX_BYTES:
        raise ValueError(f"max_bytes must be a whole number of bytes, at least {MIN_MAX_BYTES} (1 MiB), got {value!r}")
    return value


def _check_busy_timeout(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"busy_timeout must be a positive number of seconds, got {value!r}")
    return float(value)


def _file_kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISLNK, "a symlink"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a device"),
        (stat.S_ISBLK, "a device"),
    ):
        if test(mode):
            return name
    return "not a regular file"


class JudgmentCache:
    """Judgments and diagnostics in `<directory>/verdicts.sqlite3` (the folder is created 0700 and the
    file 0600 when missing), at most `max_bytes` on disk; writers wait up to `busy_timeout` seconds
    for each other."""

    def __init__(
        self, directory: str | os.PathLike, max_bytes: int = DEFAULT_MAX_BYTES, *, busy_timeout: float = 5.0
    ) -> None:
        try:
            self.directory = Path(directory)
        except TypeError:
            raise ValueError(f"cache_dir must be a path, got {directory!r}") from None
        if self.directory.exists() and not self.directory.is_dir():
            raise ValueError(f"cache_dir {str(self.directory)!r} exists and is not a directory")
        self.max_bytes = _check_max_bytes(max_bytes)
        self.busy_timeout = _check_busy_timeout(busy_timeout)
        self._reset()

    def _reset(self) -> None:
        self.path = self.directory / DATABASE_NAME
        # Between writes the log holds at most 1/16 of the bound (64 KiB to 4 MiB; a write that leaves more
        # folds it into the database and empties it) and the shared-memory index beside it 32 KiB; the
        # database gets the rest.
        self._log_limit = min(4 << 20, max(64 << 10, self.max_bytes // 16))
        self._database_limit = self.max_bytes - self._log_limit - (64 << 10)
        self._local = threading.local()
        self._lock = threading.Lock()
        self._touched: dict[bytes, None] = {}
        self._refused: str | None = None
        self._folder_checked = False

    def __getstate__(self) -> dict:
        # Connections, locks and pending uses belong to this process; a copy opens its own.
        return {"directory": self.directory, "max_bytes": self.max_bytes, "busy_timeout": self.busy_timeout}

    def __setstate__(self, state: dict) -> None:
        self.directory = state["directory"]
        self.max_bytes = state["max_bytes"]
        self.busy_timeout = state["busy_timeout"]
        self._reset()

    def __repr__(self) -> str:
        return f"JudgmentCache({str(self.directory)!r}, max_bytes={self.max_bytes})"

    # ---- connections --------------------------------------------------------------------------

    def _connection(self) -> sqlite3.Connection | None:
        """This thread's connection (opened on first use); None when the cache is refused or cannot be
        opened now."""
        if self._refused is not None:
            return None
        local = self._local
        connection = getattr(local, "connection", None)
        if connection is not None:
            if local.pid == os.getpid():
                return connection
            _INHERITED.append(connection)
            local.connection = None
        try:
            connection = self._open()
        except _Refused as refusal:
            self._refuse(str(refusal))
            return None
        except OSError as error:  # the folder or the file cannot be made: asking again would not help
            self._refuse(f"{self.path} cannot be opened ({error})")
            return None
        except sqlite3.Error as error:
            if self._permanent(error):
                self._refuse(f"{self.path} cannot be used ({error})")
            else:
                logger.warning("judge cache: cannot open %s now (%s); a miss", self.path, error)
            return None
        local.connection = connection
        local.pid = os.getpid()
        return connection

    def _open(self) -> sqlite3.Connection:
        self._check_folder()
        for suffix in ("", "-wal", "-shm"):
            path = f"{self.path}{suffix}"
            try:
                mode = os.lstat(path).st_mode
            except FileNotFoundError:
                continue
            if not stat.S_ISREG(mode):
                raise _Refused(f"{path} is {_file_kind(mode)}, not a regular file")
        try:
            # Created here, not by SQLite, so that it is 0600 whatever the umask (the log and the index
            # beside it take its mode) and a symlink put there meanwhile is not followed.
            os.close(os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
        except FileExistsError:
            pass
        connection = sqlite3.connect(
            f"file:{quote(str(self.path))}?mode=rw",
            uri=True,
            timeout=self.busy_timeout,
            isolation_level=None,
            check_same_thread=False,
        )
        try:
            self._configure(connection)
        except BaseException:
            connection.close()
            raise
        return connection

    def _check_folder(self) -> None:
        """Creates the folder (0700) when missing; names entries of the per-file layout once."""
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self._folder_checked:
            return
        self._folder_checked = True
        try:
            with os.scandir(self.directory) as entries:
                old = [e.name for e in entries if _OLD_FOLDER.fullmatch(e.name) and e.is_dir(follow_symlinks=False)]
        except OSError:
            return
        if old:
            logger.warning(
                "judge cache: %s holds %d folder(s) of per-file entries (e.g. %s/), which this version does not "
                "read; delete them to free their space",
                self.directory,
                len(old),
                sorted(old)[0],
            )

    def _configure(self, connection: sqlite3.Connection) -> None:
        connection.execute("PRAGMA trusted_schema = OFF")
        mode = connection.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise _Refused(f"{self.path} cannot be put in WAL mode (it is in {mode!r} mode)")
        page_size = connection.execute("PRAGMA page_size").fetchone()[0]
        for pragma in (
            "synchronous = NORMAL",
            # An overwritten entry's old bytes are zeroed in the pages written anyway.
            "secure_delete = FAST",
            f"wal_autocheckpoint = {max(1, self._log_limit // page_size)}",
            f"journal_size_limit = {self._log_limit}",
        ):
            connection.execute(f"PRAGMA {pragma}")
        version = connection.execute("PRAGMA user_version").fetchone()[0]
        if version == 0:
            connection.execute("BEGIN IMMEDIATE")
            try:
                # Another process may have made it meanwhile; anything else in the file is not ours.
                version = connection.execute("PRAGMA user_version").fetchone()[0]
                if version == 0:
                    if connection.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
                        raise _Refused(f"{self.path} is a database of something else")
                    for statement in _SCHEMA:
                        connection.execute(statement)
                    connection.execute(f"PRAGMA user_version = {_SCHEMA_VERSION}")
                    version = _SCHEMA_VERSION
                connection.execute("COMMIT")
            except BaseException:
                connection.rollback()
                raise
        if version != _SCHEMA_VERSION:
            raise _Refused(f"{self.path} has schema version {version}; this version reads {_SCHEMA_VERSION}")
        objects = set(connection.execute("SELECT type, name FROM sqlite_master").fetchall())
        if objects != _OBJECTS:
            raise _Refused(f"{self.path} holds other tables, indexes, views or triggers than a verdict cache")

    @staticmethod
    def _permanent(error: BaseException) -> bool:
        name = getattr(error, "sqlite_errorname", "") or ""
        return isinstance(error, sqlite3.DatabaseError) and (
            name.startswith(_PERMANENT) or type(error) is sqlite3.DatabaseError
        )

    def _refuse(self, reason: str) -> None:
        with self._lock:
            if self._refused is not None:
                return
            self._refused = reason
        logger.warning(
            "judge cache: %s; the run goes on without a cache (move the file away to start a new one)", reason
        )
        self.close()

    def _failed(self, action: str, error: sqlite3.Error) -> None:
        if self._permanent(error):
            self._refuse(f"{self.path} cannot be used ({error})")
        else:
            logger.warning("judge cache: could not %s in %s (%s)", action, self.path, error)

    def close(self) -> None:
        """Writes the uses of hits not written yet and closes this thread's connection (another call
        opens a new one)."""
        if self._refused is None and self._touched:
            self._write([], "record uses")
        connection = getattr(self._local, "connection", None)
        self._local.connection = None
        if connection is None:
            return
        if getattr(self._local, "pid", None) != os.getpid():
            _INHERITED.append(connection)
            return
        try:
            connection.close()
        except sqlite3.Error as error:
            logger.warning("judge cache: closing %s: %s", self.path, error)

    # ---- reading --------------------------------------------------------------------------------

    def _fetch(self, keys: Iterable[str]) -> dict[str, dict]:
        """The entries stored for `keys` (one query per 500 keys), each checked to be an object of this
        format; unreadable ones are logged and left out."""
        wanted = {_key_bytes(key): key for key in keys}
        connection = self._connection()
        if connection is None or not wanted:
            return {}
        rows = []
        blobs = list(wanted)
        try:
            for start in range(0, len(blobs), _CHUNK):
                chunk = blobs[start : start + _CHUNK]
                rows += connection.execute(
                    "SELECT key, CASE WHEN length(value) > ? THEN NULL ELSE value END, length(value) FROM verdicts "
                    f"WHERE key IN ({','.join('?' * len(chunk))})",
                    (MAX_ENTRY_BYTES, *chunk),
                ).fetchall()
        except sqlite3.Error as error:
            self._failed("look entries up (a miss)", error)
            return {}
        found: dict[str, dict] = {}
        for blob, value, length in rows:
            key = wanted.get(blob)
            if key is None:
                continue
            if value is None and isinstance(length, int) and length > MAX_ENTRY_BYTES:
                logger.warning(
                    "judge cache: ignoring entry %s of %d bytes (at most %d); a miss", key, length, MAX_ENTRY_BYTES
                )
                continue
            try:
                if not isinstance(value, (bytes, str)):
                    raise ValueError(f"a {type(value).__name__}, not JSON text")
                entry = json.loads(value)
            except (ValueError, RecursionError) as error:
                logger.warning("judge cache: ignoring unreadable entry %s (%s); a miss", key, str(error)[:200])
                continue
            if not isinstance(entry, dict) or entry.get("format") != CACHE_FORMAT:
                logger.warning(
                    "judge cache: ignoring entry %s, which is not an entry of format %d; a miss", key, CACHE_FORMAT
                )
                continue
            found[key] = entry
        return found

    def _used(self, keys: Iterable[str]) -> None:
        with self._lock:
            for key in keys:
                self._touched[_key_bytes(key)] = None
            flush = len(self._touched) >= _TOUCH_FLUSH
        if flush:
            self._write([], "record uses")

    def get_judgments(self, wanted: Iterable[tuple[str, str]]) -> dict[str, RubricJudgment]:
        """The stored judgments for (key, rubric_id) pairs, by key, each relabelled with its rubric_id;
        misses are left out."""
        wanted = list(wanted)
        entries = self._fetch(key for key, _ in wanted)
        hits: dict[str, RubricJudgment] = {}
        for key, rubric_id in wanted:
            entry = entries.get(key)
            if entry is None:
                continue
            problem = "not a judgment" if entry.get("kind") != "judgment" else _judgment_problem(entry)
            if problem is not None:
                logger.warning("judge cache: ignoring entry %s (%s); a miss", key, problem)
                continue
            hits[key] = RubricJudgment(
                rubric_id,
                Verdict[entry["verdict"]],
                score=entry.get("score"),
                confidence=entry.get("confidence"),
                evidence=entry.get("evidence", ""),
            )
        self._used(hits)
        return hits

    def get_judgment(self, key: str, rubric_id: str) -> RubricJudgment | None:
        """The stored judgment for `key`, relabelled with `rubric_id`; None on a miss."""
        return self.get_judgments([(key, rubric_id)]).get(key)

    def get_uncovered_many(self, keys: Iterable[str]) -> dict[str, tuple[str, ...]]:
        """The stored uncovered behaviours for `keys`, by key; misses are left out."""
        hits: dict[str, tuple[str, ...]] = {}
        for key, entry in self._fetch(keys).items():
            items = entry.get("uncovered")
            if (
                entry.get("kind") != "diagnostics"
                or not isinstance(items, list)
                or not all(isinstance(item, str) for item in items)
            ):
                logger.warning("judge cache: ignoring entry %s (not a list of uncovered behaviours); a miss", key)
                continue
            hits[key] = tuple(items)
        self._used(hits)
        return hits

    def get_uncovered(self, key: str) -> tuple[str, ...] | None:
        """The stored uncovered behaviours for `key`; None on a miss."""
        return self.get_uncovered_many([key]).get(key)

    # ---- writing --------------------------------------------------------------------------------

    def put_batch(
        self,
        judgments: Iterable[tuple[str, RubricJudgment]] = (),
        uncovered: Iterable[tuple[str, Sequence[str]]] = (),
        **provenance: str,
    ) -> bool:
        """Stores (key, judgment) pairs (PASS / FAIL / NA; INVALID is never stored) and (key, uncovered
        behaviours) pairs in one transaction, replacing what their keys held. True when committed (or
        there was nothing to store); False when the write was skipped (logged)."""
        entries = [
            (
                key,
                {
                    "kind": "judgment",
                    "verdict": judgment.verdict.name,
                    "score": judgment.score,
                    "confidence": judgment.confidence,
                    "evidence": judgment.evidence,
                },
            )
            for key, judgment in judgments
            if judgment.verdict != Verdict.INVALID
        ]
        entries += [(key, {"kind": "diagnostics", "uncovered": list(items)}) for key, items in uncovered]
        rows = []
        for key, entry in entries:
            value = json.dumps(
                {"format": CACHE_FORMAT, **entry, **provenance}, separators=(",", ":"), ensure_ascii=False
            ).encode()
            if len(value) > MAX_ENTRY_BYTES:
                logger.warning(
                    "judge cache: not storing entry %s of %d bytes (at most %d)", key, len(value), MAX_ENTRY_BYTES
                )
                continue
            rows.append((_key_bytes(key), value))
        if not rows and not entries:
            return True
        return self._write(rows, f"store {len(rows)} entries (skipped)")

    def put_judgment(self, key: str, judgment: RubricJudgment, **provenance: str) -> bool:
        """Stores one PASS / FAIL / NA judgment (INVALID is never stored); see `put_batch`."""
        return self.put_batch(judgments=[(key, judgment)], **provenance)

    def put_uncovered(self, key: str, uncovered: Sequence[str], **provenance: str) -> bool:
        """Stores one trajectory's uncovered behaviours; see `put_batch`."""
        return self.put_batch(uncovered=[(key, uncovered)], **provenance)

    def _write(self, rows: list[tuple[bytes, bytes]], action: str) -> bool:
        """One write transaction: the pending uses, room for `rows` and `rows`."""
        connection = self._connection()
        if connection is None:
            return False
        with self._lock:
            touched = list(self._touched)
            self._touched.clear()
        try:
            connection.execute("BEGIN IMMEDIATE")
            try:
                # Last use as a clock shared by every writer: milliseconds, but always after the newest
                # use already stored, so that what is written now is never older than what was.
                newest = connection.execute("SELECT max(used) FROM verdicts").fetchone()[0] or 0
                now = max(int(time.time() * 1000), newest + 1)
                for start in range(0, len(touched), _CHUNK):
                    chunk = touched[start : start + _CHUNK]
                    connection.execute(
                        f"UPDATE verdicts SET used = ? WHERE key IN ({','.join('?' * len(chunk))})", (now, *chunk)
                    )
                # Room first (an estimate: a row takes about twice its bytes in pages and indexes), then
                # again after, in case the estimate was short.
                self._evict(connection, 2 * sum(len(key) + len(value) for key, value in rows))
                connection.executemany(
                    "INSERT INTO verdicts (key, used, size, value) VALUES (?, ?, ?, ?) ON CONFLICT (key) DO UPDATE "
                    "SET used = excluded.used, size = excluded.size, value = excluded.value",
                    [(key, now, len(key) + len(value), value) for key, value in rows],
                )
                self._evict(connection, 0)
                connection.execute("COMMIT")
            except BaseException:
                if connection.in_transaction:
                    connection.rollback()
                raise
        except sqlite3.Error as error:
            self._failed(action, error)
            return False
        self._empty_log(connection)
        return True

    def _empty_log(self, connection: sqlite3.Connection) -> None:
        """Folds the log into the database and truncates it when it holds more than its share of the
        bound (a transaction writes about a page per entry it adds or evicts, more than a small share)."""
        try:
            size = os.stat(f"{self.path}-wal").st_size
        except OSError:
            return
        if size <= self._log_limit:
            return
        try:
            connection.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        except sqlite3.Error as error:
            # Committed already; a reader or writer elsewhere kept the log busy, and a later write retries.
            logger.debug("judge cache: checkpoint of %s postponed (%s)", self.path, error)

    def _evict(self, connection: sqlite3.Connection, incoming: int) -> None:
        """Deletes the least recently used entries when the database's pages in use plus `incoming` bytes
        would pass its share of the bound: down to about 1% of that share below it, at least."""
        page_size = connection.execute("PRAGMA page_size").fetchone()[0]
        limit = self._database_limit
        target = limit - max(incoming, limit // 100)
        while True:
            pages = connection.execute("PRAGMA page_count").fetchone()[0]
            free = connection.execute("PRAGMA freelist_count").fetchone()[0]
            in_use = (pages - free) * page_size
            if in_use + incoming <= limit:
                return
            need = in_use + incoming - target
            oldest = connection.execute("SELECT id, size FROM verdicts ORDER BY used, id LIMIT 4096").fetchall()
            if not oldest:
                return
            chosen, freed = [], 0
            for row_id, size in oldest:
                chosen.append(row_id)
                freed += size
                if freed >= need:
                    break
            for start in range(0, len(chosen), _CHUNK):
                chunk = chosen[start : start + _CHUNK]
                connection.execute(f"DELETE FROM verdicts WHERE id IN ({','.join('?' * len(chunk))})", chunk)
