"""Every fenced code block of README.md and docs/*.md runs as written, or says why it does not.

The conventions (docs/index.md, "Contributing to the docs", says the same for writers):

- A ```python block runs as a script of its own: in a fresh process, a fresh empty temporary working directory,
  as `__main__`, with this venv's Python and this checkout's package, under a timeout (`TIMEOUT_S`). It fails
  the test if it raises. Blocks do not share names: a user who copies one block gets a program that runs.
  For speed the processes are forked from one runner that has imported torch, NumPy and rwcore already
  (tests/docs/snippet_runner.py); each block still starts with an empty namespace, so a missing import fails.
- `<!-- continues -->` on the line right above a fence: the block is the continuation of the page's previous
  python block; the two (or a chain of them) run as one script, the earlier ones first. Use it to split one
  program into explained steps; the first block of the chain must run alone as well.
- `<!-- fragment: PATH -->` on the line right above a fence: the block is an excerpt that cannot run alone in
  a few seconds offline (it needs a trainer's cluster, a GPU, a model from a hub, an exported model, or takes
  long); it is not run, and PATH, relative to the repository root, is a runnable example or a test that runs
  what the block shows. The test checks that PATH exists and is a file.
- Shell blocks (bash, sh, shell, console; in a console block the lines after a `$ ` prompt) pass `bash -n`, and
  every `rw` command in them (`rw`, `.venv/bin/rw`, ...; several per line joined with `&&`, `;`, `|`) is
  parsed by `rw`'s own parser (`rwcore.trainer.cli.parse_argv`): the subcommand and its flags must exist,
  every `key=value` override must name a key of the config schema (and, when its value is literal text, not a
  placeholder -- `$VAR`, a quoted `'<folder>'`, `...` or a word in capitals such as `N` -- hold a value of the
  key's type), and `--config NAME` must be a shipped config or
  a path. The `rw config` and `rw variants` commands run (they are fast and write nothing); the rest are
  checked, not run.
- `<!-- needs: gpu -->`, `<!-- needs: hub -->` or `<!-- needs: network -->` (several may be combined,
  `<!-- needs: hub, gpu -->`) on the lines right above a fence: the block needs what it names and is never
  run (a python one must then also be a fragment); a shell block is still checked as above. A shell block
  whose `rw` command trains a model from a hub (`model=` / `model.name=` an `org/name` id, or a shipped config
  that names one) must say `needs: hub`.

Marker lines are HTML comments (MkDocs renders nothing for them); several may stand one above the other, the
lowest right above the fence. Blocks in other languages (yaml, text, none) are not checked here.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from _util import ROOT

TIMEOUT_S = 60  # one python block (they take well under a second each; the slow ones are fragments)
SHELL_LANGS = {"bash", "sh", "shell", "console"}
NEEDS = {"gpu", "hub", "network"}
RUNNER = Path(__file__).with_name("snippet_runner.py")
_MARKER = re.compile(r"^\s*<!--\s*(continues|fragment|needs)\s*(?::\s*(.*?))?\s*-->\s*$")
_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")


def doc_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


@dataclass
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    markers: dict[str, str] = field(default_factory=dict)  # continues / fragment / needs -> argument

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def needs(self) -> set[str]:
        return {part.strip() for part in self.markers.get("needs", "").split(",") if part.strip()}


def read_blocks(page: Path) -> list[Block]:
    """The fenced code blocks of a markdown page, with the marker comments right above each fence."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, fence, lang = match.group(1), match.group(2), match.group(3).lower()
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            j += 1
        body = [line[len(indent) :] if line.startswith(indent) else line for line in lines[i + 1 : j]]
        markers, k = {}, i - 1
        while k >= 0 and (marker := _MARKER.match(lines[k])):
            markers[marker.group(1)] = marker.group(2) or ""
            k -= 1
        blocks.append(Block(page, i + 1, lang, "\n".join(body) + "\n", markers))
        i = j + 1
    return blocks


