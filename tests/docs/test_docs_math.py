"""docs/math.md (each equation of both papers -> the code that implements it -> the tests that check it) stays true.

- every backticked dotted reference `rwcore.…` resolves: the longest importable module prefix is imported and
  the rest taken with getattr; the module must be imported under its own name (not a deprecated alias of a
  module that moved) and a function or class must be named in the module that defines it (not a re-export);
- every backticked `tests/….py::name` names an existing test file that defines `name` (a parametrized id
  `name[...]` counts by its base name); every other backticked repository path exists;
- the Arise section has a row for each numbered equation of the paper (1-21, so the pool's eq. 4-8, the
  advantages' eq. 15-17 and the loss's eq. 18-19 among them); the RewardWeaver section has a row for its
  process reward R = R_o + 1/|A| sum_{d in A} Jbar_d;
- every table row has the five columns, names its code, and names its tests or says "no test".
"""

from __future__ import annotations

import importlib
import inspect
import re

import pytest
from _util import ROOT

DOC = ROOT / "docs" / "math.md"
HEADER = ["Eq.", "Formula", "Code", "Tests", "Note"]

CODE_REF = re.compile(r"`(rwcore(?:\.[A-Za-z_][A-Za-z0-9_]*)+)`")
TEST_REF = re.compile(r"`(tests/[A-Za-z0-9_/]+\.py)::([A-Za-z_][A-Za-z0-9_]*)(\[[^`]*\])?`")
PATH_REF = re.compile(r"`((?:csrc|kernels|trainer|rwcore|tests|docs|configs|bench|examples|scripts)/[A-Za-z0-9_./-]+)`")
EQ_NUMBER = re.compile(r"\beq\.\s*(\d+)\b")

ARISE_EQUATIONS = set(range(1, 22))  # Arise numbers 21 equations (eq. 21 is appendix D.4's pass rate)
ARISE_POOL_ADVANTAGES_LOSS = {4, 5, 6, 7, 8, 15, 16, 17, 18, 19}


def _text() -> str:
    return DOC.read_text(encoding="utf-8") if DOC.exists() else ""


def _sections(text: str) -> dict[str, str]:
    """Level-2 sections: heading text -> body."""
    sections: dict[str, str] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("## "):
            current = line[3:].strip()
            sections[current] = ""
        elif current is not None:
            sections[current] += line + "\n"
    return sections


def _rows(text: str) -> list[tuple[int, list[str]]]:
    """(line number, cells) of every table row below a header row, separator rows left out."""
    rows = []
    lines = text.splitlines()
    in_table = False
    for number, line in enumerate(lines, 1):
        if not line.startswith("|"):
            in_table = False
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not in_table:
            in_table = True  # the header row; checked in test_tables_have_the_five_columns
            continue
        if all(set(cell) <= set("-: ") for cell in cells):
            continue
        rows.append((number, cells))
    return rows


def _section_rows(prefix: str) -> list[list[str]]:
    body = next((body for heading, body in _sections(_text()).items() if heading.startswith(prefix)), "")
    return [cells for _, cells in _rows(body)]


def _resolve(reference: str):
    """(module name, module, attribute path, object) for a dotted reference; raises on failure."""
    parts = reference.split(".")
    for end in range(len(parts), 0, -1):
        name = ".".join(parts[:end])
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as error:
            # only "this name is not a module" moves on to a shorter prefix; a module that fails to import
            # something it needs is a real failure
            if error.name and (name == error.name or name.startswith(error.name + ".")):
                continue
            raise
        break
    else:  # pragma: no cover - "rwcore" itself always imports
        raise AssertionError(f"no prefix of {reference!r} imports")
    obj = module
    attributes = parts[end:]
    for i, attribute in enumerate(attributes):
        if not hasattr(obj, attribute):
            owner = ".".join(parts[: end + i])
            raise AssertionError(f"{reference}: {owner} has no attribute {attribute!r}")
        obj = getattr(obj, attribute)
    return name, module, attributes, obj


TEXT = _text()
CODE_REFS = sorted(set(CODE_REF.findall(TEXT)))
TEST_REFS = sorted({(path, name) for path, name, _ in TEST_REF.findall(TEXT)})


