"""`AdaptiveBatchSampler`: any rwcore task sampler as a `torch.utils.data` batch sampler.

    sampler = rwcore.CapabilitySampler(tasks, batch_size=32, group_size=8)
    batches = rwcore.AdaptiveBatchSampler(sampler, dataset_task_ids=[row["id"] for row in dataset], num_batches=1000)
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=batches, collate_fn=...)
    for step, batch in enumerate(loader):
        ...roll out and judge each task `group_size` times, update the policy...
        for task_id, verdicts, outcomes in judged_groups:
            batches.feedback(task_id, verdicts, outcomes=outcomes)
        batches.advance_policy()

Each batch is drawn when the loader asks for it, so with `num_workers=0` it
sees all feedback given so far; with worker processes the loader prefetches
`num_workers * prefetch_factor` batches, which are then drawn that many steps
early. `state_dict` / `load_state_dict` let a stateful loader (torchdata's
`StatefulDataLoader`) checkpoint the sampler mid-epoch.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Mapping, Sequence

from torch.utils.data import Sampler

from rwcore.tasks import check_int, check_version

_STATE_FORMAT = 1


class AdaptiveBatchSampler(Sampler[list[int]]):
    """Yields `num_batches` lists of dataset indices chosen by `sampler`.

    Args:
        sampler: a `CapabilitySampler`, `OutcomeSampler` or `UniformSampler`.
        dataset_task_ids: the task id of every dataset index; each of the
            sampler's tasks must appear exactly once.
        num_batches: batches per pass (the loader's length).
        policy_version: the policy version batches are drawn for; `advance_policy` moves it.
    """

    def __init__(
        self, sampler, dataset_task_ids: Sequence[Hashable], num_batches: int, policy_version: int = 0
    ) -> None:
        super().__init__()
        self.sampler = sampler
        self.num_batches = check_int(num_batches, "num_batches", low=1)
        self.policy_version = check_version(policy_version)
        self._dataset_index: dict = {}
        for index, task_id in enumerate(dataset_task_ids):
            if task_id in self._dataset_index:
                raise ValueError(
                    f"dataset_task_ids lists task {task_id!r} twice (indices {self._dataset_index[task_id]} and "
                    f"{index})"
                )
            self._dataset_index[task_id] = index
        missing = [task_id for task_id in sampler.task_ids if task_id not in self._dataset_index]
        if missing:
            raise ValueError(f"dataset_task_ids lacks {len(missing)} of the sampler's tasks, e.g. {missing[:3]!r}")
        self._batches_done = 0

    def __len__(self) -> int:
        return self.num_batches

    def __iter__(self) -> Iterator[list[int]]:
        # A pass resumed from a state dict yields only its remaining batches.
        while self._batches_done < self.num_batches:
            batch = [self._dataset_index[task_id] for task_id in self.sampler.sample(self.policy_version)]
            self._batches_done += 1
            yield batch
        self._batches_done = 0

    def feedback(
        self,
        task_id: Hashable,
        verdicts: Mapping[Hashable, Sequence],
        outcomes: Sequence[float] | None = None,
        policy_version: int | None = None,
    ) -> None:
        """Records one judged rollout group (`sampler.record_group`), by default at the current policy version."""
        version = self.policy_version if policy_version is None else policy_version
        self.sampler.record_group(task_id, verdicts, version, outcomes=outcomes)

    def advance_policy(self, version: int | None = None) -> int:
        """Moves to policy version `version` (default: the next one) after an update; returns it."""
        self.policy_version = self.policy_version + 1 if version is None else check_version(version)
        return self.policy_version

    def state_dict(self) -> dict:
        return {
            "kind": "AdaptiveBatchSampler",
            "format": _STATE_FORMAT,
            "sampler": self.sampler.state_dict(),
            "policy_version": self.policy_version,
            "batches_done": self._batches_done,
            "num_batches": self.num_batches,
        }

    def load_state_dict(self, state: Mapping) -> None:
        if not isinstance(state, Mapping) or state.get("kind") != "AdaptiveBatchSampler":
            raise ValueError("state_dict is not an AdaptiveBatchSampler state")
        if state.get("format") != _STATE_FORMAT:
            raise ValueError(f"state_dict has format {state.get('format')!r}; this version reads {_STATE_FORMAT}")
        if state.get("num_batches") != self.num_batches:
            raise ValueError(
                f"state_dict was saved with num_batches={state.get('num_batches')!r}, this sampler has "
                f"{self.num_batches}"
            )
        version = check_version(state.get("policy_version"))
        done = check_int(state.get("batches_done"), "state_dict['batches_done']", low=0, high=self.num_batches)
        self.sampler.load_state_dict(state["sampler"])
        self.policy_version, self._batches_done = version, done