ALL_BLOCKS = [block for page in doc_pages() for block in read_blocks(page)]
PYTHON = [b for b in ALL_BLOCKS if b.lang in ("python", "py", "python3")]
SHELL = [b for b in ALL_BLOCKS if b.lang in SHELL_LANGS]
RUN = [b for b in PYTHON if "fragment" not in b.markers]


def script_of(block: Block) -> str:
    """The program a python block runs: the block, after the blocks it continues (`<!-- continues -->`)."""
    page = [b for b in PYTHON if b.page == block.page]
    chain = [block]
    while "continues" in chain[0].markers:
        earlier = [b for b in page if b.line < chain[0].line]
        assert earlier, f"{chain[0].id}: <!-- continues --> but no python block above it on the page"
        chain.insert(0, earlier[-1])
    return "\n".join(f"# --- {b.id}\n{b.text}" for b in chain)


# ------------------------------------------------------------------------------------------------ the markers


def test_the_pages_have_blocks_and_markers_are_well_formed():
    assert len(PYTHON) >= 10 and len(SHELL) >= 20  # the parser finds the pages' blocks
    for block in ALL_BLOCKS:
        assert block.needs <= NEEDS, f"{block.id}: unknown needs {sorted(block.needs - NEEDS)}; known: {sorted(NEEDS)}"
        if "fragment" in block.markers:
            assert block.lang in ("python", "py", "python3"), f"{block.id}: only python blocks are fragments"
        if block.needs and block.lang == "python":
            assert "fragment" in block.markers, (
                f"{block.id}: a python block marked needs: is never run: mark it a fragment"
            )


@pytest.mark.parametrize("block", [b for b in PYTHON if "fragment" in b.markers], ids=lambda b: b.id)
def test_a_fragment_points_to_a_runnable_example_or_test(block):
    pointer = block.markers["fragment"].strip()
    assert pointer, f"{block.id}: <!-- fragment: PATH --> needs the path of a runnable example or test"
    path = ROOT / pointer.split("::", 1)[0]
    assert path.is_file(), f"{block.id}: the fragment's pointer {pointer!r} is not a file of the repository"
    assert path.relative_to(ROOT).parts[0] in ("examples", "tests"), (
        f"{block.id}: {pointer!r} is not under examples/ or tests/"
    )
    compile(block.text, block.id, "exec")  # an excerpt, but valid Python
    assert not unimportable_names(block.text), (
        f"{block.id}: imports names that do not exist: {unimportable_names(block.text)}"
    )
    if "::" in pointer:  # a test function named in the pointer exists in that file
        name = pointer.split("::", 1)[1]
        assert re.search(rf"^def {re.escape(name)}\(", path.read_text(), re.M), f"{block.id}: no test {name} in {path}"


_RWCORE_IMPORT = re.compile(
    r"^[ \t]*(?:>>>[ \t]*)?from[ \t]+(rwcore[\w.]*)[ \t]+import[ \t]+(?:\(([\w\s,]+)\)|([\w ,]+))", re.M
)


def unimportable_names(text: str) -> list[str]:
    """`module.name` for every name a `from rwcore... import a, b` line of `text` names that the module lacks (a
    lazily exported name counts when the module's __all__ lists it: nothing heavy is imported to check)."""
    import importlib

    missing = []
    for match in _RWCORE_IMPORT.finditer(text):
        module_name = match.group(1)
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            missing.append(module_name)
            continue
        for name in (part.split(" as ")[0].strip() for part in (match.group(2) or match.group(3)).split(",")):
            if name and name not in getattr(module, "__all__", ()) and not hasattr(module, name):
                missing.append(f"{module_name}.{name}")
    return missing


