"""rwcore.integrations.trl with the real TRL (GRPOTrainer) on the CPU: a tiny random Llama, a word-level
tokenizer and in-memory datasets, all built locally (nothing is downloaded).

Shown here: the loss our trainer hands to TRL's `Trainer` equals `filtered_dual_clip_loss` on the same
inputs (TRL's per-token log-probs, old log-probs, advantages and completion mask), recomputed
independently at every loss call; and equals TRL's own "dapo" loss (value and gradients) where the two
must coincide (on-policy, ratio 1).
"""

from __future__ import annotations

import math
import subprocess
import sys

import datasets  # noqa: F401
import pytest
import torch  # E402
import trl  # noqa: F401 - the real TRL (installed by the test extra)
from datasets import Dataset  # E402
from kernel_reference import ref_dual_clip  # E402
from trl import GRPOConfig, GRPOTrainer  # E402

from rwcore import CapabilitySampler, UniformSampler, Verdict  # E402
from rwcore.integrations import trl as rw_trl  # E402
from rwcore.integrations.trl import (  # E402
    GroupRepeatSampler,
    RubricRecorder,
    RWGRPOTrainer,
    rubric_reward_funcs,
    trajectory_from_trl,
)
from rwcore.judges import RuleJudge  # E402
from rwcore.kernels import filtered_dual_clip_loss  # E402
from rwcore.types import RubricSpec  # E402

