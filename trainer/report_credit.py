"""`rw report`'s credit-diagnosis plot: where the step's credit could tell episodes apart.

`credit_diagnosis.png`, three panels over training steps, from `metrics.jsonl`'s train rows:
- the share of task groups whose outcomes differ (1 - `groups/zero_variance`), whose method reward differs
  (`groups/reward_varies`) and whose process term differs (`groups/process_varies`);
- the policy's entropy per model token (`entropy`, written when loss.entropy_coef > 0, the default);
- each judged rubric's within-group variation (`rubric/<id>/varies`), the rubrics judged most often.
A process reward whose active rubrics every episode fails alike shows here as process-varies at 0 and, once the
entropy has collapsed, reward-varies at 0: the update has no gradient (docs/method.md, "Release of
uninformative failure modes").
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

_RUBRIC_LINES = 8  # rubric curves drawn at most (the rubrics with the most rows)


def plot_credit_diagnosis(run_dir: Path, out: Path) -> tuple[Path, str]:
    from rwcore.trainer.report import _figure, _need, _number, _save, _Skip, _step, load_jsonl

    rows, bad = load_jsonl(_need(run_dir, "metrics.jsonl"))
    series: dict[str, dict[int, float]] = {}
    for row in rows:
        step = _step(row)
        if step is None or row.get("kind", "train") != "train":
            continue
        for key, value in row.items():
            if key in ("groups/zero_variance", "groups/reward_varies", "groups/process_varies", "entropy") or (
                key.startswith("rubric/") and key.endswith("/varies")
            ):
                number = _number(value)
                if number is not None:
                    series.setdefault(key, {})[step] = number  # a resumed run may repeat steps: the last wins
    if "groups/reward_varies" not in series:
        raise _Skip("metrics.jsonl has no groups/reward_varies values (a run written before they existed)")

    def line(ax, key: str, label: str, color: str, transform=lambda v: v) -> None:
        if key in series:
            steps = np.array(sorted(series[key]))
            ax.plot(steps, [transform(series[key][s]) for s in steps], color=color, linewidth=1.4, label=label)

    fig = _figure(15.0, 4.2)
    groups_ax, entropy_ax, rubric_ax = fig.subplots(1, 3)
    line(groups_ax, "groups/zero_variance", "outcome varies", "#8ab6d6", lambda v: 1.0 - v)
    line(groups_ax, "groups/reward_varies", "reward varies", "#1f5f8b")
    line(groups_ax, "groups/process_varies", "process term varies", "#d1495b")
    groups_ax.set_ylabel("Share of task groups")
    groups_ax.set_ylim(-0.02, 1.02)
    groups_ax.set_title("Groups that give credit")
    line(entropy_ax, "entropy", "entropy", "#2a9d8f")
    entropy_ax.set_ylabel("Nats per model token")
    entropy_ax.set_title("Policy entropy" if "entropy" in series else "Policy entropy (not logged)")
    rubric_keys = sorted(
        (key for key in series if key.startswith("rubric/")), key=lambda key: (-len(series[key]), key)
    )[:_RUBRIC_LINES]
    colors = [f"C{i}" for i in range(_RUBRIC_LINES)]
    for key, color in zip(rubric_keys, colors):
        line(rubric_ax, key, key[len("rubric/") : -len("/varies")], color)
    rubric_ax.set_ylabel("Share of groups with differing verdicts")
    rubric_ax.set_ylim(-0.02, 1.02)
    rubric_ax.set_title("Within-group variation per rubric")
    for ax in (groups_ax, entropy_ax, rubric_ax):
        ax.set_xlabel("Training step")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="best", frameon=False, fontsize=8)
    fig.suptitle("Credit diagnosis")
    return _save(fig, out / "credit_diagnosis.png"), f"skipped {bad} unparsable metrics.jsonl lines" if bad else ""
