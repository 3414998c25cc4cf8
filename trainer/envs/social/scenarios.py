"""The social environment's scenario files: their format and the loader that checks every field (see the package
docstring, "Scenarios"); the built-in scenarios are scenarios.json next to this module."""

from __future__ import annotations

import json
from pathlib import Path

DEFAULT_SCENARIOS = Path(__file__).parent / "scenarios.json"
TASK_TYPES = ("negotiation", "persuasion", "cooperation", "conflict", "information")
REQUIRED = (
    "id",
    "task_type",
    "difficulty",
    "split",
    "setting",
    "agent",
    "partner",
    "goal_keywords",
    "secret_keywords",
    "partner_lines",
    "partner_agrees",
)
SIDE_FIELDS = ("name", "background", "goal", "secret")


def load_scenarios(path: str | Path) -> list[dict]:
    """Every scenario of a JSON file or of a folder's *.json files; ValueError naming the file, the scenario
    and the field on anything missing or malformed."""
    path = Path(path)
    files = sorted(path.glob("*.json")) if path.is_dir() else [path]
    if not files or not all(f.is_file() for f in files):
        raise ValueError(
            f"env.options.scenarios: {str(path)!r} is not a scenario file or a folder holding *.json files"
        )
    scenarios, seen = [], {}
    for file in files:
        try:
            data = json.loads(file.read_text())
        except (OSError, ValueError) as error:
            raise ValueError(f"scenario file {str(file)!r}: not readable JSON ({error})") from None
        items = data.get("scenarios") if isinstance(data, dict) else data
        if not isinstance(items, list) or not items:
            raise ValueError(f"scenario file {str(file)!r}: missing field 'scenarios' (a non-empty list)")
        for index, item in enumerate(items):
            where = f"scenario file {str(file)!r}, scenario #{index}"
            if not isinstance(item, dict):
                raise ValueError(f"{where}: must be an object")
            if isinstance(item.get("id"), str):
                where += f" ({item['id']!r})"
            for key in REQUIRED:
                if key not in item:
                    raise ValueError(f"{where}: missing field {key!r}")
            for side in ("agent", "partner"):
                if not isinstance(item[side], dict):
                    raise ValueError(f"{where}: field {side!r} must be an object")
                for key in SIDE_FIELDS:
                    if key not in item[side]:
                        raise ValueError(f"{where}: missing field '{side}.{key}'")
                    if not isinstance(item[side][key], str) or (key != "secret" and not item[side][key].strip()):
                        raise ValueError(f"{where}: field '{side}.{key}' must be a non-empty string")
            for key in ("id", "task_type", "setting", "partner_agrees"):
                if not isinstance(item[key], str) or not item[key].strip():
                    raise ValueError(f"{where}: field {key!r} must be a non-empty string")
            if item["split"] not in ("train", "eval"):
                raise ValueError(f"{where}: field 'split' must be 'train' or 'eval', got {item['split']!r}")
            if isinstance(item["difficulty"], bool) or item["difficulty"] not in (1, 2, 3):
                raise ValueError(f"{where}: field 'difficulty' must be 1, 2 or 3, got {item['difficulty']!r}")
            for key in ("goal_keywords", "secret_keywords", "partner_lines"):
                value = item[key]
                if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
                    raise ValueError(f"{where}: field {key!r} must be a list of non-empty strings")
            if not item["goal_keywords"] or not item["partner_lines"]:
                raise ValueError(f"{where}: fields 'goal_keywords' and 'partner_lines' must not be empty")
            if item["id"] in seen:
                raise ValueError(f"{where}: id {item['id']!r} already used in {seen[item['id']]!r}")
            seen[item["id"]] = str(file)
            scenarios.append(item)
    for split in ("train", "eval"):
        if not any(s["split"] == split for s in scenarios):
            raise ValueError(f"env.options.scenarios {str(path)!r}: no scenario has split {split!r}")
    return scenarios
