"""The tool-use environment ("tools"): Arise-style agent tasks solved with a sandboxed Python / shell tool.

Each episode gets a private sandbox (rwcore.trainer.envs.tools.sandbox: a subprocess in its own working
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

Rubrics (rwcore.trainer.envs.tools.rubrics): programmatic checks of observable behaviour over the
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

Modules
-------
calls             the tool-call format: TOOL_SCHEMAS, the system prompts that teach it, parse_call
tasks             the task types and their seeded generator
environment       ToolsEnv: episodes in sandboxes, the verifier, the vocabularies, the providers
sandbox           the limited subprocess every tool call runs in
policies          OraclePolicy and run_episode
rubrics           the rubric library over the tool-call log, and its skill texts
providers         the reflector and attributor without an LLM
labelled_cases    synthetic tool-call logs with declared labels, for admitting the rubrics
"""

from rwcore.trainer.envs.base import register
from rwcore.trainer.envs.tools.calls import TOOL_SCHEMAS, parse_call
from rwcore.trainer.envs.tools.environment import ToolsEnv
from rwcore.trainer.envs.tools.policies import OraclePolicy, run_episode
from rwcore.trainer.envs.tools.tasks import KINDS

register("tools", ToolsEnv)

__all__ = ["KINDS", "TOOL_SCHEMAS", "OraclePolicy", "ToolsEnv", "parse_call", "run_episode"]
