"""Judging that overlaps generation: each task group is judged as soon as its episodes end.

`rw train` hands `GroupJudging.submit` to `run_episodes(on_group=...)`: a finished group's trajectories go to
the judge's coroutine (`aevaluate`, which an LLM judge has) on one event loop in a background thread, while
the other groups still generate. All groups share that loop, so the judge's `max_concurrency` and rate
limits hold for the whole step. `collect()` waits for the rest after the last episode ends and returns the
reports in group order.

The requests are the same as judging the whole step afterwards (one request per trajectory and rubric
chunk either way), so the verdicts, rewards and advantages do not depend on when a group finished: with a
deterministic server the same seed gives the same run, timings aside. A judge call that raises gives its
trajectories INVALID judgments, as `rwcore.method.judge_groups` does; `MissingAPIKeyError` is raised.
A judge without `aevaluate` (the rule judge: microseconds per trajectory) is not overlapped.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Sequence

from rwcore.judges.client import MissingAPIKeyError
from rwcore.types import JudgeReport, RubricJudgment, RubricSpec, Trajectory
from rwcore.verdict import Verdict

__all__ = ["GroupJudging", "can_overlap"]

logger = logging.getLogger("rwcore.trainer")


def can_overlap(judge) -> bool:
    """Whether `judge` can be judged from an event loop while generation runs (it has `aevaluate`)."""
    return callable(getattr(judge, "aevaluate", None))


class GroupJudging:
    """Judges task groups in the background as they finish (see the module docstring).

    plans: one rubric list per group (`MethodLoop.rubrics`), in group order; group_index: group id -> its
    position in `plans`.
    """

    def __init__(self, judge, plans: Sequence[Sequence[RubricSpec]], group_index: dict[str, int]) -> None:
        self.judge = judge
        self.plans = [list(plan) for plan in plans]
        self.group_index = dict(group_index)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="rwcore-judging", daemon=True)
        self.thread.start()
        self.futures: dict[int, object] = {}
        # one connection pool for the whole step (a judge whose aevaluate takes a session: OpenAIJudge)
        self.session_context = None
        self.session = None
        client = getattr(judge, "client", None)
        if client is not None and hasattr(client, "session"):
            self.session_context = client.session()
            self.session = asyncio.run_coroutine_threadsafe(self.session_context.__aenter__(), self.loop).result()
        self.started: float | None = None
        self.failures: list[str] = []

    def submit(self, group_id: str, rollouts: Sequence) -> None:
        """`run_episodes`' `on_group`: starts judging one finished group."""
        index = self.group_index[group_id]
        trajectories = [rollout.trajectory for rollout in rollouts]
        if self.started is None:
            self.started = time.perf_counter()
        self.futures[index] = asyncio.run_coroutine_threadsafe(self._judge(trajectories, self.plans[index]), self.loop)

    async def _judge(self, trajectories: list[Trajectory], rubrics: list[RubricSpec]) -> list[JudgeReport]:
        try:
            if not rubrics:
                return [JudgeReport(t.trajectory_id, {}) for t in trajectories]
            if self.session is not None:
                got = await self.judge.aevaluate(trajectories, rubrics, session=self.session)
            else:
                got = await self.judge.aevaluate(trajectories, rubrics)
            if len(got) != len(trajectories):
                raise ValueError(
                    f"judge.aevaluate returned {len(got)} reports for {len(trajectories)} trajectories "
                    f"({type(self.judge).__name__})"
                )
            return list(got)
        except MissingAPIKeyError:
            raise
        except Exception as exc:  # a judge failure is INVALID, never a crash
            error = f"{type(exc).__name__}: {exc}"[:500]
            self.failures.append(error)
            message = f"the judge raised {error}"
            return [
                JudgeReport(
                    t.trajectory_id,
                    {r.rubric_id: RubricJudgment(r.rubric_id, Verdict.INVALID, error=message) for r in rubrics},
                )
                for t in trajectories
            ]

    def collect(self, count: int) -> tuple[list[JudgeReport], float, float]:
        """(reports of groups 0..count-1 in order, seconds judging was under way, seconds waited for it now)."""
        waited = time.perf_counter()
        try:
            missing = [i for i in range(count) if i not in self.futures]
            if missing:
                raise RuntimeError(f"groups {missing[:5]} were never submitted for judging")
            reports = [report for i in range(count) for report in self.futures[i].result()]
            done = time.perf_counter()
        finally:
            if self.session_context is not None:
                asyncio.run_coroutine_threadsafe(self.session_context.__aexit__(None, None, None), self.loop).result()
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join()
            self.loop.close()
        if self.failures:
            logger.warning(
                "judge %s raised in %d of its calls; those trajectories' judgments are INVALID (first: %s)",
                type(self.judge).__name__,
                len(self.failures),
                self.failures[0],
            )
        busy = (done - self.started) if self.started is not None else 0.0  # first submit to the last answer
        return reports, busy, done - waited
