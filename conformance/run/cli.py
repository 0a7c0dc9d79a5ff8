"""`conformance`: the command-line front door.

  conformance run --tier p0 [--rocm|--cuda|--cpu] [--model DIR] [--engine vllm|transformers] [-- pytest args]
  conformance dashboard [--runs DIR] [--db FILE] [--out DIR]
  conformance baseline list|promote|establish ...   (pinned serving baselines; docs/results.md "Pinned serving
                                                    baselines")
  conformance diagnose FILE|- [FILE ...] [--json]   (what pasted tool outputs/logs say, cross-checked; see --help)
  conformance drill [--faults NAME,...] [RUN OPTIONS]   (does P0 see each planted fault on this stack? see --help)
  conformance compare BEFORE AFTER [--markdown|--json] [--db FILE]   (the upgrade diff of two runs; exit 1 on a
                                                    regression, 2 on bad input; see --help)
  conformance checks [--tier p0] [--json|--markdown|--catalogue]   (every check: what it verifies, against what,
                                                    its limits per dtype; --markdown writes docs/checks/)

Exit codes of `run`: 0 every check of the tiers ran and passed (skips and known-bug xfails allowed),
1 a check failed or errored (or none ran), 2 interrupted or bad usage, 3 internal error, 4 narrowed: the checks
that ran passed, but checks of the tiers did not run (-k, --lf, --deselect, node ids …): not a pass, no evidence."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

from conformance.run import options
from conformance.run.coverage import NARROWED_EXIT, NARROWED_STATUS
from conformance.run.tiers import DEFAULT_TIERS, TIER_INFO

CHECKS = Path(__file__).parent.parent / "checks"
# No pytest plugin autoloads into a run: the plugins the checks use are loaded by module name (junitxml is built
# in). Whatever else the venv holds stays out of the verdict (GPU venvs see the image's site-packages; a
# rerun-on-failure or reordering plugin would change what a run means), and out of its start-up: autoloading
# hypothesis, anyio and xdist took ~1.5 s of every run here.
NEEDED_PLUGINS = ("pytest_timeout", "_hypothesis_pytestplugin")


def run_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run conformance checks against the installed stack",
                       description="Run the checks of the given tiers against the stack installed here and "
                                   "write reports/runs/<run-id>/{results.json,junit.xml,fingerprint.json}.")
    target = p.add_mutually_exclusive_group()
    for flag in options.target_flags():  # data/targets.toml
        flag.add_to(target.add_argument)
    for option in options.OPTIONS:  # declared once, with the plugin (conformance/run/options.py)
        option.add_to(p.add_argument)
    p.add_argument("-k", dest="keyword", help="only checks matching this pytest -k expression")
    p.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")


def build_pytest_args(ns: argparse.Namespace) -> list[str]:
    values = vars(ns) | {"tier": ns.tier or list(DEFAULT_TIERS)}
    # the cache (--lf, --ff) lives beside the runs, never in the installed package that is the rootdir
    cache_dir = Path(ns.reports_dir).resolve().parent / ".pytest_cache"
    args = [str(CHECKS), "-p", "conformance.run.plugin", "-q", "-o", f"cache_dir={cache_dir}", "--rootdir",
            str(CHECKS), "-o", "console_output_style=classic"]
    args += [a for name in NEEDED_PLUGINS if importlib.util.find_spec(name) for a in ("-p", name)]
    args += [a for option in options.OPTIONS for a in option.relayed(values[option.dest])]  # one table, both sides
    if ns.target:
        args.append(f"--{ns.target}")
    if ns.keyword:
        args += ["-k", ns.keyword]
    return args + list(ns.pytest_args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="conformance", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    run_parser(sub)
    sub.add_parser("dashboard", help="ingest reports/runs into history and render the site", add_help=False)
    sub.add_parser("baseline", help="list serving lineages, or pin a serving baseline (median of accepted runs)",
                   add_help=False)
    sub.add_parser("diagnose", help="read a pasted tool output or log (FILE or -): facts and known faults",
                   add_help=False)
    sub.add_parser("drill", help="plant each fault of data/faults.toml in the engine under test, one run each, and "
                                 "say whether P0's checks caught it", add_help=False)
    sub.add_parser("compare", help="the upgrade diff: what changed from run BEFORE to run AFTER, per check, "
                                   "against the recorded limits (exit 1 on a regression)", add_help=False)
    sub.add_parser("checks", help="every check: what it verifies, against what, its limits per dtype read from the "
                                  "data, what to do when it fails (--markdown writes docs/checks/)", add_help=False)
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["checks"]:
        from conformance.tooling import check_reference

        return check_reference.main(argv[1:], TIER_INFO)
    if argv[:1] == ["compare"]:
        from reports.upgrade_diff_report import main as compare_main

        return compare_main(argv[1:])
    if argv[:1] == ["drill"]:
        from conformance.run import drill

        return drill.main(argv[1:], run_parser)
    if argv[:1] == ["diagnose"]:
        from env_checks.diagnose import main as diagnose_main

        return diagnose_main(argv[1:])
    if argv[:1] == ["baseline"]:
        from reports.baselines import main as baseline_main

        return baseline_main(argv[1:])
    if argv[:1] == ["dashboard"]:
        from reports.dashboard import main as dashboard_main

        return dashboard_main(argv[1:])
    ns = parser.parse_args(argv)
    before = os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD")
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    import pytest

    exit_of = {0: 0, 1: 1, 2: 2, 3: 3, 4: 2, 5: 1, NARROWED_STATUS: NARROWED_EXIT}
    try:
        from conformance.run import profile_rows
        from conformance.verdicts import profiles

        try:
            rows = profile_rows.expand(ns.profile)  # --profile NAME:all: one run per backend row
        except profiles.ProfileError as exc:
            print(f"conformance: {exc}", file=sys.stderr)
            return 2
        if rows:
            return profile_rows.run_rows(rows, build_pytest_args(ns), CHECKS,
                                         lambda args: exit_of.get(int(pytest.main(args)), 3))
        code = int(pytest.main(build_pytest_args(ns)))
    finally:  # the process goes on (tests call main in-process): leave its environment as it was
        if before is None:
            os.environ.pop("PYTEST_DISABLE_PLUGIN_AUTOLOAD", None)
        else:
            os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = before
    return exit_of.get(code, 3)


def entry() -> None:
    """The `conformance` command. After a run (its record written, its engines, server and forkserver
    stopped) the process ends at once: the interpreter's own teardown with torch, vLLM and transformers
    loaded took 4-5 s of a P0 run's wall time, and nothing of the run depends on it."""
    argv = sys.argv[1:]
    if argv[:1] == ["run"]:
        # the run's own process (references, records): a 50000-object young generation took P0's collections from
        # 1760 (1.9 s) to 23 (1.1 s). The engines and the server are child processes and keep their own settings.
        import gc

        gc.set_threshold(50_000, 10, 10)
    code = main(argv)
    if argv[:1] == ["run"]:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
