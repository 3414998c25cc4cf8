"""On-disk cache of judgments, keyed by (model, rubric content, trajectory content, prompt).

One small JSON file per entry, `<dir>/<key[:2]>/<key>.json`, written atomically
(`rwcore._io.atomic_write_bytes`), so concurrent judges and crashed runs leave either no entry or
a whole one. An entry holds only the judgment (or the diagnostics) and the hashes that produced
it — no prompt text, no server address, no key. Only PASS / FAIL / NA are stored: INVALID is a
failure of this attempt, and the next evaluation should try again.

A cache is a cache: an entry that cannot be read, is not a regular file (a FIFO, device, directory
or symlink is never opened for reading: `O_NOFOLLOW | O_NONBLOCK` and an fstat first), is larger than
`MAX_ENTRY_BYTES`, does not match its key (e.g. written by another version) or holds a value out of
range (a score or confidence outside [0, 1] or not finite, an unknown verdict, text that is not text)
counts as a miss, logged once per entry; it is overwritten by the next result.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import stat
from pathlib import Path

from rwcore._io import atomic_write_bytes
from rwcore.types import RubricJudgment
from rwcore.verdict import Verdict

logger = logging.getLogger("rwcore.judges")

CACHE_FORMAT = 1
MAX_ENTRY_BYTES = 1 << 20
"""An entry is a verdict and a short evidence string; anything larger is not one of ours."""


def cache_key(kind: str, **parts: str) -> str:
    """sha256 over `kind` and the named parts (sorted), e.g. model, rubric hash, trajectory hash."""
    payload = json.dumps({"format": CACHE_FORMAT, "kind": kind, **parts}, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(payload.encode()).hexdigest()


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


class JudgmentCache:
    """Judgments and diagnostics on disk under `directory` (created when missing)."""

    def __init__(self, directory: str | os.PathLike) -> None:
        try:
            self.directory = Path(directory)
        except TypeError:
            raise ValueError(f"cache_dir must be a path, got {directory!r}") from None
        if self.directory.exists() and not self.directory.is_dir():
            raise ValueError(f"cache_dir {str(self.directory)!r} exists and is not a directory")

    def __repr__(self) -> str:
        return f"JudgmentCache({str(self.directory)!r})"

    def _path(self, key: str) -> Path:
        return self.directory / key[:2] / f"{key}.json"

    def _read(self, key: str) -> dict | None:
        path = self._path(key)
        try:
            # O_NONBLOCK: opening a FIFO for reading must not wait for a writer; O_NOFOLLOW: a symlink is
            # not followed (ELOOP). What is opened is checked to be a regular file before any read.
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            return None
        except OSError as error:
            logger.warning("judge cache: ignoring entry %s that cannot be opened (%s); a miss", path, error)
            return None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                logger.warning("judge cache: ignoring %s, which is not a regular file; a miss", path)
                return None
            if info.st_size > MAX_ENTRY_BYTES:
                logger.warning(
                    "judge cache: ignoring %s of %d bytes (at most %d); a miss", path, info.st_size, MAX_ENTRY_BYTES
                )
                return None
            with os.fdopen(fd, "rb", closefd=True) as handle:
                fd = -1
                data = handle.read(MAX_ENTRY_BYTES + 1)
            entry = json.loads(data)
        except (OSError, ValueError, RecursionError) as error:
            logger.warning("judge cache: ignoring unreadable entry %s (%s); a miss", path, error)
            return None
        finally:
            if fd >= 0:
                os.close(fd)
        if not isinstance(entry, dict) or entry.get("key") != key or entry.get("format") != CACHE_FORMAT:
            logger.warning(
                "judge cache: ignoring %s, which is not an entry of format %d for its key; a miss", path, CACHE_FORMAT
            )
            return None
        return entry

    def _write(self, key: str, entry: dict) -> None:
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(
                path,
                json.dumps({"format": CACHE_FORMAT, "key": key, **entry}, sort_keys=True, ensure_ascii=False).encode(),
            )
        except OSError as error:
            # A cache that cannot be written costs only a repeated request later.
            logger.warning("could not write judge cache entry %s: %s", path, error)

    def get_judgment(self, key: str, rubric_id: str) -> RubricJudgment | None:
        """The stored judgment for `key`, relabelled with `rubric_id`; None on a miss."""
        entry = self._read(key)
        if entry is None:
            return None
        problem = "not a judgment" if entry.get("kind") != "judgment" else _judgment_problem(entry)
        if problem is not None:
            logger.warning("judge cache: ignoring entry %s (%s); a miss", self._path(key), problem)
            return None
        return RubricJudgment(
            rubric_id,
            Verdict[entry["verdict"]],
            score=entry.get("score"),
            confidence=entry.get("confidence"),
            evidence=entry.get("evidence", ""),
        )

    def put_judgment(self, key: str, judgment: RubricJudgment, **provenance: str) -> None:
        """Stores a PASS / FAIL / NA judgment (INVALID is never stored)."""
        if judgment.verdict == Verdict.INVALID:
            return
        self._write(
            key,
            {
                "kind": "judgment",
                "verdict": judgment.verdict.name,
                "score": judgment.score,
                "confidence": judgment.confidence,
                "evidence": judgment.evidence,
                **provenance,
            },
        )

    def get_uncovered(self, key: str) -> tuple[str, ...] | None:
        """The stored uncovered behaviours for `key`; None on a miss."""
        entry = self._read(key)
        if entry is None:
            return None
        items = entry.get("uncovered")
        if (
            entry.get("kind") != "diagnostics"
            or not isinstance(items, list)
            or not all(isinstance(item, str) for item in items)
        ):
            logger.warning(
                "judge cache: ignoring entry %s (not a list of uncovered behaviours); a miss", self._path(key)
            )
            return None
        return tuple(items)

    def put_uncovered(self, key: str, uncovered: tuple[str, ...], **provenance: str) -> None:
        self._write(key, {"kind": "diagnostics", "uncovered": list(uncovered), **provenance})
