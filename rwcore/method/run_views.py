"""What the run folder and the metrics rows show about an `AdaptiveMethod`: RewardWeaver's stages, reward history
and appendix-G diagnostics, Arise's pool counts, events and rubrics, the sampler's probabilities (`RunViews`, a
base of `AdaptiveMethod`; it reads the method's parts and changes nothing)."""

from __future__ import annotations

__all__ = ["RunViews"]


class RunViews:
    """The read-only views of `AdaptiveMethod` that `rw train` writes to the run folder and its metrics rows."""

    def run_files(self) -> dict[str, object]:
        """file name -> JSON payload: what this variant's run folder holds about the method (RewardWeaver's
        stages, history and appendix-G diagnostics; Arise's pool counts, events and rubrics)."""
        files: dict[str, object] = {}
        if self.variant.has_stages:
            files["reward_stages.json"] = self.reward_stages()
            if self.reward_history() is not None:
                files["reward_history.json"] = self.reward_history()
                files["diagnostics.json"] = self.diagnostic_scores()
        if self.pool is not None:
            files["pool_counts.json"] = self.pool_counts()
            files["pool_events.json"] = self.pool_events()
            files["pool_rubrics.json"] = self.pool_rubrics()
        return files

    def sampling_probabilities(self, step: int, num_draws: int = 500) -> dict | None:
        """(task-type tag, capability) -> probability that the sampler draws a task of that pair at `step`
        (estimated from `num_draws` draws); None for samplers without pairs."""
        if not hasattr(self.sampler, "pair_probabilities"):
            return None
        return self.sampler.pair_probabilities(step, num_draws=num_draws)

    @property
    def task_ids(self) -> list:
        """The training tasks' ids, in the order the method was given them."""
        return list(self._task_ids)

    def active_rubric_count(self) -> int:
        """Distinct rubrics that steer training now (pool rubrics plus RewardWeaver's set)."""
        ids = {spec.rubric_id for spec in self.pool.active_rubrics()} if self.pool is not None else set()
        ids |= {spec.rubric_id for spec in self.process_rubrics()}
        if hasattr(self._process, "all_rubric_ids"):
            ids |= self._process.all_rubric_ids()
        return len(ids)

    @property
    def reflection_errors(self) -> int:
        return self._reflection_errors

    def pool_events(self) -> list[dict]:
        """The pool's event history; `step` counts optimizer steps done when it happened (an update at
        the end of 0-based iteration k is step k + 1, the row of metrics.jsonl it follows)."""
        if self.pool is None:
            return []
        return [{**event, "step": event["step"] + 1} for event in self.pool.history()]

    def pool_counts(self) -> list[dict]:
        if self.pool is None:
            return []
        return [
            {"step": row["step"] + 1, "active": row["active_rubrics"], "added": row["added"], "retired": row["retired"]}
            for row in self.pool.counts()
        ]

    def pool_rubrics(self) -> list[dict]:
        """Every rubric the pool ever held (current and retired) with its skill: what
        `arise_frozen_rubrics` reads from a source run."""
        if self.pool is None:
            return []
        pairs = self.pool.pairs() + self.pool.retired_pairs()
        out = []
        for pair in pairs:
            r = pair.rubric
            out.append(
                {
                    "rubric_id": r.rubric_id,
                    "criterion": r.criterion,
                    "applicability": r.applicability,
                    "capability": r.capability,
                    "evaluator_prompt": r.evaluator_prompt,
                    "scored": r.scored,
                    "skill": pair.skill.text,
                    "created_step": pair.created_step + 1,
                    "retired_step": None if pair.retired_step is None else pair.retired_step + 1,
                }
            )
        return out

    def reward_stages(self) -> list[dict]:
        """One record per RewardWeaver stage: steps, active set (with families), strategy, reason."""
        if self.weaver is not None:
            library = self.weaver.library
            return [
                {
                    "stage": r.stage,
                    "start_step": r.start_step,
                    "end_step": r.end_step,
                    "active": list(r.active),
                    "families": {c: library[c].capability.family for c in r.active},
                    "strategy": r.strategy,
                    "reason": r.reason,
                    "admitted": list(r.admitted),
                    "expansion": r.diagnosis.get("expansion"),
                }
                for r in self.weaver.history.stages
            ]
        return self._process.reward_stages() if hasattr(self._process, "reward_stages") else []

    def reward_history(self) -> dict | None:
        return self.weaver.history.state_dict() if self.weaver is not None else None

    def diagnostic_scores(self) -> list[dict]:
        return [dict(point) for point in self._diagnostic_scores]

    def metrics(self) -> dict:
        """A few numbers for a metrics row."""
        row = {"active_rubrics": self.active_rubric_count()}
        if self.pool is not None:
            row["pool/rubrics"] = len(self.pool)
            row["pool/active_skills"] = len(self.pool.active_skills())
            row["pool/reflection_errors"] = self._reflection_errors
        if self.weaver is not None and self.weaver.stage is not None:
            row["rewardweaver/stage"] = self.weaver.stage
            row["rewardweaver/stage_errors"] = self._stage_errors
        if hasattr(self.sampler, "coverage"):
            row["sampler/coverage"] = self.sampler.coverage()
        return row