def docstrings() -> list[tuple[str, str]]:
    """(where, docstring) of every module, class and function of the package's sources."""
    import ast

    found = []
    for folder in ("rwcore", "kernels", "trainer"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    doc = ast.get_docstring(node, clean=False)
                    if doc and "from rwcore" in doc:
                        found.append((f"{path.relative_to(ROOT)}:{getattr(node, 'name', '<module>')}", doc))
    return found


def test_the_imports_docstrings_show_import():
    """A docstring's `from rwcore... import X` line (what a user copies first) names what the module exports."""
    found = docstrings()
    assert len(found) >= 4
    problems = [f"{where}: {names}" for where, doc in found if (names := unimportable_names(doc))]
    assert not problems, "\n".join(problems)


# ----------------------------------------------------------------------------------------- the python blocks


CANARIES = [  # jobs that check the runner itself (test_the_runner_reports_a_failing_block_and_a_timeout)
    {"id": "canary:ok", "source": "import os\nprint(__name__, os.listdir('.'))"},
    {"id": "canary:missing-import", "source": "torch.zeros(1)"},
    {"id": "canary:slow", "source": "import time\ntime.sleep(30)", "timeout": 1},
]


@pytest.fixture(scope="module")
def python_results(tmp_path_factory):
    """Runs every python block that is not a fragment, each as its own process (snippet_runner.py)."""
    work = tmp_path_factory.mktemp("snippets")
    jobs = [{"id": b.id, "source": script_of(b)} for b in RUN] + CANARIES
    (work / "jobs.json").write_text(json.dumps(jobs))
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), PYTHONDONTWRITEBYTECODE="1")
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")  # offline, as CI: a hub name fails at once
    done = subprocess.run(
        [sys.executable, str(RUNNER), str(work / "jobs.json"), str(work), str(TIMEOUT_S)],
        capture_output=True,
        text=True,
        env=env,
        timeout=TIMEOUT_S * (len(jobs) + 2),
    )
    assert done.returncode == 0, f"the snippet runner failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return json.loads((work / "results.json").read_text())


@pytest.mark.parametrize("block", RUN, ids=lambda b: b.id)
def test_a_python_block_runs_as_written(block, python_results):
    result = python_results[block.id]
    assert result["rc"] == 0, (
        f"{block.id} ({'timed out' if result['timed_out'] else 'exit ' + str(result['rc'])}) does not run as "
        f"written; fix it, or mark it <!-- fragment: PATH --> naming a runnable example or test:\n{result['output']}"
    )


# ------------------------------------------------------------------------------------------ the shell blocks

_CONTROL = {"&&", "||", ";", "|", "&", ";;", "(", ")", "{", "}"}
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_LOCAL_DIRS = {"runs", "exports", "models", "tmp", "data"}  # run / export folders the docs use, not hub ids
_LOADS_A_MODEL = {"train", "pretrain", "probe", "eval", "ablate"}  # what `rw config` only prints, these load
_PLACEHOLDER = re.compile(r"[$<>`]|\.\.\.|^[A-Z][A-Z0-9_]*$")  # $RUN, '<folder>', ..., or a word in capitals: N, FILE


def shell_commands(block: Block) -> list[str]:
    """The block's script: in a console block the commands after `$ ` prompts, else the whole text."""
    if block.lang != "console":
        return [block.text]
    commands = []
    for line in block.text.splitlines():
        if line.startswith("$ "):
            commands.append(line[2:])
        elif commands and commands[-1].endswith("\\"):
            commands[-1] += "\n" + line
    return commands


def rw_commands(script: str) -> list[list[str]]:
    """Every `rw ...` command of a shell script, as its argument list after `rw`."""
    joined = re.sub(r"\\\n", " ", script)
    found = []
    for line in joined.splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|()")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        try:
            tokens = list(lexer)
        except ValueError:  # unbalanced quotes: bash -n reports it
            continue
        words: list[str] = []
        for token in [*tokens, ";"]:
            if token in _CONTROL or set(token) <= set(";&|()"):
                while words and re.match(r"^[A-Za-z_]\w*=", words[0]):  # VAR=value before the program
                    words.pop(0)
                if words and (words[0] == "rw" or words[0].endswith("/rw")):
                    found.append(words[1:])
                words = []
            else:
                words.append(token)
    return found


