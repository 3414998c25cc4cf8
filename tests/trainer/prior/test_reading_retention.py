"""loss.reading_retention (off by default): the reading prior's corpus loss added to every optimizer step.

- The term is pretraining's corpus loss of the step's examples, recomputed here from the corpus generator and
  the model by hand, one example at a time: cross-entropy over the move words and `<end>` against the line's
  move where a line names the situation, against the even spread over the move words elsewhere, averaged over
  the batch's agent turns.
- Its batch depends on the step index alone; a run logs the term's value (before the step's update) as
  `reading_retention_loss`, which equals the hand computation on the previous checkpoint's weights.
- It is refused, naming the key, for a named model and on an environment without a guidance language.
- A run with it on resumes exactly.
"""

from __future__ import annotations

import pytest
import torch
from _util import TINY_MODEL, TINY_PRIOR, metrics_rows, without_timing

from rwcore.trainer import checkpoint as ckpt
from rwcore.trainer import envs
from rwcore.trainer.config import load_config
from rwcore.trainer.policy import WordCodec, build_model
from rwcore.trainer.prior import ensure_prior, heldout_pairs
from rwcore.trainer.prior.corpus import CorpusSpec, fillers_for, make_example
from rwcore.trainer.prior.retention import RETENTION_FIRST_EXAMPLE, ReadingRetention
from rwcore.trainer.trainer import Trainer

ENV = envs.make("negotiation")
LANGUAGE = ENV.guidance_language()
CODEC = WordCodec(ENV.vocabulary())
ACTIONS = list(LANGUAGE.actions)

TINY_RUN = [
    "env.options.num_train=24",
    "env.options.num_eval=4",
    "rollout.tasks_per_step=2",
    "rollout.group_size=2",
    "train.eval_every=2",
    "train.checkpoint_every=1",
    "pool.delta_pool=2",
    "rewardweaver.adaptation_interval=2",
    "rewardweaver.diagnosis_tasks=2",
    "rewardweaver.diagnostic_tasks=2",
    "rewardweaver.min_support=1",
    "loss.reading_retention=0.5",
    "loss.reading_retention_batch=4",
]


def corpus_example(index: int, seed: int = 0, max_length: int = 256):
    """Example `index` of the reading corpus, straight from the corpus generator."""
    spec = CorpusSpec(seed=seed, max_length=max_length)
    return make_example(
        index,
        spec,
        LANGUAGE,
        CODEC,
        ENV.system_prompt,
        ENV.max_turns,
        set(heldout_pairs(LANGUAGE, spec)),
        fillers_for(LANGUAGE, ENV.vocabulary()),
        forbidden=set(LANGUAGE.skill_texts),
    )


def hand_loss(model, step: int, batch: int) -> float:
    """The corpus loss of step `step`'s examples, one example at a time, no padding."""
    allowed = [CODEC.vocab[a] for a in ACTIONS] + [CODEC.end_id]
    terms = []
    with torch.no_grad():
        for j in range(batch):
            example = corpus_example(RETENTION_FIRST_EXAMPLE + step * batch + j)
            hidden = model.model(input_ids=torch.tensor([example.token_ids])).last_hidden_state[0]
            for position, target in zip(example.positions, example.targets):
                logits = model.lm_head.weight[allowed].double() @ hidden[position].double()
                logp = logits - torch.logsumexp(logits, dim=0)
                terms.append(-float(logp[target]) if target >= 0 else -float(logp[: len(ACTIONS)].mean()))
    return sum(terms) / len(terms)


def tiny_model(seed: int = 5):
    """A random model, sharper than the default init, so that different batches have clearly different losses."""
    model = build_model(len(CODEC), 16, 1, 2, 32, 256, seed, True, None)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(4.0)
    return model


def test_the_term_is_the_pretraining_loss_of_the_steps_corpus_examples():
    config = load_config(None, [*TINY_MODEL, "loss.reading_retention=0.1", "loss.reading_retention_batch=5"])
    model = tiny_model()
    retention = ReadingRetention(config, ENV, CODEC, torch.device("cpu"))
    for step in (0, 3):
        examples = retention.examples(step)
        assert [e.token_ids for e in examples] == [
            corpus_example(RETENTION_FIRST_EXAMPLE + step * 5 + j).token_ids for j in range(5)
        ]
        assert any(t >= 0 for e in examples for t in e.targets) and any(t < 0 for e in examples for t in e.targets)
        value = retention.loss(model, step)
        assert value.requires_grad and value.dtype == torch.float32
        assert float(value.detach()) == pytest.approx(hand_loss(model, step, 5), rel=1e-5)
    first, later = float(retention.loss(model, 0).detach()), float(retention.loss(model, 3).detach())
    assert abs(first - later) > 1e-2  # another step, other examples
    # the batch follows the step alone: a second object draws the same examples
    again = ReadingRetention(config, ENV, CODEC, torch.device("cpu"))
    assert [e.token_ids for e in again.examples(3)] == [e.token_ids for e in retention.examples(3)]


