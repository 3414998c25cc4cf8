"""A scripted policy that solves every tools task through the tools (`OraclePolicy`), and `run_episode`, which
plays one episode with any policy and returns the Trajectory the trainer would build."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from rwcore.trainer.envs.base import Task
from rwcore.trainer.envs.tools.environment import ToolsEnv
from rwcore.types import Trajectory, Turn


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
        partner_failure=episode.partner_failure,
    )
