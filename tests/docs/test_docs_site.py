"""The documentation: the MkDocs site builds with --strict, the README stays short, and no link leads out of
the repository.

- `mkdocs build --strict` (mkdocs.yml at the root; docs/ and the API reference rendered by mkdocstrings):
  a broken link or anchor, a page missing from the nav, or a docstring the API reference cannot collect
  fails the build.
- README.md has at most 200 lines; the rest lives in docs/.
- No markdown file of README.md, docs/ or bench/ links to `../shared/...` (the project's shared folder is
  not part of the repository) or to an absolute local path; every link of README.md is an http(s) URL or
  a relative path to a file or folder of the repository.
- README.md holds the exact test command that .ci/run runs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from _util import ROOT

README = ROOT / "README.md"
MAX_README_LINES = 200

# [text](target "title") and [text](<target>); reference definitions `[label]: target`.
_INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+[\"'][^)]*[\"'])?\s*\)")
_REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.M)
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")


def _without_code(text: str) -> str:
    """The text less its fenced code blocks and inline code spans (links there are examples, not links)."""
    kept, fence = [], None
    for line in text.splitlines():
        stripped = line.lstrip()
        if fence is not None:
            if stripped.startswith(fence):
                fence = None
            continue
        if stripped.startswith(("```", "~~~")):
            fence = stripped[:3]
            continue
        kept.append(_CODE_SPAN.sub("", line))
    return "\n".join(kept)


def link_targets(text: str) -> list[str]:
    """Every link target of a markdown text, code blocks and code spans left out."""
    text = _without_code(text)
    return [m.group(1) for m in _INLINE.finditer(text)] + [m.group(1) for m in _REFERENCE.finditer(text)]


def forbidden_target(target: str) -> str | None:
    """Why a link target may not appear in the repository's markdown, or None."""
    if target.startswith(("../shared", "./../shared")) or "../shared/" in target:
        return "points into the project's shared folder, outside the repository"
    if target.startswith(("file:", "/", "~", "\\")) or re.match(r"^[A-Za-z]:[\\/]", target):
        return "is an absolute local path"
    return None


def unresolved_readme_target(target: str, base: Path = ROOT) -> str | None:
    """Why a README link does not resolve inside the repository, or None."""
    if re.match(r"^https?://", target):
        return None
    if target.startswith("#"):
        return None  # an anchor of the README itself
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", target):
        return "is neither an http(s) URL nor a relative path"
    reason = forbidden_target(target)
    if reason:
        return reason
    path = target.split("#", 1)[0].split("?", 1)[0]
    resolved = (base / path).resolve()
    if base.resolve() not in (resolved, *resolved.parents):
        return "leads outside the repository"
    if not resolved.exists():
        return f"names {path}, which does not exist in the repository"
    return None


def markdown_files() -> list[Path]:
    files = [README]
    for folder in ("docs", "bench"):
        files += sorted((ROOT / folder).rglob("*.md"))
    return files


def ci_test_command() -> str:
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.strip()]
    return lines[-1]


# --------------------------------------------------------------------------------------------
# The checkers themselves catch what they are for (so the repository checks below can fail)
# --------------------------------------------------------------------------------------------


def test_link_checkers_catch_bad_links(tmp_path):
    text = (
        "A `span` and then\nSee [the design](../shared/notes.md), [a file](/work/main/x.md), [ok](docs/index.md),\n"
        "[web](https://example.org/a), `[not a link](../shared/x)` and\n\n```\n[neither](/abs)\n```\n"
        "[ref]: ~/notes.md\n"
    )
    targets = link_targets(text)
    assert targets == ["../shared/notes.md", "/work/main/x.md", "docs/index.md", "https://example.org/a", "~/notes.md"]
    assert [t for t in targets if forbidden_target(t)] == ["../shared/notes.md", "/work/main/x.md", "~/notes.md"]
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# x\n")
    assert unresolved_readme_target("docs/index.md#top", tmp_path) is None
    assert unresolved_readme_target("https://example.org", tmp_path) is None
    assert "does not exist" in unresolved_readme_target("docs/missing.md", tmp_path)
    assert "outside the repository" in unresolved_readme_target("../elsewhere/README.md", tmp_path)
    assert unresolved_readme_target("mailto:someone@example.org", tmp_path) is not None


# --------------------------------------------------------------------------------------------
# The repository
# --------------------------------------------------------------------------------------------


def test_mkdocs_build_strict(tmp_path):
    """The site builds with --strict: every page in the nav, every link and anchor resolves, every
    mkdocstrings target is collected. mkdocs comes with the test extra (its `docs` extra)."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"mkdocs build --strict failed (exit {result.returncode}):\n{output}"
    assert (tmp_path / "site" / "index.html").is_file(), output
    assert (tmp_path / "site" / "api" / "index.html").is_file(), output


def test_readme_is_short():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, (
        f"README.md has {len(lines)} lines (at most {MAX_README_LINES}): move the details into docs/ "
        "and experiment notes into bench/results/<folder>/README.md"
    )


def test_no_link_leaves_the_repository():
    files = markdown_files()
    assert len(files) > 3 and (ROOT / "docs" / "index.md") in files
    bad = []
    for path in files:
        for target in link_targets(path.read_text()):
            reason = forbidden_target(target)
            if reason:
                bad.append(f"{path.relative_to(ROOT)}: link {target!r} {reason}")
    assert not bad, "\n".join(bad)


def test_readme_links_resolve_in_the_repository():
    targets = link_targets(README.read_text())
    assert targets, "README.md has no links (the docs pointers are missing)"
    bad = [f"README.md: link {t!r} {why}" for t in targets if (why := unresolved_readme_target(t))]
    assert not bad, "\n".join(bad)


def test_readme_holds_the_ci_test_command():
    command = ci_test_command()
    assert "pytest" in command, f".ci/run's last line is not the test command: {command!r}"
    assert command in README.read_text(), f"README.md must show the exact test command that .ci/run runs:\n  {command}"


def test_the_config_reference_page_is_the_configs_own_fields():
    from rwcore.trainer.config import config_markdown

    page = (ROOT / "docs" / "configs.md").read_text()
    assert "## Every section and key" in page
    assert page.split("## Every section and key", 1)[1].strip() == config_markdown().strip(), (
        "docs/configs.md is out of date: regenerate its last section with rwcore.trainer.config.config_markdown()"
    )


def test_the_metrics_glossary_is_the_declared_keys():
    from rwcore.trainer.metrics import metrics_markdown

    page = (ROOT / "docs" / "metrics.md").read_text()
    assert "## Every key" in page
    assert page.split("## Every key", 1)[1].strip() == metrics_markdown().strip(), (
        "docs/metrics.md is out of date: regenerate its last section with rwcore.trainer.metrics.metrics_markdown()"
    )
