"""Reading a task file of `env.name=tasks` (JSONL, or parquet with pyarrow): every row checked before any is
used, the first bad one refused as `FILE:LINE:FIELD: what is wrong` (parquet: LINE is the 1-based row number).

A row (one JSON object per line; blank lines are skipped):

    id        optional string, unique in the file (default: "<file stem>-<line>")
    prompt    the user's message (a non-empty string), or
    messages  the opening as chat messages [{"role": "user" | "assistant", "content": str}, ...], alternating
              and ending with a user message (exactly one of prompt / messages)
    metadata  optional JSON object, handed to the reward function (e.g. the reference answer)
    tags      optional list of capability tags (non-empty strings; default ["untagged"]): the task types
              Arise's sampler pairs with rubrics and the per-tag success in the metrics
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

FIELDS = ("id", "prompt", "messages", "metadata", "tags")
ROLES = ("user", "assistant")
MAX_TAGS = 32


@dataclass(frozen=True)
class TaskRow:
    """One checked row: `where` is "FILE:LINE" (for errors at run time); `opening` the chat messages the agent
    sees, the last one the user's; metadata and tags as given."""

    task_id: str
    opening: tuple[tuple[str, str], ...]
    metadata: dict = field(default_factory=dict)
    tags: tuple[str, ...] = ("untagged",)
    where: str = ""


def read_tasks(path: str | Path, option: str) -> list[TaskRow]:
    """Every row of the file at `path` (named by config key `option` in errors), checked; ValueError on the first
    bad one, naming FILE:LINE:FIELD, before anything is returned."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{option}: {str(path)!r} is not a file")
    if path.suffix == ".parquet":
        rows = _parquet_rows(path, option)
    elif path.suffix in (".jsonl", ".json"):
        rows = _jsonl_rows(path)
    else:
        raise ValueError(f"{option}: {str(path)!r}: a task file is .jsonl (one JSON object per line) or .parquet")
    tasks: list[TaskRow] = []
    first_line: dict[str, int] = {}
    for line, row in rows:
        task = _task(path, line, row)
        if task.task_id in first_line:
            raise ValueError(
                f"{path}:{line}:id: duplicate id {task.task_id!r} (first on line {first_line[task.task_id]})"
            )
        first_line[task.task_id] = line
        tasks.append(task)
    if not tasks:
        raise ValueError(f"{option}: {str(path)!r} holds no task")
    return tasks


def _jsonl_rows(path: Path):
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not UTF-8 text ({error})") from None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{number}: not JSON ({error.msg} at column {error.colno})") from None
        yield number, row


def _parquet_rows(path: Path, option: str):
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ValueError(f"{option}: reading {str(path)!r} needs pyarrow (pip install pyarrow), or use JSONL") from None
    try:
        table = pq.read_table(path)
    except Exception as error:
        raise ValueError(f"{option}: {str(path)!r} is not a readable parquet file ({error})") from None
    for number, row in enumerate(table.to_pylist(), 1):
        # parquet has no "absent": a null column value counts as not given
        yield number, {key: value for key, value in row.items() if value is not None}


def _task(path: Path, line: int, row) -> TaskRow:
    where = f"{path}:{line}"
    if not isinstance(row, dict):
        raise ValueError(f"{where}: a row is a JSON object, got {type(row).__name__}")
    unknown = [key for key in row if key not in FIELDS]
    if unknown:
        raise ValueError(
            f"{where}:{unknown[0]}: not a task field (fields: {', '.join(FIELDS)}); put the task's own data under "
            "metadata"
        )
    task_id = row.get("id", f"{path.stem}-{line}")
    if not isinstance(task_id, str) or not task_id.strip() or len(task_id) > 200:
        raise ValueError(f"{where}:id: a non-empty string of at most 200 characters, got {task_id!r}")
    if ("prompt" in row) == ("messages" in row):
        raise ValueError(f"{where}:prompt: give exactly one of prompt (a string) or messages (chat messages)")
    if "prompt" in row:
        prompt = row["prompt"]
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError(f"{where}:prompt: a non-empty string, got {prompt!r}")
        opening = (("user", prompt),)
    else:
        opening = _messages(where, row["messages"])
    metadata = row.get("metadata", {})
    if not isinstance(metadata, dict):
        raise ValueError(f"{where}:metadata: a JSON object, got {type(metadata).__name__}")
    tags = row.get("tags", ["untagged"])
    if (
        not isinstance(tags, list)
        or not tags
        or len(tags) > MAX_TAGS
        or not all(isinstance(t, str) and t.strip() for t in tags)
    ):
        raise ValueError(f"{where}:tags: a list of 1 to {MAX_TAGS} non-empty strings, got {tags!r}")
    return TaskRow(task_id, opening, metadata, tuple(dict.fromkeys(tags)), where)


def _messages(where: str, messages) -> tuple[tuple[str, str], ...]:
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"{where}:messages: a non-empty list of {{role, content}} objects")
    out = []
    for i, message in enumerate(messages):
        at = f"{where}:messages[{i}]"
        if not isinstance(message, dict) or set(message) != {"role", "content"}:
            raise ValueError(f"{at}: an object with exactly the keys role and content, got {message!r}")
        role, content = message["role"], message["content"]
        if role not in ROLES:
            hint = " (the system prompt is env.options.system_prompt)" if role == "system" else ""
            raise ValueError(f"{at}.role: one of {', '.join(ROLES)}, got {role!r}{hint}")
        if not isinstance(content, str) or not content.strip():
            raise ValueError(f"{at}.content: a non-empty string, got {content!r}")
        expected = ROLES[i % 2]
        if role != expected:
            raise ValueError(f"{at}.role: the opening alternates user, assistant, user, ...; expected {expected!r}")
        out.append((role, content))
    if out[-1][0] != "user":
        raise ValueError(f"{where}:messages: the opening ends with a user message (the agent answers it)")
    return tuple(out)
