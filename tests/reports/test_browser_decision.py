"""The release decision, the run pages and the check pages in a real headless Chromium (as test_browser.py: Debian's
`chromium` through Playwright, the site served from localhost), on the recorded runs (fixtures/runs,
fixtures/device_runs) and on bad ones: a narrowed, an interrupted and a refused run appear as not counted and leave
the lineage's verdict as it was; a combo with only such runs shows "no evidence". Two kept runs are copied with the
limits they were judged by added to their records (as results.json now carries them): their run pages and the check
page show those limits, the one of them judged by a looser limit as a second line."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from reports.results import write_run
from reports.verdict import LEVELS, SAFE
from tests.reports import test_browser
from tests.reports.conftest import DEVICE_RUNS, FIXTURE_RUNS, ROCM_RED, load_fixture
from tests.reports.test_browser import Watched, _serve_built, _Server
from tests.reports.test_decision import REFUSED, ROCM_LINEAGE, bad_runs

browser, watched = test_browser.browser, test_browser.watched  # the same Chromium and page fixtures

DECISION = "#decision-table tbody tr[data-verdict]"
PARITY = "conformance/checks/test_logit_parity.py::test_greedy_logprobs_match_reference"
JUDGED = {"20261201T112759-cuda-5b65f0": ("20261201T112800-cuda-limit1", 16.0),
          "20261201T112918-cuda-45f576": ("20261201T112919-cuda-limit2", 0.002)}


def copy_with_limits(runs: Path) -> None:
    """Each run of `JUDGED` copied one second later under a new id, its parity check's record carrying the limit of
    `max_abs_dlogprob` it was judged by (bf16: 16, fp32: 2e-3) as results.json now records them."""
    for source, (run_id, value) in JUDGED.items():
        rec = load_fixture(source, DEVICE_RUNS)
        started = f"{run_id[:4]}-{run_id[4:6]}-{run_id[6:8]}T{run_id[9:11]}:{run_id[11:13]}:{run_id[13:15]}+00:00"
        rec.update(run_id=run_id, started_at=started, finished_at=started,
                   suite={"version": "0.9.0", "commit": "0123abc", "data_hash": "sha256:feed"})
        for check in rec["checks"]:
            check["limits"] = ({"max_abs_dlogprob": {"value": value, "kind": "max",
                                                     "source": f"tolerances.toml logprobs max_abs ({value:g})"}}
                               if check["id"] == PARITY else {})
        write_run(runs / run_id, rec, None, {})


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Server]:
    runs = tmp_path_factory.mktemp("runs")
    for source in (FIXTURE_RUNS, DEVICE_RUNS):
        for run in source.iterdir():
            shutil.copytree(run, runs / run.name)
    bad_runs(runs)
    copy_with_limits(runs)
    served = _serve_built(runs, tmp_path_factory.mktemp("work"))
    yield served
    served.close()


def _clean(seen: Watched) -> None:
    assert seen.problems() == [], seen.problems()
    assert seen.outside() == [], seen.outside()


def test_every_combination_names_a_verdict_and_its_reasons(site: _Server, watched: Watched) -> None:
    page = watched.open(site.url).page
    rows = page.locator(DECISION)
    assert rows.count() >= 10
    for row in rows.all():
        verdict = row.get_attribute("data-verdict")
        assert verdict in LEVELS
        assert row.locator(".verdict").first.inner_text() == verdict
        if verdict != SAFE:
            assert row.locator("ul.reasons li").count() >= 1
        if row.get_attribute("data-lineage") != row.get_attribute("data-combo"):  # a lineage, not a combo never run
            assert row.locator(".cov").count() >= 1  # coverage beside every pass rate
    rocm = page.locator(f'{DECISION}[data-lineage="{ROCM_LINEAGE}"]')
    assert rocm.get_attribute("data-verdict") == "not safe"  # as the samples alone say
    text = rocm.text_content()
    assert "P0 (the gate)" in text and "narrowed by -k parity" in text and "interrupted (complete: false)" in text
    assert "refused" in text and ROCM_RED in text
    rocm.locator("details.why summary").click()  # the reasons open on a click
    assert rocm.locator("ul.reasons").is_visible() and "narrowed by -k parity" in rocm.inner_text()
    partial = page.locator(f'{DECISION}[data-lineage="rocm gfx942 · vllm · rocm-partial · gpt-oss-120b · bfloat16"]')
    assert partial.get_attribute("data-verdict") == "no evidence"
    refused = page.locator(DECISION, has_text=REFUSED)
    assert refused.get_attribute("data-verdict") == "no evidence"
    assert "CUDA counterpart" in page.locator("#decision-table thead").inner_text()
    # the refused and partial runs are no ROCm failure: parity counts the samples' five only
    assert page.locator("#disagreement-count").inner_text() == "5"
    _clean(watched)


def test_a_run_id_opens_its_page_with_checks_limits_and_logs(site: _Server, watched: Watched) -> None:
    """The runs list links the newest runs (older ones are in the history store), and every run keeps its page: an
    older run's, opened from its address, holds its checks, limits and logs."""
    page = watched.open(site.url).page
    newest = max((p for p in DEVICE_RUNS.iterdir() if (p / "results.json").is_file()),
                 key=lambda p: json.loads((p / "results.json").read_text())["started_at"])
    page.locator(f'#runs a.run[href="runs/{newest.name}.html"]').click()
    page.wait_for_selector("body[data-ready='1']", state="attached")
    assert newest.name in page.locator("h1").inner_text()
    page = watched.open(site.url + "runs/20261201T112918-cuda-45f576.html").page
    assert page.locator("#run-checks > tbody > tr").count() == 25
    assert page.locator('tr[data-figure="max_abs_dlogprob"][data-limit]').count() == 0  # it recorded none
    assert "limit not recorded" in page.locator('tr[data-figure="max_abs_dlogprob"]').inner_text()
    assert "run.dtype" in page.locator("#changes").inner_text()
    logs = page.locator("dl.head a", has_text=".log")
    assert logs.count() == len(list((DEVICE_RUNS / "20261201T112918-cuda-45f576").glob("*.log"))) > 0
    for href in logs.evaluate_all("links => links.map(a => a.getAttribute('href'))"):
        response = page.request.get(site.url + "runs/" + href)
        assert response.ok
        assert response.body() == (DEVICE_RUNS / "20261201T112918-cuda-45f576" / href.split("/")[-1]).read_bytes()
    _clean(watched)


