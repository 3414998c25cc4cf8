"""RewardWeaver's stages of one run, as markdown: python stages.py RUN_DIR

Per stage (read from the run's reward_history.json, nothing recomputed): its start step, the active set, the
capabilities whose judgment varied within at least one rollout group of the stage's diagnosis batch (with that
share of groups and their judge FAIL rate among low-outcome trajectories), and how Select explained its choice."""

import json
import pathlib
import sys


def main(run: pathlib.Path) -> None:
    history = json.loads((run / "reward_history.json").read_text())
    stages = history["stages"] if isinstance(history, dict) else history
    print(f"# RewardWeaver's stages: `{run.name}`\n")
    print(__doc__.split("\n\n", 1)[1].replace("\n", " ") + "\n")
    print("| stage | start step | active set | varying within a group (share of groups, FAIL rate) | Select's reason |")
    print("|---|---|---|---|---|")
    for stage in stages:
        diagnosis = stage.get("diagnosis") or {}
        variation = diagnosis.get("within_group_variation", {})
        fails = diagnosis.get("judge_fail_rates", {})
        varying = ", ".join(
            f"{cid} ({share:.2f}, {fails.get(cid, float('nan')):.2f})" for cid, share in variation.items() if share > 0
        )
        print(
            f"| {stage['stage']} | {stage['start_step']} | {', '.join(stage['active']) or '(none)'} | "
            f"{varying or 'none'} | {stage.get('reason', '')} |"
        )


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]))
