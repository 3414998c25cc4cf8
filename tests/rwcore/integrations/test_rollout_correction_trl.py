"""TRL's vLLM importance sampling with rwcore (TRL 1.16, the real GRPOTrainer, on the CPU; nothing downloaded).

(a) `correction_from_trl_args(args)` + `rollout_correction.correction_weights` give the `importance_sampling_ratio`
    TRL's own `GRPOTrainer._generate_and_score_completions` computes, for its four modes.
(b) `AdaptiveGRPOTrainer`'s loss with TRL's ratio in the inputs is `filtered_dual_clip_loss(...,
    rollout_is_weights=ratio)`, differs from the loss without the ratio, and equals TRL's own loss (ratio
    included) where the two must coincide (policy ratio 1).

How TRL's real code is driven without vLLM: TRL computes the ratio only when `self.use_vllm` and
`vllm_importance_sampling_correction` are set; the completions and their sampling log-probs come from a
`rollout_func` -- TRL's (experimental) public hook for a custom generation backend, which returns
`prompt_ids`, `completion_ids`, `logprobs` (and optionally `env_mask`, TRL's tool mask) exactly as vLLM's
path would. The trainers are built with `use_vllm=False` (no vLLM engine), then `use_vllm` is set to True
on the instance and the weight sync TRL does before a `rollout_func` call is a no-op stub. Everything else
-- padding, the NaN handling of missing log-probs, the old (proximal) log-probs, the ratio, the masks, the
loss -- is TRL's code. The sampling log-probs are the model's own log-probs of the chosen tokens minus a
known offset, so the log ratio old - sampling spans the clip bounds on both sides; one token's log-prob is
None (vLLM's NaN), one completion is a lone EOS (a length-1 sequence), and env_mask marks a tool token.
"""

from __future__ import annotations

import importlib.util
import math
import os
import random
from types import SimpleNamespace

import pytest
import torch
from _util import ROOT
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from rwcore.integrations.trl import AdaptiveGRPOTrainer
from rwcore.integrations.trl.trainer import correction_from_trl_args
from rwcore.kernels import RolloutCorrection, filtered_dual_clip_loss
from rwcore.kernels.rollout_correction import correction_weights

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func's "experimental" warning

EXAMPLE = ROOT / "examples" / "trl_adaptive_method.py"
_spec = importlib.util.spec_from_file_location("trl_adaptive_method_for_correction", EXAMPLE)
example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(example)

# (mode, clip_min, clip_max): TRL's four modes, with both bounds, TRL's defaults (clip_min None, clip_max 3)
# and an open upper bound.
MODES = [
    ("token_truncate", 0.5, 2.0),
    ("token_truncate", None, 3.0),
    ("token_mask", 0.5, 2.0),
    ("token_mask", 0.6, None),
    ("sequence_truncate", 0.25, 3.0),
    ("sequence_truncate", None, 3.0),
    ("sequence_mask", 0.25, 3.0),
    ("sequence_mask", None, 3.0),
]
MODE_IDS = [f"{m}-{lo}-{hi}" for m, lo, hi in MODES]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return example.make_tiny_model(str(tmp_path_factory.mktemp("tiny-llama-correction")))


