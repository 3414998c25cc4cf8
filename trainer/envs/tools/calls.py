"""The tools environment's call format: the tool schemas, the system prompts that teach the format, and the
parser of an agent message into a tool call (see the package docstring, "Tool-call format")."""

from __future__ import annotations

import json
import re

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
