"""The release decision, the run pages and the check pages in a real headless Chromium (as test_browser.py: Debian's
`chromium` through Playwright, the site served from localhost), on the recorded runs (fixtures/runs,
fixtures/device_runs) and on bad ones: a narrowed, an interrupted and a refused run appear as not counted and leave
the lineage's verdict as it was; a combo with only such runs shows "not enough evidence"."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator

import pytest

from tests.reports import test_browser
from tests.reports.conftest import FIXTURE_RUNS, ROCM_RED
from tests.reports.test_browser import Watched, _serve_built, _Server
from tests.reports.test_decision import DEVICE_RUNS, REFUSED, ROCM_LINEAGE, bad_runs

browser, watched = test_browser.browser, test_browser.watched  # the same Chromium and page fixtures

DECISION = "#decision-table tbody tr"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Server]:
    runs = tmp_path_factory.mktemp("runs")
    for source in (FIXTURE_RUNS, DEVICE_RUNS):
        for run in source.iterdir():
            shutil.copytree(run, runs / run.name)
    bad_runs(runs)
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
        assert verdict in ("production-safe", "not safe", "not enough evidence")
        assert row.locator(".verdict").first.inner_text() == verdict
        if verdict != "production-safe":
            assert row.locator("ul.reasons li").count() >= 1
        assert row.locator(".cov").count() >= 1  # coverage beside every pass rate
    rocm = page.locator(f'{DECISION}[data-lineage="{ROCM_LINEAGE}"]')
    assert rocm.get_attribute("data-verdict") == "not safe"  # as the samples alone say
    text = rocm.inner_text()
    assert "P0 (the gate)" in text and "narrowed by -k parity" in text and "interrupted (complete: false)" in text
    assert "refused" in text and ROCM_RED in text
    partial = page.locator(f'{DECISION}[data-lineage="rocm gfx942 · vllm · rocm-partial · gpt-oss-120b · bfloat16"]')
    assert partial.get_attribute("data-verdict") == "not enough evidence"
    refused = page.locator(DECISION, has_text=REFUSED)
    assert refused.get_attribute("data-verdict") == "not enough evidence"
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
    assert page.locator('tr[data-figure="max_abs_dlogprob"][data-limit="0.002"]').count() == 1
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
    assert page.locator('#figures .card[data-figure="max_abs_dlogprob"] svg line.limit').count() >= 2
    assert page.locator("#check-history", has_text="not counted").count() == 1  # the partial runs are listed
    _clean(watched)


def test_a_not_counted_run_has_its_page(site: _Server, watched: Watched) -> None:
    page = watched.open(site.url).page
    page.locator(f'#not-counted a.run[href="runs/{REFUSED}.html"]').click()
    page.wait_for_selector("body[data-ready='1']", state="attached")
    assert page.locator("[data-evidence='0']").inner_text().startswith("not counted: refused")
    _clean(watched)