def test_refused_for_a_named_model_and_without_a_guidance_language(tmp_path):
    named = Trainer(
        load_config(None, ["model.name=Qwen/Qwen3-0.6B", "loss.reading_retention=0.1"]), tmp_path / "a", quiet=True
    )
    with pytest.raises(ValueError, match=r"'loss.reading_retention'.*model.name='Qwen/Qwen3-0.6B'"):
        named.setup()  # before the model is loaded
    tools = Trainer(
        load_config(
            None,
            [*TINY_MODEL, "env.name=tools", "env.options.num_train=4", "env.options.num_eval=2"]
            + ["loss.reading_retention=0.1"],
        ),
        tmp_path / "b",
        quiet=True,
    )
    with pytest.raises(ValueError, match=r"'loss.reading_retention'.*env.name='tools' has none"):
        tools.setup()
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    for bad in ("loss.reading_retention=-1", "loss.reading_retention_batch=0"):
        with pytest.raises(ValueError, match=bad.split("=")[0].replace(".", r"\.")):
            load_config(None, [bad])
    assert load_config(None, []).loss.reading_retention == 0.0  # off by default


def test_a_run_logs_the_term_and_its_value_is_the_hand_computation(tmp_path, cache):
    config = load_config(None, [*TINY_PRIOR, cache, *TINY_RUN, "train.steps=3"])
    trainer = Trainer(config, tmp_path / "on", quiet=True)
    trainer.setup()
    trainer.train()
    trained = {k: v.clone() for k, v in trainer.policy.model.state_dict().items()}
    trainer.cleanup()
    train_rows = [r for r in metrics_rows(tmp_path / "on") if r["kind"] == "train"]
    assert [r["step"] for r in train_rows] == [1, 2, 3]
    model = build_model(len(CODEC), 16, 1, 2, 32, 256, 0, True, None)
    for row in train_rows:
        # the row of step k + 1 holds the term of step index k on the weights before its update (checkpoint k)
        before = tmp_path / "on" / "checkpoints" / f"step_{row['step'] - 1:06d}"
        if row["step"] == 1:
            model.load_state_dict(ensure_prior(config, ENV, progress=False).state_dict)
        else:
            model.load_state_dict(ckpt.load(before / "model.pt"))
        assert row["reading_retention_loss"] == pytest.approx(hand_loss(model, row["step"] - 1, 4), rel=1e-5)
    off = Trainer(
        load_config(None, [*TINY_PRIOR, cache, *TINY_RUN, "train.steps=3", "loss.reading_retention=0"]),
        tmp_path / "off",
        quiet=True,
    )
    off.setup()
    off.train()
    untouched = off.policy.model.state_dict()
    off.cleanup()
    assert all("reading_retention_loss" not in r for r in metrics_rows(tmp_path / "off"))
    assert any(not torch.equal(trained[k], untouched[k]) for k in trained)  # the term moved the weights


def test_resume_with_retention_reproduces_the_uninterrupted_run(tmp_path, cache):
    """tests/trainer/test_trainer_e2e.py's pattern: a run cut after step 4's checkpoint and one more step (whose
    checkpoint never happened) resumes to the same metrics and weights as the run never cut."""
    overrides = [*TINY_PRIOR, cache, *TINY_RUN, "train.steps=6", "train.checkpoint_every=2", "optim.epochs=2"]
    straight = Trainer(load_config(None, overrides), tmp_path / "straight", quiet=True)
    straight.setup()
    straight.train()
    final = {k: v.clone() for k, v in straight.policy.model.state_dict().items()}
    straight.cleanup()
    interrupted = Trainer(load_config(None, overrides), tmp_path / "cut", quiet=True)
    interrupted.setup()
    interrupted.config.train.steps = 4
    interrupted.train()
    interrupted._log(interrupted.train_step())  # killed before this step's checkpoint
    interrupted.cleanup()
    resumed = Trainer.resume(tmp_path / "cut", quiet=True)
    resumed.setup()
    assert resumed.step == 4 and resumed.prior is None
    resumed.train()
    assert all(torch.equal(final[k], v) for k, v in resumed.policy.model.state_dict().items())
    resumed.cleanup()
    cut, whole = without_timing(metrics_rows(tmp_path / "cut")), without_timing(metrics_rows(tmp_path / "straight"))
    assert cut == whole
    assert sum("reading_retention_loss" in r for r in whole) == 6
