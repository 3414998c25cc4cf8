"""The tool-use environment ("tools"): Arise-style agent tasks solved with a sandboxed Python / shell tool.

Each episode gets a private sandbox (rwcore.trainer.envs.sandbox: a subprocess in its own working
folder, with time, CPU, memory, file-size, process and output limits, a clean environment, and no
network - see that module for the exact guarantees and limits). The agent calls tools over several
turns and finally answers; a programmatic verifier scores the outcome from the answer and the files in
the sandbox.

Task types (Task.tags), generated from `seed`, every split holding each type in equal shares
------------------------------------------------------------------------------------------
compute     data.csv (item, group, value; 8 rows easy, 30 hard): answer the sum / mean (2 decimals) / max /
            count of `value` over the rows of one group. Needs: read the input, compute. Answer: the number.
transform   people.csv (name, age, city): write out.json, a JSON list of the names of the people in one city
            aged at least N, sorted. Needs: read, transform, write a file (check it). Answer: "done".
write_file  create notes/summary.txt whose content is exactly the given lines (no input to read). Needs:
            write a file exactly (check it). Answer: "done".
fix_bug     stats.py should print the sum of the numbers in numbers.txt but has a bug (it skips the first
            number, or subtracts, or starts from 1); fix it, run it, answer what it prints. Success needs
            both: the fixed script, re-run by the verifier, prints the right sum, and the answer is that sum.
search      docs/ holds 3 (easy) or 8 (hard) files of sentences "the <key> of <entity> is <value>."; answer
            the value asked for. Needs: look through files (grep / ls / cat).

Success and reward: success when the verifier accepts (numbers within 0.01, file contents exact, JSON
equal, value exact ignoring case); reward 1.0 on success, else 0.0; an episode that ends without an answer
(max_turns, default 6) fails. A sandbox that cannot start or set up a call is not the agent's fault: the
episode ends as a partner failure (base.partner_failed), never charged to the agent.

Tool-call format
----------------
The documented JSON format (always accepted; the system prompt teaches it with `call_format="json"`,
the default), one call per agent message, the first JSON object in the message:

    {"tool": "python", "code": "print(1 + 1)"}
    {"tool": "shell", "cmd": "head -n 3 data.csv"}
    {"answer": "42"}

The chat-template format of tool-calling models (Qwen2.5 / Hermes style, what a tokenizer renders for
`apply_chat_template(messages, tools=TOOL_SCHEMAS)`), also always accepted:

    <tool_call>
    {"name": "python", "arguments": {"code": "print(1 + 1)"}}
    </tool_call>

with the tools `python(code)`, `shell(cmd)` and `answer(answer)` (`TOOL_SCHEMAS`, OpenAI function
schemas). With `call_format="chat_template"` the system prompt does not spell out the JSON format (the
chat template shows the tools) and a message with no tool call is the final answer, as such models
end. A message that is not a call (JSON format), is malformed, names an unknown tool, or is longer than
`max_call_chars` gets a `tool error: ...` observation and costs the turn; nothing crashes the run.

Tool results come back as the next observation: `tool python result: exit 0` then stdout / stderr
(truncated) and the files the call changed.

The built-in word-level policy: its words are split on spaces and joined with spaces, so it can spell
the JSON format as `{ "tool" : "shell" , "cmd" : "ls" }` (valid JSON); `action_vocabulary()` gives those
tokens (braces, keys, tool names, quoted command words and file names) and `vocabulary()` everything
the prompts say.

Rubrics (rwcore.trainer.envs.tools_rubrics): programmatic checks of observable behaviour over the
episode's tool-call log (Arise category / RewardWeaver family): inspects_input (Understanding /
information), runs_code_before_answer (Execution / execution), checks_output (Verification /
verification), reruns_after_fix (Debugging / debugging), recovers_from_errors (Debugging / persistence),
answer_format (Understanding / communication), efficient_calls (Efficiency / efficiency).

`OraclePolicy(task)` is a scripted policy that solves every task through the tools (it reads the inputs
and prints the answer with the tools, never from the task data, except fix_bug's patch), which proves
each task solvable; `run_episode(env, task, policy)` runs one episode.

Episode state (JSON): events (one per agent turn: kind python / shell / answer / error, the call text,
ok, exit, error, files changed), answer, verdict (reward, success, reason, set when the episode ends),
seed, sandbox (the id of the live sandbox in the environment, None once it is closed). `step` runs the
tool for real, so an episode can be stepped only once per state; the sandbox is closed (its folder
deleted) when the episode ends, and `close()` closes any left.
"""

