"""The rows of a run's `metrics.jsonl`: every key a row can hold, declared once, the rows built from those
declarations, and the metrics glossary (docs/metrics.md) generated from them.

A row is a JSON object: `step` (optimizer steps completed), `kind`, then the keys of its kind in the order
declared here (rwcore.trainer.metric_schema: `Metric`, `Group`, `RowKind`). Keys the trainer computes carry the
function that computes them from the row's record (`TrainStep`, `Evaluation`). Keys other parts compute (the
method, the loss kernel, the reading probe, the LLM clients' usage) are declared in a `Group`, which inserts
them where the row holds them, in the order their producer gives.

`metrics_markdown()` renders the declarations as docs/metrics.md's glossary (tests/docs checks the page
against it); `declared(kind, key)` finds a key's declaration (tests/trainer check that runs write only
declared keys).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from rwcore.rewardweaver.judgments import within_group_variation
from rwcore.trainer.exploration import group_figures
from rwcore.trainer.metric_schema import KIND, STEP, Group, Metric, RowKind, build, declare, find, flat, glossary

# ------------------------------------------------------------------ what the LLM roles cost (LLMUsage)

_LLM = "the role is an LLM (judge: judge.kind=openai; reflector: the method's reflection model)"
_PRICED = f"{_LLM}, and judge.price_in or judge.price_out is set"
LLM_USAGE = Group(
    declare(
        (
            "<role>/requests",
            "count",
            "HTTP requests the role (`judge`, `reflector`) sent since the previous row, retries included, summed "
            "over the processes: the rows partition the run's requests (the first row also holds library "
            "admission and the first diagnosis).",
            _LLM,
        ),
        ("<role>/prompt_tokens", "tokens", "Prompt tokens of its successful answers (the server's `usage`).", _LLM),
        ("<role>/completion_tokens", "tokens", "Completion tokens of its successful answers.", _LLM),
        ("<role>/cache_hits", "count", "Judgments (or diagnostics) served from the cache instead of a request.", _LLM),
        ("<role>/retries", "count", "Attempts made after a failed one.", _LLM),
        ("<role>/rate_limited", "count", "Attempts the server answered with 429.", _LLM),
        ("<role>/failed", "count", "Requests that failed for good, after their retries.", _LLM),
        ("<role>/seconds", "seconds", "Summed wall time of its attempts.", _LLM),
        ("<role>/cost", "money", "Prompt tokens at judge.price_in plus completion tokens at judge.price_out.", _PRICED),
        ("<role>/cost_total", "money", "What the role has cost since the run began.", _PRICED),
    ),
    lambda record: record.usage,
)


def usage_metrics(figures: Mapping[str, Mapping[str, float]]) -> dict:
    """`LLMUsage.since_last_row`'s figures (role -> name -> value) as the row's `<role>/<name>` keys."""
    return {f"{role}/{name}": value for role, named in figures.items() for name, value in named.items()}


# ------------------------------------------------------------------ train rows


@dataclass(frozen=True)
class TrainStep:
    """What one training step measured: its row's inputs (trajectories: every process's, in group order)."""

    step: int  # optimizer steps completed, this one's included
    index: int  # the step's 0-based index
    trajectories: Sequence
    scored: object  # the method's Scored for them (rwcore.method.method.Scored)
    groups: int  # task groups in the step
    versions: Sequence[int]  # the policy version that generated each group
    lr: float
    method: Mapping  # AdaptiveMethod.metrics()
    update: Mapping  # PolicyUpdate.update's figures
    step_seconds: float
    adaptive_seconds: float
    diagnosis_seconds: float
    rollout_wait_seconds: float
    judge_seconds: float
    judge_wait_seconds: float
    usage: Mapping  # usage_metrics(...)


ENV_METRIC = Metric(
    "env/<metric>",
    "the environment's",
    "An environment's own per-episode number (`Outcome.details[\"metrics\"]`, e.g. a verifiers environment's "
    "@metric and @reward values): the mean over the episodes that report a finite value.",
    "the environment reports such numbers",
)
ZERO_VARIANCE, ALL_FAILED = declare(
    (
        "groups/zero_variance",
        "fraction",
        "Share of the step's task groups whose outcomes are all equal: they give outcome-only GRPO no gradient.",
    ),
    ("groups/all_failed", "fraction", "Share of the step's task groups without a success."),
)


PROCESS_VARIES, REWARD_VARIES = declare(
    (
        "groups/process_varies",
        "fraction",
        "Share of the step's task groups whose process term (RewardWeaver's) differs between episodes: the groups "
        "where process credit can tell trajectories apart. 0 when every active rubric is failed (or passed) by "
        "every episode of every group.",
    ),
    (
        "groups/reward_varies",
        "fraction",
        "Share of the step's task groups whose method reward (outcome plus process term) differs between "
        "episodes: the groups that give the update a gradient from the reward (Arise's rubric advantages aside).",
    ),
)
RUBRIC_VARIES = Metric(
    "rubric/<rubric>/varies",
    "fraction",
    "Share of the step's task groups (with two or more episodes the rubric applied to) whose verdicts on it "
    "differ: its within-group variation, what group-normalized credit reads (null when it applied to no two "
    "episodes of a group).",
    "one per rubric judged in the step",
)


def _varies(values: np.ndarray) -> float:
    """Share of the rows of [T, k] whose entries are not all equal."""
    return float((values.max(axis=1) > values.min(axis=1)).mean()) if values.size else 0.0


def _credit_figures(step: TrainStep) -> dict:
    """Where the step's credit can tell episodes apart: groups whose process term / reward vary, and each judged
    rubric's within-group variation (groups contiguous, equal size)."""
    groups = step.groups
    process = np.asarray(step.scored.process_terms, dtype=np.float64).reshape(groups, -1)
    rewards = np.asarray(step.scored.rewards, dtype=np.float64).reshape(groups, -1)
    figures = {PROCESS_VARIES.key: _varies(process), REWARD_VARIES.key: _varies(rewards)}
    judged = step.scored.judged
    if judged.rubric_ids:
        keys = np.repeat(np.arange(groups), len(step.trajectories) // groups)
        shares = within_group_variation(judged.reward_values(), keys)
        for rubric_id, share in zip(judged.rubric_ids, shares):
            figures[RUBRIC_VARIES.format(rubric=rubric_id)] = float(share) if np.isfinite(share) else None
    return figures


def environment_metrics(details: Sequence) -> dict:
    """The environment's own per-episode numbers (Outcome.details["metrics"], e.g. a verifiers environment's
    @metric and @reward values) as `env/<name>`: the mean over the episodes that report a finite value."""
    values: dict[str, list[float]] = {}
    for detail in details:
        metrics = detail.get("metrics") if isinstance(detail, dict) else None
        if not isinstance(metrics, dict):
            continue
        for key, value in metrics.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                values.setdefault(str(key), []).append(float(value))
    return {ENV_METRIC.format(metric=key): float(np.mean(found)) for key, found in sorted(values.items())}


def _group_shares(step: TrainStep) -> dict:
    """The step's zero-variance and all-failed shares over its task groups (groups contiguous, equal size)."""
    trajectories = step.trajectories
    outcomes = np.array([t.outcome for t in trajectories], dtype=np.float64).reshape(step.groups, -1)
    successes = np.array([bool(t.metadata.get("success", False)) for t in trajectories]).reshape(step.groups, -1)
    figures = group_figures(outcomes, successes)
    return {ZERO_VARIANCE.key: figures["zero_variance_groups"], ALL_FAILED.key: figures["all_failed_groups"]}


_IS = "the rollout correction has an importance-sampling part"
_RS = "the rollout correction has a rejection-sampling part"
# PolicyUpdate's figures: the loss kernel's (rwcore.kernels.fused_linear_policy_loss) averaged over minibatches and
# optim.epochs, then the train-inference mismatch before the update (verl's names; rwcore.kernels.rollout_correction)
_UPDATE = declare(
    (
        "loss",
        "loss",
        "The step's loss: the filtered dual-clip policy loss over its model tokens, less the entropy bonus, plus "
        "loss.reading_retention x the retention loss; averaged over optim.epochs.",
    ),
    ("grad_norm", "norm", "Gradient norm before clipping (optim.grad_clip) at the step's last optimizer step."),
    ("kept_fraction", "fraction", "Share of model tokens kept: ratio strictly between loss.ratio_low and ratio_high."),
    ("filtered_low_fraction", "fraction", "Share of model tokens filtered out with ratio <= loss.ratio_low."),
    ("filtered_high_fraction", "fraction", "Share of model tokens filtered out with ratio >= loss.ratio_high."),
    ("dual_clipped_fraction", "fraction", "Share of model tokens whose term the dual clip capped (loss.clip_c)."),
    ("mean_ratio", "ratio", "Mean ratio current / behaviour policy (decoupled correction: current / proximal)."),
    ("entropy", "nats", "Mean policy entropy per model token.", "loss.entropy_coef > 0 or loss.adaptive_entropy"),
    ("rollout_corr/kl", "nats", "KL(behaviour || current) per model token: mean(log behaviour - log current)."),
    ("rollout_corr/k3_kl", "nats", "The same KL by the k3 estimator."),
    ("rollout_corr/chi2_token", "-", "Token-level chi-squared divergence: mean(ratio^2) - 1."),
    ("rollout_corr/ratio_mean", "ratio", "Mean current / behaviour ratio over model tokens."),
    ("rollout_corr/ratio_min", "ratio", "Smallest token ratio."),
    ("rollout_corr/ratio_max", "ratio", "Largest token ratio."),
    ("rollout_corr/eff_sample_size", "fraction", "Effective sample size of the ratios: 1 / mean((ratio / mean)^2)."),
    ("rollout_corr/training_ppl", "-", "Mean over sequences of the current policy's perplexity."),
    ("rollout_corr/training_log_ppl", "nats", "Mean over sequences of the current policy's log perplexity."),
    ("rollout_corr/rollout_ppl", "-", "Mean over sequences of the behaviour policy's perplexity."),
    ("rollout_corr/rollout_log_ppl", "nats", "Mean over sequences of the behaviour policy's log perplexity."),
    ("rollout_corr/log_ppl_diff", "nats", "Mean over sequences of log perplexity, behaviour minus current."),
    ("rollout_corr/log_ppl_abs_diff", "nats", "Mean over sequences of its absolute value."),
    ("rollout_corr/log_ppl_diff_max", "nats", "Its largest value over sequences."),
    ("rollout_corr/log_ppl_diff_min", "nats", "Its smallest value over sequences."),
    ("rollout_corr/ppl_ratio", "ratio", "Mean over sequences of the perplexity ratio exp(log_ppl_diff)."),
    ("rollout_corr/chi2_seq", "-", "Sequence-level chi-squared divergence: mean(sequence ratio^2) - 1."),
    ("rollout_corr/rollout_is_mean", "-", "Mean importance-sampling weight.", _IS),
    ("rollout_corr/rollout_is_eff_sample_size", "fraction", "Effective sample size of the weights (verl's).", _IS),
    ("rollout_corr/rollout_is_max", "-", "Largest weight.", _IS),
    ("rollout_corr/rollout_is_min", "-", "Smallest weight.", _IS),
    ("rollout_corr/rollout_is_ratio_fraction_high", "fraction", "Share above the upper threshold.", _IS),
    ("rollout_corr/rollout_is_ratio_fraction_low", "fraction", "Share below the lower threshold.", _IS),
    (
        "rollout_corr/rollout_is_oob_ratio",
        "fraction",
        "Share of tokens masked for a weight outside the band (IcePop).",
        "the importance sampling masks (loss.rollout_is_threshold lower_upper)",
    ),
    (
        "rollout_corr/truncated_fraction",
        "fraction",
        "Share of tokens whose weight was truncated at the threshold (TIS).",
        "the importance sampling truncates",
    ),
    ("rollout_corr/rollout_rs_masked_fraction", "fraction", "Share of tokens rejection sampling rejected.", _RS),
    ("rollout_corr/rollout_rs_seq_masked_fraction", "fraction", "Share of sequences with a rejected token.", _RS),
    (
        "rollout_corr/masked_fraction",
        "fraction",
        "Share of tokens the correction gave weight 0.",
        "loss.rollout_correction is not off",
    ),
    (
        "reading_retention_loss",
        "loss",
        "The reading prior's corpus loss (unweighted) on the weights before the update, averaged over optim.epochs.",
        "loss.reading_retention > 0",
    ),
    (
        "entropy_coef",
        "-",
        "The entropy coefficient applied (mean over the step's optimizer steps).",
        "loss.adaptive_entropy",
    ),
)

_PER_RUBRIC = "one per rubric judged in the step"
_POOL = "the variant has Arise's rubric-skill pool"
_WEAVER = "the variant has RewardWeaver's active set (from its first stage on)"
_METHOD = declare(
    ("active_rubrics", "count", "Distinct rubrics that steer training now (the pool's active and RewardWeaver's)."),
    ("pool/rubrics", "count", "Rubrics in Arise's pool.", _POOL),
    ("pool/active_skills", "count", "Skills the training prompt shows.", _POOL),
    ("pool/reflection_errors", "count", "Pool updates so far whose reflector failed (run without new pairs).", _POOL),
    ("rewardweaver/stage", "count", "RewardWeaver's current stage (0-based).", _WEAVER),
    ("rewardweaver/stage_errors", "count", "Stage boundaries so far whose update failed (the set stayed).", _WEAVER),
    (
        "sampler/coverage",
        "fraction",
        "Eq. 11: the mean over tasks and represented capabilities of the evaluated share of active rubrics.",
        "the variant samples tasks by capability",
    ),
)
TRAIN_ENTRIES: tuple[Metric | Group, ...] = (
    Metric(
        "success_rate",
        "fraction",
        "Share of the step's episodes (every task group, every process) the environment counted a success.",
        value=lambda s: float(np.mean([t.metadata.get("success", False) for t in s.trajectories])),
    ),
    Metric(
        "outcome_mean",
        "reward",
        "Mean outcome reward of the step's episodes (the environment's task reward, `Trajectory.outcome`).",
        value=lambda s: float(np.array([t.outcome for t in s.trajectories], dtype=np.float64).mean()),
    ),
    Metric(
        "reward_mean",
        "reward",
        "Mean reward the method gave them: the length-regularized outcome plus the process term.",
        value=lambda s: float(np.mean(s.scored.rewards)),
    ),
    Metric(
        "process_term_mean",
        "reward",
        "Mean process term: RewardWeaver's mean judged score over its active rubrics (0 without them, and where "
        "advantage.process_gate gates process credit off).",
        value=lambda s: float(np.mean(s.scored.process_terms)),
    ),
    Metric(
        "advantage_std",
        "-",
        "Standard deviation of the step's advantages.",
        value=lambda s: float(np.std(s.scored.advantages)),
    ),
    Metric(
        "rubrics/process",
        "count",
        "Rubrics counted in the process reward (RewardWeaver's active set).",
        value=lambda s: len(s.scored.process_rubrics),
    ),
    Metric(
        "rubrics/advantage",
        "count",
        "Rubrics counted in the advantages: Arise's active pool rubrics outside RewardWeaver's set.",
        value=lambda s: len(s.scored.advantage_rubrics),
    ),
    Metric(
        "rubrics/shared",
        "count",
        "Pool rubrics also in RewardWeaver's set: counted in the process reward only.",
        value=lambda s: len(s.scored.shared_rubrics),
    ),
    Metric(
        "judgments",
        "count",
        "Verdicts of the step (episodes x rubrics).",
        value=lambda s: int(s.scored.judged.codes.size),
    ),
    Metric(
        "invalid_rate",
        "fraction",
        "Share of those verdicts that are INVALID (the judge failed, timed out or answered unparsably: a FAIL).",
        value=lambda s: s.scored.judged.invalid_fraction(),
    ),
    Group(
        declare(
            ("judge/invalid_rate/<rubric>", "fraction", "Share of the rubric's verdicts that are INVALID.", _PER_RUBRIC)
        ),
        lambda s: s.scored.judged.invalid_rate_metrics(),
    ),
    Metric(
        "generated_tokens_mean",
        "tokens",
        "Mean number of tokens the policy generated per episode.",
        value=lambda s: float(np.mean([t.generated_length for t in s.trajectories])),
    ),
    Metric(
        "lr",
        "-",
        "The learning rate of the step's optimizer steps (optim.lr, optim.warmup_steps, optim.schedule).",
        value=lambda s: s.lr,
    ),
    Group(
        declare(
            ("rubric/<rubric>/applicable", "fraction", "Share of the episodes the rubric applied to.", _PER_RUBRIC),
            ("rubric/<rubric>/pass", "fraction", "Its pass rate there (null when it applied to none).", _PER_RUBRIC),
        ),
        lambda s: s.scored.judged.rubric_rate_metrics(),
    ),
    Group(_METHOD, lambda s: s.method),
    Group(_UPDATE, lambda s: s.update),
    Metric(
        "time/step",
        "seconds",
        "Wall time of the step: rollouts, judging, scoring, the update and adaptation.",
        value=lambda s: s.step_seconds,
    ),
    Metric(
        "time/adaptive",
        "seconds",
        "Time in the method's adaptive machinery: task sampling, evidence, rewards and advantages, pool and "
        "active-set updates (without their extra rollouts).",
        value=lambda s: s.adaptive_seconds,
    ),
    Metric(
        "time/diagnosis",
        "seconds",
        "RewardWeaver's extra rollouts and their judging at a stage boundary (the diagnosis batch, the fixed "
        "diagnostic set); 0 at other steps.",
        value=lambda s: s.diagnosis_seconds,
    ),
    Metric(
        "time/rollout_wait",
        "seconds",
        "Waiting for the step's rollouts (generating them; with rollout.max_lag, the wait for the rollout process).",
        value=lambda s: s.rollout_wait_seconds,
    ),
    Metric(
        "rollout/version_lag",
        "steps",
        "Mean over the step's task groups of how many versions their policy is behind the one trained.",
        value=lambda s: float(np.mean([s.index - v for v in s.versions])),
    ),
    Metric(
        "evidence/late_groups",
        "count",
        "Task groups whose evidence entered the sampler at a version older than the one trained.",
        value=lambda s: int(sum(v < s.index for v in s.versions)),
    ),
    Metric(
        "rollout/trajectories",
        "count",
        "Episodes in the step (rollout.tasks_per_step x rollout.group_size).",
        value=lambda s: len(s.trajectories),
    ),
    Metric(
        "partner_failures",
        "count",
        "Episodes ended by the partner's failure: no advantage, no loss, no evidence.",
        value=lambda s: int(sum(bool(t.partner_failure) for t in s.trajectories)),
    ),
    Group((ZERO_VARIANCE, ALL_FAILED), _group_shares),
    Group((PROCESS_VARIES, REWARD_VARIES, RUBRIC_VARIES), _credit_figures),
    Group((ENV_METRIC,), lambda s: environment_metrics([t.metadata.get("outcome_details") for t in s.trajectories])),
    Metric(
        "time/adaptive_fraction",
        "fraction",
        "time/adaptive / time/step (the run's last line averages it).",
        value=lambda s: s.adaptive_seconds / s.step_seconds if s.step_seconds > 0 else 0.0,
    ),
    Metric("time/judge", "seconds", "How long judging was under way in the step.", value=lambda s: s.judge_seconds),
    Metric(
        "time/judge_wait",
        "seconds",
        "The part of time/judge not hidden behind generation (all of it unless judge.overlap).",
        value=lambda s: s.judge_wait_seconds,
    ),
    LLM_USAGE,
)


def train_row(step: TrainStep) -> dict:
    """The step's row (kind `train`)."""
    return {STEP.key: step.step, KIND.key: TRAIN.kind, **build(TRAIN_ENTRIES, step)}


# ------------------------------------------------------------------ held-out evaluation and exploration rows


@dataclass(frozen=True)
class Evaluation:
    """What an evaluation measured: its row's inputs.

    name: the keys' first segment (`eval`; `eval_with_skills` with the skills shown; `train` / `train_with_skills`
    for `rw eval --split train`). outcomes: (success, outcome reward, task type) per episode. details: each
    episode's Outcome.details. ceiling: the best success any policy can reach, where the environment states it."""

    step: int
    name: str
    with_skills: bool
    outcomes: Sequence[tuple[bool, float, str]]
    details: Sequence
    ceiling: float | None


def _success_se(e: Evaluation) -> float:
    # binomial standard error of the success rate: sqrt(p (1 - p) / n)
    successes = np.array([float(success) for success, _, _ in e.outcomes])
    return float(np.sqrt(successes.mean() * (1 - successes.mean()) / len(successes)))


def _per_type(e: Evaluation) -> dict:
    return {
        SUCCESS_BY_TYPE.format(type=tag): float(np.mean([s for s, _, t in e.outcomes if t == tag]))
        for tag in sorted({tag for _, _, tag in e.outcomes})
    }


SUCCESS_BY_TYPE, CEILING, EVAL_ENV_METRIC = declare(
    (
        "eval/success/<type>",
        "fraction",
        "Success rate of the tasks of one task type (a task's first tag, or `untagged`).",
    ),
    (
        "eval/ceiling",
        "fraction",
        "The best held-out success rate any policy can reach (`rw ablate` and `rw compare` normalize areas "
        "under curves by it).",
        "the environment states it (the built-in negotiation environment does)",
    ),
    ("eval/env/<metric>", ENV_METRIC.unit, f"{ENV_METRIC.help} Held-out episodes.", ENV_METRIC.when),
)
EVALUATION_ENTRIES: tuple[Metric | Group, ...] = (
    Metric(
        "eval/success_rate",
        "fraction",
        "Held-out success rate: one sampled episode per held-out task, fixed seeds, the environment's base prompt.",
        value=lambda e: float(np.mean([float(success) for success, _, _ in e.outcomes])),
    ),
    Metric("eval/success_se", "fraction", "Its binomial standard error, sqrt(p (1 - p) / n).", value=_success_se),
    Metric(
        "eval/outcome_mean",
        "reward",
        "Mean outcome reward of the held-out episodes.",
        value=lambda e: float(np.mean([reward for _, reward, _ in e.outcomes])),
    ),
    Metric("eval/episodes", "count", "Episodes evaluated (one per held-out task).", value=lambda e: len(e.outcomes)),
    Group((SUCCESS_BY_TYPE,), _per_type),
    Group(
        (EVAL_ENV_METRIC,), lambda e: {f"eval/{key}": value for key, value in environment_metrics(e.details).items()}
    ),
    Group((CEILING,), lambda e: {CEILING.key: float(e.ceiling)} if e.ceiling is not None else {}),
)

_PROBED = "train.probe_at_eval is on (auto: the built-in model on an environment with a guidance language)"
PROBE_METRICS = declare(
    (
        "eval/probe/heldout_with",
        "probability",
        "The light skill-reading probe: P(hinted move) on the held-out pairings with their line among distractors.",
        _PROBED,
    ),
    ("eval/probe/heldout_without", "probability", "The same under the bare prompt.", _PROBED),
    (
        "eval/probe/skill_lift_mean",
        "probability",
        "Mean over the probed skill texts of their move's lift (with - without) at their situation (NaN: none).",
        _PROBED,
    ),
    ("eval/probe/skill_lift_min", "probability", "The smallest of those lifts.", _PROBED),
    ("time/probe", "seconds", "How long the probe took.", _PROBED),
)


def evaluation_row(evaluation: Evaluation) -> dict:
    """The evaluation's row (kind `eval`, or `eval_with_skills`) with its keys under `evaluation.name`; the
    trainer adds the probe's keys (`PROBE_METRICS`) and the usage to an `eval` row of metrics.jsonl."""
    kind = EVAL_WITH_SKILLS.kind if evaluation.with_skills else EVAL.kind

    def renamed(key: str) -> str:
        return f"{evaluation.name}/{key.removeprefix('eval/')}"

    return {STEP.key: evaluation.step, KIND.key: kind, **build(EVALUATION_ENTRIES, evaluation, renamed)}


_EXPLORATION = declare(
    (
        "exploration/pass@1",
        "fraction",
        "The starting policy's success rate over k = train.start_pass_k sampled episodes of every held-out task "
        "(no skills, fixed seeds).",
    ),
    ("exploration/pass@<k>", "fraction", "Share of held-out tasks with a success among their k episodes."),
    ("exploration/zero_variance_groups", "fraction", "Share of held-out tasks whose k outcomes are all equal."),
    ("exploration/all_failed_groups", "fraction", "Share of held-out tasks without a success."),
    ("exploration/pass@<k>/<type>", "fraction", "pass@k of the tasks of one task type (a task counts under each tag)."),
    ("exploration/types_pass@<k>_below_0.05", "fraction", "Share of task types whose pass@k is below 0.05."),
)


def exploration_row(step: int, figures: Mapping[str, float], usage: Mapping) -> dict:
    """The starting policy's figures (rwcore.trainer.exploration.exploration_figures) as a row of kind
    `exploration`, with the usage."""
    return {STEP.key: step, KIND.key: EXPLORATION.kind, **{f"exploration/{k}": v for k, v in figures.items()}, **usage}


def usage_row(step: int, usage: Mapping) -> dict:
    """A row of kind `usage`: what the LLM roles cost since the previous row."""
    return {STEP.key: step, KIND.key: USAGE.kind, **usage}


# ------------------------------------------------------------------ the kinds, and the glossary

TRAIN = RowKind("train", "One per optimizer step, after the step's update.", TRAIN_ENTRIES)
EVAL = RowKind(
    "eval",
    "The held-out evaluation: before training, every train.eval_every steps and after the last step.",
    (*EVALUATION_ENTRIES, Group(PROBE_METRICS), LLM_USAGE),
)
EVAL_WITH_SKILLS = RowKind(
    "eval_with_skills",
    "With train.eval_with_skills=on, after each eval row: the same evaluation with the active skills in the "
    "prompt (analysis only).",
    (Group(tuple(metric.under("eval_with_skills") for metric in flat(EVALUATION_ENTRIES))),),
)
EXPLORATION = RowKind(
    "exploration",
    "With train.start_pass_k > 0 (default 8), once at step 0 after the first eval row: how much outcome signal "
    "the starting policy gives.",
    (Group(_EXPLORATION), LLM_USAGE),
)
USAGE = RowKind(
    "usage",
    "After the last step, where an LLM judged the fixed diagnostic set at the end of training: what that cost.",
    (LLM_USAGE,),
)
ROW_KINDS = (TRAIN, EVAL, EVAL_WITH_SKILLS, EXPLORATION, USAGE)


def declared(kind: str, key: str) -> Metric | None:
    """The declaration of `key` in a row of kind `kind` (None: not declared)."""
    return find(ROW_KINDS, kind, key)


def metrics_markdown() -> str:
    """The row kinds and every key as markdown tables: docs/metrics.md's glossary (tests/docs checks the page
    against it)."""
    parts = (
        "A `<part>` of a key is one segment that varies: a rubric id, a task type, an environment's metric name, "
        "`<k>` = train.start_pass_k, `<role>` = `judge` or `reflector`. A blank *when* means that every row of "
        "the key's kinds holds it."
    )
    return "Generated from the declarations in `rwcore.trainer.metrics`.\n\n" + glossary(ROW_KINDS, parts)
