"""The dashboard shows, per platform lineage, the latest run of each tier (a P1 run does not hide the P0
results before it), and ingests directories of runs given on the command line (`nox -s dashboard -- DIR`),
such as the H200/MI300X runs kept in fixtures/device_runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from reports import analysis
from reports.dashboard import main
from reports.history import History
from reports.results import write_run
from reports.sitedata import collect
from tests.reports.conftest import make_record

DEVICE_RUNS = Path(__file__).resolve().parents[2] / "fixtures" / "device_runs"


def _store(tmp_path: Path, records: list[dict]) -> History:
    runs = tmp_path / "runs"
    for record in records:
        write_run(runs / record["run_id"], record, None, {})
    history = History.open(tmp_path / "h.sqlite")
    history.ingest_dir(runs)
    return history


def _p0_then_p1(tmp_path: Path) -> History:
    p0 = make_record("20250101T000000Z-cpu-00000a", checks=[
        {"id": "checks/test_a.py::test_gate", "outcome": "passed", "tier": "p0"},
        {"id": "checks/test_a.py::test_parity", "outcome": "failed", "tier": "p0", "message": "off by 2"}],
        started_at="2025-01-01T00:00:00Z")
    p1 = make_record("20250102T000000Z-cpu-00000b", checks=[
        {"id": "checks/test_b.py::test_prod", "outcome": "passed", "tier": "p1"}],
        started_at="2025-01-02T00:00:00Z")
    return _store(tmp_path, [p0, p1])


def test_a_p1_run_does_not_hide_the_p0_results_before_it(tmp_path: Path) -> None:
    with _p0_then_p1(tmp_path) as history:
        data = collect(history)
    [column] = data.columns
    assert column.run.run_id == "20250102T000000Z-cpu-00000b"  # the column is still named by its newest run
    checks = {c.id: (c.tier, c.run_id, c.outcome) for c in data.latest_checks[column.key]}
    assert checks == {"checks/test_a.py::test_gate": ("p0", "20250101T000000Z-cpu-00000a", "passed"),
                      "checks/test_a.py::test_parity": ("p0", "20250101T000000Z-cpu-00000a", "failed"),
                      "checks/test_b.py::test_prod": ("p1", "20250102T000000Z-cpu-00000b", "passed")}
    assert analysis.tier_counts(data.latest_checks[column.key])["p0"] == {"passed": 1, "failed": 1}
    assert {t: r.run_id[-1] for t, r in data.tier_runs[column.key].items()} == {"p0": "a", "p1": "b"}
    # Negative control: the newest run alone (what the page showed before) has no P0 row at all.
    newest = analysis.latest_per_lineage(history_runs(tmp_path))[column.key]
    assert newest.tiers == ("p1",)


def history_runs(tmp_path: Path) -> list:
    with History.open(tmp_path / "h.sqlite") as history:
        return history.runs()


def test_a_newer_run_of_a_tier_replaces_only_that_tier(tmp_path: Path) -> None:
    _p0_then_p1(tmp_path).close()
    again = make_record("20250103T000000Z-cpu-00000c", checks=[
        {"id": "checks/test_a.py::test_gate", "outcome": "failed", "tier": "p0", "message": "broke"}],
        started_at="2025-01-03T00:00:00Z")
    write_run(tmp_path / "runs" / again["run_id"], again, None, {})
    with History.open(tmp_path / "h.sqlite") as history:
        history.ingest_dir(tmp_path / "runs")
        data = collect(history)
    checks = {c.id: c.run_id[-1] for c in data.latest_checks[data.columns[0].key]}
    assert checks == {"checks/test_a.py::test_gate": "c", "checks/test_b.py::test_prod": "b"}


def test_the_platform_row_names_the_run_of_each_tier(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    for record in (make_record("20250101T000000Z-cpu-00000a", started_at="2025-01-01T00:00:00Z"),
                   make_record("20250102T000000Z-cpu-00000b", started_at="2025-01-02T00:00:00Z",
                               checks=[{"id": "checks/test_b.py::test_prod", "outcome": "passed", "tier": "p1"}])):
        write_run(runs / record["run_id"], record, None, {})
    assert main([str(runs), "--db", str(tmp_path / "h.sqlite"), "--out", str(tmp_path / "site")]) == 0
    html = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    platforms = html[html.index('id="platforms"'):html.index("</section>", html.index('id="platforms"'))]
    assert "20250101T000000Z-cpu-00000a" in platforms and "20250102T000000Z-cpu-00000b" in platforms
    assert '<small class="tiers">P0</small>' in platforms and '<small class="tiers">P1</small>' in platforms
    assert '<td class="num muted">–</td>' not in platforms  # neither tier reads "not run"


def test_device_runs_are_ingested_from_a_directory_given_on_the_command_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    own = tmp_path / "own"
    own.mkdir()
    count = sum(1 for p in DEVICE_RUNS.iterdir() if p.is_dir() and (p / "results.json").exists())
    code = main([str(DEVICE_RUNS), "--runs", str(own), "--db", str(tmp_path / "h.sqlite"),
                 "--out", str(tmp_path / "site")])
    assert code == 0, capsys.readouterr().err
    assert f"dashboard: {count} runs ingested, 0 already stored, 0 skipped" in capsys.readouterr().out
    with History.open(tmp_path / "h.sqlite") as history:
        data = collect(history)
        runs = history.runs()
    # the one ROCm run there is `--rocm` refused on a CUDA torch: listed, never a ROCm column
    assert {c.target for c in data.columns} == {"cuda"}
    refused = [r for r in data.not_counted if r.target == "rocm"]
    assert [r.run_id for r in refused] == ["20261129T102148-rocm-bcf9b7"]
    assert refused[0].not_evidence.startswith("refused: the installed torch is no rocm build")
    assert {c.run.lineage for c in data.columns} >= {"cuda H200 · transformers · installed"}
    # the dashboard's lineages part runs by model, dtype and profile too
    tiny = "cuda H200 · transformers · installed · tiny-gpt-oss"
    assert {c.key for c in data.columns} >= {f"{tiny} · bfloat16 · profile h200-tiny",
                                            f"{tiny} · float32 · profile h200-tiny"}
    for column in data.columns:
        lineage = [r for r in runs if r.series == column.key and r.not_evidence is None]
        shown = {c.tier: c.run_id for c in data.latest_checks[column.key]}
        for tier, run_id in shown.items():  # each tier's checks come from the newest run of that tier
            assert run_id == max((r for r in lineage if tier in r.tiers), key=lambda r: r.started_at).run_id
        ran = {t for r in lineage for t in r.tiers}
        assert set(shown) == ran, f"{column.key}: a tier it ran is missing from the page"


def test_a_missing_directory_on_the_command_line_is_one_sentence(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "absent"), "--db", str(tmp_path / "h.sqlite"),
                 "--out", str(tmp_path / "site")]) == 2
    err = capsys.readouterr().err
    assert "absent does not exist" in err and "Traceback" not in err
