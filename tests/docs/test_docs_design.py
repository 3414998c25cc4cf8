"""docs/design.md stays true, and nothing in the repository points at a file outside it.

- the table "Every default the method uses" of docs/design.md: each row's default equals what the code declares,
  read from the config's own reference (`config_markdown`, generated from the declarations) for a config key,
  or from the signature or class attribute for a Python default; every method setting with a config key (the
  `advantage`, `sampler`, `pool` and `rewardweaver` sections, the batch shape and the loss's filter band and
  dual clip) has a row;
- no code, test, doc or build file names the project's planning document, the papers' text files or the
  shared folder beside the checkout: the docs hold the design, and papers are cited by title and section.
"""

from __future__ import annotations

import importlib
import inspect
import re

from _util import ROOT

DESIGN = ROOT / "docs" / "design.md"
TABLE_HEADER = "| symbol | meaning | default | set by | source |"
CONFIG_ROW = re.compile(r"^\| `([a-z_]+(?:\.[a-z_]+)+)` \| `([^`]*)` \|")
# Every key of these sections is a method setting that must have a row, but for what is not a number of the
# method: the run folder a frozen-rubrics run reads its pool from.
METHOD_SECTIONS = ("advantage.", "sampler.", "pool.", "rewardweaver.")
ALSO_REQUIRED = ("rollout.tasks_per_step", "rollout.group_size", "loss.ratio_low", "loss.ratio_high", "loss.clip_c")
NOT_A_DEFAULT = ("pool.frozen_from",)

# The patterns are put together here so that this file does not name what it looks for.
_OUTSIDE = re.compile(
    "|".join(
        (
            r"\bDESIGN" + r"\.md\b",  # the planning document beside the checkout
            r"\bpapers/[A-Za-z0-9_-]+\.(?:txt|pdf)\b",  # the papers' text files beside it
            r"\.\./" + r"shared\b",  # the shared folder, relative to the checkout
            r"/work/" + r"(?:shared|main)\b",  # ... or absolute
            r"process-" + r"credit-literature",  # the literature notes there
        )
    )
)
SCANNED_FOLDERS = ("rwcore", "trainer", "kernels", "tests", "bench", "docs", "scripts", "examples", "csrc", "configs")
SCANNED_SUFFIXES = (".py", ".md", ".cpp", ".h", ".hpp", ".sh", ".yaml", ".yml", ".toml", ".txt", ".cfg", ".ini")
ROOT_FILES = ("README.md", "mkdocs.yml", "pyproject.toml", "setup.py", "CMakeLists.txt")
# The link checker's own test names a link into the shared folder as the case it must refuse.
EXEMPT = ("tests/docs/test_docs_site.py",)


def _value(text: str):
    """A default as written in a table cell or by yaml: bool, int, float or str."""
    text = text.strip().strip("'\"")
    if text in ("true", "false"):
        return text == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _design_rows() -> list[tuple[str, str]]:
    """(default, set by) of every row of the defaults table, backticks removed."""
    lines = DESIGN.read_text(encoding="utf-8").splitlines()
    assert TABLE_HEADER in lines, f"docs/design.md has no table with the header {TABLE_HEADER!r}"
    rows = []
    for line in lines[lines.index(TABLE_HEADER) + 2 :]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        assert len(cells) == 5, f"docs/design.md: a defaults row without five cells: {line}"
        default, source = cells[2], cells[3]
        assert default.startswith("`") and source.startswith("`"), f"docs/design.md: unquoted cell in {line}"
        rows.append((default.strip("`"), source.strip("`")))
    return rows


def _config_defaults() -> dict[str, str]:
    from rwcore.trainer.config import config_markdown

    return {m.group(1): m.group(2) for line in config_markdown().splitlines() if (m := CONFIG_ROW.match(line))}


def _python_default(reference: str):
    """The default of `module.Name(param)` (a signature) or `module.Name.attr` (a class or module attribute)."""
    call = re.fullmatch(r"([\w.]+)\((\w+)\)", reference)
    path = call.group(1) if call else reference
    parts = path.split(".")
    for end in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:end]))
        except ImportError:
            continue
        for name in parts[end:]:
            obj = getattr(obj, name)
        break
    else:
        raise AssertionError(f"{reference}: no module of it imports")
    if call:
        parameter = inspect.signature(obj).parameters[call.group(2)]
        assert parameter.default is not inspect.Parameter.empty, f"{reference} has no default"
        return parameter.default
    return obj


def _outside_references(text: str) -> list[str]:
    return [m.group(0) for m in _OUTSIDE.finditer(text)]


def test_the_checkers_catch_what_they_are_for():
    assert _value("1.0e-09") == _value("1e-9") and _value("true") is True and _value("'off'") == "off"
    assert _value("16384") == 16384 and _value("group") == "group" and _value("0.5") != _value("5.0")
    assert _python_default("rwcore.arise.sampler.CapabilitySampler(batch_size)") == 32
    sample = (
        "see DESIGN" + ".md, papers/" + "arise.txt and ../" + "shared/x, /work/" + "shared/y, "
        "process-" + "credit-literature.md; not papers/README or docs/design.md"
    )
    assert _outside_references(sample) == [
        "DESIGN" + ".md",
        "papers/" + "arise.txt",
        "../" + "shared",
        "/work/" + "shared",
        "process-" + "credit-literature",
    ]


def test_every_default_in_the_design_page_is_the_declared_one():
    rows = _design_rows()
    config = _config_defaults()
    assert "loss.clip_c" in config and "advantage.lam" in config, "config_markdown's table changed its layout"
    wrong = []
    for default, source in rows:
        if source in config:
            declared = config[source]
        else:
            assert source.startswith("rwcore."), f"docs/design.md: {source!r} is neither a config key nor rwcore.*"
            declared = _python_default(source)
        if _value(default) != (declared if not isinstance(declared, str) else _value(declared)):
            wrong.append(f"{source}: docs/design.md says {default}, the code declares {declared!r}")
    assert not wrong, "\n".join(wrong)


def test_every_method_setting_has_a_row():
    documented = {source for _, source in _design_rows()}
    config = _config_defaults()
    required = {key for key in config if key.startswith(METHOD_SECTIONS) and key not in NOT_A_DEFAULT}
    required |= set(ALSO_REQUIRED)
    assert len(required) > 30, sorted(required)
    missing = sorted(required - documented)
    assert not missing, f"docs/design.md's defaults table has no row for {missing}"


def test_nothing_points_at_a_file_outside_the_repository():
    files = [ROOT / name for name in ROOT_FILES if (ROOT / name).is_file()]
    for folder in SCANNED_FOLDERS:
        files += [
            path
            for path in sorted((ROOT / folder).rglob("*"))
            if path.suffix in SCANNED_SUFFIXES and path.is_file() and "__pycache__" not in path.parts
        ]
    assert len(files) > 200 and DESIGN in files
    found = []
    for path in files:
        relative = path.relative_to(ROOT).as_posix()
        if relative in EXEMPT:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            found += [f"{relative}:{number}: {hit!r} in {line.strip()[:100]}" for hit in _outside_references(line)]
    assert not found, "files outside the repository are named (write what they hold into docs/):\n" + "\n".join(found)
