"""`conformance`: the command-line front door.

  conformance run --tier p0 [--rocm|--cuda|--cpu] [--model DIR] [--engine vllm|transformers] [-- pytest args]
  conformance dashboard [--runs DIR] [--db FILE] [--out DIR]
  conformance baseline list|promote ...   (pinned serving baselines; docs/results.md "Pinned serving baselines")
  conformance diagnose FILE|- [FILE ...] [--json]   (what pasted tool outputs/logs say, cross-checked; see --help)

Exit codes of `run`: 0 every selected check passed (skips and known-bug xfails allowed),
1 a check failed or errored (or none ran), 2 interrupted or bad usage, 3 internal error."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

from conformance.run import run_target
from conformance.run.tiers import DEFAULT_TIERS, TIERS

CHECKS = Path(__file__).parent.parent / "checks"
# No pytest plugin autoloads into a run: the plugins the checks use are loaded by module name (junitxml is built
# in). Whatever else the venv holds stays out of the verdict (GPU venvs see the image's site-packages; a
# rerun-on-failure or reordering plugin would change what a run means), and out of its start-up: autoloading
# hypothesis, anyio and xdist took ~1.5 s of every run here.
NEEDED_PLUGINS = ("pytest_timeout", "_hypothesis_pytestplugin")
# `--server` without a URL: the openai SDK's variable names the server (conformance.engines.openai_api)
SERVER_FROM_ENV = "$OPENAI_BASE_URL"


def run_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run conformance checks against the installed stack",
                       description="Run the checks of the given tiers against the stack installed here and "
                                   "write reports/runs/<run-id>/{results.json,junit.xml,fingerprint.json}.")
    p.add_argument("--tier", action="append", choices=list(TIERS),
                   help=f"tier to run (repeatable; default {', '.join(DEFAULT_TIERS)})")
    target = p.add_mutually_exclusive_group()
    for name in run_target.names():  # data/targets.toml
        target.add_argument(f"--{name}", dest="target", action="store_const", const=name,
                            help=f"assert the {name} stack and test it")
    p.add_argument("--model", help="local gpt-oss checkpoint directory (default: the tiny generated one)")
    p.add_argument("--engine", choices=list(run_target.engine_names()), help="engine under test (default per target)")
    p.add_argument("--dtype", help="float32 | bfloat16 | float16 (default per target)")
    p.add_argument("--combo", help="matrix combination id to record")
    p.add_argument("--server", nargs="?", const=SERVER_FROM_ENV,
                   help="URL of a running OpenAI-compatible server to test instead of starting one, with or "
                        "without /v1 (alone: $OPENAI_BASE_URL; key: $CONFORMANCE_SERVER_API_KEY or $OPENAI_API_KEY)")
    p.add_argument("--tokenizer-vocab", help="o200k_base.tiktoken file or folder (nothing is downloaded)")
    p.add_argument("--eval-data", help="folder of local eval datasets for the P3 accuracy checks")
    p.add_argument("--history-db", help="history store for the serving drift (default reports/history.sqlite); "
                                        "the pinned baselines are baselines.json beside it, or $CONFORMANCE_BASELINES")
    p.add_argument("--profile", help="serving profile NAME[:BACKEND] from data/profiles.toml (default: the production "
                                    "profile of the detected SKU and model; `cpu` on the CPU default); NAME:all "
                                    "runs once per backend row, the rows after the first the engine-level checks")
    p.add_argument("--health-policy", help="machine-health policy TOML (default: the suite's data/health.toml)")
    p.add_argument("--fresh-reference", action="store_true",
                   help="compute every fp64 reference result again: by default a result already computed for the "
                        "same checkpoint bytes, token ids, options and reference source is read from the cache")
    p.add_argument("--reference-pack", metavar="FILE|DIR",
                   help="fp64 reference results keyed by model, prompt set and reference version: read where the "
                        "pack exists, written at the run's end, so another node skips computing them; a FILE made "
                        "for another key is refused")
    p.add_argument("--planted-fault", help="negative controls only: plant this fault of conformance/engines/"
                   "faults.py in the engine under test; the run is recorded as a control, never as a platform result")
    p.add_argument("--reports-dir", default="reports/runs", help="where runs are written (default reports/runs)")
    p.add_argument("-k", dest="keyword", help="only checks matching this pytest -k expression")
    p.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")


def build_pytest_args(ns: argparse.Namespace) -> list[str]:
    tiers = ns.tier or list(DEFAULT_TIERS)
    # the cache (--lf, --ff) lives beside the runs, never in the installed package that is the rootdir
    cache_dir = Path(ns.reports_dir).resolve().parent / ".pytest_cache"
    args = [str(CHECKS), "-p", "conformance.run.plugin", *(a for t in tiers for a in ("--tier", t)), "-q",
            "-o", f"cache_dir={cache_dir}", "--rootdir", str(CHECKS), "--reports-dir", ns.reports_dir,
            "-o", "console_output_style=classic"]
    args += [a for name in NEEDED_PLUGINS if importlib.util.find_spec(name) for a in ("-p", name)]
    for flag in ("model", "engine", "dtype", "combo", "server", "tokenizer_vocab", "eval_data", "history_db",
                 "profile", "health_policy", "planted_fault", "reference_pack"):
        if getattr(ns, flag):  # one token: a value that starts with '-' or a bare --server stays this option's
            args.append(f"--{flag.replace('_', '-')}={getattr(ns, flag)}")
    if ns.fresh_reference:
        args.append("--fresh-reference")
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
    argv = sys.argv[1:] if argv is None else argv
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

    exit_of = {0: 0, 1: 1, 2: 2, 3: 3, 4: 2, 5: 1}
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
