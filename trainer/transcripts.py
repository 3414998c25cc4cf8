"""Sampled held-out transcripts for the experiment trackers (`train.tracker_transcripts`, docs/trackers.md).

Every held-out evaluation of `rw train` sends the transcripts of its first N episodes (the first N held-out tasks,
with the evaluation's fixed seeds: the same tasks at every evaluation, so one task's play can be followed over
training) to each tracker of `train.loggers`, in that tracker's own form: TensorBoard text, a wandb table, an
MLflow JSON artifact, a trackio table (rwcore.trainer.trackers). This module holds what they share: a `Transcript`
per episode and its renderings.

A transcript is data, never markup: the model's and the partner's messages may hold anything, markdown and HTML
included. TensorBoard renders its text as markdown, so there each transcript is one fenced code block whose fence
is longer than any run of backticks in it (`code_block`): nothing inside can close it, and TensorBoard shows the
text verbatim. The tables and the JSON artifact carry the plain text, which their viewers show as text.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "TABLE_COLUMNS",
    "Transcript",
    "code_block",
    "transcript_of",
    "transcripts_document",
    "transcripts_markdown",
]

TABLE_COLUMNS = ("episode", "task", "tags", "success", "outcome", "reason", "transcript")
"""The columns of the wandb and trackio tables, one row per transcript (`Transcript.table_row`)."""


@dataclass(frozen=True)
class Transcript:
    """One held-out episode as the trackers show it.

    episode: its held-out task's index in the evaluation (0-based; the same task at every evaluation).
    task_id, tags: the task. success, outcome, reason: how the episode ended (the environment's `Outcome`).
    text: the episode as `Trajectory.transcript()` gives it (one `[role] content` block per turn: what judges
    read). turns: (role, content) per turn, in order."""

    episode: int
    task_id: str
    tags: tuple[str, ...]
    success: bool
    outcome: float
    reason: str
    text: str
    turns: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, episode: int, rollout) -> Transcript:
        """The transcript of a held-out `rollout` (rwcore.trainer.rollout.Rollout) of the `episode`-th task."""
        trajectory, outcome = rollout.trajectory, rollout.outcome
        return cls(
            episode=int(episode),
            task_id=str(trajectory.task_id),
            tags=tuple(str(tag) for tag in trajectory.tags),
            success=bool(outcome.success),
            outcome=float(outcome.reward),
            reason=str(outcome.reason),
            text=trajectory.transcript(),
            turns=tuple((turn.role, turn.content) for turn in trajectory.turns),
        )

    def header(self) -> str:
        """One line: the episode, its task and how it ended."""
        tags = f" [{', '.join(self.tags)}]" if self.tags else ""
        reason = f" ({self.reason})" if self.reason else ""
        return (
            f"episode {self.episode}: task {self.task_id}{tags}, "
            f"{'success' if self.success else 'no success'}, outcome {self.outcome:g}{reason}"
        )

    def record(self) -> dict:
        """The transcript as JSON data (MLflow's artifact)."""
        return {
            "episode": self.episode,
            "task_id": self.task_id,
            "tags": list(self.tags),
            "success": self.success,
            "outcome": self.outcome,
            "reason": self.reason,
            "turns": [{"role": role, "content": content} for role, content in self.turns],
            "transcript": self.text,
        }

    def table_row(self) -> list:
        """Its row of the wandb and trackio tables (`TABLE_COLUMNS`)."""
        return [
            self.episode,
            self.task_id,
            ", ".join(self.tags),
            self.success,
            self.outcome,
            self.reason,
            self.text,
        ]


_BACKTICKS = re.compile(r"`+")


def code_block(text: str) -> str:
    """`text` as one fenced markdown code block that shows it verbatim: the fence is one backtick longer than the
    longest run of backticks in `text` (at least three), so no line of `text` can close it (CommonMark and
    Python-Markdown's fenced_code, which TensorBoard uses, alike)."""
    longest = max((len(run) for run in _BACKTICKS.findall(text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}\n{text}\n{fence}"


def transcripts_markdown(transcripts: Sequence[Transcript]) -> str:
    """TensorBoard's text for one evaluation: per transcript a heading line of rw's own words, then its header and
    text in one code block."""
    parts = [
        f"**Episode {number} of {len(transcripts)}**\n\n" + code_block(f"{t.header()}\n\n{t.text}")
        for number, t in enumerate(transcripts, 1)
    ]
    return "\n\n".join(parts)


def transcripts_document(name: str, step: int, transcripts: Sequence[Transcript]) -> dict:
    """MLflow's JSON artifact for one evaluation (`name`: the row kind, `eval`)."""
    return {"evaluation": name, "step": int(step), "transcripts": [t.record() for t in transcripts]}


def transcript_of(rollout) -> dict:
    """One episode as `rw eval --transcripts` writes it, a JSON object: its task, tags, outcome and the
    conversation (role, content), generated turns marked."""
    trajectory, outcome = rollout.trajectory, rollout.outcome
    return {
        "task_id": trajectory.task_id,
        "tags": list(trajectory.tags),
        "reward": float(outcome.reward),
        "success": bool(outcome.success),
        "reason": outcome.reason,
        "turns": [
            {"role": turn.role, "content": turn.content, **({"generated": True} if turn.generated else {})}
            for turn in trajectory.turns
        ],
    }
