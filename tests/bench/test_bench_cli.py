"""`rw bench`: the smallest benchmark through the CLI writes the JSON and Markdown reports; without bench/
(a non-editable install) it says to run from a source checkout."""

from __future__ import annotations

import json

from _util import ROOT

from rwcore.trainer.cli import bench as bench_cli
from rwcore.trainer.cli import main


def test_rw_bench_quick_advantages_writes_json_and_markdown(tmp_path, capsys):
    out = tmp_path / "bench"
    assert main(["bench", "--quick", "--only", "advantages", "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert list(report["benchmarks"]) == ["advantages"]
    assert report["quick"] is True and report["machine"]["cpus"] >= 1
    result = report["benchmarks"]["advantages"]
    for row in result["report"]["rows"]:
        for function in ("compute_advantages", "length_regularize"):
            assert row[function]["speedup"] > 0
            assert row[function]["max_abs_diff"] <= 1e-6
    markdown = (out / "report.md").read_text()
    assert "Machine:" in markdown and "| advantages | compute_advantages" in markdown
    assert "per-group loop" in capsys.readouterr().out


def test_rw_bench_without_a_source_checkout_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(
        bench_cli, "_bench_candidates", lambda: [tmp_path / "site-packages" / "bench", tmp_path / "bench"]
    )
    assert main(["bench", "--quick"]) == 2
    err = capsys.readouterr().err
    assert "source checkout" in err and str(tmp_path / "bench") in err


def test_every_benchmark_script_has_its_section_in_the_bench_readme():
    """bench/README.md is where a benchmark's command, method and latest figures live; an edit once dropped
    two sections without anyone noticing."""
    bench = ROOT / "bench"
    readme = (bench / "README.md").read_text()
    scripts = sorted(path.name for path in bench.glob("bench_*.py"))
    assert len(scripts) >= 9
    missing = [name for name in scripts if f"## `{name}`" not in readme]
    assert not missing, f"bench/README.md has no section for {missing}"
