"""The dashboard command: exit codes, summary line, escaping, self-containment and the 1,000-run bar."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from reports.dashboard import build, main
from reports.results import write_run
from tests.reports.conftest import FIXTURE_RUNS, GOOD_RUNS, load_fixture, make_record

REPO = Path(__file__).resolve().parents[2]


def run_main(tmp_path: Path, *extra: str, runs: Path = FIXTURE_RUNS) -> tuple[int, Path]:
    out = tmp_path / "site"
    code = main(["--runs", str(runs), "--db", str(tmp_path / "h.sqlite"), "--out", str(out), *extra])
    return code, out / "index.html"


def test_builds_the_site_from_the_samples(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, index = run_main(tmp_path)
    captured = capsys.readouterr()
    assert code == 0
    assert captured.out.strip() == (f"dashboard: {len(GOOD_RUNS)} runs ingested, 0 already stored, "
                                    f"1 skipped; wrote {index}")
    assert "20250613T030000Z-rocm-0bad00" in captured.err and "not valid JSON" in captured.err
    html = index.read_text(encoding="utf-8")
    assert 'id="matrix-table"' in html and 'id="parity-scores"' in html
    assert '<b id="disagreement-count">5</b>' in html
    assert "platform.rocm_version" in html and "6.4.1" in html and "7.0.0" in html  # what changed
    assert "20250613T030000Z-rocm-0bad00" in html  # the skipped run is named on the page too
    # A second build ingests nothing new.
    assert run_main(tmp_path)[0] == 0
    assert f"0 runs ingested, {len(GOOD_RUNS)} already stored" in capsys.readouterr().out


def test_strict_mode_fails_on_skipped_runs(tmp_path: Path) -> None:
    assert run_main(tmp_path, "--strict")[0] == 2


def test_missing_runs_dir_is_a_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_main(tmp_path, runs=tmp_path / "nope")[0] == 2
    assert "does not exist" in capsys.readouterr().err


def test_damaged_history_exits_2_keeps_the_file_and_still_renders(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "h.sqlite"
    db.write_bytes(b"\x00garbage" * 100)
    code, index = run_main(tmp_path)
    err = capsys.readouterr().err
    assert code == 2
    assert f"{db} is not a usable history database" in err and "move it aside" in err
    assert db.read_bytes() == b"\x00garbage" * 100
    assert index.exists() and "History store not used" in index.read_text(encoding="utf-8")


def test_help_explains_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for needle in ("--runs DIR", "--db FILE", "--out DIR", "self-contained", "Exit status"):
        assert needle in text


def test_python_dash_m_reports_runs_the_cli(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "reports", "--runs", str(FIXTURE_RUNS), "--db",
                           str(tmp_path / "h.sqlite"), "--out", str(tmp_path / "site")],
                          cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "runs ingested" in done.stdout and (tmp_path / "site" / "index.html").exists()


def test_run_text_is_escaped(tmp_path: Path) -> None:
    nasty = '<script>alert("x")</script><img src=x onerror=alert(1)>'
    rec = make_record(run_id="20250101T000000Z-cuda-e5c4e0", target="cuda", checks=[
        {"id": "checks/test_x.py::test_<b>bold</b>", "outcome": "failed", "message": nasty,
         "bug_link": "javascript:alert(1)"}], fingerprint={"gpu": {"name": nasty}})
    runs = tmp_path / "runs"
    write_run(runs / rec["run_id"], rec, None, {})
    build(runs, tmp_path / "h.sqlite", tmp_path / "site")
    html = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    assert "<script>alert" not in html and "<img src=x" not in html and "<b>bold</b>" not in html
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in html
    assert 'href="javascript:' not in html
    assert html.count("<script>") == 1  # only the page's own


def test_a_figure_that_is_not_finite_is_left_off_its_trend_and_the_site_still_builds(tmp_path: Path) -> None:
    """A failed check may record an infinite error (a run of a suite that wrote `inf` for a figure it could not
    measure); once a later run records the limit of that figure, the figure gets a trend, which drew `inf` on a log
    axis and stopped the whole dashboard (OverflowError). The point is left off the chart; its run's page shows it."""
    check = "checks/test_s.py::test_raw_logprobs"
    old = make_record(run_id="20250101T000000Z-cpu-0000aa", checks=[
        {"id": check, "outcome": "failed", "figures": {"raw_logprob_max_abs_err": float("inf")}}])
    new = make_record(run_id="20250102T000000Z-cpu-0000bb", started_at="2025-01-02T00:00:00Z", checks=[
        {"id": check, "outcome": "passed", "figures": {"raw_logprob_max_abs_err": 1.7e-5},
         "limits": {"raw_logprob_max_abs_err": {"value": 0.002, "kind": "max", "source": "tolerances.toml"}}}])
    runs = tmp_path / "runs"
    for rec in (old, new):
        write_run(runs / rec["run_id"], rec, None, {})
    assert build(runs, tmp_path / "h.sqlite", tmp_path / "site").ingest.skipped == []
    html = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    card = html.split('data-figure="raw_logprob_max_abs_err"', 1)[1].split("</svg>", 1)[0]
    assert 'data-limit="0.002"' in card and card.count("<circle") == 1  # the finite point alone


