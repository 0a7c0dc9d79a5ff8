"""The dashboard in a real headless Chromium (Debian's `chromium`): it renders, its script runs without
console errors, the filters work, it fetches nothing but the page itself, and a screenshot is kept.

Without Chromium these tests fail (install it with `apt-get install -y chromium`), unless
CONFORMANCE_ALLOW_NO_BROWSER=1, when they are skipped with that reason. Screenshots go to
$CONFORMANCE_TEST_OUTPUT when set, else to pytest's temporary directory.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from reports.dashboard import build
from reports.render import CSP
from tests.reports.conftest import FIXTURE_RUNS

BROWSER_NAMES = ("chromium", "chromium-browser", "google-chrome")
TOTAL_CHECKS = 23  # distinct checks in the sample runs


def find_browser() -> str:
    for name in BROWSER_NAMES:
        path = shutil.which(name)
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


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Server]:
    work = tmp_path_factory.mktemp("site")
    build(FIXTURE_RUNS, work / "history.sqlite", work / "site")
    served = _Server(work / "site")
    yield served
    served.close()


def run_chromium(browser: str, profile: Path, url: str, *args: str) -> tuple[str, list[str]]:
    """Run headless Chromium on `url`; returns stdout and the page's console lines."""
    command = [
        browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--disable-extensions", "--disable-default-apps",
        "--no-first-run", "--no-default-browser-check", f"--user-data-dir={profile}",
        # Belt and braces: even if the page tried, no name but localhost resolves.
        "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
        "--enable-logging=stderr", "--v=0", *args, url,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, f"chromium exited {done.returncode}: {done.stderr[-2000:]}"
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
    return done.stdout, console


def assert_clean_console(console: list[str]) -> None:
    problems = [line for line in console
                if any(word in line for word in ("Uncaught", "Content Security Policy", "Error", "error"))]
    assert problems == [], problems
    assert any(f"dashboard ready: {TOTAL_CHECKS} checks" in line for line in console), console


def test_dashboard_renders_and_its_script_runs(server: _Server, tmp_path: Path) -> None:
    server.paths.clear()
    dom, console = run_chromium(find_browser(), tmp_path / "profile", server.url, "--dump-dom")
    assert 'data-ready="1"' in dom  # set by the page's script at the end of its run
    assert f"{TOTAL_CHECKS} of {TOTAL_CHECKS} checks shown" in dom
    assert dom.count('class="colhead"') == 6  # three platforms, in the pass-rate table and the matrix
    assert dom.count("data-everywhere=") == TOTAL_CHECKS
    # The parity scores: 18 of 23 checks pass on every platform; P0 engine 3 of 3.
    assert 'data-score="0.7826"' in dom and "78% <small>18/23</small>" in dom
    assert '<b id="disagreement-count">5</b>' in dom
    assert_clean_console(console)
    # The page fetched nothing but itself: no favicon, no asset, no script, no font.
    assert server.paths == ["/"], server.paths


@pytest.mark.parametrize("fragment, shown", [
    ("q=logit_parity", 1),
    ("tier=p1&disagree=1", 3),
    ("broken=1", TOTAL_CHECKS - 18),
])
def test_matrix_filters_work(server: _Server, tmp_path: Path, fragment: str, shown: int) -> None:
    url = f"{server.url}#{fragment}"
    dom, console = run_chromium(find_browser(), tmp_path / "profile", url, "--dump-dom")
    assert f"{shown} of {TOTAL_CHECKS} checks shown" in dom
    assert f'data-visible="{shown}"' in dom
    assert_clean_console(console)


def test_console_capture_sees_a_blocked_external_fetch(tmp_path: Path) -> None:
    """Negative control: with the dashboard's CSP, a page that tries to fetch from outside is caught."""
    browser = find_browser()
    root = tmp_path / "bad"
    root.mkdir()
    (root / "index.html").write_text(
        f'<!doctype html><html><head><meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<link rel="icon" href="data:,"></head><body><img src="https://example.invalid/x.png">'
        f'<script>console.info("dashboard ready: {TOTAL_CHECKS} checks")</script></body></html>')
    served = _Server(root)
    try:
        _, console = run_chromium(browser, tmp_path / "profile", served.url, "--dump-dom")
    finally:
        served.close()
    with pytest.raises(AssertionError, match="Content Security Policy"):
        assert_clean_console(console)


def test_screenshot_is_kept(server: _Server, tmp_path: Path) -> None:
    browser = find_browser()
    out_dir = Path(os.environ.get("CONFORMANCE_TEST_OUTPUT", tmp_path))
    out_dir.mkdir(parents=True, exist_ok=True)
    shot = out_dir / "dashboard.png"
    shot.unlink(missing_ok=True)
    run_chromium(browser, tmp_path / "profile", server.url, "--hide-scrollbars", "--window-size=1440,2400",
                 f"--screenshot={shot}")
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    # A blank page of this size compresses to about 15 KB; the rendered dashboard is several hundred.
    assert len(data) > 150_000, f"{shot} is only {len(data)} bytes: did the page render?"
    print(f"dashboard screenshot: {shot}")
