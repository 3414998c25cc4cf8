"""TRL's group-repeat sampling structure over task batches a rwcore sampler chooses."""

from __future__ import annotations

from torch.utils.data import Sampler


class GroupRepeatSampler(Sampler):
    """TRL's `RepeatSampler` structure over batches chosen by a rwcore sampler.

    `batch_sampler` is a `rwcore.AdaptiveBatchSampler`; each of its batches (K distinct dataset
    indices, drawn lazily when the data loader reaches it) is yielded `repeat_count` times, every index
    `mini_repeat_count` times in a row:
    [a, a, b, b] * repeat_count for K=2, mini_repeat_count=2. In `RWGRPOTrainer`,
    mini_repeat_count = num_generations and repeat_count = num_iterations * steps_per_generation.
    """

    def __init__(self, batch_sampler, mini_repeat_count: int, repeat_count: int = 1) -> None:
        super().__init__()
        for name, value in (("mini_repeat_count", mini_repeat_count), ("repeat_count", repeat_count)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.batch_sampler = batch_sampler
        self.mini_repeat_count = mini_repeat_count
        self.repeat_count = repeat_count

    def __iter__(self):
        for batch in self.batch_sampler:
            for _ in range(self.repeat_count):
                for index in batch:
                    for _ in range(self.mini_repeat_count):
                        yield index

    def __len__(self) -> int:
        per_batch = self.batch_sampler.sampler.batch_size
        return len(self.batch_sampler) * per_batch * self.mini_repeat_count * self.repeat_count
