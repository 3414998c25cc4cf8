"""The README's main job (the sampler demo) and the benchmark script run and say what they claim."""

from __future__ import annotations

import importlib.util
import io
import json

from _util import ROOT

from rwcore.sampling import demo as demo_sampler


def test_demo_moves_pick_mass_toward_learnable_pairs():
    out = io.StringIO()
    reports = demo_sampler.run(steps=45, num_tasks=400, batch_size=32, group_size=8, report_every=15, seed=0, out=out)
    assert len(reports) == 3
    for mass, share in reports:
        assert abs(sum(mass.values()) - 1.0) < 1e-9
        assert abs(sum(share.values()) - 1.0) < 1e-9
    # p (1 - p)^2 favours pass rates in (0.1, 0.8): a sampler blind to evidence
    # would put mass in proportion to the pairs' share; this one clearly more.
    final_mass, final_share = reports[-1]
    assert final_mass["learnable"] > final_share["learnable"] + 0.15
    assert final_mass["mastered"] < final_share["mastered"]
    text = out.getvalue()
    assert "adaptive pick mass by pass rate" in text
    assert text.count("coverage") == 3


def test_demo_cli_rejects_bad_arguments(capsys):
    try:
        demo_sampler.main(["--batch-size", "50", "--tasks", "10"])
    except SystemExit as exit:
        assert exit.code == 2
    else:
        raise AssertionError("a batch larger than the task set must be refused")
    assert "--batch-size" in capsys.readouterr().err


def test_bench_script_quick_run_writes_json_and_markdown(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_sampler", ROOT / "bench" / "bench_sampler.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "sampler.json"
    report = bench.main(["--quick", "--tasks", "300", "--native-repeat", "3", "--peer-repeat", "1", "--out", str(out)])
    saved = json.loads(out.read_text())
    assert saved["config"]["tasks"] == 300
    for row in (saved["observe_many"], saved["sample"]["discovery"], saved["sample"]["adaptive"]):
        assert row["speedup"] > 0
    assert saved["sample"]["adaptive"]["coverage"] == 1.0
    assert saved["sample"]["discovery"]["coverage"] < 0.5
    markdown = out.with_suffix(".md").read_text()
    assert "| observe_many throughput |" in markdown and "Machine:" in markdown
    assert report["config"] == saved["config"]


def test_kernel_bench_workers_measure_time_and_memory():
    spec = importlib.util.spec_from_file_location("bench_kernels", ROOT / "bench" / "bench_kernels.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    report = bench.main(["--size", "256", "64", "2048", "--peers", "rwcore,eager", "--repeats", "1"])
    (row,) = report["rows"]
    for peer in ("rwcore", "eager"):
        assert row[peer]["seconds"] > 0
        assert row[peer]["tokens"] == 256 and row[peer]["vocab"] == 2048
    # eager materializes [256, 2048] fp32 logits (2 MiB) more than once; rwcore holds 64-row chunks
    assert row["eager"]["peak_mib"] >= 2.0
    assert row["rwcore"]["peak_mib"] < row["eager"]["peak_mib"]


def _bench_module(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_scoring_memory_bench_compares_the_same_log_probs(tmp_path):
    report = _bench_module("bench_scoring_memory").main(
        ["--tokens", "512", "--hidden", "64", "--vocab", "20000", "--out", str(tmp_path / "m.json")]
    )
    (row,) = report["rows"]
    assert row["max_abs_difference"] < 1e-4  # the fused path scores the same tokens
    assert row["materialized_peak_mib"] > 0 and row["logits_mib"] == 512 * 20000 * 4 / 2**20
    assert "| 20,000 |" in (tmp_path / "m.md").read_text()


def test_trl_step_bench_runs_both_trainers_at_equal_work():
    # inside, rwcore's rollouts are checked to generate exactly --tokens tokens each, as TRL's must
    report = _bench_module("bench_trl_step").main(["--quick"])
    # the steps are taken in turns: one rwcore step of each kind after each TRL step
    assert len(report["rwcore_step_s"]) == len(report["trl_step_s"]) == len(report["entropy_bonus"]["step_s"]) == 3
    assert report["speedup"] > 0 and report["config"]["tokens"] == 8
    assert report["speedup"] == report["trl_median_s"] / report["rwcore_median_s"]
    assert report["entropy_bonus"]["entropy_coef"] == 0.01  # rw train's default, measured for reference


def test_rollout_correction_bench_times_every_preset_against_the_plain_loss(tmp_path):
    from rwcore.kernels.rollout_correction import PRESETS

    bench = _bench_module("bench_rollout_correction")
    out = tmp_path / "rc.json"
    report = bench.main(
        ["--device", "cpu", "--size", "256", "64", "1024", "--seq-len", "64", "--repeats", "1", "--out", str(out)]
    )
    result = json.loads(out.read_text())["result"]
    assert result == report["result"] and result["tokens"] == 256 and result["sequences"] == 4
    rows = {row["name"]: row for row in result["rows"]}
    assert list(rows) == ["off", *[name for name in PRESETS if name != "off"], "off + metrics"]
    for row in rows.values():
        assert row["sanity"] == "ok", row  # finite loss and gradients; "off" is the plain loss bit for bit
        assert row["ratio"] > 0 and row["plain_median_s"] > 0 and "added_vs_logits" in row
    assert rows["decoupled_geo_rs"]["masked_fraction"] > 0  # the correction did reject something
    assert result["logits_bytes"] == 256 * 1024 * 4
    markdown = out.with_suffix(".md").read_text()
    assert "| bypass_pg_geo_rs_seq_tis | bypass |" in markdown and "A/A control" in markdown
