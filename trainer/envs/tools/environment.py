"""`ToolsEnv`: tool-use episodes in private sandboxes, the verifier that scores them, the vocabularies and the
providers (see the package docstring)."""

from __future__ import annotations

import itertools
import json
import random
import re
import shlex
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from rwcore.trainer.envs.base import Episode, Outcome, Task, partner_failed
from rwcore.trainer.envs.tools.calls import SYSTEM_PROMPT_JSON, SYSTEM_PROMPT_TEMPLATE, TOOL_SCHEMAS, parse_call
from rwcore.trainer.envs.tools.sandbox import Limits, Sandbox
from rwcore.trainer.envs.tools.tasks import KINDS, make_task_data, task_words


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
    """Tool-use tasks in a sandbox (see the package docstring).

    seed, num_train, num_eval: task generation (disjoint splits, same every call); max_turns: agent turns;
    kinds: the task types to use (default all of KINDS); call_format: "json" | "chat_template" (what the
    system prompt teaches and whether a message without a call is the answer); max_call_chars: longest
    accepted agent message; max_observation_chars: cut of a tool result in the transcript;
    isolation: the sandbox's ("auto" | "namespace" | "none", see the sandbox module); wall_seconds,
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
            except Exception as exc:  # whatever the tool did to the host side: not the agent's fault
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
        except Exception:  # BLE001
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
                f"the verifier's run of stats.py printed {printed!r} ({run.error or f'exit {run.exit_code}'}),"
                f" answer {answer!r}, expected {data['expected']}"
            )
        else:
            ok = answer.strip().strip(".").lower() == str(data["expected"]).lower()
            reason = f"answer {answer!r}, expected {data['expected']!r}"
        return {"reward": 1.0 if ok else 0.0, "success": bool(ok), "reason": reason}

    def outcome(self, episode: Episode) -> Outcome:
        if episode.partner_failure:
            return Outcome(0.0, False, "tool sandbox failure", failure=episode.partner_failure)
        s = episode.state
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
        from rwcore.trainer.envs.tools import rubrics

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
        words |= task_words()
        for variants in rubrics.SKILLS.values():
            for text in variants:
                words |= set(text.split())
        return sorted(w.lower() for w in words)

    # -- adaptive-method pieces -------------------------------------------------------------------

    def rules(self):
        from rwcore.trainer.envs.tools import rubrics

        return rubrics.make_rules()

    def reflector(self):
        from rwcore.trainer.envs.tools import providers

        return providers.ToolsReflector()

    def attributor(self):
        from rwcore.trainer.envs.tools import providers

        return providers.ToolsAttributor()

    def initial_library(self) -> tuple[str, ...]:
        from rwcore.trainer.envs.tools import rubrics

        return rubrics.INITIAL_LIBRARY

    def labelled_cases_by_rule(self, rule_ids: Sequence[str]) -> dict:
        from rwcore.trainer.envs.tools import labelled_cases

        return labelled_cases.labelled_cases_by_rule(rule_ids)

    def labelled_cases(self, rule_ids: Sequence[str]) -> list:
        by_rule = self.labelled_cases_by_rule(rule_ids)
        return [case for rule_id in rule_ids for case in by_rule[rule_id]]


def _number_close(answer: str, expected) -> bool:
    match = re.fullmatch(r"\s*(-?\d+(?:\.\d+)?)\s*", str(answer))
    return match is not None and abs(float(match.group(1)) - float(expected)) <= 0.01