from __future__ import annotations

import itertools
import json
import random
import re
import shlex
import statistics
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from rwcore.trainer.envs.base import Episode, Outcome, Task, partner_failed, register
from rwcore.trainer.envs.sandbox import Limits, Sandbox
from rwcore.types import Trajectory, Turn

__all__ = ["KINDS", "TOOL_SCHEMAS", "OraclePolicy", "ToolsEnv", "parse_call", "run_episode"]

KINDS: tuple[str, ...] = ("compute", "transform", "write_file", "fix_bug", "search")
OUTPUT_FILES = {"transform": "out.json", "write_file": "notes/summary.txt", "fix_bug": "stats.py"}
INPUT_FILES = {
    "compute": ("data.csv",),
    "transform": ("people.csv",),
    "write_file": (),
    "fix_bug": ("stats.py", "numbers.txt"),
    "search": ("docs",),
}
CALL_BUDGET = {"compute": 3, "transform": 4, "write_file": 3, "fix_bug": 4, "search": 4}
"""Tool calls a careful agent needs at most (efficient_calls)."""

TOOL_SCHEMAS: list[dict] = [
    {
        "type": "function",
        "function": {
            "name": "python",
            "description": "Run a Python 3 program in the task folder; returns exit code, stdout, stderr.",
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string", "description": "the program"}},
                "required": ["code"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "shell",
            "description": "Run a shell command (/bin/sh) in the task folder; returns exit code, stdout, stderr.",
            "parameters": {
                "type": "object",
                "properties": {"cmd": {"type": "string", "description": "the command"}},
                "required": ["cmd"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "answer",
            "description": "Give the final answer and end the task.",
            "parameters": {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]},
        },
    },
]

SYSTEM_PROMPT_JSON = (
    "you solve the task with tools in a private folder . each message is one call : "
    '{ "tool" : "python" , "code" : "..." } runs python , { "tool" : "shell" , "cmd" : "..." } runs a shell '
    'command , { "answer" : "..." } gives the final answer . look at the input files first , run code , '
    "check the files you write , then answer"
)
SYSTEM_PROMPT_TEMPLATE = (
    "you solve the task with tools in a private folder : python runs python code , shell runs a shell command , "
    "answer gives the final answer . look at the input files first , run code , check the files you write , "
    "then answer"
)

_GROUPS = ("red", "blue", "green", "gold")
_ITEMS = ("bolt", "nut", "gear", "pipe", "valve", "wire", "cog", "pin", "rod", "belt", "cap", "disk")
_NAMES = (
    "ada",
    "ben",
    "cleo",
    "dan",
    "eve",
    "finn",
    "gus",
    "hana",
    "ivan",
    "june",
    "kai",
    "lena",
    "milo",
    "nora",
    "omar",
    "pia",
    "quin",
    "rosa",
    "sam",
    "tara",
)
_CITIES = ("oslo", "lima", "rome", "kyiv", "baku")
_WORDS = ("alpha", "beta", "gamma", "delta", "omega", "lamp", "river", "stone", "cloud", "maple", "north", "amber")
_ENTITIES = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa")
_KEYS = ("port", "owner", "region", "version", "color")
_VALUES = {
    "port": lambda r: str(r.randrange(1024, 9999)),
    "owner": lambda r: r.choice(_NAMES),
    "region": lambda r: r.choice(("north", "south", "east", "west")) + str(r.randrange(1, 9)),
    "version": lambda r: f"{r.randrange(1, 9)}.{r.randrange(0, 20)}",
    "color": lambda r: r.choice(("teal", "ochre", "navy", "plum", "jade")),
}
STATS = ("sum", "mean", "max", "count")

_GOOD_STATS = (
    "import sys\n\n\ndef total(values):\n    s = 0\n    for i in range(0, len(values)):\n"
    "        s += values[i]\n    return s\n\n\nvalues = [int(line) for line in open('numbers.txt') if "
    "line.strip()]\nprint(total(values))\n"
)
BUGS: dict[str, tuple[str, str]] = {  # bug name -> (buggy text, correct text) in stats.py
    "skips_first": ("range(1, len(values))", "range(0, len(values))"),
    "subtracts": ("s -= values[i]", "s += values[i]"),
    "starts_at_one": ("s = 1", "s = 0"),
}


# -- tool calls ------------------------------------------------------------------------------------


def _first_json_object(text: str):
    """The first JSON object in `text` (None when there is none)."""
    decoder = json.JSONDecoder()
    for match in re.finditer(r"\{", text):
        try:
            value, _ = decoder.raw_decode(text, match.start())
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def parse_call(text: object, max_chars: int = 8000) -> tuple[str, str]:
    """Agent message -> (kind, argument): ("python", code), ("shell", cmd), ("answer", text), or ("error", why).

    Accepts a `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` block (chat-template format) or the
    first JSON object of the message (`{"tool": "python", "code": ...}`, `{"tool": "shell", "cmd": ...}`,
    `{"answer": ...}`, or {"name": ..., "arguments": ...} without the tags). A message over `max_chars`
    characters is an error whatever it holds."""
    if not isinstance(text, str):
        return "error", "the message is not text"
    if len(text) > max_chars:
        return "error", f"the call is {len(text)} characters; at most {max_chars} are allowed"
    block = re.search(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", text, re.S)
    call = _first_json_object(block.group(1) if block else text)
    if call is None:
        return "error", (
            'no tool call found; call a tool with {"tool": "python", "code": "..."} or '
            '{"tool": "shell", "cmd": "..."}, or answer with {"answer": "..."}'
        )
    if "name" in call and "tool" not in call:  # function-call shape
        args = call.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                return "error", "the tool call's arguments are not valid JSON"
        if not isinstance(args, dict):
            return "error", "the tool call's arguments must be an object"
        call = {"tool": call["name"], **args}
    if "answer" in call and call.get("tool") in (None, "answer"):
        answer = call["answer"]
        if isinstance(answer, (int, float)) and not isinstance(answer, bool):
            answer = str(answer)
        if not isinstance(answer, str):
            return "error", "the answer must be a string"
        return "answer", answer.strip()
    tool = call.get("tool")
    field = {"python": "code", "shell": "cmd"}.get(tool) if isinstance(tool, str) else None
    if field is None:
        return "error", f"unknown tool {tool!r}; the tools are python, shell and answer"
    argument = call.get(field)
    if not isinstance(argument, str) or not argument.strip():
        return "error", f"the {tool} tool needs a non-empty string {field!r}"
    return tool, argument


# -- tasks -----------------------------------------------------------------------------------------


def make_task_data(rng: random.Random, kind: str) -> dict:
    """One task instance of `kind` (files to put in the sandbox, the question, what the verifier expects)."""
    if kind not in KINDS:
        raise ValueError(f"unknown task kind {kind!r}; known: {list(KINDS)}")
    hard = rng.random() < 0.5
    data: dict = {"kind": kind, "difficulty": "hard" if hard else "easy", "files": {}}
    if kind == "compute":
        rows = [(rng.choice(_ITEMS), rng.choice(_GROUPS), rng.randrange(1, 100)) for _ in range(30 if hard else 8)]
        group = rows[0][1]
        stat = rng.choice(STATS)
        values = [v for _, g, v in rows if g == group]
        expected = {
            "sum": sum(values),
            "mean": round(statistics.mean(values), 2),
            "max": max(values),
            "count": len(values),
        }[stat]
        data["files"]["data.csv"] = "item,group,value\n" + "".join(f"{i},{g},{v}\n" for i, g, v in rows)
        data.update(stat=stat, group=group, expected=expected)
        data["brief"] = (
            f"data.csv has columns item , group , value . answer the {stat} of value over the rows "
            f"whose group is {group}" + (" , rounded to 2 decimals" if stat == "mean" else "")
        )
    elif kind == "transform":
        people = [(name, rng.randrange(18, 70), rng.choice(_CITIES)) for name in rng.sample(_NAMES, 16 if hard else 6)]
        city, age = people[0][2], rng.choice((25, 30, 40))
        expected = sorted(n for n, a, c in people if c == city and a >= age)
        data["files"]["people.csv"] = "name,age,city\n" + "".join(f"{n},{a},{c}\n" for n, a, c in people)
        data.update(city=city, min_age=age, expected=expected, output="out.json")
        data["brief"] = (
            f"people.csv has columns name , age , city . write out.json : a json list of the names of "
            f"the people in {city} aged at least {age} , sorted . then answer done"
        )
    elif kind == "write_file":
        lines = [" ".join(rng.choice(_WORDS) for _ in range(rng.randrange(2, 5))) for _ in range(5 if hard else 2)]
        data.update(lines=lines, output="notes/summary.txt")
        data["brief"] = (
            "create notes/summary.txt whose content is exactly these lines : "
            + " | ".join(lines)
            + " . then answer done"
        )
    elif kind == "fix_bug":
        numbers = [rng.randrange(1, 50) for _ in range(12 if hard else 4)]
        bug = rng.choice(sorted(BUGS))
        buggy, correct = BUGS[bug]
        data["files"]["numbers.txt"] = "".join(f"{n}\n" for n in numbers)
        data["files"]["stats.py"] = _GOOD_STATS.replace(correct, buggy)
        data.update(bug=bug, patch=[buggy, correct], expected=sum(numbers), output="stats.py")
        data["brief"] = (
            "stats.py should print the sum of the numbers in numbers.txt but it has a bug . fix it , "
            "run it and answer what it prints"
        )
    else:  # search
        entity, key = rng.choice(_ENTITIES), rng.choice(_KEYS)
        facts = {}
        for e in _ENTITIES:
            for k in _KEYS:
                facts[(e, k)] = _VALUES[k](rng)
        count = 8 if hard else 3
        pairs = sorted(facts)
        rng.shuffle(pairs)
        chunks = [pairs[i::count] for i in range(count)]
        for i, chunk in enumerate(chunks):
            data["files"][f"docs/file{i}.txt"] = "".join(f"the {k} of {e} is {facts[(e, k)]}.\n" for e, k in chunk)
        data.update(entity=entity, key=key, expected=facts[(entity, key)])
        data["brief"] = f"the files in docs say facts about services . what is the {key} of {entity} ?"
    return data


# -- the environment ------------------------------------------------------------------------------


def _printable_name(name: str) -> str:
    """A file name as transcript text: bytes that are not UTF-8 (kept by the OS as lone surrogates, which
    break a tokenizer) and control characters (a newline would start a fake transcript line) escaped."""
    text = name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def _changed_line(names: Sequence[str], budget: int) -> str:
    """ "files changed : a , b ..." within `budget` characters (names escaped; the rest counted)."""
    if not names:
        return ""
    shown, used = [], 0
    for name in names:
        text = _printable_name(name)[:200]
        if used + len(text) + 3 > budget and shown:
            break
        shown.append(text)
        used += len(text) + 3
    more = f" (and {len(names) - len(shown)} more)" if len(shown) < len(names) else ""
    return f"\nfiles changed : {' , '.join(shown)}{more}"[: budget + 40]


class ToolsEnv:
    """Tool-use tasks in a sandbox (see the module docstring).

    seed, num_train, num_eval: task generation (disjoint splits, same every call); max_turns: agent turns;
    kinds: the task types to use (default all of KINDS); call_format: "json" | "chat_template" (what the
    system prompt teaches and whether a message without a call is the answer); max_call_chars: longest
    accepted agent message; max_observation_chars: cut of a tool result in the transcript;
    isolation: the sandbox's ("auto" | "namespace" | "none", see sandbox.py); wall_seconds,
    memory_mb, output_bytes: per-call sandbox limits; workers: threads running the calls of one turn's
    episodes in parallel (step_many).
    """

    name = "tools"

    def __init__(
        self,
        seed: int = 0,
        num_train: int = 200,
        num_eval: int = 100,
        max_turns: int = 6,
        kinds: Sequence[str] | None = None,
        call_format: str = "json",
        max_call_chars: int = 4000,
        max_observation_chars: int = 1500,
        isolation: str = "auto",
        wall_seconds: float = 10.0,
        memory_mb: int = 1024,
        output_bytes: int = 4096,
        workers: int = 4,
    ) -> None:
        for key, value, low in (
            ("seed", seed, None),
            ("num_train", num_train, 1),
            ("num_eval", num_eval, 1),
            ("max_turns", max_turns, 2),
            ("max_call_chars", max_call_chars, 16),
            ("max_observation_chars", max_observation_chars, 64),
            ("memory_mb", memory_mb, 64),
            ("output_bytes", output_bytes, 64),
            ("workers", workers, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or (low is not None and value < low):
                bound = f" >= {low}" if low is not None else ""
                raise ValueError(f"env.options.{key} must be an integer{bound}, got {value!r}")
        if isinstance(wall_seconds, bool) or not isinstance(wall_seconds, (int, float)) or not wall_seconds > 0:
            raise ValueError(f"env.options.wall_seconds must be a positive number, got {wall_seconds!r}")
        kinds = list(KINDS if kinds is None else kinds)
        if not kinds or any(k not in KINDS for k in kinds) or len(set(kinds)) != len(kinds):
            raise ValueError(f"env.options.kinds must be distinct task types from {list(KINDS)}, got {kinds!r}")
        if call_format not in ("json", "chat_template"):
            raise ValueError(f"env.options.call_format must be 'json' or 'chat_template', got {call_format!r}")
        if isolation not in ("auto", "namespace", "none"):
            raise ValueError(f"env.options.isolation must be 'auto', 'namespace' or 'none', got {isolation!r}")
        self.seed, self.num_train, self.num_eval, self.max_turns = seed, num_train, num_eval, max_turns
        self.kinds = kinds
        self.call_format = call_format
        self.max_call_chars = max_call_chars
        self.max_observation_chars = max_observation_chars
        self.isolation = isolation
        self.workers = workers
        self.limits = Limits(
            wall_seconds=float(wall_seconds),
            cpu_seconds=max(1, int(wall_seconds)),
            memory_bytes=memory_mb << 20,
            output_bytes=output_bytes,
            flood_bytes=max(output_bytes, 1 << 20),
        )
        self.system_prompt = SYSTEM_PROMPT_JSON if call_format == "json" else SYSTEM_PROMPT_TEMPLATE
        self._boxes: dict[str, Sandbox] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()
        # fail at start, not in the middle of a run, when the sandbox cannot be had here
        Sandbox(self.limits, isolation=isolation).close()
        self._splits = self._generate()

    def __repr__(self) -> str:
        return (
            f"ToolsEnv(seed={self.seed}, num_train={self.num_train}, num_eval={self.num_eval}, "
            f"max_turns={self.max_turns}, kinds={self.kinds})"
        )

    def tool_schemas(self) -> list[dict]:
        """OpenAI function schemas of the tools, for `tokenizer.apply_chat_template(..., tools=...)`."""
        return json.loads(json.dumps(TOOL_SCHEMAS))

    # -- tasks ------------------------------------------------------------------------

    def _generate(self) -> dict[str, list[Task]]:
        rng = random.Random(f"tools-tasks-v1-{self.seed}")
        seen: set[str] = set()
        splits: dict[str, list[Task]] = {}
        for split, size in (("train", self.num_train), ("eval", self.num_eval)):
            tasks: list[Task] = []
            for index in range(size):
                kind = self.kinds[index % len(self.kinds)]
                for _ in range(1000):
                    data = make_task_data(rng, kind)
                    key = json.dumps(data, sort_keys=True)
                    if key not in seen:  # distinct instances, so eval tasks never appear in train
                        break
                else:
                    raise ValueError(f"cannot generate {size} distinct {split} tasks; ask for fewer")
                seen.add(key)
                tasks.append(Task("", (kind,), data))
            rng.shuffle(tasks)
            splits[split] = [Task(f"tools-{split}-{i:04d}", t.tags, t.data) for i, t in enumerate(tasks)]
        return splits

    def tasks(self, split: str) -> list[Task]:
        if split not in self._splits:
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        return list(self._splits[split])

    # -- episodes ---------------------------------------------------------------------------

    def reset(self, task: Task, seed: int) -> Episode:
        data = task.data
        box = Sandbox(self.limits, isolation=self.isolation)
        for path, content in data.get("files", {}).items():
            box.write_file(path, content)
        with self._lock:
            box_id = f"box{next(self._ids)}"
            self._boxes[box_id] = box
        files = sorted(data.get("files", {}))
        listing = " , ".join(files) if files else "( empty )"
        observation = f"task : {data['brief']} . files : {listing}"
        state = {
            "seed": int(seed),
            "kind": data["kind"],
            "turns": 0,
            "events": [],
            "answer": None,
            "verdict": None,
            "sandbox": box_id,
            "max_turns": self.max_turns,
        }
        return Episode(task=task, observation=observation, state=state)

    def step(self, episode: Episode, action: str) -> Episode:
        if episode.done:
            raise ValueError("step called on a finished episode")
        box = self._boxes.get(episode.state.get("sandbox"))
        if box is None:
            raise ValueError("step: this episode's sandbox is closed (an episode can be stepped once per state)")
        s = dict(episode.state)
        s["events"] = list(s["events"])
        s["turns"] += 1
        kind, argument = parse_call(action, self.max_call_chars)
        if (
            kind == "error"
            and self.call_format == "chat_template"
            and isinstance(action, str)
            and "<tool_call>" not in action
            and "{" not in action
            and len(action) <= self.max_call_chars
        ):
            kind, argument = "answer", action.strip()  # a tool-calling model ends with a plain message
        event = {
            "turn": s["turns"],
            "kind": kind,
            "text": argument[:2000],
            "ok": False,
            "exit": None,
            "error": None,
            "changed": [],
        }
        done = False
        if kind == "error":
            event["error"] = "malformed"
            observation = f"tool error : {argument}"
        elif kind == "answer":
            event["ok"] = True
            s["answer"] = argument
            observation = f"answer received : {argument[:200]}"
            done = True
        else:
            try:
                result = box.run_python(argument) if kind == "python" else box.run_shell(argument)
            except Exception as exc:  # noqa: BLE001 - whatever the tool did to the host side: not the agent's fault
                s["events"].append(event)
                self._close(s)
                return partner_failed(
                    Episode(episode.task, episode.observation, False, s),
                    f"tool sandbox failed: {type(exc).__name__}: {str(exc)[:200]}",
                )
            event.update(
                ok=result.ok,
                exit=result.exit_code,
                error=result.error,
                changed=[_printable_name(name) for name in result.changed[:64]],
            )
            if result.error in ("sandbox_setup", "start_failed"):
                s["events"].append(event)
                self._close(s)
                return partner_failed(
                    Episode(episode.task, episode.observation, False, s),
                    f"tool sandbox failed: {result.error} {result.stderr[:200]}",
                )
            changed = _changed_line(result.changed, self.max_observation_chars // 4)
            text = result.render(max(16, self.max_observation_chars - len(changed)))
            observation = f"tool {kind} result : {text}{changed}"
            if result.workspace is not None:  # whatever else stopped the call (a timeout included)
                observation += f"\nthe folder is over its {result.workspace} limit : episode over"
                done = True
        s["events"].append(event)
        if not done and s["turns"] >= s["max_turns"]:
            observation += "\ntime up"
            done = True
        if done:
            s["verdict"] = self._verify(episode.task, s, box)
            self._close(s)
        return Episode(task=episode.task, observation=observation, done=done, state=s)

    def step_many(self, episodes: Sequence[Episode], actions: Sequence[str]) -> list[Episode]:
        """One turn of many episodes, their tool calls run in parallel (`workers` threads)."""
        if len(episodes) != len(actions):
            raise ValueError(f"step_many needs one action per episode, got {len(actions)} for {len(episodes)}")
        if self.workers == 1 or len(episodes) < 2:
            return [self.step(e, a) for e, a in zip(episodes, actions)]
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            return list(pool.map(self.step, episodes, actions))

    def _close(self, s: dict) -> None:
        with self._lock:
            box = self._boxes.pop(s.get("sandbox"), None)
        s["sandbox"] = None
        if box is not None:
            box.close()

    def close(self) -> None:
        """Closes every sandbox still open (episodes that never finished)."""
        with self._lock:
            boxes, self._boxes = list(self._boxes.values()), {}
        for box in boxes:
            box.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass

    def _verify(self, task: Task, s: dict, box: Sandbox) -> dict:
        data, answer = task.data, s["answer"]
        kind = data["kind"]
        if answer is None:
            return {"reward": 0.0, "success": False, "reason": "no answer"}
        ok, reason = False, ""
        if kind == "compute":
            ok = _number_close(answer, data["expected"])
            reason = f"answer {answer!r}, expected {data['expected']}"
        elif kind == "transform":
            text = box.read_file("out.json")
            try:
                got = json.loads(text) if text is not None else None
            except ValueError:
                got = "invalid json"
            ok = got == data["expected"]
            reason = "out.json " + ("matches" if ok else f"is {str(got)[:200]!r}, expected {data['expected']}")
        elif kind == "write_file":
            text = box.read_file("notes/summary.txt")
            want = "\n".join(data["lines"])
            ok = text is not None and text.rstrip("\n") == want
            reason = "notes/summary.txt " + ("matches" if ok else f"is {str(text)[:200]!r}")
        elif kind == "fix_bug":
            run = box.run_shell(f"{shlex.quote(box.python)} stats.py")
            printed = run.stdout.strip() if run.ok else None
            fixed = printed == str(data["expected"])
            ok = fixed and _number_close(answer, data["expected"])
            reason = (
                f"the verifier's run of stats.py printed {printed!r} ({run.error or 'exit %s' % run.exit_code}),"
                f" answer {answer!r}, expected {data['expected']}"
            )
        else:
            ok = answer.strip().strip(".").lower() == str(data["expected"]).lower()
            reason = f"answer {answer!r}, expected {data['expected']!r}"
        return {"reward": 1.0 if ok else 0.0, "success": bool(ok), "reason": reason}

    def outcome(self, episode: Episode) -> Outcome:
        s = episode.state
        if s.get("partner_failure"):
            return Outcome(0.0, False, "tool sandbox failure", failure=str(s["partner_failure"]))
        verdict = s.get("verdict")
        if verdict is None:
            return Outcome(0.0, False, "episode not finished")
        return Outcome(float(verdict["reward"]), bool(verdict["success"]), verdict["reason"])

    # -- language ------------------------------------------------------------------------------

    def action_vocabulary(self) -> list[str]:
        """The tokens the built-in policy's agent messages are made of: the JSON call syntax spelled with spaces
        (`{ "tool" : "shell" , "cmd" : "ls" }`), quoted command words and file names, and a few answers."""
        words = {
            "{",
            "}",
            ":",
            ",",
            '"tool"',
            '"python"',
            '"shell"',
            '"code"',
            '"cmd"',
            '"answer"',
            '"done"',
            '"ls"',
            '"ls',
            '"cat',
            '"head',
            '"grep',
            '"python3',
            "-r",
            "docs",
            'data.csv"',
            'people.csv"',
            'stats.py"',
            'numbers.txt"',
            'out.json"',
            'docs"',
            '"0"',
            '"1"',
        }
        return sorted(words)

    def vocabulary(self) -> list[str]:
        from rwcore.trainer.envs import tools_rubrics as rubrics

        words: set[str] = set(SYSTEM_PROMPT_JSON.split()) | set(SYSTEM_PROMPT_TEMPLATE.split())
        words |= set(self.action_vocabulary())
        words |= {
            "task",
            "files",
            "(",
            ")",
            "empty",
            "tool",
            "error",
            "result",
            "exit",
            "stdout",
            "stderr",
            "answer",
            "received",
            "time",
            "up",
            "changed",
            "python",
            "shell",
            "no",
            "code",
            "|",
            "?",
            ".",
        }
        for task in self.tasks("train")[:50] + self.tasks("eval")[:20]:
            words |= set(task.data["brief"].split())
        words |= set(_GROUPS) | set(_CITIES) | set(_WORDS) | set(_ENTITIES) | set(_KEYS) | set(STATS)
        for variants in rubrics.SKILLS.values():
            for text in variants:
                words |= set(text.split())
        return sorted(w.lower() for w in words)

    # -- adaptive-method pieces -------------------------------------------------------------------

    def rules(self):
        from rwcore.trainer.envs import tools_rubrics as rubrics

        return rubrics.make_rules()

    def reflector(self):
        from rwcore.trainer.envs import tools_rubrics as rubrics

        return rubrics.ToolsReflector()

    def attributor(self):
        from rwcore.trainer.envs import tools_rubrics as rubrics

        return rubrics.ToolsAttributor()

    def initial_library(self) -> tuple[str, ...]:
        from rwcore.trainer.envs import tools_rubrics as rubrics

        return rubrics.INITIAL_LIBRARY

    def labelled_cases_by_rule(self, rule_ids: Sequence[str]) -> dict:
        from rwcore.trainer.envs import tools_rubrics as rubrics

        return rubrics.labelled_cases_by_rule(rule_ids)

    def labelled_cases(self, rule_ids: Sequence[str]) -> list:
        by_rule = self.labelled_cases_by_rule(rule_ids)
        return [case for rule_id in rule_ids for case in by_rule[rule_id]]


def _number_close(answer: str, expected) -> bool:
    match = re.fullmatch(r"\s*(-?\d+(?:\.\d+)?)\s*", str(answer))
    return match is not None and abs(float(match.group(1)) - float(expected)) <= 0.01


# -- policies and episodes -----------------------------------------------------------------------


def _call(tool: str, argument: str) -> str:
    return json.dumps({"tool": tool, ("code" if tool == "python" else "cmd"): argument})


def _stdout(observation: str) -> str:
    """The stdout block of a tool result observation."""
    match = re.search(r"stdout:\n(.*?)(?:\nstderr:|\n\(output truncated|\nfiles changed|\Z)", observation, re.S)
    return match.group(1).strip() if match else ""


class OraclePolicy:
    """A scripted policy that solves `task` through the tools: it inspects the inputs, computes or writes with
    code, reads back what it wrote, and answers from what the tools printed (never from the task's expected
    value). `__call__(observation) -> message`, one call per turn, JSON format."""

    def __init__(self, task: Task) -> None:
        self.task = task
        self.turn = 0

    def __call__(self, observation: str) -> str:
        d = self.task.data
        kind, turn = d["kind"], self.turn
        self.turn += 1
        if kind == "compute":
            code = (
                "import csv, statistics\nrows = [r for r in csv.DictReader(open('data.csv')) "
                f"if r['group'] == {d['group']!r}]\nvalues = [int(r['value']) for r in rows]\n"
                f"stat = {d['stat']!r}\n"
                "print({'sum': sum(values), 'max': max(values), 'count': len(values), "
                "'mean': round(statistics.mean(values), 2)}[stat])"
            )
            steps = [
                lambda: _call("shell", "head -n 5 data.csv"),
                lambda: _call("python", code),
                lambda: json.dumps({"answer": _stdout(observation)}),
            ]
        elif kind == "transform":
            code = (
                "import csv, json\nnames = sorted(r['name'] for r in csv.DictReader(open('people.csv')) "
                f"if r['city'] == {d['city']!r} and int(r['age']) >= {d['min_age']})\n"
                "json.dump(names, open('out.json', 'w'))"
            )
            steps = [
                lambda: _call("shell", "head -n 3 people.csv"),
                lambda: _call("python", code),
                lambda: _call("shell", "cat out.json"),
                lambda: json.dumps({"answer": "done"}),
            ]
        elif kind == "write_file":
            code = (
                "import os\nos.makedirs('notes', exist_ok=True)\n"
                f"open('notes/summary.txt', 'w').write({chr(10).join(d['lines']) + chr(10)!r})"
            )
            steps = [
                lambda: _call("python", code),
                lambda: _call("shell", "cat notes/summary.txt"),
                lambda: json.dumps({"answer": "done"}),
            ]
        elif kind == "fix_bug":
            buggy, correct = d["patch"]
            code = f"src = open('stats.py').read()\nopen('stats.py', 'w').write(src.replace({buggy!r}, {correct!r}))"
            steps = [
                lambda: _call("shell", "cat stats.py numbers.txt"),
                lambda: _call("python", code),
                lambda: _call("shell", "python3 stats.py"),
                lambda: json.dumps({"answer": _stdout(observation)}),
            ]
        else:
            pattern = f"the {d['key']} of {d['entity']} is"
            steps = [
                lambda: _call("shell", "ls docs"),
                lambda: _call("shell", f"grep -rh '{pattern}' docs"),
                lambda: json.dumps({"answer": _search_value(observation, pattern)}),
            ]
        return steps[min(turn, len(steps) - 1)]()


def _search_value(observation: str, pattern: str) -> str:
    match = re.search(re.escape(pattern) + r" (\S+?)\.?$", _stdout(observation), re.M)
    return match.group(1) if match else ""


def run_episode(
    env: ToolsEnv, task: Task, policy: Callable[[str], str], seed: int = 0, trajectory_id: str = "", group_id: str = ""
) -> Trajectory:
    """Runs `task` with `policy(observation) -> message`; returns the Trajectory the trainer would build (turns
    system / partner / assistant; metadata env_state, task, task_id, seed, success)."""
    episode = env.reset(task, seed)
    turns = [Turn("system", env.system_prompt), Turn("partner", episode.observation)]
    while not episode.done:
        message = policy(episode.observation)
        turns.append(Turn("assistant", message, generated=True))
        episode = env.step(episode, message)
        turns.append(Turn("partner", episode.observation))
    outcome = env.outcome(episode)
    metadata = {
        "env_state": episode.state,
        "task": task.data,
        "task_id": task.task_id,
        "seed": seed,
        "success": bool(outcome.success),
    }
    return Trajectory(
        task_id=task.task_id,
        turns=turns,
        outcome=float(outcome.reward),
        tags=tuple(task.tags),
        group_id=group_id,
        trajectory_id=trajectory_id or f"{task.task_id}/{group_id}/{seed}",
        metadata=metadata,
        partner_failure=str(episode.state.get("partner_failure") or ""),
    )


register("tools", ToolsEnv)