def test_page_is_self_contained(tmp_path: Path) -> None:
    _, index = run_main(tmp_path)
    html = index.read_text(encoding="utf-8")
    assert "Content-Security-Policy" in html and "default-src 'none'" in html
    assert not re.search(r"<(script|link|img|iframe)[^>]+(src|href)=\"(?!data:)", html)
    # Outbound URLs appear only as the href of a link a person may click.
    without_links = re.sub(r'<a class="ext" href="https://[^"]+"', "", html)
    assert "http://" not in without_links and "https://" not in without_links


def test_thousand_runs_ingest_and_render_every_combination(tmp_path: Path) -> None:
    """1,000 ingested runs render, every combination a column; a second build ingests nothing new. How long it
    takes is a figure of `nox -s bench` (reports/bench.py), not an assertion here."""
    from reports.bench import synthetic_runs

    runs = synthetic_runs([load_fixture(r) for r in GOOD_RUNS], tmp_path / "runs", 1000)
    result = build(runs, tmp_path / "h.sqlite", tmp_path / "site")
    assert len(result.ingest.ingested) == 1000 and not result.errors
    again = build(runs, tmp_path / "h.sqlite", tmp_path / "site")
    assert not again.ingest.ingested and not again.errors
    html = result.index.read_text(encoding="utf-8")
    assert html.count('class="colhead"') >= 12 * 2  # every combination is a column (platforms + matrix)


@pytest.mark.parametrize(("failure_class", "label", "why"), [
    ("shared_gpu", "GPU shared", "but another process held the GPU while this was measured: pid 4242"),
    ("slower_host", "slower host", "but this host ran the suite's single-thread probe at 0.71 of the speed of the "
                                   "pinned runs' host"),
])
def test_a_check_failed_on_a_shared_gpu_or_slower_host_shows_its_class_and_counts_as_open(
        tmp_path: Path, failure_class: str, label: str, why: str) -> None:
    """A serving level that missed its pin while another job held the GPU (class shared_gpu), or on a host slower
    than the pinned runs' (slower_host), each from the check's own exception: the run page labels it, and the Open
    failures tile counts it (not the stack's verdict, and not a pass either)."""
    rec = make_record(run_id="20250101T000000Z-cuda-5a4ed0", target="cuda", checks=[
        {"id": "checks/test_serving_perf.py::test_serving_perf_against_baseline[c64]", "tier": "p2",
         "outcome": "failed", "failure_class": failure_class, "message": f"output_tok_s regressed — {why}"}])
    runs = tmp_path / "runs"
    write_run(runs / rec["run_id"], rec, None, {})
    build(runs, tmp_path / "h.sqlite", tmp_path / "site")
    pages = "".join(p.read_text(encoding="utf-8") for p in (tmp_path / "site").rglob("*.html"))
    assert f'<span class="badge c-{failure_class}">{label}</span>' in pages
    assert re.search(r"Open failures.{0,200}?>1<", (tmp_path / "site" / "index.html").read_text(encoding="utf-8"),
                     re.S)


def test_a_figure_that_is_not_finite_is_written_as_such() -> None:
    from reports.numbers import short_number

    assert [short_number(v) for v in (float("inf"), float("-inf"), float("nan"), 0.0029, 1400.0)] == [
        "inf", "-inf", "nan", "0.0029", "1.4k"]