class Rollout:
    """A `rollout_func(prompts, trainer)` standing in for vLLM: random completions, the policy's own
    log-probs of them minus a known offset as the "sampling" log-probs (offset = log pi_old - log pi_vLLM)."""

    def __init__(self, seed=0, spread=1.5):
        self.rng = random.Random(seed)
        self.spread = spread
        self.calls = 0

    def __call__(self, prompts, trainer):
        tokenizer = trainer.processing_class
        words = [tokenizer.convert_tokens_to_ids(w) for w in example.WORDS]
        eos = tokenizer.eos_token_id
        prompt_ids, completion_ids, logprobs, env_mask = [], [], [], []
        for i, prompt in enumerate(prompts):
            text = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            if i % 4 == 1:  # a lone EOS: a length-1 sequence (its outcome differs from its group mate's)
                completion = [eos]
            else:
                completion = [self.rng.choice(words) for _ in range(self.rng.randint(2, 5))]
                completion += [eos] if self.rng.random() < 0.5 else []
            true = self._logps(trainer.model, ids, completion)
            sampled = [lp - self.rng.uniform(-self.spread, self.spread) for lp in true]
            if self.calls == 0 and i == 0:
                sampled[1] = None  # vLLM could not score this token (NaN): TRL gives it ratio 1
            tool = [1] * len(completion)
            if len(completion) >= 4:
                tool[2] = 0  # a tool-output token: no loss, not in the sequence's ratio
            prompt_ids.append(ids)
            completion_ids.append(completion)
            logprobs.append(sampled)
            env_mask.append(tool)
        self.calls += 1
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": logprobs, "env_mask": env_mask}

    @staticmethod
    @torch.no_grad()
    def _logps(model, prompt_ids, completion_ids):
        ids = torch.tensor([prompt_ids + completion_ids], device=model.device)
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float()
        return torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt_ids) :, None]).squeeze(-1).tolist()


def as_vllm(trainer):
    """TRL computes the importance ratio under `use_vllm`; the rollout_func replaces the engine (module doc)."""
    trainer.use_vllm = True
    trainer.vllm_generation = SimpleNamespace(sync_weights=lambda: None)
    trainer._last_loaded_step = -1
    return trainer


def trl_args(tmp_path, mode, clip_min, clip_max, **overrides):
    settings = dict(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=6,
        report_to=[],
        use_cpu=True,
        bf16=False,
        save_strategy="no",
        seed=0,
        loss_type="dapo",
        vllm_importance_sampling_correction=True,
        vllm_importance_sampling_mode=mode,
        vllm_importance_sampling_clip_min=clip_min,
        vllm_importance_sampling_clip_max=clip_max,
    )
    settings.update(overrides)
    return GRPOConfig(**settings)


def rwcore_ratio(correction, old, sampling, mask):
    """rwcore's weights from TRL's old / sampling log-probs: NaN sampling log-probs replaced by the old ones."""
    behavior = torch.where(torch.isnan(sampling), old, sampling)
    B, T = old.shape
    seq = torch.arange(B).repeat_interleave(T)
    weights, _ = correction_weights((old - behavior).float().reshape(-1), mask.bool().reshape(-1), correction, seq, B)
    return weights.reshape(B, T)


# --------------------------------------------------------------------------- (a) the weights


@pytest.mark.parametrize("mode, clip_min, clip_max", MODES, ids=MODE_IDS)
def test_weights_equal_trls_importance_sampling_ratio(model_dir, tmp_path, mode, clip_min, clip_max):
    rows = example.make_rows()
    args = trl_args(tmp_path, mode, clip_min, clip_max)
    trainer = GRPOTrainer(
        model=model_dir,
        reward_funcs=lambda prompts, completions, **kw: [float(len(str(c))) for c in completions],
        args=args,
        train_dataset=Dataset.from_list(rows),
        rollout_func=Rollout(seed=MODES.index((mode, clip_min, clip_max))),
    )
    as_vllm(trainer)
    batch = [dict(row) for row in rows for _ in range(2)]  # 6 prompts x 2 generations
    out = trainer._generate_and_score_completions(batch)  # TRL's real code path
    ratio = out["importance_sampling_ratio"]
    old, sampling = out["old_per_token_logps"], out["sampling_per_token_logps"]
    mask = out["completion_mask"] * out["tool_mask"]
    assert ratio.shape == (old.shape if mode.startswith("token") else (old.shape[0], 1))
    assert torch.isnan(sampling).sum() == 1 and (mask.sum(-1) == 1).any() and (out["tool_mask"] == 0).any()

    correction = correction_from_trl_args(args)
    assert isinstance(correction, RolloutCorrection) and not correction.bypass
    ours = rwcore_ratio(correction, old, sampling, mask)
    theirs = ratio.expand(old.shape)
    model = mask.bool()
    torch.testing.assert_close(ours[model], theirs[model], rtol=1e-6, atol=0)

    # the bounds acted: the raw ratio leaves them on both sides where a bound is set
    lr = (old - torch.where(torch.isnan(sampling), old, sampling)) * mask
    raw = torch.exp(lr.sum(-1, keepdim=True) if mode.startswith("sequence") else lr).expand(old.shape)[model]
    if clip_max is not None:
        assert (raw > clip_max).any()
    if clip_min is not None:
        assert (raw < clip_min).any()
    assert ((raw > (clip_min or 0)) & (raw < (clip_max or math.inf))).any()


