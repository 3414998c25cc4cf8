"""The metrics rows' declarations (rwcore.trainer.metrics, the source of docs/metrics.md).

- A short `rw train` with the optional metrics switched on writes only declared keys, in the declared order,
  and every declared key except exactly those whose condition the run does not meet.
- The keys other parts produce are declared: the loss kernel's under every rollout-correction preset (and
  every declared `rollout_corr/` key is produced by one), the LLM roles' usage, an environment's own numbers.
- The evaluation row of hand-made episodes, value for value and in order; the usage of two clients partitioned
  row by row, priced, and restored from a checkpoint's totals.
- A declared name with `<part>`s matches exactly the keys it stands for.
"""

from __future__ import annotations

import math

import torch
from _util import SMALL_RUN, metrics_rows

from rwcore.judges.client import Usage
from rwcore.kernels import RolloutCorrection, filtered_dual_clip_loss
from rwcore.kernels.rollout_correction import PRESETS
from rwcore.trainer.cli import main
from rwcore.trainer.metric_schema import Group, Metric
from rwcore.trainer.metrics import (
    ROW_KINDS,
    TRAIN,
    Evaluation,
    declared,
    evaluation_row,
    metrics_markdown,
    usage_metrics,
)
from rwcore.trainer.usage import LLMUsage

# every optional part of a train and an eval row switched on, bar the LLM roles and an environment's own numbers
OPTIONAL = (
    "train.method=combined",  # Arise's pool and sampler, RewardWeaver's stages
    "loss.adaptive_entropy=true",
    "loss.reading_retention=0.1",
    "loss.rollout_correction=decoupled_seq_is_rs",  # importance sampling (truncated) and rejection sampling
    "train.eval_with_skills=on",
)
USAGE_KEYS = {
    f"<role>/{name}"
    for name in (
        "requests",
        "prompt_tokens",
        "completion_tokens",
        "cache_hits",
        "retries",
        "rate_limited",
        "failed",
        "seconds",
        "cost",
        "cost_total",
    )
}


def entry_positions(kind: str) -> dict[str, int]:
    """Declared name -> the position of its entry in a row of `kind` (`step` 0, `kind` 1; a group's keys share
    one: their producer orders them)."""
    row_kind = next(r for r in ROW_KINDS if r.kind == kind)
    positions = {"step": 0, "kind": 1}
    for i, entry in enumerate(row_kind.entries, start=2):
        for metric in entry.metrics if isinstance(entry, Group) else (entry,):
            positions[metric.key] = i
    return positions


def test_a_short_rw_train_writes_only_declared_keys_in_order_and_all_but_the_unmet_conditional_ones(tmp_path):
    out = tmp_path / "run"
    assert main(["train", "--out", str(out), "--quiet", *SMALL_RUN, "train.steps=1", *OPTIONAL]) == 0
    rows = metrics_rows(out)
    assert {row["kind"] for row in rows} == {"train", "eval", "eval_with_skills", "exploration"}
    seen: dict[str, set[str]] = {}
    for row in rows:
        positions = entry_positions(row["kind"])
        order = []
        for key in row:
            metric = declared(row["kind"], key)
            assert metric is not None, f"{row['kind']} row (step {row['step']}) holds undeclared key {key!r}"
            seen.setdefault(row["kind"], set()).add(metric.key)
            order.append(positions[metric.key])
        assert order == sorted(order), f"{row['kind']} row (step {row['step']}) is out of declared order"
    unseen = {
        (row_kind.kind, metric.key)
        for row_kind in ROW_KINDS
        if row_kind.kind in seen
        for metric in row_kind.metrics
        if metric.key not in seen[row_kind.kind]
    }
    expected = (
        {("train", key) for key in USAGE_KEYS | {"env/<metric>", "rollout_corr/rollout_is_oob_ratio"}}
        | {("eval", key) for key in USAGE_KEYS | {"eval/env/<metric>"}}
        | {("exploration", key) for key in USAGE_KEYS}
        | {("eval_with_skills", "eval_with_skills/env/<metric>")}
    )
    assert unseen == expected
    conditions = {metric.key: metric.when for row_kind in ROW_KINDS for metric in row_kind.metrics}
    assert all(conditions[key] for _, key in unseen), "a declared key without a condition is missing from the run"
    # the usage rows' kind: written only where an LLM judged the final diagnostic set (test_method_llm runs one)
    assert "LLM" in next(r for r in ROW_KINDS if r.kind == "usage").help


def test_the_loss_kernels_metrics_under_every_rollout_correction_preset_are_declared():
    generator = torch.Generator().manual_seed(0)
    behavior = -torch.rand(2, 5, generator=generator) - 0.5
    logprobs = behavior + 0.3 * torch.randn(2, 5, generator=generator)
    advantages = torch.tensor([1.0, -1.0])
    mask = torch.ones(2, 5, dtype=torch.bool)
    produced = set()
    for name in PRESETS:
        correction = RolloutCorrection.preset(name)
        proximal = behavior + 0.1 if correction is not None and not correction.bypass else None
        _, stats = filtered_dual_clip_loss(
            logprobs, behavior, advantages, mask, backend="torch", proximal_logprobs=proximal, rollout_correction=name
        )
        undeclared = [key for key in stats if declared("train", key) is None]
        assert not undeclared, f"rollout_correction={name}: {undeclared}"
        produced |= set(stats)
    declared_mismatch = {m.key for m in TRAIN.metrics if m.key.startswith("rollout_corr/")}
    assert declared_mismatch == {key for key in produced if key.startswith("rollout_corr/")}


