"""The dashboard in a real headless Chromium (Debian's `chromium`), driven by Playwright: it renders, its script
runs without console errors, the filters work when typed into and clicked, nothing but localhost is requested,
run text stays text, and a screenshot is kept.

Without Chromium these tests fail (install it with `apt-get install -y chromium`), unless
CONFORMANCE_ALLOW_NO_BROWSER=1, when they are skipped with that reason. Playwright's own browser downloads are
never used (`playwright install` is not needed): the system Chromium is launched through `executable_path`.
Screenshots go to $CONFORMANCE_TEST_OUTPUT when set, else to pytest's temporary directory.
"""

from __future__ import annotations

import functools
import os
import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, sync_playwright

from reports.dashboard import build
from reports.render import CSP
from reports.results import write_run
from tests.reports.conftest import FIXTURE_RUNS, make_record

DEVICE_RUNS = FIXTURE_RUNS.parent / "device_runs"
TOTAL_CHECKS = 23  # distinct checks in the sample runs
SAMPLE_PLATFORMS = ["cuda H200 / torch 2.8 / vllm 0.11", "rocm gfx942 / torch 2.8 / vllm 0.11",
                    "cpu avx2 / torch 2.13 / vllm 0.32"]
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
LOCAL_HOSTS = {"127.0.0.1", "localhost"}
ROWS = "#matrix-table tbody tr"


def find_browser() -> str:
    path = shutil.which("chromium")
    if path:
        return path
    if os.environ.get("CONFORMANCE_ALLOW_NO_BROWSER") == "1":
        pytest.skip("Chromium is not installed and CONFORMANCE_ALLOW_NO_BROWSER=1")
    pytest.fail("Chromium is not installed: run `apt-get install -y chromium` (or set "
                "CONFORMANCE_ALLOW_NO_BROWSER=1 to skip the browser tests)", pytrace=False)


class _Server:
    """A localhost HTTP server for one directory that remembers every path requested."""

    def __init__(self, root: Path) -> None:
        self.paths: list[str] = []
        outer = self

        class Handler(SimpleHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
                outer.paths.append(self.path)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(root)))
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _serve_built(runs: Path, work: Path) -> _Server:
    build(runs, work / "history.sqlite", work / "site")
    return _Server(work / "site")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Server]:
    served = _serve_built(FIXTURE_RUNS, tmp_path_factory.mktemp("site"))
    yield served
    served.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    executable = find_browser()
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@dataclass
class Watched:
    """A page with everything it logged, threw and requested."""

    page: Page
    console: list[ConsoleMessage] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)

    def open(self, url: str) -> Watched:
        self.page.goto(url)
        self.page.wait_for_selector("body[data-ready='1']", state="attached")
        return self

    def problems(self) -> list[str]:
        return [*self.errors, *(f"console.{m.type}: {m.text}" for m in self.console
                                if m.type == "error" or "Content Security Policy" in m.text)]

    def outside(self) -> list[str]:
        return [url for url in self.requests if urlsplit(url).hostname not in LOCAL_HOSTS]

    def assert_clean(self, total: int = TOTAL_CHECKS) -> None:
        assert self.problems() == [], self.problems()
        assert self.outside() == [], self.outside()
        texts = [m.text for m in self.console]
        assert f"dashboard ready: {total} checks" in texts, texts

    def visible_rows(self) -> int:
        return self.page.locator(f"{ROWS}:visible").count()

    def shown(self) -> str:
        return self.page.locator("#shown").inner_text()


@pytest.fixture
def watched(browser: Browser) -> Iterator[Watched]:
    context = browser.new_context(viewport={"width": 1440, "height": 2400})
    page = context.new_page()
    seen = Watched(page)
    page.on("console", lambda message: seen.console.append(message))
    page.on("pageerror", lambda exc: seen.errors.append(f"pageerror: {exc}"))
    page.on("request", lambda request: seen.requests.append(request.url))
    yield seen
    context.close()


def _column_labels(page: Page) -> list[str]:
    return page.locator("#matrix-table thead .colhead b").all_inner_texts()


def test_dashboard_renders_and_its_script_runs(server: _Server, watched: Watched) -> None:
    server.paths.clear()
    page = watched.open(server.url).page
    assert watched.shown() == f"{TOTAL_CHECKS} of {TOTAL_CHECKS} checks shown"
    assert page.locator(".colhead").count() == 6  # three platforms, in the pass-rate table and the matrix
    assert _column_labels(page) == SAMPLE_PLATFORMS  # the parity matrix shows the sample runs
    assert watched.visible_rows() == TOTAL_CHECKS
    assert page.locator(f"{ROWS}[data-everywhere]").count() == TOTAL_CHECKS
    assert page.locator(f"{ROWS} td.cell[data-outcome]").count() > TOTAL_CHECKS  # outcome pills are filled in
    # The parity scores: 18 of 23 checks pass on every platform; ROCm-vs-CUDA disagreements: 5.
    assert page.locator("[data-score='0.7826']").first.inner_text().replace("\n", " ") == "78% 18/23"
    assert page.locator("#disagreement-count").inner_text() == "5"
    watched.assert_clean()
    # The page fetched nothing but itself: no favicon, no asset, no script, no font.
    assert server.paths == ["/"], server.paths
    assert watched.requests == [server.url], watched.requests


