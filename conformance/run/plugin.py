"""The suite's pytest plugin: options, target resolution, metadata lint, expectations, progress
lines, the closing summary table and the run record (results.json, junit.xml, fingerprint.json).

Loaded with `-p conformance.run.plugin` (the `conformance` CLI and the nox sessions do that).

The plugin's run-time rules kept out of plugin.py: the `--tier` selection, the xdist refusal, the run
header at session start, the heartbeat lines on the terminal and the `--server` address.

Tiers are a plugin option, not a `-m` expression, so that a user's own `-m "not slow"` (or `-k`) narrows the
tiers asked for instead of replacing them."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from conformance import datafiles
from conformance.engines import heartbeat, openai_api, vllm_server
from conformance.engines.vllm_server import SERVER_URL_ENV, ServerError
from conformance.monitor import machine_health
from conformance.monitor.cpu_features import amx as _cpu_amx
from conformance.run import capabilities, cli, phases, recorder, run_target, runrecord
from conformance.run.runcontext import RUN_KEY, RunContext, ctx_of
from conformance.run.runrecord import CheckRecord
from env_checks.record.results import CHECKS_LOG

# -- run options -----------------------------------------------------------------------------------------------------


XDIST_SENTENCE = ("the conformance plugin runs its checks in one process (its engines, server and run record are "
                  "per session), so it cannot run under pytest-xdist: drop -n/--dist (for one run per GPU use "
                  "`nox -s matrix -- --gpus N`).")


def refuse_xdist(config: pytest.Config) -> None:
    """A UsageError (one sentence) under `-n N` / `--dist`: without it the workers die on a KeyError."""
    opt = config.option
    if hasattr(config, "workerinput") or getattr(opt, "numprocesses", None) or \
            getattr(opt, "dist", "no") not in ("no", None):
        raise pytest.UsageError(XDIST_SENTENCE)


def selected_tiers(config: pytest.Config) -> tuple[str, ...]:
    try:
        return run_target.tiers_asked(config.option.tier)
    except ValueError as exc:
        raise pytest.UsageError(f"--tier: {exc}") from None


def deselect_other_tiers(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep the checks of the selected tiers; the others are reported as deselected, as `-m` would."""
    wanted = set(selected_tiers(config))
    if wanted == set(run_target.TIERS):
        return
    keep, drop = [], []
    for item in items:
        (keep if run_target.tier_of(m.name for m in item.iter_markers()) in wanted else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def configure_run(config: pytest.Config) -> None:
    """At pytest_configure: tier markers, heartbeats to the terminal, and the user's server if any."""
    for line in run_target.tier_marker_lines():
        config.addinivalue_line("markers", line)
    config.addinivalue_line("markers", phases.OWN_ENGINE_LINE)
    selected_tiers(config)  # a bad --tier is a usage error before anything starts
    try:
        heartbeat.to_fd(1)  # fd 1 is the terminal now; pytest's capture redirects it during each check
    except OSError:
        pass  # no stdout: the lines go to stderr
    try:
        url = openai_api.server_url(config.option.server, os.environ)
    except ServerError as exc:
        raise pytest.UsageError(str(exc)) from None
    if url:  # the serving checks read it; a user's server replaces the suite's own
        os.environ[SERVER_URL_ENV] = url


def print_header(session: pytest.Session, ctx: Any) -> None:
    """The run header, where pytest shows none (`-q`, `--no-header`: what `conformance run` uses)."""
    config = session.config
    tw = config.pluginmanager.get_plugin("terminalreporter")
    if tw is None or recorder.pytest_shows_header(config):
        return
    for line in header_lines(config, ctx):
        tw.write_line(line, bold=True)


def header_lines(config: pytest.Config, ctx: Any) -> list[str]:
    return recorder.run_header_lines(ctx, selected_tiers(config))


# -- plugin ----------------------------------------------------------------------------------------------------------


TIER_CHECKS = pytest.StashKey[int]()  # how many checks the run's tiers hold, before a -k / -m narrows them
REPORTS_EXISTED = pytest.StashKey[bool]()  # whether --reports-dir was there before the run


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("conformance", "GPU LLM inference stack conformance")
    g.addoption("--target", default=run_target.AUTO, choices=run_target.choices(),  # data/targets.toml
                help="stack to test; auto = the GPU torch sees, else the CPU default")
    for option in (*cli.target_flags(), *cli.OPTIONS):  # declared once, with the CLI (run/cli.py)
        option.add_to(g.addoption)
    g.addoption("--run-id", default=None, help="run id (default: time + target + random)")


def _new_run_id(target: str) -> str:
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + f"-{target}-{secrets.token_hex(3)}"


REPEAT_S = 3.0  # a repeat of the same interrupt within this is ignored: Ctrl-C signals the whole process group and
# `nox` passes its own signal on, so the run gets it twice at once
# How long each engine and server closing after an interrupt may take before it is killed: the run must exit within
# seconds of the signal (measured: tests/test_interrupt_at_random_times.py), its record written, nothing left running.
STOP_GRACE_S = 0.5
SESSION = "conformance-session"  # the name the run's session hooks are registered under


class RunSession:
    """The run's hooks that pytest calls without its config (a report, deselected items, a signal), with the state
    of its interrupts: one per pytest session, registered by `pytest_configure`, none kept in a module.

    `interrupted_at`: when the run was first interrupted (SIGINT or SIGTERM); `starting`: the session is still
    starting (an interrupt then waits for collection); `taken`: pytest has the KeyboardInterrupt."""

    def __init__(self, config: pytest.Config, ctx: RunContext) -> None:
        self.config, self.ctx = config, ctx
        self.interrupted_at: float | None = None
        self.starting = True
        self.taken = False
        self.handlers: dict[int, Any] = {}  # the handlers before the run's, put back at its end
        self.close_graces: tuple[float, float] | None = None  # the engines' and servers' close waits before a stop
        self.server_url = os.environ.get(SERVER_URL_ENV)  # as before the run: --server sets it for this run only

    def catch_interrupts(self) -> None:
        self.handlers[signal.SIGTERM] = signal.signal(signal.SIGTERM, self.interrupt)
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # one started with SIGINT ignored keeps it
            self.handlers[signal.SIGINT] = signal.signal(signal.SIGINT, self.interrupt)

    def interrupt(self, signum: int, frame: Any) -> None:
        """Ctrl-C, a CI cancellation or nox passing either on: the run stops and still writes itself, incomplete
        (exit 2). A repeat within REPEAT_S is ignored, so that it cannot cut the record short."""
        now = time.monotonic()
        if self.interrupted_at is not None and now - self.interrupted_at < REPEAT_S:
            return
        first = self.interrupted_at is None
        self.interrupted_at = now
        if self.starting and first:
            # pytest writes nothing for an interrupt inside its session start (its sessionfinish never comes): taken
            # at the start of collection instead; a second one, past REPEAT_S, stops it at once
            return
        self.stop(f"signal {signum}")

    def stop(self, why: str) -> None:
        """Stop the run now: engines and servers get a short close, and pytest the KeyboardInterrupt it writes the
        run after."""
        from conformance.engines import worker

        self.ctx.stopping.set()  # nothing in the background launches a process from now on
        if self.close_graces is None:
            self.close_graces = (worker.CLOSE_TIMEOUT_S, vllm_server.CLOSE_GRACE_S)
        worker.CLOSE_TIMEOUT_S = vllm_server.CLOSE_GRACE_S = STOP_GRACE_S
        raise KeyboardInterrupt(why)

    def release(self) -> None:
        """The run's end: the signal handlers, the close waits and the user's server as they were before it."""
        from conformance.engines import worker

        while self.handlers:
            signal.signal(*self.handlers.popitem())
        if self.server_url is None:  # a later run in this process (tests call `conformance run` in-process) starts
            os.environ.pop(SERVER_URL_ENV, None)  # its own server again, unless it names one
        else:
            os.environ[SERVER_URL_ENV] = self.server_url
        if self.close_graces is not None:
            worker.CLOSE_TIMEOUT_S, vllm_server.CLOSE_GRACE_S = self.close_graces

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection(self, session: pytest.Session) -> None:
        """The session has begun (pytest now writes the run whatever ends it): an interrupt that came during its
        start is taken here, so the run is written, incomplete (exit 2), as one that came later."""
        self.starting = False
        if self.interrupted_at is not None:
            self.stop("signal during the run's start")

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        """A check of the run's tiers taken out after collection (-k, -m, --deselect, --lf, a plugin): the run no
        longer judges its whole tiers. The other tiers' checks, deselected by --tier, are not the run's."""
        tiers = selected_tiers(self.config)
        self.ctx.ledger.deselected += [runrecord.check_id(item.nodeid) for item in items
                                       if runrecord.tier_of_item(item) in tiers]

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        """After deselection: the server checks last, and the builds the selected checks need begin."""
        if hasattr(config, "workerinput") or not items:
            return
        from conformance.engines import compile_cache

        phases.order_checks(items)
        compile_cache.forget_keys()
        self.ctx.phases.record("startup", time.perf_counter() - phases.T0)
        if not self.ctx.resolved().problems:
            self.ctx.phases.start_builds(phases.build_jobs(self.ctx, items))

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """After the plugin has started the forkserver: time its imports."""
        self.ctx.phases.forkserver_ready()

    def pytest_runtest_logfinish(self, nodeid: str, location: Any) -> None:
        self.ctx.phases.mark("checks_done")  # the last one wins: the end of the last check
        factory = self.ctx.engine_factory
        if factory is not None:  # engines started ahead for checks now over are closed; the next one starts
            factory.finished(nodeid)

    @pytest.hookimpl(tryfirst=True)
    def pytest_keyboard_interrupt(self, excinfo: Any) -> None:
        self.taken = True
        # An interrupt that lands on an instruction of no source line leaves a frame without a line number
        # (tb_lineno None, Python 3.11); pytest's own report of the interrupt then crashed (TypeError in getrepr)
        # and the run ended with exit code 1 instead of 2. Such frames say nothing to the reader: they are left out.
        excinfo.traceback = excinfo.traceback.filter(lambda entry: entry._rawentry.tb_lineno is not None)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if self.interrupted_at is not None and not self.taken:  # raised where Python only prints it (a finalizer,
            raise KeyboardInterrupt("a signal earlier in this check")  # a gc callback): the run stops here instead
        _log_report(self.config, self.ctx, report)


def session_of(config: pytest.Config) -> RunSession:
    return config.pluginmanager.get_plugin(SESSION)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    refuse_xdist(config)  # a usage error under -n, not a KeyError in the workers
    opt = config.option
    report = run_target.resolve(opt.target)
    try:  # --engine, --dtype (every limit the checks read) and --profile against the data: one sentence each
        target = run_target.build(report.resolved, opt.engine, opt.dtype, report, opt.target, opt.model, opt.profile,
                                  gate_only=selected_tiers(config) == ("p0",))
    except (run_target.RunRefused, datafiles.DataError) as exc:
        raise pytest.UsageError(str(exc)) from None
    run_id = opt.run_id or _new_run_id(target.name)
    run_dir = Path(opt.reports_dir) / run_id
    if run_dir.exists():
        raise pytest.UsageError(f"run directory {run_dir} already exists: pick another --run-id.")
    config.stash[REPORTS_EXISTED] = run_dir.parent.exists()
    narrowed_by = runrecord.narrowing_options(opt, list(config.args))
    ctx = RunContext(run_id, run_dir, runrecord.now_iso(), target, opt.combo, opt.planted_fault, narrowed_by)
    config.stash[RUN_KEY] = ctx
    session = RunSession(config, ctx)
    config.pluginmanager.register(session, SESSION)
    if not getattr(opt, "xmlpath", None):
        opt.xmlpath = str(run_dir / "junit.xml")  # read later by pytest's own junitxml plugin
    session.catch_interrupts()
    configure_run(config)  # tier markers, heartbeat lines, --server (root URL, $OPENAI_BASE_URL)
    # the tiers' checks, known before collection: a run stopped before it names every one as not run
    ctx.ledger.expected = runrecord.tier_functions(selected_tiers(config),
                                                  runrecord.checks_dir(config.rootpath))
    from conformance.run import preflight  # every argument, once, before any check, engine or server starts

    bad = preflight.problems(opt, report, os.environ.get(vllm_server.SERVER_URL_ENV) if opt.server else None,
                             target.engine)
    if bad:
        raise pytest.UsageError("\n".join(bad))
    if opt.compile_cache:  # before any engine, server or forkserver starts: they inherit the variables
        from conformance.engines import compile_cache

        try:
            compile_cache.use(Path(opt.compile_cache))
        except compile_cache.CompileCacheError as exc:
            raise pytest.UsageError(str(exc)) from None
    capabilities.register(config)  # the `needs` marker: what a check needs of the engine (data/engines.toml)
    for value, env in ((opt.tokenizer_vocab, "CONFORMANCE_TOKENIZER_VOCAB"), (opt.eval_data, "CONFORMANCE_EVAL_DATA"),
                       (opt.history_db, "CONFORMANCE_HISTORY_DB")):
        if value:
            os.environ[env] = value
    from conformance.run import fixtures, serving_fixtures

    config.pluginmanager.register(fixtures, "conformance-fixtures")
    config.pluginmanager.register(serving_fixtures, "conformance-serving-fixtures")


def pytest_report_header(config: pytest.Config) -> list[str]:
    return header_lines(config, ctx_of(config))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    ctx = ctx_of(config)
    bad = [f"{item.nodeid} {p}" for item in items for p in runrecord.check_metadata_problems(item)]
    if bad:
        raise pytest.UsageError("checks without required metadata (docs/contributing.md):\n  " + "\n  ".join(bad))
    named = capabilities.lint(items)  # not applicable: a capability, never a name comparison; no: a verdict
    if named:
        raise pytest.UsageError("\n".join(named))
    t = ctx.resolved()
    run_info = {"target": t.resolved, "engine": ctx.engine, "dtype": ctx.dtype_name,
                "torch_flavour": t.torch_flavour, "gcn_arch": sorted(set(t.gcn_arch)), "cpu_isa": _cpu_isa(),
                "cpu_amx": _cpu_amx(), "missing_modules": capabilities.missing_modules(),
                "needs_device": ctx.target.needs_device, "versions": capabilities.installed_versions()}
    profile = ctx.target.profile  # the serving profile's SKU (H200, MI300X, cpu) and model (tiny, gpt-oss-120b)
    run_info |= {"sku": profile.sku, "model": profile.model} if profile is not None else {}
    ctx.unmatched_expectations = capabilities.apply_expectations(items, run_info)
    check_s = ctx.target.timeouts.check_s
    for item in items:
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(check_s))  # a hang is that check's timeout failure
    deselect_other_tiers(config, items)  # --tier; a user's -m / -k narrow it further
    config.stash[TIER_CHECKS] = len(items)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Records for the checks that will run (after -k / -m deselection)."""
    if sys.exc_info()[0] is not None:  # pytest calls this as collection fails too (a UsageError on its way out)
        return  # nothing is recorded or started for a run that is refused
    ctx, items = ctx_of(session.config), session.items
    from conformance.run import preflight

    none = preflight.selection(ctx.narrowed_by, len(items), session.config.stash.get(TIER_CHECKS, 0),
                               selected_tiers(session.config))
    if none:
        raise pytest.UsageError(none)  # pytest_sessionfinish records nothing
    for item in items:
        tier = runrecord.tier_of_item(item)
        ref = runrecord.docstring_field(item.function, "Reference") or ""
        ctx.records[item.nodeid] = CheckRecord(runrecord.check_id(item.nodeid), tier, runrecord.area_of(item), ref)
    ctx.collected = len(items)
    ctx.ledger.collected = [r.id for r in ctx.records.values()]
    target = ctx.target
    from conformance.engines import forkserver

    engines = not target.problems and phases.need_engines(items)
    if engines and target.forks_engines:
        # its imports (vLLM, transformers) overlap the checks that need no engine; a run whose checks
        # start no engine (platform checks alone) does not import vLLM a second time for nothing
        forkserver.start(dict(target.env), vllm=target.start_method("vllm") == "forkserver",
                         more=target.table.get("forkserver_preload", ()))
    if engines and target.inspects_vllm_in_an_interpreter(ctx.engine):
        forkserver.inspect_in_a_fresh_interpreter(dict(target.env))  # vLLM's model inspection, ahead of them
    prestart = bool(target.table.get("server_prestart", True))  # targets.toml: not beside a GPU engine's start
    if prestart and any("server" in getattr(item, "fixturenames", ()) for item in items):
        from conformance.run.serving_fixtures import prestart_server

        prestart_server(ctx)


def _cpu_isa() -> str:
    from conformance.monitor.cpu_features import vector_isa

    return vector_isa()


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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    """The exception a check failed on, kept on its report for the failure class (runrecord.classify)."""
    outcome = yield
    outcome.get_result().exception_chain = runrecord.exception_chain(call.excinfo.value if call.excinfo else None)


def _log_report(config: pytest.Config, ctx: RunContext, report: pytest.TestReport) -> None:
    """A check's report into its record (outcome, duration, figures, limits), and its progress line."""
    rec = ctx.records.get(report.nodeid)
    if rec is None:
        return
    rec.duration_s += report.duration
    for key, value in report.user_properties:
        if str(key).startswith("figure:"):
            rec.figures[key.removeprefix("figure:")] = value
        elif str(key).startswith("limit:"):
            rec.limits[key.removeprefix("limit:")] = value
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
        ctx.ledger.reported.add(rec.id)
        rec.outcome, rec.message = outcome, _message(report)
        rec.failure_class = runrecord.classify(outcome, rec.message, getattr(report, "exception_chain", None))
        rec.bug_link = capabilities.link_of(rec.message) if outcome in ("xfailed", "xpassed") else None
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
        if rec.outcome in ("failed", "error") and rec.message.strip():  # why, at once, not only in the summary
            tw.write_line(f"    {rec.message.strip().splitlines()[0][:300]}", **colour)
    # each check's record as it finished: a run whose node is lost before results.json keeps what it judged
    ctx.run_dir.mkdir(parents=True, exist_ok=True)
    with (ctx.run_dir / CHECKS_LOG).open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(rec.as_dict(), default=str) + "\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config) -> Any:
    outcome = yield
    res = outcome.get_result()
    if res and config.option.verbose <= 0:
        outcome.force_result((res[0], "", res[2]))  # our progress line replaces pytest's dots