def _key_exists(key: str) -> str | None:
    """Why `section.key[.deeper]` is not a key of the config schema, or None."""
    import dataclasses
    import typing

    from rwcore.trainer.config import Config
    from rwcore.trainer.config.coercion import field_types, is_section
    from rwcore.trainer.config.schema import config_sections

    if key == "model":
        key = "model.name"
    parts = key.split(".")
    sections = config_sections(Config())
    if len(parts) < 2 or parts[0] not in sections:
        return f"{key!r} has no config section {parts[0]!r} (sections: {', '.join(sections)})"
    node = sections[parts[0]]
    for depth, part in enumerate(parts[1:], start=1):
        names = [f.name for f in dataclasses.fields(node)]
        if part not in names:
            return f"unknown config key {'.'.join(parts[: depth + 1])!r}; keys there: {', '.join(names)}"
        tp = field_types(type(node))[part]
        if is_section(tp):
            node = getattr(node, part)
            continue
        if depth < len(parts) - 1 and not (tp is dict or typing.get_origin(tp) is dict):
            return f"{'.'.join(parts[: depth + 1])!r} is not a mapping: {key!r} goes deeper"
        return None
    return f"{key!r} is a section, not a key"


def check_rw_command(argv: list[str]) -> tuple[list[str], list[str]]:
    """(problems, hub model ids) of one `rw` command: parsed by rw's parser, overrides against the schema."""
    from rwcore.trainer.cli import parse_argv
    from rwcore.trainer.cli.command import _shipped_configs
    from rwcore.trainer.config import Config, load_config
    from rwcore.trainer.config.loader import _apply_override

    problems, models = [], []
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            command, args = parse_argv(argv)
    except SystemExit as stop:
        if stop.code in (0, None):  # --help
            return problems, models
        return [f"rw {' '.join(argv)}: {err.getvalue().strip().splitlines()[-1]}"], models
    for override in getattr(args, "overrides", None) or []:
        key, _, value = override.partition("=")
        reason = _key_exists(key.strip())
        if reason:
            problems.append(f"rw {' '.join(argv)}: {reason}")
            continue
        if not _PLACEHOLDER.search(value):
            try:
                _apply_override(Config(), override)
            except ValueError as error:
                problems.append(f"rw {' '.join(argv)}: {error}")
        if key.strip() in ("model", "model.name"):
            models.append(value)
    config = getattr(args, "config", None)
    if config and not _PLACEHOLDER.search(config):
        shipped = _shipped_configs()
        if config in shipped:
            models.append(str(load_config(shipped[config]).model.name))
        elif "/" not in config and not config.endswith((".yaml", ".yml")):
            problems.append(f"rw {' '.join(argv)}: --config {config!r} is neither a path nor a shipped config")
    if command.name not in _LOADS_A_MODEL:
        return problems, []
    hub = [m for m in models if _HUB_ID.match(m) and m.split("/")[0] not in _LOCAL_DIRS]
    return problems, hub


@pytest.mark.parametrize("block", SHELL, ids=lambda b: b.id)
def test_a_shell_block_parses_and_its_rw_commands_are_valid(block):
    for script in shell_commands(block):
        syntax = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True, timeout=30)
        assert syntax.returncode == 0, f"{block.id}: bash -n: {syntax.stderr.strip()}"
    commands = [argv for script in shell_commands(block) for argv in rw_commands(script)]
    problems, hub = [], []
    for argv in commands:
        found, models = check_rw_command(argv)
        problems += found
        hub += models
    assert not problems, f"{block.id}:\n" + "\n".join(problems)
    if hub:
        assert "hub" in block.needs, f"{block.id}: trains {hub} from a hub: put <!-- needs: hub --> above the fence"


