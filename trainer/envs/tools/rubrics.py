"""The tools environment's rubric library: programmatic checks over the tool-call log, and their skill texts.

Rules read the episode's tool-call log, `trajectory.metadata["env_state"]["events"]` (one event per agent
turn: kind python / shell / answer / error, the call text, ok, exit, error, files changed; see
rwcore.trainer.envs.tools), and the task kind (`env_state["kind"]`, else metadata["task"]["kind"]).
Without an env_state they raise (RuleJudge: INVALID). Each returns True (PASS), False (FAIL) or None (NA).

An "inspection" is a successful shell call whose command starts with a look-only program (cat, head, tail,
ls, wc, grep, sed, awk, less, more, find, file, nl) and names an input (data.csv, people.csv, stats.py,
numbers.txt, docs), before the first call that changed a file and before the answer.

rule id                 Arise category / RewardWeaver family   PASS when                          applies when
inspects_input          Understanding / information     an inspection came first                  the task has inputs
and the agent acted
runs_code_before_answer Execution / execution           a tool call succeeded before the answer   the agent answered
checks_output           Verification / verification     after its last write of the output file a the agent wrote
out.json /
                                                        later successful call names the file and  notes/summary.txt
                                                        changes nothing
reruns_after_fix        Debugging / debugging           after its last change to stats.py a later the agent changed
stats.py
                                                        successful call names it, changing nothing
recovers_from_errors    Debugging / persistence         no failed call is repeated verbatim next  some call failed
answer_format           Understanding / communication   the answer has the required form (a plain the agent answered
                                                        number; one word; "done")
efficient_calls         Efficiency / efficiency         at most CALL_BUDGET[kind] calls, none     the agent answered
                                                        repeated

Labelled cases for admitting these rules are in labelled_cases.py; the reflector and attributor that read them
in providers.py.
"""

from __future__ import annotations

from rwcore.trainer.envs.base import Rule, RuleDef, rules_from
from rwcore.trainer.envs.tools.tasks import CALL_BUDGET, INPUT_FILES
from rwcore.types import Trajectory

LOOK = ("cat", "head", "tail", "ls", "wc", "grep", "sed", "awk", "less", "more", "find", "file", "nl")
OUTPUTS = {"transform": "out.json", "write_file": "notes/summary.txt"}
"""The output file checks_output wants read back, per task kind (fix_bug's stats.py is reruns_after_fix's)."""


def episode_state(trajectory: Trajectory) -> dict:
    state = (trajectory.metadata or {}).get("env_state")
    if not isinstance(state, dict) or not isinstance(state.get("events"), list):
        raise KeyError("trajectory.metadata has no 'env_state' with events: cannot check tools rules")
    if "kind" not in state:
        kind = ((trajectory.metadata or {}).get("task") or {}).get("kind")
        state = {**state, "kind": kind}
    return state


def _calls(s: dict) -> list[dict]:
    return [e for e in s["events"] if e["kind"] != "answer"]


def _answer_index(s: dict) -> int:
    for i, e in enumerate(s["events"]):
        if e["kind"] == "answer":
            return i
    return len(s["events"])


def _is_inspection(event: dict, kind: str) -> bool:
    if event["kind"] != "shell" or not event["ok"] or event["changed"]:
        return False
    words = event["text"].strip().split()
    return bool(words) and words[0] in LOOK and any(name in event["text"] for name in INPUT_FILES.get(kind, ()))


def _inspects_input(s: dict):
    kind = s["kind"]
    if not INPUT_FILES.get(kind) or not s["events"]:
        return None, ""
    for e in s["events"]:
        if e["kind"] == "answer" or e["changed"]:
            return False, e["text"]
        if _is_inspection(e, kind):
            return True, e["text"]
    return False, s["events"][-1]["text"]


def _runs_code_before_answer(s: dict):
    end = _answer_index(s)
    if end == len(s["events"]):
        return None, ""
    for e in s["events"][:end]:
        if e["kind"] in ("python", "shell") and e["ok"]:
            return True, e["text"]
    return False, s["events"][end]["text"]


def _checked_after_last_change(s: dict, path: str):
    events = s["events"][: _answer_index(s)]
    last = max((i for i, e in enumerate(events) if path in e["changed"]), default=None)
    if last is None:
        return None, ""
    name = path.rsplit("/", 1)[-1]
    for e in events[last + 1 :]:
        if e["kind"] in ("python", "shell") and e["ok"] and not e["changed"] and name in e["text"]:
            return True, e["text"]
    return False, events[last]["text"]


def _checks_output(s: dict):
    path = OUTPUTS.get(s["kind"])
    return (None, "") if path is None else _checked_after_last_change(s, path)


def _reruns_after_fix(s: dict):
    return (None, "") if s["kind"] != "fix_bug" else _checked_after_last_change(s, "stats.py")