WORDS = "refund order search bulk import yes no the a please done check".split()
SPECIAL = ["<pad>", "<unk>", "<bos>", "<end>", "<user>", "<assistant>", "<system>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} {% if m['role'] == 'assistant' %}<end> {% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<assistant> {% endif %}"
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A 1-layer random Llama and a word-level chat tokenizer, saved to disk (TRL loads the model by path)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    path = tmp_path_factory.mktemp("tiny-llama")
    vocab = {token: i for i, token in enumerate(SPECIAL + WORDS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, unk_token="<unk>", pad_token="<pad>", bos_token="<bos>", eos_token="<end>"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=128,
        bos_token_id=vocab["<bos>"],
        eos_token_id=vocab["<end>"],
        pad_token_id=vocab["<pad>"],
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def load_tokenizer(model_dir):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(model_dir)


def make_rows(n=6):
    return [
        {
            "prompt": [{"role": "user", "content": f"please {WORDS[i]} {WORDS[i + 1]}"}],
            "task_id": f"t{i}",
            "tags": ["refund" if i % 2 else "search"],
        }
        for i in range(n)
    ]


def grpo_config(tmp_path, **overrides):
    settings = dict(
        output_dir=str(tmp_path / "out"),
        max_steps=3,
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=6,
        report_to=[],
        use_cpu=True,
        bf16=False,
        logging_steps=1,
        save_strategy="no",
        learning_rate=1e-3,
        seed=0,
        loss_type="dapo",
    )
    settings.update(overrides)
    return GRPOConfig(**settings)


def generated(trajectory):
    return " ".join(turn.content for turn in trajectory.turns if turn.generated)


RUBRICS = [
    RubricSpec("short", "the reply has at most four words", capability="Efficiency"),
    RubricSpec("says-refund", "a refund task's reply mentions the refund", capability="Verification"),
]


def make_judge():
    return RuleJudge(
        {
            "short": lambda t: len(generated(t).split()) <= 4,
            # NA on tasks that are not about refunds
            "says-refund": lambda t: ("refund" in generated(t)) if "refund" in t.tags else None,
        }
    )


def completion_logps(model, inputs):
    """Per-token log-probs of the completion tokens from a plain forward pass and log_softmax (not TRL's code)."""
    prompt_ids, completion_ids = inputs["prompt_ids"], inputs["completion_ids"]
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    length = completion_ids.size(1)
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits  # temperature is 1.0
    logits = logits[:, -length - 1 : -1].double()
    return torch.log_softmax(logits, dim=-1).gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)


class LossProbe(RWGRPOTrainer):
    """Records, at every loss call TRL's Trainer makes, the loss our trainer returned and independent
    recomputations of it from the same inputs."""

    compare_gradients_once = True

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if not hasattr(self, "probe"):
            self.probe = []
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        record = {"loss": loss.detach().clone(), "on_policy": "old_per_token_logps" not in inputs}
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        mask = inputs["completion_mask"]
        with torch.no_grad():
            length = inputs["completion_ids"].size(1)
            logps = self._get_per_token_logps_and_entropies(model, ids, attention, length)[
                0
            ]  # 2 or 3 values by release
        old = inputs.get("old_per_token_logps")
        behavior = logps if old is None else old
        # The denominator D: model tokens of the whole generation batch (one process here), which TRL
        # counts in num_items_in_batch; spread over the micro-batches of an accumulation window it is
        # TRL's "dapo" normalizer num_items * gradient_accumulation_steps / steps_per_generation.
        accumulation, per_generation = self.current_gradient_accumulation_steps, self.args.steps_per_generation
        denominator = int(inputs["num_items_in_batch"]) * accumulation // per_generation
        if accumulation == per_generation == 1:
            assert denominator == int(mask.sum())  # one micro-batch: D is this batch's model tokens
        expected, stats = filtered_dual_clip_loss(
            logps,
            behavior,
            inputs["advantages"],
            mask,
            ratio_low=self.rw_loss_settings.ratio_low,
            ratio_high=self.rw_loss_settings.ratio_high,
            clip_c=self.rw_loss_settings.clip_c,
            num_model_tokens=denominator,
        )
        if self.beta != 0.0:  # TRL's k3 KL to the reference model, same denominator
            ref = inputs["ref_per_token_logps"]
            kl = torch.exp(ref - logps) - (ref - logps) - 1
            expected = expected + self.beta * (kl * mask).sum() / denominator
        record["expected"] = expected
        record["stats"] = {k: float(v) for k, v in stats.items()}
        # Fully independent: float64 log_softmax log-probs and the float64 reference formula.
        plain = completion_logps(model, inputs)
        record["logp_gap"] = float(((plain - logps.double()).abs() * mask).max())
        record["reference"] = ref_dual_clip(
            plain,
            plain if old is None else old.double(),
            inputs["advantages"].double(),
            mask,
            ratio_low=self.rw_loss_settings.ratio_low,
            ratio_high=self.rw_loss_settings.ratio_high,
            clip_c=self.rw_loss_settings.clip_c,
            num_model_tokens=denominator,
        )["loss"]
        if self.beta != 0.0:
            ref = inputs["ref_per_token_logps"].double()
            kl = torch.exp(ref - plain) - (ref - plain) - 1
            record["reference"] += self.beta * float((kl * mask).sum()) / denominator
        record["max_log_ratio"] = float(((logps - behavior).abs() * mask).max())
        if record["max_log_ratio"] < 1e-6:
            # TRL's own loss on the same inputs. With loss_type="dapo" and ratio 1, TRL's per-token loss
            # -min(r A, clip(r, 1-eps, 1+eps) A) is -A (r = 1 is inside the clip range), summed over the
            # completion mask and divided by the same normalizer (num_items_in_batch, rescaled to the
            # accumulation window); ours keeps every token (ratio_low < 1 < ratio_high) and never
            # dual-clips (the cap c|A| > |A| since c > 1), giving the same sum(-A)/D, and the same gradient
            # -A * d logp / D. ("bnpo" coincides too here, where one micro-batch is the whole generation
            # batch on one process; "grpo" and "dr_grpo" normalize differently.)
            with torch.no_grad():
                record["trl_loss"] = GRPOTrainer._compute_loss(self, model, inputs).detach().clone()
            if self.compare_gradients_once:
                self.compare_gradients_once = False
                params = [p for p in model.parameters() if p.requires_grad]
                ours = RWGRPOTrainer._compute_loss(self, model, inputs)
                ours_grads = torch.autograd.grad(ours, params, allow_unused=True)
                theirs = GRPOTrainer._compute_loss(self, model, inputs)
                theirs_grads = torch.autograd.grad(theirs, params, allow_unused=True)
                record["grad_pairs"] = [
                    (a, b) for a, b in zip(ours_grads, theirs_grads) if a is not None or b is not None
                ]
        self.probe.append(record)
        return loss


def assert_loss_matches(probe):
    assert probe, "the loss was never computed"
    for record in probe:
        loss = float(record["loss"])
        assert math.isfinite(loss)
        # The loss TRL got is filtered_dual_clip_loss of TRL's inputs: same floats, same result.
        assert loss == pytest.approx(float(record["expected"]), abs=1e-7)
        # ... and the float64 reference from independently computed log-probs.
        assert record["logp_gap"] < 1e-4
        assert loss == pytest.approx(record["reference"], abs=1e-4)
        if "trl_loss" in record:
            assert loss == pytest.approx(float(record["trl_loss"]), abs=1e-6)


# --------------------------------------------------------------------------- end to end


def test_grpo_steps_with_rw_loss_capability_sampler_and_rubric_feedback(model_dir, tmp_path):
    rows = make_rows(6)
    sampler = CapabilitySampler({row["task_id"]: row["tags"] for row in rows}, batch_size=2, group_size=2, seed=0)
    drawn = []
    original_sample = sampler.sample

    def sample(policy_version):
        batch = original_sample(policy_version)
        drawn.append((policy_version, list(batch)))
        return batch

    sampler.sample = sample
    funcs = rubric_reward_funcs(make_judge(), RUBRICS, tags_column="tags")
    recorded = []
    original_record = funcs.recorder.record

    def record(task_ids, verdicts, outcomes=None, policy_version=None):
        recorded.append((policy_version, list(task_ids), verdicts))
        original_record(task_ids, verdicts, outcomes, policy_version)

    funcs.recorder.record = record

    trainer = LossProbe(
        model=model_dir,
        reward_funcs=funcs,
        args=grpo_config(tmp_path),
        train_dataset=Dataset.from_list(rows),
        processing_class=load_tokenizer(model_dir),
        task_sampler=sampler,
    )
    output = trainer.train()

    assert trainer.state.global_step == 3
    assert math.isfinite(output.training_loss)
    assert_loss_matches(trainer.probe)
    assert len(trainer.probe) == 3 and all(r["on_policy"] and "trl_loss" in r for r in trainer.probe)
    pairs = next(r["grad_pairs"] for r in trainer.probe if "grad_pairs" in r)
    assert pairs and any(float(a.abs().max()) > 0 for a, _ in pairs)
    for ours, theirs in pairs:
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-7)

    # TRL trained on the sampler's batches, each task repeated num_generations times in a row.
    assert len(recorded) == 3
    for (_, task_ids, _), (_, batch) in zip(recorded, drawn):
        assert task_ids == [task for task in batch for _ in range(2)]
    assert [version for version, _, _ in recorded] == [0, 1, 2]
    # The sampler got every group's verdicts (record_group), and its policy version followed the steps.
    assert trainer.rw_feedback_callback.groups_recorded == 6
    states = {task: sampler.task_state(task) for task in sampler.task_ids}
    assert sum(state["attempts"] for state in states.values()) == 6
    for task in {t for _, batch in drawn[:3] for t in batch}:
        assert states[task]["attempts"] >= 1 and states[task]["evaluated"] == {"short", "says-refund"}
    assert sampler.rubrics == {"short": "Efficiency", "says-refund": "Verification"}
    assert trainer.rw_batch_sampler.policy_version == 3
    # Batches are drawn for the policy version current when the loader reaches them (accelerate
    # prefetches one batch, so the first two are drawn at version 0).
    versions = [v for v, _ in drawn]
    assert versions[0] == 0 and versions == sorted(versions) and versions[-1] >= 1

    logged = {key for entry in trainer.state.log_history for key in entry}
    assert {
        "rw/kept_fraction",
        "rw/dual_clipped_fraction",
        "rw/mean_ratio",
        "rw/sampler_coverage",
        "rewards/rubric/short/mean",
        "rewards/rubric/says-refund/mean",
    } <= logged
    first = trainer.state.log_history[0]
    assert first["rw/kept_fraction"] == 1.0 and first["rw/mean_ratio"] == pytest.approx(1.0)


def test_gradient_accumulation_keeps_group_structure_and_normalization(model_dir, tmp_path):
    """gradient_accumulation_steps=2 (so steps_per_generation=2): each generation batch is two micro-batches,
    the sampler's round is repeated twice as TRL's RepeatSampler does, and the loss still equals both
    filtered_dual_clip_loss with TRL's dapo denominator and TRL's own dapo loss at ratio 1. beta > 0 adds
    TRL's KL term to the reference model (same normalizer) in both."""
    rows = make_rows(6)
    sampler = CapabilitySampler({row["task_id"]: row["tags"] for row in rows}, batch_size=2, group_size=2, seed=3)
    funcs = rubric_reward_funcs(make_judge(), RUBRICS, tags_column="tags")
    seen = []
    original_record = funcs.recorder.record
    funcs.recorder.record = lambda task_ids, *rest: (seen.append(list(task_ids)), original_record(task_ids, *rest))
    trainer = LossProbe(
        model=model_dir,
        reward_funcs=funcs,
        args=grpo_config(
            tmp_path,
            max_steps=2,
            per_device_train_batch_size=2,
            gradient_accumulation_steps=2,
            beta=0.1,
            learning_rate=0.05,
        ),
        train_dataset=Dataset.from_list(rows),
        processing_class=load_tokenizer(model_dir),
        task_sampler=sampler,
    )
    assert trainer.args.steps_per_generation == 2 and trainer.args.generation_batch_size == 4
    trainer.train()
    assert len(trainer.probe) == 4  # 2 optimizer steps x 2 micro-batches
    assert trainer.ref_model is not None
    assert any("kl" in entry and entry["kl"] > 0 for entry in trainer.state.log_history)
    assert_loss_matches(trainer.probe)
    assert all("trl_loss" in r for r in trainer.probe)
    assert len(seen) == 2 and all(ids[0] == ids[1] and ids[2] == ids[3] and ids[0] != ids[2] for ids in seen)
    assert trainer.rw_feedback_callback.groups_recorded == 4
    assert sum(sampler.task_state(t)["attempts"] for t in sampler.task_ids) == 4


def test_feedback_callback_groups_completions_and_refuses_broken_groups():
    from types import SimpleNamespace

    from rwcore.integrations.trl import RubricFeedbackCallback

    sampler = CapabilitySampler({"a": ["x"], "b": ["y"]}, batch_size=1, group_size=2)
    recorder = RubricRecorder()
    recorder.rubric_capabilities.update({"short": "Efficiency"})
    callback = RubricFeedbackCallback(sampler, recorder)
    args = SimpleNamespace(num_generations=2, world_size=1)
    callback.on_train_begin(args, SimpleNamespace(global_step=0), None)
    assert sampler.rubrics == {"short": "Efficiency"}
    recorder.record(
        ["a", "a", "b", "b"],
        [{"short": Verdict.PASS}, {"short": Verdict.FAIL}, {"short": Verdict.NA}, {"short": Verdict.INVALID}],
        policy_version=0,
    )
    callback.on_step_end(args, SimpleNamespace(global_step=1), None)
    assert callback.groups_recorded == 2 and callback.policy_version == 1 and len(recorder) == 0
    assert sampler.task_state("a") == {"attempts": 1, "evaluated": {"short"}, "applicable": {"short"}}
    assert sampler.task_state("b")["attempts"] == 1 and sampler.task_state("b")["applicable"] == set()
    recorder.record(["a", "b"], [{"short": Verdict.PASS}] * 2, policy_version=1)
    with pytest.raises(ValueError, match="different tasks"):
        callback.on_step_end(args, SimpleNamespace(global_step=2), None)
    recorder.record(["a", "a"], [{"short": Verdict.PASS}] * 2)
    callback.on_evaluate(args, SimpleNamespace(global_step=2), None)  # evaluation completions are dropped
    assert len(recorder) == 0
    with pytest.raises(ValueError, match="num_generations"):
        callback.on_train_begin(SimpleNamespace(num_generations=4), SimpleNamespace(global_step=0), None)


def test_off_policy_loss_filters_and_clips_and_still_matches(model_dir, tmp_path):
    """num_iterations=2 makes TRL compute old_per_token_logps and reuse each generation batch after an
    update, so ratios leave 1; tight bounds make the filter and the dual clip act. TRL's own sampler."""
    rows = make_rows(6)

    def length_reward(prompts, completions, **kwargs):
        return [float(len(c[0]["content"].split())) for c in completions]

    trainer = LossProbe(
        model=model_dir,
        reward_funcs=length_reward,
        args=grpo_config(tmp_path, max_steps=6, num_iterations=2, learning_rate=0.1, seed=0),
        train_dataset=Dataset.from_list(rows),
        processing_class=load_tokenizer(model_dir),
        ratio_low=0.8,
        ratio_high=2.0,
        clip_c=1.05,
    )
    trainer.train()
    probe = trainer.probe
    assert len(probe) == 6 and not any(r["on_policy"] for r in probe)
    assert_loss_matches(probe)
    # The first pass over each generation batch is at ratio 1 (TRL's loss agrees there, checked above);
    # the second is off-policy after one large update, and both the ratio filter and the dual clip acted
    # (deterministic on the CPU for this seed; the stats are in the message if a version change moves them).
    assert all(r["max_log_ratio"] < 1e-6 and "trl_loss" in r for r in probe[0::2])
    assert all(r["max_log_ratio"] > 1e-3 for r in probe[1::2])
    stats = [r["stats"] for r in probe]
    assert any(s["kept_fraction"] < 1.0 for s in stats), stats
    assert any(s["dual_clipped_fraction"] > 0.0 for s in stats), stats
    logged = {key for entry in trainer.state.log_history for key in entry}
    assert "rw/filtered_high_fraction" in logged and "rw/sampler_coverage" not in logged


# --------------------------------------------------------------------------- reward functions


def test_rubric_reward_funcs_signature_values_and_single_judge_call():
    calls = []

    class CountingJudge(RuleJudge):
        def evaluate(self, trajectories, rubrics):
            calls.append(len(trajectories))
            return super().evaluate(trajectories, rubrics)

    def flaky(t):
        if "boom" in generated(t):
            raise RuntimeError("judge down")
        return 0.75

    judge = CountingJudge(
        {
            "short": lambda t: len(generated(t).split()) <= 2,
            "says-refund": lambda t: ("refund" in generated(t)) if "refund" in t.tags else None,
            "graded": flaky,
        }
    )
    rubrics = RUBRICS + [RubricSpec("graded", "graded", capability="Execution", scored=True)]
    recorder = RubricRecorder()
    funcs = rubric_reward_funcs(judge, rubrics, tags_column="tags", recorder=recorder, invalid_value=-1.0)
    assert [f.__name__ for f in funcs] == ["rubric/short", "rubric/says-refund", "rubric/graded"]
    assert funcs.recorder is recorder and all(f.rw_recorder is recorder for f in funcs)

    prompts = [[{"role": "user", "content": "please refund"}]] * 2 + ["search the order"] * 2
    completions = [
        [{"role": "assistant", "content": "refund done"}],
        [{"role": "assistant", "content": "no boom"}],
        "the order is done",
        "yes",
    ]
    kwargs = dict(
        completion_ids=[[1]] * 4,
        task_id=["t1", "t1", "t0", "t0"],
        tags=[["refund"], ["refund"], ["search"], ["search"]],
        answer=["a", "a", "b", "b"],
        trainer_state=type("State", (), {"global_step": 7})(),
        log_extra=None,
        log_metric=None,
    )
    results = [f(prompts=prompts, completions=completions, **kwargs) for f in funcs]
    assert calls == [4]  # one judge call for the batch, shared by the three functions
    assert results[0] == [1.0, 1.0, 0.0, 1.0]
    assert results[1] == [1.0, 0.0, None, None]  # NA -> None (TRL: not applicable)
    assert results[2] == [0.75, -1.0, 0.75, 0.75]  # INVALID -> invalid_value; scored rubric -> its score
    (entry,) = recorder.drain()
    assert entry["task_ids"] == ["t1", "t1", "t0", "t0"] and entry["policy_version"] == 7
    assert entry["verdicts"][1] == {"short": Verdict.PASS, "says-refund": Verdict.FAIL, "graded": Verdict.INVALID}
    assert entry["verdicts"][2]["says-refund"] == Verdict.NA

    # A new batch (new list objects) is judged again; calling the same function again is a new batch too.
    funcs[0](prompts=list(prompts), completions=list(completions), **kwargs)
    assert calls == [4, 4]
    with pytest.raises(ValueError, match="task_id"):
        funcs[0](prompts=prompts, completions=completions)


def test_trajectory_from_trl_marks_generated_turns():
    trajectory = trajectory_from_trl(
        [{"role": "developer", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        [
            {"role": "assistant", "content": "calling"},
            {"role": "tool", "content": "42"},
            {"role": "assistant", "content": "it is 42"},
        ],
        task_id=3,
        tags=["math"],
    )
    assert [(t.role, t.generated) for t in trajectory.turns] == [
        ("system", False),
        ("user", False),
        ("assistant", True),
        ("tool", False),
        ("assistant", True),
    ]
    assert trajectory.turns[1].content == "hi" and trajectory.task_id == "3" and trajectory.tags == ("math",)
    plain = trajectory_from_trl("q?", "a.", "t")
    assert [(t.role, t.content, t.generated) for t in plain.turns] == [("user", "q?", False), ("assistant", "a.", True)]


# --------------------------------------------------------------------------- sampler structure and checks


def test_group_repeat_sampler_keeps_trl_repeat_structure():
    from rwcore import AdaptiveBatchSampler

    tasks = {f"t{i}": ["x"] for i in range(5)}
    sampler = UniformSampler(tasks, batch_size=2, group_size=3, seed=1)
    dataset_ids = ["t4", "t3", "t2", "t1", "t0", "extra"]  # row i holds task dataset_ids[i]
    batches = AdaptiveBatchSampler(sampler, dataset_ids, num_batches=2)
    reference = [
        b
        for b in AdaptiveBatchSampler(
            UniformSampler(tasks, batch_size=2, group_size=3, seed=1), dataset_ids, num_batches=2
        )
    ]
    repeat = GroupRepeatSampler(batches, mini_repeat_count=3, repeat_count=2)
    indices = list(repeat)
    assert len(indices) == len(repeat) == 2 * 2 * 3 * 2
    expected = []
    for batch in reference:
        expected += [i for i in batch for _ in range(3)] * 2
    assert indices == expected
    assert all(len(set(batch)) == 2 for batch in reference)


def test_trainer_refuses_mismatched_sampler_and_unsupported_features(model_dir, tmp_path):
    rows = make_rows(6)
    dataset = Dataset.from_list(rows)
    tokenizer = load_tokenizer(model_dir)
    tasks = {row["task_id"]: row["tags"] for row in rows}
    funcs = rubric_reward_funcs(make_judge(), RUBRICS)
    with pytest.raises(ValueError, match="batch_size"):
        RWGRPOTrainer(
            model=model_dir,
            reward_funcs=funcs,
            args=grpo_config(tmp_path),
            train_dataset=dataset,
            processing_class=tokenizer,
            task_sampler=CapabilitySampler(tasks, batch_size=3, group_size=2),
        )
    with pytest.raises(ValueError, match="group_size"):
        RWGRPOTrainer(
            model=model_dir,
            reward_funcs=funcs,
            args=grpo_config(tmp_path),
            train_dataset=dataset,
            processing_class=tokenizer,
            task_sampler=CapabilitySampler(tasks, batch_size=2, group_size=4),
        )
    with pytest.raises(ValueError, match="task_id_column"):
        RWGRPOTrainer(
            model=model_dir,
            reward_funcs=funcs,
            args=grpo_config(tmp_path),
            train_dataset=dataset,
            processing_class=tokenizer,
            task_sampler=CapabilitySampler(tasks, batch_size=2, group_size=2),
            task_id_column="id",
        )
    with pytest.raises(ValueError, match="top_entropy_quantile"):
        RWGRPOTrainer(
            model=model_dir,
            reward_funcs=funcs,
            args=grpo_config(tmp_path, top_entropy_quantile=0.5),
            train_dataset=dataset,
            processing_class=tokenizer,
        )
    with pytest.raises(ValueError, match="clip_c"):
        RWGRPOTrainer(
            model=model_dir,
            reward_funcs=funcs,
            args=grpo_config(tmp_path),
            train_dataset=dataset,
            processing_class=tokenizer,
            clip_c=1.0,
        )
    # an adaptive sampler that would never get feedback is refused at start, naming what to pass
    plain_reward = [lambda prompts, completions, **kwargs: [0.0] * len(completions)]
    with pytest.raises(ValueError, match="rubric_reward_funcs"):
        RWGRPOTrainer(
            model=model_dir,
            reward_funcs=plain_reward,
            args=grpo_config(tmp_path),
            train_dataset=dataset,
            processing_class=tokenizer,
            task_sampler=CapabilitySampler(tasks, batch_size=2, group_size=2),
        )
    uniform = RWGRPOTrainer(
        model=model_dir,
        reward_funcs=plain_reward,
        args=grpo_config(tmp_path),
        train_dataset=dataset,
        processing_class=tokenizer,
        task_sampler=UniformSampler(tasks, batch_size=2, group_size=2),
    )
    assert uniform.rw_batch_sampler is not None and uniform.rw_feedback_callback is None  # needs none
    # rw_loss=False keeps TRL's loss (and its loss-type settings)
    kept = RWGRPOTrainer(
        model=model_dir,
        reward_funcs=funcs,
        args=grpo_config(tmp_path, top_entropy_quantile=0.5),
        train_dataset=dataset,
        processing_class=tokenizer,
        rw_loss=False,
    )
    assert kept.rw_batch_sampler is None and kept.rw_recorder is funcs.recorder


def test_trl_is_imported_lazily_and_missing_trl_says_pip_install(monkeypatch):
    code = (
        "import sys, rwcore.integrations.trl as m; "
        "assert 'trl' not in sys.modules, 'imported trl'; m.rubric_reward_funcs; m.RubricRecorder(); "
        "sys.modules['trl'] = None\n"
        "try:\n    m.RWGRPOTrainer\nexcept ImportError as e:\n    assert 'pip install trl' in str(e), e\n"
        "else:\n    raise SystemExit('no ImportError')"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    monkeypatch.setitem(sys.modules, "trl", None)
    with pytest.raises(ImportError, match="pip install trl"):
        rw_trl._require_trl()
