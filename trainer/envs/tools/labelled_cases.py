"""Labelled cases for admitting the tools rubrics as RewardWeaver capabilities: synthetic tool-call logs built
from behaviour flags (inspected or not, checked the output or not, repeated an error or not...), and
each label is the flags' declared meaning (`_labels`), not the rule's reading of the log, so admission
tests the rule against an independent statement of what it should say.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from rwcore.trainer.envs.tools.rubrics import OUTPUTS, RULES_BY_ID
from rwcore.trainer.envs.tools.tasks import CALL_BUDGET, INPUT_FILES, KINDS
from rwcore.types import Trajectory, Turn
from rwcore.verdict import Verdict

_WORK = {  # kind -> (main call kind, text, files it changes)
    "compute": ("python", "import csv\nrows = list(csv.DictReader(open('data.csv')))\nprint(len(rows))", []),
    "transform": (
        "python",
        "import csv, json\njson.dump([r['name'] for r in csv.DictReader(open('people.csv'))], open('out.json', 'w'))",
        ["out.json"],
    ),
    "write_file": (
        "python",
        "import os\nos.makedirs('notes', exist_ok=True)\nopen('notes/summary.txt', 'w').write('a b\\n')",
        ["notes/summary.txt"],
    ),
    "fix_bug": (
        "python",
        "s = open('stats.py').read()\nopen('stats.py', 'w').write(s.replace('s -= ', 's += '))",
        ["stats.py"],
    ),
    "search": ("python", "import os\nfor f in os.listdir('docs'):\n    print(open('docs/' + f).read())", []),
}
_CHECK = {"transform": "cat out.json", "write_file": "cat notes/summary.txt", "fix_bug": "python3 stats.py"}
_GOOD_ANSWER = {"compute": "42", "fix_bug": "17", "search": "teal", "transform": "done", "write_file": "done"}
_BAD_ANSWER = {
    "compute": "the answer is 42",
    "fix_bug": "it prints 17",
    "search": "the color is teal",
    "transform": "i wrote the file",
    "write_file": "finished writing",
}


def _event(turn, kind, text, ok=True, changed=(), error=None):
    return {
        "turn": turn,
        "kind": kind,
        "text": text,
        "ok": ok,
        "exit": 0 if ok else 1,
        "error": error,
        "changed": list(changed),
    }


def _synthetic(rng: random.Random, kind: str, flags: dict) -> list[dict]:
    events: list[dict] = []

    def add(*args, **kwargs):
        events.append(_event(len(events) + 1, *args, **kwargs))

    if flags["error"] != "none":
        bad = rng.choice(("print(undefined_name)", "import nosuchmodule", "open('missing.txt').read()"))
        add("python", bad, ok=False)
        if flags["error"] == "repeat":
            add("python", bad, ok=False)
    if flags["inspect"] and INPUT_FILES[kind]:
        add(
            "shell",
            f"{rng.choice(('head -n 3', 'cat', 'wc -l'))} {INPUT_FILES[kind][0]}"
            if kind != "search"
            else rng.choice(("ls docs", "grep -rh port docs")),
        )
    if flags["work"]:
        call, text, changed = _WORK[kind]
        add(call, text, changed=changed)
        if flags["check"] and kind in _CHECK:
            add("shell", _CHECK[kind])
    for i in range(flags["extra"]):
        add("shell", f"echo step {i} {rng.randrange(1000)}")
    if flags["answered"]:
        add("answer", _GOOD_ANSWER[kind] if flags["answer_ok"] else _BAD_ANSWER[kind])
    return events


def _labels(kind: str, flags: dict) -> dict[str, Verdict]:
    """The declared verdict of every rule for a log built from `flags` (the rules' specification restated over
    the flags, independently of the code that reads logs)."""
    P, F, NA = Verdict.PASS, Verdict.FAIL, Verdict.NA
    acted = (
        flags["error"] != "none"
        or flags["work"]
        or flags["extra"]
        or flags["answered"]
        or (flags["inspect"] and INPUT_FILES[kind])
    )
    calls = (
        (2 if flags["error"] == "repeat" else 1 if flags["error"] == "recover" else 0)
        + bool(flags["inspect"] and INPUT_FILES[kind])
        + flags["work"]
        + (flags["work"] and flags["check"] and kind in _CHECK)
        + flags["extra"]
    )
    answered = flags["answered"]
    return {
        "inspects_input": NA if not INPUT_FILES[kind] or not acted else (P if flags["inspect"] else F),
        "runs_code_before_answer": NA
        if not answered
        else (P if (flags["inspect"] and INPUT_FILES[kind]) or flags["work"] or flags["extra"] else F),
        "checks_output": NA if kind not in OUTPUTS or not flags["work"] else (P if flags["check"] else F),
        "reruns_after_fix": NA if kind != "fix_bug" or not flags["work"] else (P if flags["check"] else F),
        "recovers_from_errors": NA if flags["error"] == "none" else (P if flags["error"] == "recover" else F),
        "answer_format": NA if not answered else (P if flags["answer_ok"] else F),
        "efficient_calls": NA
        if not answered
        else (P if flags["error"] != "repeat" and calls <= CALL_BUDGET[kind] else F),
    }


def _case_trajectory(kind: str, events: list[dict], case_id: str) -> Trajectory:
    turns = [Turn("system", "you solve the task with tools"), Turn("partner", f"task : a {kind} task")]
    for e in events:
        turns.append(Turn("assistant", e["text"], generated=True))
        turns.append(Turn("partner", "tool result : exit 0" if e["ok"] else "tool result : exit 1"))
    state = {"kind": kind, "events": events, "answer": None, "verdict": None, "turns": len(events)}
    return Trajectory(
        task_id=case_id,
        turns=turns,
        outcome=0.0,
        tags=(kind,),
        trajectory_id=case_id,
        metadata={"env_state": state, "task": {"kind": kind}, "task_id": case_id, "seed": 0, "success": False},
    )


def labelled_cases_by_rule(
    rule_ids: Sequence[str], *, num_sources: int = 10, per_label: int = 3, per_na: int = 1, logs_per_source: int = 60
) -> dict[str, list]:
    """rule id -> LabelledCases: per source "gen<i>", `logs_per_source` synthetic logs with random behaviour flags
    and task kinds; up to `per_label` PASS and FAIL and `per_na` NA cases per rule and source."""
    from rwcore.rewardweaver import LabelledCase

    unknown = [r for r in rule_ids if r not in RULES_BY_ID]
    if unknown:
        raise ValueError(f"rule_ids: unknown tools rule(s) {unknown}; known: {sorted(RULES_BY_ID)}")
    out: dict[str, list] = {r: [] for r in rule_ids}
    for source in range(num_sources):
        rng = random.Random(f"tools-labelled-v1-{source}")
        quotas = {r: {Verdict.PASS: per_label, Verdict.FAIL: per_label, Verdict.NA: per_na} for r in rule_ids}
        for j in range(logs_per_source):
            kind = KINDS[j % len(KINDS)]
            flags = {
                "inspect": rng.random() < 0.5,
                "work": rng.random() < 0.75,
                "check": rng.random() < 0.5,
                "error": rng.choice(("none", "none", "recover", "repeat")),
                "extra": rng.choice((0, 0, 1, 3)),
                "answered": rng.random() < 0.8,
                "answer_ok": rng.random() < 0.6,
            }
            labels = _labels(kind, flags)
            events = _synthetic(rng, kind, flags)
            for rule_id in rule_ids:
                label = labels[rule_id]
                if quotas[rule_id][label] <= 0:
                    continue
                quotas[rule_id][label] -= 1
                case_id = f"case/{rule_id}/gen{source}/{j}"
                trajectory = _case_trajectory(kind, [dict(e) for e in events], case_id)
                trajectory.metadata["labelled_rule"] = rule_id
                out[rule_id].append(LabelledCase(trajectory, label, f"gen{source}"))
    return out