def _failed(e: dict) -> bool:
    return e["kind"] != "answer" and not e["ok"]


def _recovers_from_errors(s: dict):
    events = s["events"]
    if not any(_failed(e) for e in events):
        return None, ""
    for e, nxt in zip(events, events[1:]):
        if _failed(e) and nxt["kind"] == e["kind"] and nxt["text"] == e["text"]:
            return False, nxt["text"]
    return True, next(e["text"] for e in events if _failed(e))


def _answer_format(s: dict):
    end = _answer_index(s)
    if end == len(s["events"]):
        return None, ""
    answer = s["events"][end]["text"].strip()
    kind = s["kind"]
    if kind in ("compute", "fix_bug"):
        try:
            float(answer)
            ok = answer.replace(".", "", 1).lstrip("-").isdigit()
        except ValueError:
            ok = False
    elif kind == "search":
        ok = bool(answer) and len(answer.split()) == 1
    else:
        ok = answer.lower() == "done"
    return ok, answer


def _efficient_calls(s: dict):
    end = _answer_index(s)
    if end == len(s["events"]):
        return None, ""
    calls = _calls({"events": s["events"][:end]})
    seen = set()
    for e in calls:
        key = (e["kind"], e["text"])
        if key in seen:
            return False, e["text"]
        seen.add(key)
    if len(calls) > CALL_BUDGET.get(s["kind"], 4):
        return False, f"{len(calls)} calls"
    return True, f"{len(calls)} calls"


RULE_DEFS: tuple[RuleDef, ...] = (
    RuleDef(
        "inspects_input",
        "before changing any file or answering, the agent looks at an input (a shell cat, head, "
        "ls, grep... of the input file or folder)",
        "the task has input files and the agent acted",
        "Understanding",
        "information",
        _inspects_input,
    ),
    RuleDef(
        "runs_code_before_answer",
        "the agent ran at least one successful tool call before answering",
        "the agent answered",
        "Execution",
        "execution",
        _runs_code_before_answer,
    ),
    RuleDef(
        "checks_output",
        "after its last write of the output file the agent reads it back with a successful call before answering",
        "the agent wrote the task's output file",
        "Verification",
        "verification",
        _checks_output,
    ),
    RuleDef(
        "reruns_after_fix",
        "after its last change to stats.py the agent runs or reads it again with a successful call before answering",
        "the agent changed stats.py",
        "Debugging",
        "debugging",
        _reruns_after_fix,
    ),
    RuleDef(
        "recovers_from_errors",
        "the agent never repeats a failed call verbatim right after it failed",
        "some call failed",
        "Debugging",
        "persistence",
        _recovers_from_errors,
    ),
    RuleDef(
        "answer_format",
        "the answer has the required form: a plain number for compute and fix_bug, one word for "
        "search, done for file tasks",
        "the agent answered",
        "Understanding",
        "communication",
        _answer_format,
    ),
    RuleDef(
        "efficient_calls",
        "the agent answers within the task type's call budget and never repeats a call",
        "the agent answered",
        "Efficiency",
        "efficiency",
        _efficient_calls,
    ),
)
RULES_BY_ID = {r.rule_id: r for r in RULE_DEFS}
INITIAL_LIBRARY: tuple[str, ...] = (
    "inspects_input",
    "runs_code_before_answer",
    "checks_output",
    "reruns_after_fix",
    "answer_format",
)
"""RewardWeaver's starting library; recovers_from_errors and efficient_calls are left for expansion."""

SKILLS: dict[str, tuple[str, ...]] = {
    "inspects_input": (
        "look at the input files first with head or cat",
        "first run ls and head on the input",
        "read the input before you write code",
    ),
    "runs_code_before_answer": (
        "run code before you answer",
        "compute the answer with a tool call",
        "never answer before a tool call",
    ),
    "checks_output": (
        "cat the output file after you write it",
        "check the file you wrote before you answer",
        "read back the output file",
    ),
    "reruns_after_fix": (
        "run the script again after you fix it",
        "after a fix run python3 on the script",
        "check the fixed script by running it",
    ),
    "recovers_from_errors": (
        "when a call fails change it before you try again",
        "never repeat a failed call",
        "read the error and fix the call",
    ),
    "answer_format": (
        "answer with only the number or the word asked for",
        "answer done for file tasks",
        "keep the answer to the value asked for",
    ),
    "efficient_calls": (
        "use few tool calls and never repeat one",
        "plan the calls then answer",
        "answer once the output is checked",
    ),
}


def make_rules() -> list[Rule]:
    return rules_from(RULE_DEFS, episode_state)


def explain(rule_id: str, trajectory: Trajectory) -> tuple[bool | None, str]:
    return RULES_BY_ID[rule_id].check(episode_state(trajectory))
