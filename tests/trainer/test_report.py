"""`rw report`: plots from a synthetic run folder; missing or malformed inputs are skipped."""

import json
import random
import struct
from pathlib import Path

import pytest

from rwcore.trainer.cli import main
from rwcore.trainer.report import PLOTS, render_report

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
TAGS = ["bulk_buy", "no_deal", "price_match", "used_goods"]
CAPS = ["Understanding", "Execution", "Verification", "Debugging", "Efficiency"]
FAMILIES = {
    "maintain-goal": "Strategy",
    "switch-strategy": "Strategy",
    "conditional-concession": "Strategy",
    "state-benefits": "Communication",
    "empathy": "Communication",
    "verify-price": "Verification",
    "walk-away": "Verification",
    "cite-budget": "Verification",
}


def make_run(folder: Path, steps: int = 60) -> Path:
    rng = random.Random(0)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "metrics.jsonl", "w") as stream:
        stream.write(
            json.dumps({"kind": "eval", "step": 0, "eval/success_rate": 0.12, "eval/outcome_mean": 0.2}) + "\n"
        )
        for step in range(1, steps + 1):
            rate = min(1.0, 0.1 + 0.5 * step / steps + rng.uniform(-0.1, 0.1))
            stream.write(
                json.dumps(
                    {
                        "kind": "train",
                        "step": step,
                        "success_rate": rate,
                        "outcome_mean": rate,
                        "reward_mean": rate + 0.1,
                        "kept_fraction": 0.98,
                        "active_rubrics": 6,
                        "invalid_rate": 0.0,
                        "loss": 0.1,
                        "time/step": 0.5,
                        "time/adaptive_fraction": 0.05,
                        "judge/requests": 16,
                        "judge/prompt_tokens": 4000,
                        "judge/completion_tokens": 300,
                        "judge/cost": 0.013,
                        "reflector/requests": step % 10 == 0,
                        "reflector/prompt_tokens": 900 * (step % 10 == 0),
                        "reflector/completion_tokens": 200 * (step % 10 == 0),
                        "reflector/cost": 0.004 * (step % 10 == 0),
                        "entropy": 2.0 / step,
                        "groups/zero_variance": 0.9,
                        "groups/reward_varies": 0.5,
                        "groups/process_varies": 0.4,
                        "rubric/asks_budget_first/varies": 0.25,
                        "rubric/quotes_list_price/varies": None,
                    }
                )
                + "\n"
            )
            if step % 20 == 0:
                stream.write(
                    json.dumps(
                        {
                            "kind": "eval",
                            "step": step,
                            "eval/success_rate": 0.12 + 0.4 * step / steps,
                            "eval/outcome_mean": 0.3,
                        }
                    )
                    + "\n"
                )
    with open(folder / "sampling.jsonl", "w") as stream:
        for step in range(1, steps + 1):
            caps = CAPS[: 2 + 3 * step // steps]
            pairs = [
                {"tag": t, "capability": c, "probability": rng.random()}
                for t in TAGS
                for c in caps
                if rng.random() < 0.8
            ]
            total = sum(p["probability"] for p in pairs) or 1.0
            for p in pairs:
                p["probability"] /= total
            stream.write(json.dumps({"step": step, "pairs": pairs}) + "\n")
    caps = list(FAMILIES)
    stages = []
    for stage, start in enumerate(range(0, steps, 15)):
        active = rng.sample(caps, 4 if stage else 3)
        stages.append(
            {
                "stage": stage,
                "start_step": start,
                "end_step": start + 15 if start + 15 < steps else None,
                "active": active,
                "families": FAMILIES,
                "strategy": "attribution",
                "reason": "attribution over 12 failed trajectories",
            }
        )
    (folder / "reward_stages.json").write_text(json.dumps(stages))
    counts, events, active_ids, n = [], [], [], 0
    for step in range(10, steps + 1, 10):
        added = rng.randint(1, 5)
        retired = min(len(active_ids), rng.randint(0, 3))
        for _ in range(retired):
            events.append({"kind": "retired", "rubric_id": active_ids.pop(0), "step": step, "pass_rate": 0.95})
        for _ in range(added):
            active_ids.append(f"r{n}")
            events.append({"kind": "created", "rubric_id": f"r{n}", "step": step, "pass_rate": None})
            n += 1
        counts.append({"step": step, "active": len(active_ids), "added": added, "retired": retired})
    (folder / "pool_counts.json").write_text(json.dumps(counts))
    (folder / "pool_events.json").write_text(json.dumps(events))
    return folder


def assert_png(path: Path) -> None:
    data = Path(path).read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert len(data) > 10_000
    width, height = struct.unpack(">II", data[16:24])  # IHDR
    assert width > 400 and height > 300


def test_render_all_plots(tmp_path):
    run = make_run(tmp_path / "run")
    results = render_report(run, tmp_path / "out")
    assert set(results) == set(PLOTS)
    for name, outcome in results.items():
        assert isinstance(outcome, Path), (name, outcome)
        assert outcome.name == f"{name}.png" and outcome.parent == tmp_path / "out"
        assert_png(outcome)


def test_default_out_dir_is_run_report(tmp_path):
    run = make_run(tmp_path / "run", steps=12)
    results = render_report(run)
    assert all(isinstance(p, Path) and p.parent == run / "report" for p in results.values())


def test_empty_run_folder_skips_everything(tmp_path):
    results = render_report(tmp_path)
    assert set(results) == set(PLOTS)
    for outcome in results.values():
        assert isinstance(outcome, str) and outcome.startswith("skipped:")
    assert "metrics.jsonl not found" in results["success_curves"]
    assert not list((tmp_path / "report").glob("*.png"))


def test_missing_and_empty_files_skip_only_their_plot(tmp_path):
    run = make_run(tmp_path / "run", steps=20)
    (run / "reward_stages.json").unlink()
    (run / "sampling.jsonl").write_text("")
    results = render_report(run)
    assert "reward_stages.json not found" in results["active_rubric_emphasis"]
    assert "sampling.jsonl is empty" in results["sampling_probabilities"]
    assert_png(results["pool_counts"])
    assert_png(results["success_curves"])


def test_malformed_inputs_never_crash(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "reward_stages.json").write_text("{not json")
    (run / "sampling.jsonl").write_text('[1, 2]\n{"step": "x"}\n')
    (run / "pool_counts.json").write_text('{"a": 1}')
    (run / "metrics.jsonl").write_text('{"kind": "train", "step": 1, "loss": 1.0}\n{"ste')
    results = render_report(run)
    for outcome in results.values():
        assert isinstance(outcome, str) and outcome.startswith("skipped:")


def test_torn_metrics_line_and_eval_only(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(
        '{"kind": "eval", "step": 0, "eval/success_rate": 0.1}\n'
        '{"kind": "eval", "step": 10, "eval/success_rate": NaN}\n'
        '{"kind": "eval", "step": 20, "eval/success_rate": 0.4}\n{"kind": "tr'
    )
    notes = {}
    results = render_report(run, notes=notes)
    assert_png(results["success_curves"])
    assert "1 unparsable" in notes["success_curves"]


def test_pool_plot_falls_back_to_events(tmp_path):
    run = make_run(tmp_path / "run", steps=30)
    (run / "pool_counts.json").unlink()
    notes = {}
    results = render_report(run, notes=notes)
    assert_png(results["pool_counts"])
    assert "pool_events.json" in notes["pool_counts"]


def test_stages_without_active_capabilities_are_skipped(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "reward_stages.json").write_text(
        json.dumps(
            [
                {
                    "stage": 0,
                    "start_step": 0,
                    "end_step": None,
                    "active": [],
                    "families": {},
                    "strategy": "attribution",
                    "reason": "",
                }
            ]
        )
    )
    results = render_report(run)
    assert "no capability was active" in results["active_rubric_emphasis"]


def test_render_report_rejects_a_missing_folder(tmp_path):
    with pytest.raises(ValueError, match="run_dir"):
        render_report(tmp_path / "nope")


def test_cli_report(tmp_path, capsys):
    run = make_run(tmp_path / "run", steps=12)
    (run / "pool_counts.json").unlink()
    (run / "pool_events.json").unlink()
    assert main(["report", str(run), "--out", str(tmp_path / "figs")]) == 0
    captured = capsys.readouterr()
    printed = captured.out.split()
    assert len(printed) == 5 and all(p.endswith(".png") and Path(p).is_file() for p in printed)
    assert "skipped pool_counts" in captured.err
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert "is not a folder" in capsys.readouterr().err


def test_the_llm_cost_plot_needs_llm_figures(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"kind": "train", "step": 1, "success_rate": 0.5}\n')
    results = render_report(tmp_path, tmp_path / "out")
    assert "no judge/* or reflector/* figures" in results["llm_cost"]
    assert_png(results["success_curves"])


def test_credit_diagnosis_needs_the_credit_keys_and_reads_them(tmp_path):
    run = make_run(tmp_path / "run", steps=20)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    stripped = [{k: v for k, v in row.items() if not k.startswith(("groups/", "rubric/"))} for row in rows]
    (run / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in stripped))
    results = render_report(run)
    assert results["credit_diagnosis"] == (
        "skipped: metrics.jsonl has no groups/reward_varies values (a run written before they existed)"
    )
    assert isinstance(results["success_curves"], Path)
