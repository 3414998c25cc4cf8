"""The rubrics of `env.name=tasks` (`env.options.rubrics`: a YAML or JSON file), for RewardWeaver and Arise.

    rubrics:
      - id: states_answer                    # unique; [A-Za-z0-9_.-]
        criterion: The reply states one final answer.
        applicability: Every task.           # optional (default: every task)
        capability: Execution                # optional Arise category (default Execution)
        family: execution                    # optional RewardWeaver family (default: capability, lower case)
        skill: End with one final answer.    # optional skill text the rule reflector proposes (default: criterion)
        check: my_rewards:states_answer      # optional module:function (see functions.py): True / False / None

Either every rubric has a check or none does. With checks the rubrics are the environment's rules: judge.kind=rule
judges them, and a rule reflector and attributor come with them (every variant runs without an LLM). Without
checks they are capability candidates for an LLM judge (judge.kind=openai), admitted to RewardWeaver's library
unvalidated (no labelled cases); the LLM judge, reflector and attributor do the rest.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from rwcore.trainer.envs.base import Rule
from rwcore.trainer.envs.tasks.functions import UserFunction, check_value
from rwcore.types import RubricSpec, Trajectory

FIELDS = ("id", "criterion", "applicability", "capability", "family", "skill", "check")
_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class TaskRubrics:
    """The rubrics of a rubrics file, checked when read (ValueError naming FILE:rubrics[i].FIELD).

    specs: the RubricSpecs; families / skills: by rubric id; checks: by rubric id (empty without checks)."""

    def __init__(self, path: str | Path, option: str = "env.options.rubrics") -> None:
        self.path = Path(path).resolve()
        if not self.path.is_file():
            raise ValueError(f"{option}: {str(path)!r} is not a file")
        entries = self._entries(option)
        self.specs: list[RubricSpec] = []
        self.families: dict[str, str] = {}
        self.skills: dict[str, str] = {}
        self.checks: dict[str, UserFunction] = {}
        for i, entry in enumerate(entries):
            self._add(f"{self.path}:rubrics[{i}]", entry)
        if self.checks and len(self.checks) != len(self.specs):
            bare = next(s.rubric_id for s in self.specs if s.rubric_id not in self.checks)
            raise ValueError(
                f"{self.path}: rubric {bare!r} has no check while others have one; either every rubric has a "
                "check (judge.kind=rule) or none does (judge.kind=openai judges them)"
            )

    def _entries(self, option: str) -> list:
        text = self.path.read_text(encoding="utf-8")
        try:
            if self.path.suffix == ".json":
                data = json.loads(text)
            else:
                import yaml

                data = yaml.safe_load(text)
        except Exception as error:
            reason = str(error).replace("\n", " ")
            raise ValueError(f"{option}: {str(self.path)!r} is not valid YAML/JSON ({reason})") from None
        if not isinstance(data, dict) or set(data) != {"rubrics"} or not isinstance(data["rubrics"], list):
            raise ValueError(f"{self.path}: the file holds one key, rubrics: a list of rubric entries")
        if not data["rubrics"]:
            raise ValueError(f"{self.path}:rubrics: the list is empty")
        return data["rubrics"]

    def _add(self, where: str, entry) -> None:
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: a mapping with the fields {', '.join(FIELDS)}")
        unknown = [key for key in entry if key not in FIELDS]
        if unknown:
            raise ValueError(f"{where}.{unknown[0]}: not a rubric field (fields: {', '.join(FIELDS)})")
        for key in ("id", "criterion"):
            if key not in entry:
                raise ValueError(f"{where}.{key}: missing")
        for key in FIELDS:
            if key in entry and (not isinstance(entry[key], str) or not entry[key].strip()):
                raise ValueError(f"{where}.{key}: a non-empty string, got {entry[key]!r}")
        rubric_id = entry["id"]
        if not _ID.match(rubric_id):
            raise ValueError(f"{where}.id: letters, digits, _ . - (at most 64), got {rubric_id!r}")
        if rubric_id in self.families:
            raise ValueError(f"{where}.id: duplicate rubric id {rubric_id!r}")
        capability = entry.get("capability", "Execution")
        self.specs.append(
            RubricSpec(
                rubric_id=rubric_id,
                criterion=entry["criterion"],
                applicability=entry.get("applicability", "Every task."),
                capability=capability,
            )
        )
        self.families[rubric_id] = entry.get("family", capability.lower())
        self.skills[rubric_id] = entry.get("skill", entry["criterion"])
        if "check" in entry:
            self.checks[rubric_id] = UserFunction(entry["check"], f"{where}.check")

    def rules(self, arguments_of) -> list[Rule] | None:
        """The rubrics with checks as Rules (None without checks); `arguments_of(trajectory)` -> (the
        function arguments, where) of a finished episode."""
        if not self.checks:
            return None
        return [Rule(spec, self.families[spec.rubric_id], self._check(spec, arguments_of)) for spec in self.specs]

    def _check(self, spec: RubricSpec, arguments_of):
        function = self.checks[spec.rubric_id]

        def check(trajectory: Trajectory):
            arguments, where = arguments_of(trajectory)
            return check_value(function.call(where, arguments), function, where)

        check.__name__ = f"check_{spec.rubric_id}"
        check.__doc__ = spec.criterion
        return check

    def digest(self) -> str:
        from rwcore.trainer.envs.tasks.functions import file_digest

        return file_digest(self.path)