@pytest.hookimpl(trylast=True)  # after pytest's own header, if it shows one
def pytest_sessionstart(session: pytest.Session) -> None:
    print_header(session, ctx_of(session.config))  # where -q / --no-header hide pytest's header
    from conformance.reference import cache  # conformance/reference/cache.py

    cache.reset_counts()
    if not session.config.option.fresh_reference:
        cache.enable(datafiles.cache_root() / "reference-results")
    if session.config.option.reference_pack:  # a pack for another prompt set or version: refused before anything runs
        from conformance.checkpoints.models import tiny_gpt_oss
        from conformance.reference import pack
        from conformance.verdicts import settings

        model = session.config.option.model
        try:
            pack.open_for_run(Path(session.config.option.reference_pack), Path(model) if model else tiny_gpt_oss().path,
                              settings.tiny_prompts, read=not session.config.option.fresh_reference)
        except pack.PackRefused as exc:
            raise pytest.UsageError(str(exc)) from None
    if not hasattr(session.config, "workerinput"):  # before/after snapshots and telemetry: machine_health.py
        machine_health.start(ctx_of(session.config).target.name, session.config.option.health_policy)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    from conformance.run import recorder, serving_fixtures

    ctx = ctx_of(session.config)
    serving_fixtures.discard_prestarted(ctx)
    if exitstatus == pytest.ExitCode.USAGE_ERROR or session.config.option.collectonly:
        # refused once the session began (-k selecting none), or a listing (--collect-only): no run is recorded
        machine_health.finish()  # its telemetry stopped; its record goes nowhere
        _discard(ctx.run_dir, session.config)
        return
    if session_of(session.config).interrupted_at is not None:  # even if the KeyboardInterrupt got lost
        session.exitstatus = exitstatus = pytest.ExitCode.INTERRUPTED
    ran = [r for r in ctx.records.values() if r.duration_s > 0]
    if not ran and exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED  # zero executed checks is a failure
    if machine_health.finish() and machine_health.failed() and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED  # a GPU fault during the run fails it

    ctx.shortfall = recorder.shortfall(ctx.records.values())
    if ctx.shortfall and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED  # every check skipped, or P0 without its core verdicts
    if ctx.ledger.not_run() and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = runrecord.NARROWED_STATUS  # what ran passed, but not all the tiers' checks ran: no pass
    ctx.run_dir.mkdir(parents=True, exist_ok=True)
    status = int(session.exitstatus)  # recorded as `conformance run` exits (a narrowed run: 4)
    recorder.write(ctx, runrecord.NARROWED_EXIT if status == runrecord.NARROWED_STATUS else status,
                   complete=exitstatus != pytest.ExitCode.INTERRUPTED and bool(ran))


def _discard(run_dir: Path, config: pytest.Config) -> None:
    """What a refused session left (pytest's junit.xml, in the run's folder, which did not exist before it, and
    the reports folder if the run made it): the reports folder stays as it was."""
    import shutil

    shutil.rmtree(run_dir, ignore_errors=True)
    if not config.stash[REPORTS_EXISTED]:
        with contextlib.suppress(OSError):
            run_dir.parent.rmdir()  # only if empty


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if exitstatus == pytest.ExitCode.USAGE_ERROR:
        return  # a refused run: its one sentence, no table and no verdict
    if config.option.collectonly:
        terminalreporter.write_line(f"--collect-only: {ctx_of(config).collected} check(s) listed; nothing ran and "
                                    "no run was recorded", yellow=True)
        return
    from conformance.run import recorder

    recorder.print_summary(terminalreporter, ctx_of(config))


def pytest_unconfigure(config: pytest.Config) -> None:
    session = session_of(config)
    if session is not None:
        session.release()
    from conformance.engines import forkserver

    forkserver.stop()  # the engines and the server are closed by now
    from conformance.reference import cache

    cache.disable()  # a process that goes on (tests call `conformance run` in-process) computes afresh
    from conformance.engines import compile_cache

    compile_cache.release()