def test_correction_from_trl_args_settings():
    off = SimpleNamespace(vllm_importance_sampling_correction=False, vllm_importance_sampling_mode="token_mask")
    assert correction_from_trl_args(off) is None
    settings = dict(
        vllm_importance_sampling_correction=True,
        vllm_importance_sampling_mode="sequence_truncate",
        vllm_importance_sampling_clip_min=0.0,  # never acts on a ratio > 0: dropped
        vllm_importance_sampling_clip_max=3.0,
    )
    assert correction_from_trl_args(settings) == RolloutCorrection("sequence", "truncate", 3.0, None)
    default = correction_from_trl_args(GRPOConfig(output_dir="unused", report_to=[], use_cpu=True))
    assert default == RolloutCorrection("sequence", "mask", 3.0, None)  # TRL's defaults: sequence_mask, C_max 3
    # truncation with no bound left is the raw ratio (TRL's own torch.clamp refuses two None bounds)
    unbounded = correction_from_trl_args({**settings, "vllm_importance_sampling_clip_max": None})
    assert unbounded == RolloutCorrection("sequence", "truncate", None, None)
    with pytest.raises(ValueError, match="vllm_importance_sampling_mode"):
        correction_from_trl_args({**settings, "vllm_importance_sampling_mode": "token"})
    with pytest.raises(ValueError, match="clip_max"):
        correction_from_trl_args({**settings, "vllm_importance_sampling_clip_max": 0.0})
    with pytest.raises(ValueError, match="clip_min"):
        correction_from_trl_args({**settings, "vllm_importance_sampling_clip_min": float("nan")})


# --------------------------------------------------------------------------- (b) the trainer's loss


