"""Short end-to-end `rw train` runs on the CPU: every method, strategy and sampler runs; resume
reproduces an uninterrupted run; a failing judge degrades to INVALID verdicts; `rw report` draws."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _util import SMALL_RUN, metrics_rows, without_timing

from rwcore import AdaptiveMethod
from rwcore.judges import RuleJudge
from rwcore.trainer import cli
from rwcore.trainer.config import load_config
from rwcore.trainer.trainer import Trainer

SMALL = list(SMALL_RUN)


def run(tmp_path: Path, *overrides: str, steps: int = 4, name: str = "run") -> tuple[Trainer, list[dict]]:
    trainer = Trainer(load_config(None, [*SMALL, f"train.steps={steps}", *overrides]), tmp_path / name, quiet=True)
    trainer.setup()
    trainer.train()
    trainer.cleanup()
    return trainer, metrics_rows(tmp_path / name)


@pytest.fixture(scope="module")
def arise_run(tmp_path_factory):
    """A short Arise run whose pool_rubrics.json is the source of arise_frozen_rubrics."""
    folder = tmp_path_factory.mktemp("arise-source")
    run(folder, "train.method=arise", steps=4)
    return folder / "run"


@pytest.mark.parametrize("name", list(AdaptiveMethod.variants()))
def test_every_variant_trains_end_to_end(tmp_path, name, arise_run):
    variant = AdaptiveMethod.variants()[name]
    extra = [f"pool.frozen_from={arise_run}"] if name == "arise_frozen_rubrics" else []
    trainer, metrics = run(tmp_path, f"train.method={name}", *extra)
    folder = tmp_path / "run"
    train_rows = [r for r in metrics if r["kind"] == "train"]
    eval_rows = [r for r in metrics if r["kind"] == "eval"]
    assert [r["step"] for r in train_rows] == [1, 2, 3, 4]
    assert [r["step"] for r in eval_rows] == [0, 2, 4]  # one before training
    for row in train_rows:
        assert 0.0 <= row["success_rate"] <= 1.0 and 0.0 <= row["kept_fraction"] <= 1.0
        assert 0.0 <= row["time/adaptive_fraction"] < 1.0
    resolved = json.loads((folder / "method.json").read_text())
    assert resolved["variant"]["name"] == name and resolved["variant"]["components"] == dict(variant.components)
    assert (folder / "checkpoints" / "latest").read_text() == "step_000004"
    c = variant.components
    # RewardWeaver's process reward: present exactly when the variant has one
    if c["process_reward"] is None:
        assert all(r["process_term_mean"] == 0.0 and r["rubrics/process"] == 0 for r in train_rows)
    else:
        assert any(r["rubrics/process"] > 0 for r in train_rows)
    if variant.has_stages:
        stages = json.loads((folder / "reward_stages.json").read_text())
        assert [s["start_step"] for s in stages] == [0, 2, 4]  # before training, then every interval
        strategy = c["process_reward"]
        assert all(s["strategy"] == strategy for s in stages[1:])
    else:
        assert not (folder / "reward_stages.json").exists()
    # Arise's pool: empty until the first scheduled update (unless frozen), skills only when the variant has them
    if c["arise_rubrics"] is None:
        assert not (folder / "pool_events.json").exists()
        assert all(r["rubrics/advantage"] == 0 for r in train_rows)
    else:
        events = json.loads((folder / "pool_events.json").read_text())
        created = [e["step"] for e in events if e["kind"] == "created"]
        assert created and (min(created) == 0 if c["arise_rubrics"] == "frozen" else min(created) >= 2)
    base = trainer.env.system_prompt
    assert (trainer.method.system_prompt(base) != base) == (c["skills"] and bool(trainer.method.pool.active_skills()))
    assert trainer.method.system_prompt(base, evaluation=True) == base
    assert (
        type(trainer.method.sampler).__name__
        == {"capability": "CapabilitySampler", "outcome": "OutcomeSampler", "uniform": "UniformSampler"}[c["sampler"]]
    )


def test_resume_reproduces_the_uninterrupted_run(tmp_path):
    _, straight = run(tmp_path, "train.method=combined", steps=6, name="straight")
    interrupted = Trainer(
        load_config(None, [*SMALL, "train.steps=6", "train.method=combined"]), tmp_path / "cut", quiet=True
    )
    interrupted.setup()
    interrupted.config.train.steps = 4
    interrupted.train()  # checkpoint at step 4 (and the eval row a finished run writes)
    interrupted._log(interrupted.train_step())  # a step whose checkpoint never happened: killed here
    resumed = Trainer.resume(tmp_path / "cut", quiet=True)
    resumed.setup()
    assert resumed.step == 4
    resumed.train()
    assert without_timing(metrics_rows(tmp_path / "cut")) == without_timing(straight)


def test_a_failing_judge_yields_invalid_verdicts_and_the_run_goes_on(tmp_path):
    trainer = Trainer(load_config(None, [*SMALL, "train.steps=5", "train.method=arise"]), tmp_path / "run", quiet=True)
    trainer.setup()

    def broken(_trajectory):
        raise TimeoutError("judge timed out")

    trainer.judge = RuleJudge({rule.spec.rubric_id: broken for rule in trainer.env.rules()})
    trainer.train()
    train_rows = [r for r in metrics_rows(tmp_path / "run") if r["kind"] == "train"]
    assert len(train_rows) == 5
    judged = [r for r in train_rows if r["judgments"]]  # the pool is empty for the first delta_pool steps
    assert judged and all(r["invalid_rate"] == 1.0 for r in judged)
    sampler = trainer.method.sampler
    assert all(sampler.task_state(task)["applicable"] == set() for task in sampler.task_ids)  # INVALID is no evidence


def test_rw_cli_train_then_report_draws_pngs(tmp_path, capsys):
    out = tmp_path / "cli-run"
    code = cli.main(["train", "--out", str(out), "--quiet", *SMALL, "train.steps=4", "train.method=combined"])
    assert code == 0
    assert cli.main(["report", str(out)]) == 0
    for name in ("success_curves.png", "pool_counts.png", "active_rubric_emphasis.png", "sampling_probabilities.png"):
        png = out / "report" / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert cli.main(["eval", str(out), "--tasks", "4"]) == 0
    out_text = capsys.readouterr().out
    printed = json.loads(out_text[out_text.index("{") :])
    assert 0.0 <= printed["eval/success_rate"] <= 1.0
    assert cli.main(["eval", str(out), "--tasks", "4", "--with-skills"]) == 0
    out_text = capsys.readouterr().out
    printed = json.loads(out_text[out_text.index("{") :])
    assert 0.0 <= printed["eval_with_skills/success_rate"] <= 1.0 and "eval/success_rate" not in printed


def test_unknown_config_key_names_it_and_lists_valid_ones(capsys):
    assert cli.main(["train", "train.stepz=3"]) == 2
    err = capsys.readouterr().err
    assert "train.stepz" in err and "steps" in err


def test_action_words_restrict_sampling_and_the_loss_to_the_same_softmax(tmp_path):
    trainer = Trainer(
        load_config(None, [*SMALL, "train.steps=1", "train.method=outcome_only", "rollout.action_words=on"]),
        tmp_path / "run",
        quiet=True,
    )
    trainer.setup()
    allowed = set(trainer.policy.allowed.tolist())
    rollouts, _ = trainer._rollout(trainer.method.sample(0), 0, "s0", trainer.env.system_prompt)
    for rollout in rollouts:
        produced = [token for token, flag in zip(rollout.token_ids, rollout.generated) if flag]
        assert produced and set(produced) <= allowed
    # behavior log-probs are under the restricted softmax: the probabilities of the allowed
    # tokens at a generated position sum to 1
    import torch

    first = rollouts[0]
    position = next(t for t, flag in enumerate(first.generated) if flag)
    ids = torch.tensor([first.token_ids[:position]])
    logits = (
        trainer.policy.model(input_ids=ids).logits[0, -1, trainer.policy.allowed] / trainer.config.rollout.temperature
    )
    expected = torch.log_softmax(logits.double(), -1)[sorted(allowed).index(first.token_ids[position])]
    assert abs(float(first.behavior_logprobs[position]) - float(expected)) < 1e-5
    trainer.train()
    assert [r["step"] for r in metrics_rows(tmp_path / "run") if r["kind"] == "train"] == [1]


def _mean_entropy(trainer, rollouts) -> float:
    """Mean policy entropy at the sampling temperature over the model tokens, straight from the logits."""
    import torch

    from rwcore.trainer.rollout import batch_tensors

    input_ids, attention, generated = batch_tensors(rollouts, trainer.policy.codec.pad_id, trainer.device)
    with torch.no_grad():
        logits = trainer.policy.model(input_ids=input_ids, attention_mask=attention).logits[:, :-1].double()
    logp = torch.log_softmax(logits / trainer.config.rollout.temperature, -1)
    entropy = -(logp.exp() * logp).sum(-1)
    mask = generated[:, 1:] & (attention[:, 1:] != 0)
    return float(entropy[mask].mean())


def test_entropy_bonus_reports_the_policy_entropy_and_raises_it(tmp_path):
    import numpy as np

    trainer = Trainer(
        load_config(
            None,
            [*SMALL, "train.method=outcome_only", "loss.entropy_coef=1.0", "optim.lr=1e-2", "rollout.action_words=off"],
        ),  # full-vocabulary softmax
        tmp_path / "run",
        quiet=True,
    )
    trainer.setup()
    rollouts, _ = trainer._rollout(trainer.method.sample(0), 0, "s0", trainer.env.system_prompt)
    before = _mean_entropy(trainer, rollouts)
    update = trainer._update_policy(rollouts, np.zeros(len(rollouts)))  # no policy-gradient signal at all
    assert abs(update["entropy"] - before) < 1e-4  # the statistic is the entropy before the step
    assert _mean_entropy(trainer, rollouts) > before + 1e-3  # and the bonus alone pushed it up
    trainer.config.loss.entropy_coef = 0.0
    frozen = {k: v.clone() for k, v in trainer.policy.model.state_dict().items()}
    update = trainer._update_policy(rollouts, np.zeros(len(rollouts)))
    assert "entropy" not in update and update["loss"] == 0.0
    # AdamW's momentum from the first step still moves the weights; the gradient itself was zero
    assert update["grad_norm"] == 0.0 and frozen.keys() == trainer.policy.model.state_dict().keys()


def test_action_words_auto_is_on_for_the_built_in_model_and_the_head_is_tied(tmp_path):
    trainer = Trainer(
        load_config(None, [*SMALL, "train.steps=1", "train.method=outcome_only"]), tmp_path / "a", quiet=True
    )
    trainer.setup()
    codec = trainer.policy.codec
    expected = sorted(codec.vocab[w] for w in trainer.env.action_vocabulary()) + [codec.end_id]
    assert sorted(trainer.policy.allowed.tolist()) == sorted(expected)
    model = trainer.policy.model
    assert model.get_input_embeddings().weight.data_ptr() == model.get_output_embeddings().weight.data_ptr()
    untied = Trainer(
        load_config(
            None,
            [
                *SMALL,
                "train.steps=1",
                "train.method=outcome_only",
                "model.tie_embeddings=false",
                "rollout.action_words=off",
            ],
        ),
        tmp_path / "b",
        quiet=True,
    )
    untied.setup()
    m = untied.policy.model
    assert untied.policy.allowed is None
    assert m.get_input_embeddings().weight.data_ptr() != m.get_output_embeddings().weight.data_ptr()


def test_several_minibatches_and_epochs_with_action_words(tmp_path):
    """The restricted head is taken afresh for every backward pass (a slice made once held a freed graph)."""
    trainer = Trainer(
        load_config(
            None, [*SMALL, "train.steps=2", "train.method=outcome_only", "optim.epochs=2", "optim.minibatches=2"]
        ),
        tmp_path / "run",
        quiet=True,
    )
    trainer.setup()
    before = [p.detach().clone() for p in trainer.policy.model.parameters()]
    trainer.train()
    assert any(not torch_equal(a, b) for a, b in zip(before, trainer.policy.model.parameters()))
    assert [r["step"] for r in metrics_rows(tmp_path / "run") if r["kind"] == "train"] == [1, 2]


def torch_equal(a, b) -> bool:
    import torch

    return bool(torch.equal(a, b.detach()))


def test_held_out_rows_carry_the_standard_error_and_per_type_success(tmp_path):
    trainer = Trainer(
        load_config(None, [*SMALL, "train.steps=0", "train.method=outcome_only", "env.options.num_eval=40"]),
        tmp_path / "run",
        quiet=True,
    )
    trainer.setup()
    row = trainer.evaluate()
    n, p = row["eval/episodes"], row["eval/success_rate"]
    assert n == 40 and abs(row["eval/success_se"] - (p * (1 - p) / n) ** 0.5) < 1e-12
    # per type: the tags of the held-out tasks; their rates weighted by the type counts give the overall rate
    counts = {}
    for task in trainer.eval_tasks:
        counts[task.tags[0]] = counts.get(task.tags[0], 0) + 1
    per_type = {k.split("/")[-1]: v for k, v in row.items() if k.startswith("eval/success/")}
    assert set(per_type) == set(counts)
    assert abs(sum(per_type[t] * counts[t] for t in counts) / n - p) < 1e-12
    assert all(abs(per_type[t] * counts[t] - round(per_type[t] * counts[t])) < 1e-9 for t in counts)