def test_the_rw_config_and_variants_commands_of_the_docs_run(tmp_path, monkeypatch):
    from rwcore.trainer.cli import main
    from rwcore.trainer.cli.command import _shipped_configs

    monkeypatch.chdir(tmp_path)
    ran = 0
    for block in SHELL:
        if block.needs:
            continue
        for script in shell_commands(block):
            for argv in rw_commands(script):
                if argv[:1] not in (["config"], ["variants"]) or any(_PLACEHOLDER.search(a) for a in argv):
                    continue
                if "--config" in argv and argv[argv.index("--config") + 1] not in _shipped_configs():
                    continue  # a config file of the user's (my.yaml): checked above, not run
                out = io.StringIO()
                with contextlib.redirect_stdout(out):
                    code = main(argv)
                assert code == 0, f"{block.id}: rw {' '.join(argv)} exited {code}"
                assert out.getvalue().strip(), f"{block.id}: rw {' '.join(argv)} printed nothing"
                ran += 1
    assert ran >= 2  # the docs show `rw config --describe` and `rw variants`
    assert not list(tmp_path.iterdir()), "rw config / rw variants wrote files"


# ------------------------------------------------------------------------------------ the checks themselves


def test_the_checks_catch_what_they_are_for(tmp_path):
    """Each check fails on a page made to break it (the checks can fail)."""
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- needs: hub -->\n<!-- fragment: examples/none.py -->\n```python\nx = 1\n```\n\n"
        "```bash\n.venv/bin/rw train --out runs/x train.stepz=3 && rw variants | head\n"
        "rw train --bogus\nrw train model.name=Org/Model optim.lr=fast\n```\n",
    )
    first, second = read_blocks(page)
    assert first.markers == {"needs": "hub", "fragment": "examples/none.py"} and first.needs == {"hub"}
    argvs = rw_commands(second.text)
    assert argvs == [
        ["train", "--out", "runs/x", "train.stepz=3"],
        ["variants"],
        ["train", "--bogus"],
        ["train", "model.name=Org/Model", "optim.lr=fast"],
    ]
    assert "unknown config key 'train.stepz'" in check_rw_command(argvs[0])[0][0]
    assert check_rw_command(argvs[1]) == ([], [])
    assert "unrecognized arguments: --bogus" in check_rw_command(argvs[2])[0][0]
    problems, hub = check_rw_command(argvs[3])
    assert hub == ["Org/Model"] and len(problems) == 1 and "optim.lr" in problems[0]
    assert check_rw_command(["train", "--config", "arise-qwen"])[1]  # a shipped config naming a hub model
    assert check_rw_command(["config", "--config", "arise-qwen"]) == ([], [])  # prints it, loads nothing
    assert check_rw_command(["train", "--config", "nope"])[0]
    assert check_rw_command(["train", "model.name=runs/x", "env.options.difficulty=hard"]) == ([], [])
    assert check_rw_command(["train", "train.steps=N", "model.name=<folder>"]) == ([], [])  # placeholders
    assert check_rw_command(["train", "train.steps=n"])[0]  # not a placeholder: not an int
    assert _key_exists("model.lora.rank") is None and _key_exists("model.lora.rnk")
    assert _key_exists("env.options.anything.deeper") is None and _key_exists("optim.lr.x")
    assert unimportable_names("from rwcore import Verdict, NoSuchName\nfrom rwcore.nowhere import x") == [
        "rwcore.NoSuchName",
        "rwcore.nowhere",
    ]
    assert (
        unimportable_names("from rwcore.integrations.trl import (\n    RWGRPOTrainer,\n    rubric_reward_funcs,\n)")
        == []
    )


def test_the_runner_reports_a_failing_block_and_a_timeout(python_results):
    """The canaries, run beside the docs' blocks: an empty folder and __main__; a name the block does not import
    (torch, which the runner has imported) fails; a block past its timeout is killed and fails."""
    ok, missing, slow = (python_results[job["id"]] for job in CANARIES)
    assert ok["rc"] == 0 and "__main__ []" in ok["output"]
    assert missing["rc"] != 0 and "NameError: name 'torch' is not defined" in missing["output"]
    assert slow["timed_out"] and slow["rc"] != 0
