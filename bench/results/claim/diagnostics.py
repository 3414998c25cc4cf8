"""Per-run diagnostics of a `rw ablate` folder, as markdown: python diagnostics.py FOLDER > FOLDER/diagnostics.md

Read from each run's metrics.jsonl, nothing recomputed: the step-0 `exploration` row, the mean of
`groups/zero_variance` over training steps 1-50, the means of training `entropy`, `groups/process_varies` and
`groups/reward_varies` (the shares of task groups whose process term / reward differ between episodes) over steps
50-300, the final held-out
success, `eval/probe/skill_lift_mean` at step 0 and at the last evaluation, and the held-out curve."""

import json
import pathlib
import statistics
import sys


def read_rows(path: pathlib.Path) -> list[dict]:
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            pass  # a torn last line of a run that is still going
    return rows


def trace(run: pathlib.Path) -> dict:
    rows = read_rows(run / "metrics.jsonl")
    start = next((r for r in rows if r.get("kind") == "exploration"), {})
    train = [r for r in rows if r.get("kind") == "train"]
    evals = [r for r in rows if r.get("kind") == "eval"]
    zero_var = [r["groups/zero_variance"] for r in train if 1 <= r["step"] <= 50 and "groups/zero_variance" in r]
    entropy = [r["entropy"] for r in train if 50 <= r["step"] <= 300 and "entropy" in r]
    process = [r["groups/process_varies"] for r in train if 50 <= r["step"] <= 300 and "groups/process_varies" in r]
    reward = [r["groups/reward_varies"] for r in train if 50 <= r["step"] <= 300 and "groups/reward_varies" in r]
    return {
        "run": run.name,
        "pass@1": start.get("exploration/pass@1"),
        "pass@8": start.get("exploration/pass@8"),
        "zero_var_step0": start.get("exploration/zero_variance_groups"),
        "zero_var_1_50": statistics.mean(zero_var) if zero_var else None,
        "entropy_50_300": statistics.mean(entropy) if entropy else None,
        "process_50_300": statistics.mean(process) if process else None,
        "reward_50_300": statistics.mean(reward) if reward else None,
        "last_step": train[-1]["step"] if train else 0,
        "final": evals[-1]["eval/success_rate"] if evals else None,
        "lift_first": evals[0].get("eval/probe/skill_lift_mean") if evals else None,
        "lift_last": evals[-1].get("eval/probe/skill_lift_mean") if evals else None,
        "curve": [r["eval/success_rate"] for r in evals],
    }


def fmt(value, digits=3):
    return "-" if value is None else f"{value:.{digits}f}"


def main(folder: pathlib.Path) -> None:
    print(f"# Per-run diagnostics: `{folder.name}`\n")
    print(__doc__.split("\n\n", 1)[1].replace("\n", " ") + "\n")
    print(
        "| run | steps | pass@1 | pass@8 | zero-var. step 0 | zero-var. steps 1-50 | entropy 50-300 | "
        "process varies 50-300 | reward varies 50-300 | final | lift step 0 -> last | held-out curve (every 50 steps) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for run in sorted(folder.glob("runs/*")):
        if not (run / "metrics.jsonl").is_file():
            continue  # queued, never started
        t = trace(run)
        print(
            f"| {t['run']} | {t['last_step']} | {fmt(t['pass@1'], 4)} | {fmt(t['pass@8'], 4)} | "
            f"{fmt(t['zero_var_step0'])} | "
            f"{fmt(t['zero_var_1_50'])} | {fmt(t['entropy_50_300'], 2)} | {fmt(t['process_50_300'], 2)} | "
            f"{fmt(t['reward_50_300'], 2)} | {fmt(t['final'])} | "
            f"{fmt(t['lift_first'], 2)} -> {fmt(t['lift_last'], 2)} | {' '.join(f'{c:.2f}' for c in t['curve'])} |"
        )


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]))
