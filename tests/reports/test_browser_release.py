"""The release decision as a release manager first sees it, in a real headless Chromium at 1400×900 (as
test_browser.py: Debian's `chromium` through Playwright, the site served from localhost), on the kept device and CPU
runs (fixtures/device_runs, fixtures/cpu_runs) and two of them copied with the limits they were judged by recorded:
the decision row of every combination of ci/matrix.toml is on the first screen without scrolling, the ROCm-vs-CUDA
view says "no ROCm evidence" (there is no ROCm run that counts), no lineage of a test model reads production-safe,
and a run's page shows the limits it was judged by."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser

from reports.claims import certified_combos
from reports.verdict import LEVELS, SAFE, TEST_MODEL
from tests.reports import test_browser
from tests.reports.conftest import CPU_RUNS, DEVICE_RUNS
from tests.reports.test_browser import Watched, _serve_built, _Server
from tests.reports.test_browser_decision import JUDGED, PARITY, copy_with_limits

browser = test_browser.browser  # the same Chromium
FIRST_SCREEN = {"width": 1400, "height": 900}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Server]:
    runs = tmp_path_factory.mktemp("runs")
    for source in (DEVICE_RUNS, CPU_RUNS):
        for run in source.iterdir():
            shutil.copytree(run, runs / run.name)
    copy_with_limits(runs)
    served = _serve_built(runs, tmp_path_factory.mktemp("work"))
    yield served
    served.close()


@pytest.fixture
def first_screen(browser: Browser) -> Iterator[Watched]:
    context = browser.new_context(viewport=FIRST_SCREEN)
    page = context.new_page()
    seen = Watched(page)
    page.on("console", lambda message: seen.console.append(message))
    page.on("pageerror", lambda exc: seen.errors.append(f"pageerror: {exc}"))
    page.on("request", lambda request: seen.requests.append(request.url))
    yield seen
    context.close()


def _clean(seen: Watched) -> None:
    assert seen.problems() == [], seen.problems()
    assert seen.outside() == [], seen.outside()


def test_the_first_screen_shows_the_decision_of_every_certified_combination(site: _Server,
                                                                           first_screen: Watched) -> None:
    page = first_screen.open(site.url).page
    assert page.evaluate("window.scrollY") == 0
    combos = [c.id for c in certified_combos()]
    rows = page.locator('#decision-table tbody tr[data-certified="1"]')
    assert rows.evaluate_all("rows => rows.map(r => r.dataset.combo)") == combos
    for row in [*rows.all(), page.locator("#decision-table thead")]:
        box = row.bounding_box()
        assert box is not None and box["y"] >= 0 and box["x"] >= 0, box
        assert box["y"] + box["height"] <= FIRST_SCREEN["height"], (row.get_attribute("data-combo"), box)
        assert box["x"] + box["width"] <= FIRST_SCREEN["width"], (row.get_attribute("data-combo"), box)
        assert row.is_visible()
    for row in rows.all():  # none ran: each reads "no evidence" on the first screen, its reason one line under
        assert row.get_attribute("data-verdict") == "no evidence"
        assert row.locator(".verdict").first.inner_text() == "no evidence"
        assert row.locator("details.why summary").inner_text().startswith("never run")
    if os.environ.get("CONFORMANCE_TEST_OUTPUT"):  # kept for a person to look at, as test_browser.py keeps its own
        out = Path(os.environ["CONFORMANCE_TEST_OUTPUT"])
        out.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(out / "decision-first-screen.png"))
    _clean(first_screen)


def test_rocm_reads_no_rocm_evidence_and_no_test_model_reads_production_safe(site: _Server,
                                                                            first_screen: Watched) -> None:
    page = first_screen.open(site.url).page
    assert page.locator('[data-tile="ROCm vs CUDA"] .tval').inner_text() == "no ROCm evidence"
    assert page.locator("#disagreement-count").inner_text() == "no ROCm evidence"
    assert "ROCm agrees with CUDA" not in page.locator("#rocm-cuda").inner_text()
    rows = page.locator("#decision-table tbody tr[data-verdict]")
    lineages = rows.evaluate_all("rows => rows.map(r => [r.dataset.lineage, r.dataset.verdict, r.dataset.target])")
    assert len(lineages) > len(certified_combos()) and all(verdict in LEVELS for _, verdict, _ in lineages)
    test_models = [(key, verdict) for key, verdict, _ in lineages if "tiny-gpt-oss" in key or "realdim" in key]
    assert len(test_models) >= 10 and not [key for key, verdict in test_models if verdict == SAFE]
    assert SAFE not in {verdict for _, verdict, _ in lineages}  # the kept runs are all of test models
    assert not [key for key, verdict, target in lineages if target == "rocm" and verdict != "no evidence"]
    # a test model's lineage says why it is capped, behind its first reason
    vllm = page.locator('#decision-table tr[data-lineage="cuda H200 · vllm · installed · tiny-gpt-oss · bfloat16 · '
                        'profile h200-tiny"]')
    assert vllm.get_attribute("data-verdict") == "not safe" and vllm.get_attribute("data-flaky") == "7"
    vllm.locator("details.why summary").click()
    assert "test model (tiny-gpt-oss" in vllm.locator("ul.reasons").inner_text()
    assert vllm.locator("ul.flaky li").count() == 7
    assert TEST_MODEL in page.locator("#decision-levels").inner_text()
    _clean(first_screen)


def test_a_run_page_shows_the_limits_it_was_judged_by(site: _Server, first_screen: Watched) -> None:
    (copied, value), = [v for k, v in JUDGED.items() if k == "20261201T112918-cuda-45f576"]
    page = first_screen.open(f"{site.url}runs/{copied}.html").page
    figure = page.locator(f'#run-checks > tbody > tr[data-check="{PARITY}"] tr[data-figure="max_abs_dlogprob"]')
    assert figure.get_attribute("data-limit") == f"{value:g}" and "≤ 0.002" in figure.inner_text()
    assert "version 0.9.0" in page.locator("[data-suite]").inner_text()
    kept = first_screen.open(f"{site.url}runs/20261201T112918-cuda-45f576.html").page
    assert "limit not recorded" in kept.locator(f'#run-checks > tbody > tr[data-check="{PARITY}"] '
                                                'tr[data-figure="max_abs_dlogprob"]').inner_text()
    _clean(first_screen)

