"""On-disk cache of judgments, keyed by (model, rubric content, trajectory content, prompt).

One small JSON file per entry, `<dir>/<key[:2]>/<key>.json`, written atomically
(`rwcore._io.atomic_write_bytes`), so concurrent judges and crashed runs leave either no entry or
a whole one. An entry holds only the judgment (or the diagnostics) and the hashes that produced
it — no prompt text, no server address, no key. Only PASS / FAIL / NA are stored: INVALID is a
failure of this attempt, and the next evaluation should try again.

A file that cannot be read or does not match its key (e.g. written by another version) counts as
a miss; it is overwritten by the next result.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

from rwcore._io import atomic_write_bytes
from rwcore.types import RubricJudgment
from rwcore.verdict import Verdict

logger = logging.getLogger("rwcore.judges")

CACHE_FORMAT = 1


def cache_key(kind: str, **parts: str) -> str:
    """sha256 over `kind` and the named parts (sorted), e.g. model, rubric hash, trajectory hash."""
    payload = json.dumps({"format": CACHE_FORMAT, "kind": kind, **parts}, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(payload.encode()).hexdigest()


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
            entry = json.loads(path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as error:
            logger.warning("ignoring unreadable judge cache entry %s: %s", path, error)
            return None
        if not isinstance(entry, dict) or entry.get("key") != key or entry.get("format") != CACHE_FORMAT:
            return None
        return entry

    def _write(self, key: str, entry: dict) -> None:
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(path, json.dumps({"format": CACHE_FORMAT, "key": key, **entry},
                                                sort_keys=True, ensure_ascii=False).encode())
        except OSError as error:
            # A cache that cannot be written costs only a repeated request later.
            logger.warning("could not write judge cache entry %s: %s", path, error)

    def get_judgment(self, key: str, rubric_id: str) -> RubricJudgment | None:
        """The stored judgment for `key`, relabelled with `rubric_id`; None on a miss."""
        entry = self._read(key)
        if entry is None or entry.get("kind") != "judgment":
            return None
        try:
            verdict = Verdict[entry["verdict"]]
            if verdict == Verdict.INVALID:
                return None
            return RubricJudgment(rubric_id, verdict, score=entry.get("score"),
                                  confidence=entry.get("confidence"), evidence=entry.get("evidence", ""))
        except (KeyError, TypeError, ValueError):
            return None

    def put_judgment(self, key: str, judgment: RubricJudgment, **provenance: str) -> None:
        """Stores a PASS / FAIL / NA judgment (INVALID is never stored)."""
        if judgment.verdict == Verdict.INVALID:
            return
        self._write(key, {
            "kind": "judgment",
            "verdict": judgment.verdict.name,
            "score": judgment.score,
            "confidence": judgment.confidence,
            "evidence": judgment.evidence,
            **provenance,
        })

    def get_uncovered(self, key: str) -> tuple[str, ...] | None:
        entry = self._read(key)
        if entry is None or entry.get("kind") != "diagnostics":
            return None
        items = entry.get("uncovered")
        if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
            return None
        return tuple(items)

    def put_uncovered(self, key: str, uncovered: tuple[str, ...], **provenance: str) -> None:
        self._write(key, {"kind": "diagnostics", "uncovered": list(uncovered), **provenance})
