"""Reading retention (`loss.reading_retention`, off by default): keeping the reading prior's ability under RL.

After the default RL run the built-in policy no longer reads: the probe's lift of every skill text falls from
+0.75..+0.86 to zero, so skills Arise shows late in training cannot act on the policy. With
`loss.reading_retention` = w > 0, every optimizer step of the policy update also minimizes w x the reading
prior's corpus loss (`pretrain.corpus_loss`, the loss pretraining minimizes less its auxiliary head, which is
dropped after pretraining) on `loss.reading_retention_batch` corpus examples. Neither paper has such a term
(Arise's objective has no KL or auxiliary loss), so it is off unless named.

The examples of step k are the corpus examples `RETENTION_FIRST_EXAMPLE + k x batch + j`, j < batch
(`pretrain.example_maker`, from the prior's corpus spec: prior.seed and model.max_length): draws that
pretraining never read, fixed by the step index and the spec alone, so a resumed run draws the same ones.
"""

from __future__ import annotations

import torch

from rwcore.trainer.prior.corpus import Example
from rwcore.trainer.prior.pretrain import _tensors, corpus_loss, corpus_spec, example_maker, language_of

__all__ = ["RETENTION_FIRST_EXAMPLE", "ReadingRetention", "check_reading_retention"]

RETENTION_FIRST_EXAMPLE = 1 << 40
"""Index of the first corpus example retention draws: far past every example pretraining reads (it reads
from 0 upwards, prior.steps x prior.batch_size of them rounded up to whole pools)."""


def check_reading_retention(config, env) -> None:
    """Raises ValueError naming loss.reading_retention when it is on for a named model or an environment
    without a guidance language (there is no reading corpus for either)."""
    weight = config.loss.reading_retention
    if not weight:
        return
    if config.model.name:
        raise ValueError(
            f"config key 'loss.reading_retention': {weight} applies to the built-in model's reading prior; "
            f"model.name={config.model.name!r} has none (leave loss.reading_retention at 0)"
        )
    if language_of(env) is None:
        raise ValueError(
            f"config key 'loss.reading_retention': {weight} needs an environment with a guidance language "
            f"(the reading corpus is written in it); env.name={env.name!r} has none"
        )


class ReadingRetention:
    """The retention term of a run: `loss(model, step)` -> the scalar corpus loss (fp32, differentiable) of
    step `step`'s batch. Builds the batch's tensors once per step (optim.epochs > 1 reuses them)."""

    def __init__(self, config, env, codec, device: torch.device) -> None:
        check_reading_retention(config, env)
        language = language_of(env)
        self.batch = int(config.loss.reading_retention_batch)
        self.device = device
        self.moves = len(language.actions)
        self.make = example_maker(corpus_spec(config), env, language, codec)
        self.pad_id = codec.pad_id
        self.situations = {situation.name: i for i, situation in enumerate(language.situations)}
        self.allowed = torch.tensor(
            [codec.vocab[a] for a in language.actions] + [codec.end_id], dtype=torch.long, device=device
        )
        self._tensors: tuple[int, tuple] | None = None

    def examples(self, step: int) -> list[Example]:
        """The corpus examples of optimizer step `step` (0-based)."""
        first = RETENTION_FIRST_EXAMPLE + step * self.batch
        return [self.make(first + j) for j in range(self.batch)]

    def loss(self, model, step: int) -> torch.Tensor:
        if self._tensors is None or self._tensors[0] != step:
            ids, mask, rows, positions, targets, *_ = _tensors(self.examples(step), self.pad_id, self.situations)
            self._tensors = (step, tuple(t.to(self.device) for t in (ids, mask, rows, positions, targets)))
        ids, mask, rows, positions, targets = self._tensors[1]
        loss, _, _ = corpus_loss(model, ids, mask, rows, positions, targets, self.allowed, self.moves)
        return loss