class Owner:
    """A judge or reflector whose client counts its requests."""

    def __init__(self) -> None:
        self.client = type("Client", (), {})()
        self.client.usage = Usage()


def test_usage_rows_partition_each_roles_requests_with_declared_keys():
    judge, reflector = Owner(), Owner()
    usage = LLMUsage({"judge": judge, "reflector": reflector, "rule": object()})
    assert list(usage.clients) == ["judge", "reflector"]
    judge.client.usage.add(requests=3, prompt_tokens=1000, completion_tokens=200, retries=1, seconds=0.5)
    reflector.client.usage.add(requests=1, prompt_tokens=400, completion_tokens=100)
    first = usage.since_last_row(lambda items: items, price_in=2.0, price_out=10.0)
    judge.client.usage.add(requests=2, prompt_tokens=500, cache_hits=4)
    second = usage.since_last_row(lambda items: items * 2, price_in=2.0, price_out=10.0)  # two processes
    assert first["judge"] == {
        "requests": 3,
        "prompt_tokens": 1000,
        "completion_tokens": 200,
        "cache_hits": 0,
        "retries": 1,
        "rate_limited": 0,
        "failed": 0,
        "seconds": 0.5,
        "cost": (1000 * 2.0 + 200 * 10.0) / 1e6,
        "cost_total": (1000 * 2.0 + 200 * 10.0) / 1e6,
    }
    assert second["judge"]["requests"] == 4 and second["judge"]["cache_hits"] == 8
    assert second["judge"]["cost"] == 2 * 500 * 2.0 / 1e6
    assert math.isclose(second["judge"]["cost_total"], (2000 + 2000 + 2000) / 1e6)
    assert second["reflector"]["requests"] == 0 and second["reflector"]["cost_total"] == (800 + 1000) / 1e6
    row = usage_metrics(second)
    assert list(row)[:2] == ["judge/requests", "judge/prompt_tokens"] and row["reflector/cost"] == 0.0
    for kind in ("train", "eval", "exploration", "usage"):
        assert {declared(kind, key).key for key in row} == USAGE_KEYS
    restored = LLMUsage({"judge": Owner()})
    restored.load_state_dict({**usage.state_dict(), "gone": 5.0})
    assert restored.state_dict() == {"judge": usage.totals["judge"]}
    unpriced = LLMUsage({"judge": Owner()}).since_last_row(lambda items: items, 0.0, 0.0)
    assert "cost" not in unpriced["judge"]


def test_the_evaluation_row_of_hand_made_episodes():
    outcomes = [(True, 1.0, "bundle"), (False, 0.0, "quote"), (True, 0.5, "bundle"), (False, -1.0, "bundle")]
    details = [{"metrics": {"turns": 4}}, {"metrics": {"turns": 6.0, "odd": float("nan")}}, None, {}]
    evaluation = Evaluation(step=6, name="eval", with_skills=False, outcomes=outcomes, details=details, ceiling=0.75)
    row = evaluation_row(evaluation)
    assert list(row.items()) == [
        ("step", 6),
        ("kind", "eval"),
        ("eval/success_rate", 0.5),
        ("eval/success_se", math.sqrt(0.5 * 0.5 / 4)),
        ("eval/outcome_mean", 0.125),
        ("eval/episodes", 4),
        ("eval/success/bundle", 2 / 3),
        ("eval/success/quote", 0.0),
        ("eval/env/turns", 5.0),
        ("eval/ceiling", 0.75),
    ]
    assert all(declared("eval", key) is not None for key in row)
    skills = Evaluation(6, "eval_with_skills", True, outcomes, details, None)
    row = evaluation_row(skills)
    assert row["kind"] == "eval_with_skills" and "eval_with_skills/ceiling" not in row
    assert row["eval_with_skills/success/bundle"] == 2 / 3 and row["eval_with_skills/env/turns"] == 5.0
    assert all(declared("eval_with_skills", key) is not None for key in row)
    assert declared("eval", "eval_with_skills/success_rate") is None


def test_names_with_parts_match_only_the_keys_they_stand_for():
    per_rubric = Metric("rubric/<rubric>/pass", "fraction", "x")
    assert per_rubric.format(rubric="asks_budget_first") == "rubric/asks_budget_first/pass"
    assert per_rubric.matches("rubric/asks_budget_first/pass")
    assert not per_rubric.matches("rubric/a/b/pass") and not per_rubric.matches("rubric//pass")
    below = Metric("exploration/types_pass@<k>_below_0.05", "fraction", "x")
    assert below.matches("exploration/types_pass@8_below_0.05")
    assert not below.matches("exploration/types_pass@8_below_0x05")  # the name's own characters are literal
    assert declared("exploration", "exploration/pass@8/bundle").key == "exploration/pass@<k>/<type>"
    assert declared("train", "judge/requests").key == "<role>/requests"
    assert declared("train", "eval/success_rate") is None  # a key of another kind
    assert declared("train", "success_rates") is None
    assert declared("unknown_kind", "step") is None
    glossary = metrics_markdown()
    for row_kind in ROW_KINDS:
        assert f"| `{row_kind.kind}` |" in glossary
        for metric in row_kind.metrics:
            assert glossary.count(f"| `{metric.key}` |") == 1, metric.key