def test_a_check_page_plots_its_figure_against_the_limit(site: _Server, watched: Watched) -> None:
    page = watched.open(site.url).page
    page.locator("#matrix-table a.check", has_text="test_greedy_logprobs_match_reference").first.click()
    page.wait_for_selector("body[data-ready='1']", state="attached")
    assert page.locator("#check-history tbody tr").count() > 5
    card = page.locator('#figures .card[data-figure="max_abs_dlogprob"]')
    assert card.locator("svg line.limit").count() == 2  # the two limits the copies recorded, nothing read from data
    assert card.get_attribute("data-limits") == "16 0.002"
    assert page.locator("#check-history", has_text="not counted").count() == 1  # the partial runs are listed
    _clean(watched)


def test_a_not_counted_run_has_its_page(site: _Server, watched: Watched) -> None:
    page = watched.open(site.url).page
    page.locator(f'#not-counted a.run[href="runs/{REFUSED}.html"]').click()
    page.wait_for_selector("body[data-ready='1']", state="attached")
    assert page.locator("[data-evidence='0']").inner_text().startswith("not counted: refused")
    _clean(watched)


def test_a_run_page_shows_the_limits_it_was_judged_by(site: _Server, watched: Watched) -> None:
    page = watched.open(site.url + "runs/20261201T112919-cuda-limit2.html").page
    row = page.locator(f'#run-checks > tbody > tr[data-check="{PARITY}"]')
    limit = row.locator('tr[data-figure="max_abs_dlogprob"]')
    assert limit.get_attribute("data-limit") == "0.002" and limit.get_attribute("data-limit-kind") == "max"
    assert "≤ 0.002 (tolerances.toml logprobs max_abs (0.002))" in limit.inner_text()
    assert "no limit (an input or a count)" in row.locator('tr[data-figure="compared_steps"]').inner_text()
    assert "version 0.9.0 · commit 0123abc · data hash sha256:feed" in page.locator("[data-suite]").inner_text()
    _clean(watched)
