"""Run under torchrun by tests/trainer/test_engines.py: a data-parallel DeepSpeedEngine update on each rank's
share of a batch must equal a one-process TorchEngine update on the whole batch.

Argv: OUT ZERO_STAGES MICRO_BATCHES (stages comma-separated); each rank writes OUT.RANK (JSON).
"""

import json
import sys

import torch

from rwcore.trainer.engines import DeepSpeedEngine, TorchEngine

ROWS, FEATURES, CLASSES, STEPS, CLIP = 12, 5, 7, 3, 0.3


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 9), torch.nn.Tanh(), torch.nn.Linear(9, CLASSES))


def batch(step):
    generator = torch.Generator().manual_seed(100 + step)
    x = torch.randn(ROWS, 4, FEATURES, generator=generator)  # rows of 4 "tokens"
    labels = torch.randint(0, CLASSES, (ROWS, 4), generator=generator)
    mask = torch.rand(ROWS, 4, generator=generator) < 0.7  # ragged token counts per row
    weight = torch.randn(ROWS, 1, generator=generator).expand(ROWS, 4)
    return x, labels, mask, weight


def train(engine, rows, micro_batches):
    """STEPS updates of a token-averaged weighted NLL; this process sees `rows` of each batch, in
    `micro_batches` parts. Returns the gradient norms."""
    norms = []
    for step in range(STEPS):
        x, labels, mask, weight = batch(step)
        denominator = engine.tokens_denominator(engine.all_sum_tensor(mask[rows].sum().float()))
        engine.zero_grad()
        for part in torch.tensor_split(rows, micro_batches):
            logp = torch.log_softmax(engine.model(x[part]), -1).gather(-1, labels[part, :, None])[..., 0]
            engine.accumulate(-(logp * weight[part] * mask[part]).sum() / denominator)
        norms.append(engine.step())
    return norms


out, stages, micro_batches = sys.argv[1], [int(s) for s in sys.argv[2].split(",")], int(sys.argv[3])
results = {}
for stage in stages:
    distributed = DeepSpeedEngine(
        model(),
        lr=0.05,
        weight_decay=0.01,
        grad_clip=CLIP,
        zero_stage=stage,
        micro_batches=micro_batches,
        dtype="float32",
    )
    rank, world = distributed.rank, distributed.world_size
    mine = torch.arange(ROWS * rank // world, ROWS * (rank + 1) // world)
    norms = train(distributed, mine, micro_batches)
    reference = TorchEngine(model(), lr=0.05, weight_decay=0.01, grad_clip=CLIP)
    reference_norms = train(reference, torch.arange(ROWS), micro_batches)
    with torch.no_grad():
        pairs = list(zip(distributed.model.parameters(), reference.model.parameters()))
        results[str(stage)] = {
            "difference": max(float((a - b).abs().max()) for a, b in pairs),
            "moved": max(
                float((a - b).abs().max()) for a, b in zip(reference.model.parameters(), model().parameters())
            ),
            "norms": norms,
            "reference_norms": reference_norms,
            "clipped": max(reference_norms) > CLIP,
            "params": [p.flatten().tolist() for p in distributed.model.parameters()],
        }
    distributed.close()
with open(f"{out}.{rank}", "w") as stream:
    json.dump({"rank": rank, "world": world, "stages": results}, stream)