def test_the_document_exists_and_has_both_papers():
    assert DOC.exists(), f"{DOC} is missing"
    headings = list(_sections(TEXT))
    assert any(h.startswith("Arise") for h in headings), headings
    assert any(h.startswith("RewardWeaver") for h in headings), headings
    assert CODE_REFS and TEST_REFS


def test_tables_have_the_five_columns():
    lines = TEXT.splitlines()
    for number, line in enumerate(lines, 1):
        if not line.startswith("|"):
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        assert len(cells) == len(HEADER), (
            f"docs/math.md:{number} has {len(cells)} cells, not {len(HEADER)} (a '|' inside a formula? "
            f"write \\lvert ... \\rvert or \\mid): {line[:120]}"
        )
        previous = lines[number - 2] if number >= 2 else ""
        if not previous.startswith("|"):
            assert cells == HEADER, f"docs/math.md:{number}: a table's header must be {HEADER}, got {cells}"


@pytest.mark.parametrize("reference", CODE_REFS)
def test_code_reference_resolves_to_its_defining_module(reference):
    name, module, attributes, obj = _resolve(reference)
    assert module.__name__ == name, (
        f"{reference}: {name} is an alias of {module.__name__} (a moved module's old path); write {module.__name__}"
    )
    if attributes:
        top = getattr(module, attributes[0])
        if inspect.isclass(top) or inspect.isfunction(top):
            assert top.__module__ == name, (
                f"{reference}: {attributes[0]} is defined in {top.__module__}, not in {name}; name its defining module"
            )


@pytest.mark.parametrize("path, name", TEST_REFS, ids=[f"{p}::{n}" for p, n in TEST_REFS])
def test_test_reference_exists(path, name):
    file = ROOT / path
    assert file.is_file(), f"{path} does not exist"
    assert name.startswith("test_"), f"{path}::{name} is not a test function name"
    source = file.read_text(encoding="utf-8")
    assert re.search(rf"^\s*(?:async\s+)?def {re.escape(name)}\(", source, re.MULTILINE), f"{path} defines no {name}"


def test_repository_paths_exist():
    missing = sorted({path for path in PATH_REF.findall(TEXT) if not (ROOT / path).exists()})
    assert not missing, f"docs/math.md names paths that do not exist: {missing}"


def test_every_row_names_its_code_and_its_tests_or_says_no_test():
    problems = []
    for number, cells in _rows(TEXT):
        if len(cells) != len(HEADER):
            continue  # reported by test_tables_have_the_five_columns
        _, _, code, tests, _ = cells
        if not CODE_REF.search(code):
            problems.append(f"line {number}: no `rwcore.…` reference in the Code column")
        if not TEST_REF.search(tests) and "no test" not in tests.lower():
            problems.append(f"line {number}: the Tests column names no test and does not say 'no test'")
    assert not problems, "\n".join(problems)


def test_every_numbered_arise_equation_has_a_row():
    found = set()
    for cells in _section_rows("Arise"):
        found.update(int(n) for n in EQ_NUMBER.findall(cells[0]))
    assert ARISE_POOL_ADVANTAGES_LOSS <= found, f"no row for Arise eq. {sorted(ARISE_POOL_ADVANTAGES_LOSS - found)}"
    assert ARISE_EQUATIONS <= found, f"no row for Arise eq. {sorted(ARISE_EQUATIONS - found)}"
    assert found <= ARISE_EQUATIONS, f"rows for equations Arise does not have: {sorted(found - ARISE_EQUATIONS)}"


def test_rewardweaver_process_reward_has_a_row():
    rows = [
        cells
        for cells in _section_rows("RewardWeaver")
        if "process reward" in cells[0].lower() and "`rwcore.rewardweaver.reward.process_reward`" in cells[2]
    ]
    assert rows, "no RewardWeaver row for the process reward naming rwcore.rewardweaver.reward.process_reward"
    assert any(r"\frac{1}{\lvert A" in cells[1] and r"\bar J_d" in cells[1] for cells in rows), (
        "the process-reward row does not state R = R_o + 1/|A| sum_{d in A} Jbar_d"
    )
