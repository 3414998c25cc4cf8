"""How the keys of metrics rows are declared: `Metric` (one key), `Group` (keys inserted together), `RowKind` (a
kind of row and its keys in row order); rows built from the declarations (`build`), a key looked up among them
(`find`), and the declarations rendered as a markdown glossary (`glossary`). rwcore.trainer.metrics declares
`rw train`'s rows with them.

A row is a JSON object: `step`, `kind`, then the keys of its kind. A `<part>` of a key's name is one path
segment that varies (a rubric id, a task type, an LLM role).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

_PART = re.compile(r"<[a-z_]+>")


@dataclass(frozen=True)
class Metric:
    """One key of a metrics row.

    key: the name as the row holds it; `<part>` stands for one path segment that varies.
    unit: what the number counts or measures. help: its meaning.
    when: "" when every row of its kinds holds it; else the condition under which it appears.
    value: computes it from the row's record (None: a `Group` inserts it)."""

    key: str
    unit: str
    help: str
    when: str = ""
    value: Callable | None = field(default=None, compare=False, repr=False)

    def format(self, **parts: object) -> str:
        """The key with its `<part>`s filled in: `Metric("rubric/<rubric>/pass", ...).format(rubric="r1")`."""
        return _PART.sub(lambda match: str(parts[match.group()[1:-1]]), self.key)

    def matches(self, key: str) -> bool:
        """Whether `key` is this metric's name with each `<part>` filled in."""
        pieces = re.split(f"({_PART.pattern})", self.key)
        pattern = "".join("[^/]+" if _PART.fullmatch(piece) else re.escape(piece) for piece in pieces)
        return re.fullmatch(pattern, key) is not None

    def under(self, prefix: str) -> Metric:
        """The same metric with its first path segment (`eval`) replaced by `prefix`."""
        return replace(self, key=f"{prefix}/{self.key.split('/', 1)[1]}", value=None)


@dataclass(frozen=True)
class Group:
    """Keys inserted together as `values(record)` gives them (a dict, in its own order); `metrics` declares
    every key it may hold. Without `values`, the function that builds the row adds them."""

    metrics: tuple[Metric, ...]
    values: Callable | None = field(default=None, compare=False, repr=False)


STEP = Metric("step", "steps", "Optimizer steps completed when the row was written (0: before training).")
KIND = Metric("kind", "-", "The row's kind (above).")


@dataclass(frozen=True)
class RowKind:
    """A kind of row: its `kind`, when such a row is written (`help`) and its keys after `step` and `kind`, in
    row order."""

    kind: str
    help: str
    entries: tuple[Metric | Group, ...]

    @property
    def metrics(self) -> tuple[Metric, ...]:
        return (STEP, KIND) + flat(self.entries)


def declare(*rows: tuple[str, ...]) -> tuple[Metric, ...]:
    """Metrics from (key, unit, help[, when]) rows."""
    return tuple(Metric(*row) for row in rows)


def flat(entries: Sequence[Metric | Group]) -> tuple[Metric, ...]:
    """Every metric of `entries`, groups opened."""
    return tuple(m for entry in entries for m in (entry.metrics if isinstance(entry, Group) else (entry,)))


def build(entries: Sequence[Metric | Group], record, rename: Callable[[str], str] = str) -> dict:
    """The keys of `entries` computed from `record`, in declaration order (each group's in its own); `rename`
    maps each declared name to the row's."""
    row = {}
    for entry in entries:
        if isinstance(entry, Group):
            row.update({rename(key): value for key, value in entry.values(record).items()})
        else:
            row[rename(entry.key)] = entry.value(record)
    return row


def find(row_kinds: Sequence[RowKind], kind: str, key: str) -> Metric | None:
    """The declaration of `key` in a row of kind `kind` (None: not declared): its own name first, then the
    first name with `<part>`s that it fills in."""
    metrics = next((row_kind.metrics for row_kind in row_kinds if row_kind.kind == kind), ())
    exact = next((metric for metric in metrics if metric.key == key), None)
    return exact or next((metric for metric in metrics if metric.matches(key)), None)


def glossary(row_kinds: Sequence[RowKind], parts: str) -> str:
    """Markdown: a table of the row kinds, then one of every key (kind, key, meaning, unit, when), each key once
    with every kind that holds it (`all` for every kind); `parts` says what the `<part>`s of the names stand for."""
    lines = ["### Row kinds", "", "| kind | written |", "|---|---|"]
    lines += [f"| `{row_kind.kind}` | {row_kind.help} |" for row_kind in row_kinds]
    lines += ["", "### Keys", "", parts, "", "| kind | key | meaning | unit | when |", "|---|---|---|---|---|"]
    kinds: dict[str, list[str]] = {}
    metrics: dict[str, Metric] = {}
    for row_kind in row_kinds:
        for metric in row_kind.metrics:
            metrics.setdefault(metric.key, metric)
            kinds.setdefault(metric.key, []).append(row_kind.kind)
    for key, metric in metrics.items():
        kind = "all" if len(kinds[key]) == len(row_kinds) else ", ".join(kinds[key])
        cells = [kind, f"`{key}`", metric.help, metric.unit, metric.when]
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines) + "\n"