class CorrectionProbe(AdaptiveGRPOTrainer):
    """Records, at every loss call, the loss the trainer returned, the fused loss recomputed with and without
    TRL's ratio, and TRL's own loss on the same inputs where the policy ratio is 1."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        mask = inputs["completion_mask"] * inputs["tool_mask"]
        with torch.no_grad():
            logps = self._get_per_token_logps_and_entropies(model, ids, attention, mask.size(1))[0]
        old = inputs["old_per_token_logps"]
        ratio = inputs["importance_sampling_ratio"]
        common = dict(
            ratio_low=self.rw_loss_settings.ratio_low,
            ratio_high=self.rw_loss_settings.ratio_high,
            clip_c=self.rw_loss_settings.clip_c,
            num_model_tokens=int(inputs["num_items_in_batch"]),  # one process, one micro-batch per generation
        )
        weighted, _ = filtered_dual_clip_loss(
            logps, old, inputs["advantages"], mask, rollout_is_weights=ratio.expand(logps.shape), **common
        )
        plain, _ = filtered_dual_clip_loss(logps, old, inputs["advantages"], mask, **common)
        record = dict(loss=float(loss), weighted=float(weighted), plain=float(plain), ratio=ratio.clone())
        record["sampling"], record["old"], record["mask"] = inputs["sampling_per_token_logps"], old, mask
        if float(((logps - old).abs() * mask).max()) < 1e-6:
            with torch.no_grad():  # TRL's dapo loss, its ratio included: -A * is_ratio at policy ratio 1
                record["trl"] = float(GRPOTrainer._compute_loss(self, model, inputs))
            if not self.__dict__.get("grads_compared"):  # and its gradients, once
                self.grads_compared = True
                params = [p for p in model.parameters() if p.requires_grad]
                ours = torch.autograd.grad(AdaptiveGRPOTrainer._compute_loss(self, model, inputs), params)
                theirs = torch.autograd.grad(GRPOTrainer._compute_loss(self, model, inputs), params)
                record["grad_pairs"] = list(zip(ours, theirs))
        self.__dict__.setdefault("probe", []).append(record)
        return loss


@pytest.mark.parametrize(
    "mode, clip_min, clip_max", [MODES[0], MODES[3], MODES[5], MODES[6]], ids=[MODE_IDS[i] for i in (0, 3, 5, 6)]
)
def test_adaptive_trainer_loss_uses_trls_importance_sampling_ratio(model_dir, tmp_path, mode, clip_min, clip_max):
    rows = example.make_rows()
    trainer = CorrectionProbe(
        model_dir,
        method=example.make_method(rows),
        judge=example.make_judge(),
        outcome_fn=example.outcome,
        args=example.grpo_args(
            str(tmp_path),
            2,
            loss_type="dapo",
            vllm_importance_sampling_mode=mode,
            vllm_importance_sampling_clip_min=clip_min,
            vllm_importance_sampling_clip_max=clip_max,
        ),
        train_dataset=Dataset.from_list(rows),
        rollout_func=Rollout(seed=7),
    )
    as_vllm(trainer)
    trainer.train()
    probe = trainer.probe
    assert len(probe) == 2
    for record in probe:
        assert math.isfinite(record["loss"])
        assert record["loss"] == pytest.approx(record["weighted"], rel=1e-6, abs=1e-7)
        assert abs(record["weighted"] - record["plain"]) > 1e-3  # the ratio is really used
        assert record["loss"] == pytest.approx(record["trl"], rel=1e-5, abs=1e-7)  # TRL's own loss agrees
        # the ratio TRL handed the loss is the one correction_from_trl_args gives
        ours = rwcore_ratio(correction_from_trl_args(trainer.args), record["old"], record["sampling"], record["mask"])
        model = record["mask"].bool()
        torch.testing.assert_close(ours[model], record["ratio"].expand(ours.shape)[model], rtol=1e-6, atol=0)
    pairs = probe[0]["grad_pairs"]
    assert any(float(a.abs().max()) > 0 for a, _ in pairs)
    for ours, theirs in pairs:
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-8)
    # old (proximal) and sampling (behaviour) log-probs are both there: the mismatch metrics are logged
    logged = [entry for entry in trainer.state.log_history if "rw/rollout_corr/kl" in entry]
    assert len(logged) == 2
    first = probe[0]
    behavior = torch.where(torch.isnan(first["sampling"]), first["old"], first["sampling"])
    expected_kl = float(((behavior - first["old"]) * first["mask"]).sum() / first["mask"].sum())
    assert logged[0]["rw/rollout_corr/kl"] == pytest.approx(expected_kl, rel=1e-5, abs=1e-7)
    assert {"rw/rollout_corr/k3_kl", "rw/rollout_corr/ratio_max", "sampling/importance_sampling_ratio/mean"} <= set(
        logged[0]
    )


def test_no_mismatch_metrics_without_behaviour_log_probs(model_dir, tmp_path):
    """Without vLLM (use_vllm False: no importance ratio, and on-policy steps carry no old log-probs) the loss
    is the plain fused loss and no rw/rollout_corr/* metric is logged."""
    rows = example.make_rows()
    trainer = AdaptiveGRPOTrainer(
        model_dir,
        method=example.make_method(rows),
        judge=example.make_judge(),
        args=example.grpo_args(str(tmp_path), 1),
        train_dataset=Dataset.from_list(rows),
        rollout_func=Rollout(seed=3),
    )
    trainer.train()
    logged = {key for entry in trainer.state.log_history for key in entry}
    assert "rw/kept_fraction" in logged and not any(key.startswith("rw/rollout_corr/") for key in logged)
