"""The tools environment's programmatic pieces: rubric library, reflector, attributor, labelled cases.

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

Labelled cases (for admitting the rules as RewardWeaver capabilities) are synthetic tool-call logs built
from behaviour flags (inspected or not, checked the output or not, repeated an error or not...), and
each label is the flags' declared meaning (`_labels`), not the rule's reading of the log, so admission
tests the rule against an independent statement of what it should say.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from rwcore.trainer.envs.base import Rule, RuleDef, rule_spec, rules_from
from rwcore.types import AttributionRecord, RubricSkillProposal, RubricSpec, Trajectory, Turn
from rwcore.verdict import Verdict

LOOK = ("cat", "head", "tail", "ls", "wc", "grep", "sed", "awk", "less", "more", "find", "file", "nl")
INPUTS = {
    "compute": ("data.csv",),
    "transform": ("people.csv",),
    "write_file": (),
    "fix_bug": ("stats.py", "numbers.txt"),
    "search": ("docs",),
}
OUTPUTS = {"transform": "out.json", "write_file": "notes/summary.txt"}
CALL_BUDGET = {"compute": 3, "transform": 4, "write_file": 3, "fix_bug": 4, "search": 4}


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
    return bool(words) and words[0] in LOOK and any(name in event["text"] for name in INPUTS.get(kind, ()))


def _inspects_input(s: dict):
    kind = s["kind"]
    if not INPUTS.get(kind) or not s["events"]:
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


# -- reflector and attributor -------------------------------------------------------------------


class ToolsReflector:
    """Arise's reflection and RewardWeaver's proposer without an LLM: rules not yet in use that FAIL on at least
    `min_fail_rate` of the trajectories where they apply, most failures first, with their first skill text;
    refine_skill cycles through a rule's skill texts."""

    def __init__(self, min_fail_rate: float = 0.2) -> None:
        self.min_fail_rate = float(min_fail_rate)

    def _ranked(self, trajectories: Sequence[Trajectory], taken: set[str]) -> list[tuple]:
        states = []
        for trajectory in trajectories:
            try:
                states.append((trajectory, episode_state(trajectory)))
            except KeyError:
                continue
        ranked = []
        for order, rule in enumerate(RULE_DEFS):
            if rule.rule_id in taken:
                continue
            fails = applicable = 0
            example = ""
            for trajectory, state in states:
                verdict, evidence = rule.check(state)
                if verdict is None:
                    continue
                applicable += 1
                if verdict is False:
                    fails += 1
                    example = example or f"{trajectory.trajectory_id or trajectory.task_id}: {evidence[:200]!r}"
            if fails and fails / applicable >= self.min_fail_rate:
                ranked.append((-fails, order, rule.rule_id, fails, applicable, example))
        return sorted(ranked)

    def propose_rubric_skills(
        self,
        trajectories: Sequence[Trajectory],
        existing: Sequence[RubricSpec],
        max_new: int,
        *,
        diagnostics: str | None = None,
    ) -> list[RubricSkillProposal]:
        if max_new <= 0:
            return []
        ranked = self._ranked(trajectories, {spec.rubric_id for spec in existing})
        return [
            RubricSkillProposal(
                rubric=rule_spec(RULES_BY_ID[rid]),
                skill=SKILLS[rid][0],
                evidence=f"{rid} failed on {fails} of {applicable} applicable trajectories, e.g. {example}",
            )
            for _, _, rid, fails, applicable, example in ranked[:max_new]
        ]

    def refine_skill(self, rubric: RubricSpec, skill: str, failures: Sequence[Trajectory]) -> str:
        variants = SKILLS.get(rubric.rubric_id)
        if not variants:
            return skill
        return variants[(variants.index(skill) + 1) % len(variants)] if skill in variants else variants[0]

    def propose_capabilities(
        self, failures: Sequence[Trajectory], library: Sequence[RubricSpec], max_new: int
    ) -> list[RubricSpec]:
        if max_new <= 0:
            return []
        ranked = self._ranked(failures, {spec.rubric_id for spec in library})
        return [rule_spec(RULES_BY_ID[rid]) for _, _, rid, *_ in ranked[:max_new]]


class ToolsAttributor:
    """rwcore.types.Attributor without an LLM: per candidate, deficit = its rule FAILs (confidence 0.9, the call
    quoted as evidence), a pass 0.8, not applicable 0.5. Every task is solvable, so the cause is "policy", except
    an episode the sandbox failed ("partner"); unknown candidates or uncheckable trajectories: "unclear"."""

    def attribute(self, trajectory: Trajectory, candidates: Sequence[RubricSpec]) -> list[AttributionRecord]:
        tid = trajectory.trajectory_id or trajectory.task_id
        try:
            state = episode_state(trajectory)
        except KeyError:
            state = None
        failed = bool(trajectory.partner_failure) or bool(state and state.get("partner_failure"))
        cause = "partner" if failed else "policy"
        records = []
        for spec in candidates:
            rule = RULES_BY_ID.get(spec.rubric_id)
            if rule is None or state is None:
                records.append(AttributionRecord(tid, spec.rubric_id, False, 0.0, "", "unclear"))
                continue
            verdict, evidence = rule.check(state)
            if verdict is False:
                records.append(AttributionRecord(tid, spec.rubric_id, True, 0.9, evidence or "(no call)", cause))
            elif verdict is True:
                records.append(AttributionRecord(tid, spec.rubric_id, False, 0.8, evidence, cause))
            else:
                records.append(AttributionRecord(tid, spec.rubric_id, False, 0.5, "", cause))
        return records


# -- labelled cases ---------------------------------------------------------------------------------

_KINDS = ("compute", "transform", "write_file", "fix_bug", "search")
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
    if flags["inspect"] and INPUTS[kind]:
        add(
            "shell",
            f"{rng.choice(('head -n 3', 'cat', 'wc -l'))} {INPUTS[kind][0]}"
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
        or (flags["inspect"] and INPUTS[kind])
    )
    calls = (
        (2 if flags["error"] == "repeat" else 1 if flags["error"] == "recover" else 0)
        + bool(flags["inspect"] and INPUTS[kind])
        + flags["work"]
        + (flags["work"] and flags["check"] and kind in _CHECK)
        + flags["extra"]
    )
    answered = flags["answered"]
    return {
        "inspects_input": NA if not INPUTS[kind] or not acted else (P if flags["inspect"] else F),
        "runs_code_before_answer": NA
        if not answered
        else (P if (flags["inspect"] and INPUTS[kind]) or flags["work"] or flags["extra"] else F),
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
            kind = _KINDS[j % len(_KINDS)]
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
