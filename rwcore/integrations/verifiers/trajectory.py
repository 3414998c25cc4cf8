"""A verifiers `Trace` as a `rwcore.Trajectory`, and the task ids and tags both sides agree on.

Nothing here imports verifiers: a trace is read through its attributes (`nodes`, `rewards`, `id`), so the
conversion also reads a trace loaded from a record (`verifiers.v1.WireTrace`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping

from rwcore.types import Trajectory, Turn

REWARD_NAME = "rwcore_process"

__all__ = ["REWARD_NAME", "default_tags", "default_task_id", "env_outcome", "trajectory_from_trace"]

_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


def default_task_id(data) -> str:
    """The rwcore task id of a verifiers task (its `TaskData`): `data.id` when set, else `data.name`, else
    `"idx-<data.idx>"` (the task's position in its taskset's `load()` stream)."""
    for field in ("id", "name"):
        value = getattr(data, field, None)
        if value is not None and str(value) != "":
            return str(value)
    idx = getattr(data, "idx", None)
    if idx is None:
        raise ValueError("the task has no id, name or idx to name it by: give the TaskData an id, or pass task_id_fn")
    return f"idx-{int(idx)}"


def default_tags(data) -> tuple[str, ...]:
    """A task's task-type tags: the field `tags` of its `TaskData` subclass (a string or a list of strings)
    when it declares one, else none."""
    tags = getattr(data, "tags", None)
    if tags is None:
        return ()
    if isinstance(tags, str):
        return (tags,)
    return tuple(str(tag) for tag in tags)


def env_outcome(trace, exclude: Iterable[str] = (REWARD_NAME,)) -> float:
    """The trace's weighted reward (`sum(score * weight)`, as `Trace.reward`) over its rewards less the names in
    `exclude` (rwcore's own process reward): the environment's outcome R_o. Unscored (None) rewards count 0."""
    skip = set(exclude)
    total = 0.0
    rewards = getattr(trace, "rewards", None) or {}
    for name, reward in rewards.items():
        if reward is None or name in skip:
            continue
        value = getattr(reward, "value", None)
        if value is None:
            value = float(getattr(reward, "score", 0.0)) * float(getattr(reward, "weight", 1.0))
        total += float(value)
    return total


def _text(content) -> str:
    """Message content as text: a string as is; content parts (pydantic parts or dicts) as their text joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):
        parts = []
        for part in content:
            text = part.get("text") if isinstance(part, Mapping) else getattr(part, "text", None)
            if isinstance(text, str):
                parts.append(text)
        return "\n".join(parts)
    return str(content)


def _field(message, name: str):
    return message.get(name) if isinstance(message, Mapping) else getattr(message, name, None)


def _message_turn(message, sampled: bool, reasoning: bool) -> Turn:
    role = _ROLES.get(str(_field(message, "role")), "user")
    content = _text(_field(message, "content"))
    if role == "assistant":
        lines = []
        thought = _field(message, "reasoning_content")
        if reasoning and isinstance(thought, str) and thought:
            lines.append(f"[reasoning] {thought}")
        if content:
            lines.append(content)
        for call in _field(message, "tool_calls") or []:
            namespace = _field(call, "namespace")
            name = f"{namespace}.{_field(call, 'name')}" if namespace else f"{_field(call, 'name')}"
            lines.append(f"[tool_call {name}({_field(call, 'arguments')})]")
        content = "\n".join(lines)
    elif role == "tool" and _field(message, "name"):
        content = f"[{_field(message, 'name')}] {content}"
    return Turn(role, content, generated=bool(sampled) and role == "assistant")


def _last_branch(trace) -> list:
    """The nodes of the trace's last branch (root to its last leaf, what `Trace.messages` shows), walked with a
    guard: a malformed graph (a parent out of range, a cycle) is a ValueError, never a hang."""
    nodes = list(getattr(trace, "nodes", None) or [])
    if not nodes:
        return []
    parents = [getattr(node, "parent", None) for node in nodes]
    has_child = {p for p in parents if p is not None}
    leaves = [i for i in range(len(nodes)) if i not in has_child]
    if not leaves:
        raise ValueError("trace: its message graph has no leaf (a cycle)")
    path, seen, current = [], set(), leaves[-1]
    while current is not None:
        if not isinstance(current, int) or not 0 <= current < len(nodes) or current in seen:
            raise ValueError(f"trace: malformed message graph (parent {current!r} of {len(nodes)} nodes)")
        seen.add(current)
        path.append(nodes[current])
        current = parents[current]
    path.reverse()
    return path


def trajectory_from_trace(
    trace,
    *,
    task_id,
    tags: Iterable[str] | str = (),
    outcome: float | None = None,
    group_id: str = "",
    trajectory_id: str | None = None,
    policy_version: int = 0,
    exclude_rewards: Iterable[str] = (REWARD_NAME,),
    reasoning: bool = False,
    metadata: Mapping | None = None,
) -> Trajectory:
    """A `rwcore.Trajectory` from a verifiers `Trace` (its last branch, as `Trace.messages`).

    Each message becomes a `Turn`: system / user / assistant / tool (a "developer" message as system, an
    unknown role as user); content parts give their text (images are dropped); an assistant turn adds its
    tool calls as `[tool_call name(arguments)]` lines (and its reasoning as `[reasoning] ...` with
    `reasoning=True`). Assistant messages a model call produced (`MessageNode.sampled`) are `generated`;
    prompt-supplied ones are not.

    outcome: R_o; default `env_outcome(trace, exclude_rewards)`: the trace's weighted reward over the
        environment's own rewards (rwcore's process reward `rwcore_process` left out).
    trajectory_id: default the trace's id. generated_length: the sampled tokens of the branch
        (`MessageNode.mask`), else the trace's output tokens.
    Raises ValueError for a trace whose message graph is malformed; the text itself never raises.
    """
    if not hasattr(trace, "nodes") or not hasattr(trace, "rewards"):
        raise ValueError(f"trace must be a verifiers Trace, got {type(trace).__name__}")
    try:
        nodes = _last_branch(trace)
        turns = [_message_turn(node.message, getattr(node, "sampled", False), reasoning) for node in nodes]
    except (AttributeError, IndexError, KeyError, TypeError) as error:
        raise ValueError(f"trace: not a readable verifiers Trace ({type(error).__name__}: {error})") from error
    generated_length = sum(sum(1 for m in (getattr(node, "mask", None) or []) if m) for node in nodes)
    if not generated_length:
        try:
            generated_length = int(getattr(trace, "num_output_tokens", 0) or 0)
        except Exception:  # a usage record without counts: no length
            generated_length = 0
    if outcome is None:
        outcome = env_outcome(trace, exclude_rewards)
    outcome = float(outcome)
    if not math.isfinite(outcome):
        raise ValueError(f"outcome must be finite, got {outcome!r}")
    if isinstance(tags, str):
        tags = (tags,)
    trace_id = getattr(trace, "id", None)
    return Trajectory(
        task_id=str(task_id),
        turns=turns,
        outcome=outcome,
        tags=tuple(str(tag) for tag in tags),
        group_id=str(group_id),
        policy_version=int(policy_version),
        generated_length=max(0, int(generated_length)),
        trajectory_id=str(trajectory_id if trajectory_id is not None else trace_id or ""),
        metadata={"trace_id": str(trace_id), **dict(metadata or {})},
    )


TaskIdFn = Callable[[object], str]
TagsFn = Callable[[object], Iterable[str]]