def test_matrix_filters_work_by_interaction(server: _Server, watched: Watched) -> None:
    page = watched.open(server.url).page
    page.locator("#q").press_sequentially("logit_parity")
    assert watched.visible_rows() == 1 and watched.shown() == f"1 of {TOTAL_CHECKS} checks shown"
    assert "logit_parity" in page.locator(f"{ROWS}:visible").inner_text()
    assert urlsplit(page.url).fragment == "q=logit_parity"  # the filtered view can be linked to
    page.locator("#q").fill("")
    assert watched.visible_rows() == TOTAL_CHECKS

    page.locator("#tier").select_option("p1")
    p1_rows = watched.visible_rows()
    assert 3 < p1_rows < TOTAL_CHECKS
    assert set(page.locator(f"{ROWS}:visible").evaluate_all("rows => rows.map(r => r.dataset.tier)")) == {"p1"}
    page.locator("#only-disagree").check()
    assert watched.visible_rows() == 3 and watched.shown() == f"3 of {TOTAL_CHECKS} checks shown"
    page.locator("#only-disagree").uncheck()
    page.locator("#tier").select_option("")
    assert watched.visible_rows() == TOTAL_CHECKS

    page.locator("#only-broken").check()
    assert watched.visible_rows() == TOTAL_CHECKS - 18
    assert page.locator("#matrix-table").get_attribute("data-visible") == str(TOTAL_CHECKS - 18)
    watched.assert_clean()


def test_a_linked_filter_is_restored(server: _Server, watched: Watched) -> None:
    page = watched.open(f"{server.url}#tier=p1&disagree=1").page
    assert page.locator("#tier").input_value() == "p1" and page.locator("#only-disagree").is_checked()
    assert watched.visible_rows() == 3
    watched.assert_clean()


def test_guards_see_a_blocked_external_fetch(watched: Watched, tmp_path: Path) -> None:
    """Negative control: with the dashboard's CSP, a page that tries to fetch from outside is caught twice."""
    root = tmp_path / "bad"
    root.mkdir()
    (root / "index.html").write_text(
        f'<!doctype html><html><head><meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<link rel="icon" href="data:,"></head><body data-ready="1"><img src="https://example.invalid/x.png">'
        f'<script>console.info("dashboard ready: {TOTAL_CHECKS} checks")</script></body></html>')
    served = _Server(root)
    try:
        watched.open(served.url)
        watched.page.wait_for_timeout(200)  # let the refused image report itself
    finally:
        served.close()
    assert any("Content Security Policy" in p for p in watched.problems()), watched.problems()
    with pytest.raises(AssertionError, match="example.invalid"):
        assert watched.outside() == [], watched.outside()


def test_script_in_a_check_message_renders_as_text(watched: Watched, tmp_path: Path) -> None:
    nasty = "<script>window.pwned = 1; console.error('pwned')</script><img src=x onerror=window.pwned=2>"
    rec = make_record(run_id="20250101T000000Z-cuda-e5c4e0", target="cuda", checks=[
        {"id": "checks/test_x.py::test_<b>bold</b>", "outcome": "failed", "message": nasty}])
    write_run(tmp_path / "runs" / rec["run_id"], rec, None, {})
    served = _serve_built(tmp_path / "runs", tmp_path / "work")
    try:
        page = watched.open(served.url).page
        assert page.evaluate("window.pwned") is None
        assert page.locator("script").count() == 1  # only the page's own
        assert page.locator("img[src='x']").count() == 0
        assert page.locator("b", has_text="bold").count() == 0
        assert "<script>window.pwned = 1;" in page.locator("#failures-table").inner_text()
        assert "test_<b>bold</b>" in page.locator("#matrix-table").inner_text()
        watched.assert_clean(total=1)
    finally:
        served.close()


def test_samples_and_h200_device_runs_render_together(watched: Watched, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    for source in (FIXTURE_RUNS, DEVICE_RUNS):
        for run in source.iterdir():
            shutil.copytree(run, runs / run.name)
    served = _serve_built(runs, tmp_path / "work")
    try:
        page = watched.open(served.url).page
        labels = _column_labels(page)
        total = watched.visible_rows()
        assert total > TOTAL_CHECKS and watched.shown() == f"{total} of {total} checks shown"
        watched.assert_clean(total=total)
    finally:
        served.close()
    # The real H200 `--cuda` runs (torch 2.11) show up as a platform column next to the samples.
    assert "cuda H200 / torch 2.11" in labels, labels
    assert {"rocm gfx942 / torch 2.8 / vllm 0.11", "cpu avx2 / torch 2.13 / vllm 0.32"} <= set(labels), labels


def test_screenshot_is_kept(server: _Server, watched: Watched, tmp_path: Path) -> None:
    out_dir = Path(os.environ.get("CONFORMANCE_TEST_OUTPUT", tmp_path))
    out_dir.mkdir(parents=True, exist_ok=True)
    shot = out_dir / "dashboard.png"
    shot.unlink(missing_ok=True)
    watched.open(server.url).page.screenshot(path=str(shot))
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    # A blank page of this size compresses to about 15 KB; the rendered dashboard is several hundred.
    assert len(data) > 150_000, f"{shot} is only {len(data)} bytes: did the page render?"
    watched.assert_clean()
    print(f"dashboard screenshot: {shot}")
