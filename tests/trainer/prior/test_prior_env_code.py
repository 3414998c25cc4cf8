"""Which of an environment's code the reading prior's cache key hashes (rwcore.trainer.prior.pretrain).

The key holds the code of the module that defines the environment's class and of the modules of its package that
one imports at module level, transitively - not what it imports inside a function (what it hands out on request).
Those modules' top-level statements are hashed without imports and docstrings, in sorted order, so moving a
definition from one of them to another changes no key, and changing code does. Checked on a package written here
and on the negotiation environment's modules. Nothing is pretrained.
"""

import importlib
import sys
import textwrap

from rwcore.trainer import envs
from rwcore.trainer.prior import pretrain as pretrain_module

ENV = """
from prior_key_shapes.words import WORDS


class ShapeEnv:
    def observe(self):
        return shout(WORDS)

    def rules(self):
        from prior_key_shapes.rubrics import RULES

        return RULES


def shout(words):
    return " ".join(words).upper()
"""
WORDS = 'WORDS = ("circle", "square")\n'
RUBRICS = "RULES = ('says_circle',)\n"


def write(folder, **sources):
    for name, text in sources.items():
        (folder / "prior_key_shapes" / f"{name}.py").write_text(textwrap.dedent(text))


def digest() -> str:
    return pretrain_module._env_sources(importlib.import_module("prior_key_shapes.env").ShapeEnv())


def test_the_key_hashes_the_modules_an_environment_imports_at_module_level(tmp_path, monkeypatch):
    (tmp_path / "prior_key_shapes").mkdir()
    write(tmp_path, __init__="", env=ENV, words=WORDS, rubrics=RUBRICS)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "prior_key_shapes" or m.startswith("prior_key_shapes.")]:
        monkeypatch.delitem(sys.modules, name)
    env = importlib.import_module("prior_key_shapes.env").ShapeEnv()
    assert env.observe() == "CIRCLE SQUARE" and env.rules() == ("says_circle",)
    assert [m.__name__ for m in pretrain_module._env_modules(env)] == ["prior_key_shapes.env", "prior_key_shapes.words"]
    first = digest()

    write(tmp_path, rubrics="RULES = ('says_square',)\n")  # imported inside a method: not hashed
    assert digest() == first
    write(tmp_path, words='"""The words."""\n\n# a comment\nWORDS = ("circle",\n         "square")\n')
    assert digest() == first  # a docstring, a comment, formatting
    write(tmp_path, words='WORDS = ("circle", "triangle")\n')
    assert digest() != first  # the code of a module the environment's module imports
    write(tmp_path, words=WORDS, env=ENV.replace(".upper()", ".lower()"))
    assert digest() != first  # the environment's module's own code

    # the same code split differently: `shout` moved into words.py
    moved = '\n\ndef shout(words):\n    return " ".join(words).upper()\n'
    write(
        tmp_path,
        env=ENV.replace(moved, "\n").replace("import WORDS", "import WORDS, shout"),
        words=WORDS + moved,
    )
    assert "def shout" not in (tmp_path / "prior_key_shapes" / "env.py").read_text()
    assert digest() == first


def test_the_negotiation_key_hashes_its_language_tasks_guidance_and_simulator():
    prefix = "rwcore.trainer.envs.negotiation."
    learnable = [m.__name__ for m in pretrain_module._env_modules(envs.make("negotiation"))]
    hard = [m.__name__ for m in pretrain_module._env_modules(envs.make("negotiation", difficulty="hard"))]
    assert learnable == [prefix + name for name in ("environment", "guidance", "language", "tasks")]
    assert hard == [prefix + name for name in ("environment", "guidance", "hard", "language", "tasks")]
