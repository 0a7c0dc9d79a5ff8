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
that ran passed, but checks of the tiers did not run (-k, --lf, --deselect, node ids …): not a pass, no evidence.

The options of a run, declared once: `conformance run` (argparse) and the pytest plugin (`addoption`) are both
built from `OPTIONS` and `target_flags()`, and the CLI hands each value on to pytest through the same table.

Standard library only at import, beside the data it reads (the CLI imports it before pytest).

`conformance drill`: prove, on the stack installed here and in the run's dtype, that the suite sees each planted
fault (P0's checks, and P1's where a fault is P1's to catch: faults.toml `tier`).

  conformance drill [--faults NAME,...] [--faults-file TOML] [--junit-xml FILE] [--first-catch] [RUN OPTIONS...]
  nox -s drill -- --cuda --dtype float16

For each fault of conformance/data/faults.toml that the engine under test can carry, one `conformance run
--planted-fault NAME -k <the checks that must catch it>` with the run options given (target, dtype, profile,
model...), each in a process of its own; then a table: the fault, its verdict, its run, the checks that failed.

  caught         at least one of its checks failed with a verdict (CheckFailed or an assertion), not an engine error
  blind          every one of its checks that ran passed: the suite does not see this fault on this stack
  could not run  no results.json, an interrupted run, a run of another fault, or its checks errored or skipped

Each run is a negative control: recorded with its fault, never evidence (docs/results.md). Exit codes: 0 every fault
caught, 1 a fault went unseen, 2 a fault could not be judged, the drill was interrupted (Ctrl-C or SIGTERM: the run
under way is passed the interrupt and records itself incomplete) or bad usage.

`--profile NAME:all`: the backend-row expansion of a serving profile (data/profiles.toml [row_expansion]).

`conformance run --profile NAME:all` runs once per row of NAME's backend matrix, each run its own
results.json recording NAME:ROW: the first (default) row runs every selected check, the others the
engine-level checks (parity, KV accounting, batching, prefix cache, preemption), so "AITER on vs off" is a
row of the parity matrix. The exit code is the worst of the rows'."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from conformance import datafiles
from conformance.run import run_target
from conformance.run.run_target import DEFAULT_TIERS, TIER_INFO
from conformance.run.runrecord import NARROWED_EXIT, NARROWED_STATUS
from conformance.verdicts import profiles
from env_checks import child
from env_checks.record.results import VERDICT_FAILURE

# -- options ---------------------------------------------------------------------------------------------------------


# a bare `--server`: the openai SDK's variable names the server (conformance.engines.openai_api.FROM_ENV)
SERVER_FROM_ENV = "$OPENAI_BASE_URL"


@dataclass(frozen=True)
class Option:
    """One option: its flag, its help, and what argparse and pytest's addoption both take besides (default,
    choices, nargs, const, action, metavar, dest)."""

    flag: str
    help: str
    settings: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def dest(self) -> str:
        return str(self.settings.get("dest", self.flag.removeprefix("--").replace("-", "_")))

    def add_to(self, add: Callable[..., Any]) -> None:
        """Declare it through `add` (argparse's add_argument or pytest's addoption)."""
        add(self.flag, help=self.help, **self.settings)

    def relayed(self, value: Any) -> list[str]:
        """The pytest arguments that hand `value` on: one token, so a value starting with '-' (or a bare --server)
        stays this option's; none for an option left unset."""
        if value is None or value is False:
            return []
        if value is True:
            return [self.flag]
        if isinstance(value, list):
            return [a for each in value for a in (self.flag, str(each))]
        return [f"{self.flag}={value}"]


def _option(flag: str, help: str, **settings: Any) -> Option:
    return Option(flag, help, MappingProxyType(settings))


OPTIONS: tuple[Option, ...] = (
    _option("--tier", f"tier to run ({', '.join(run_target.TIERS)}; repeatable or comma-separated; default: "
                      f"{', '.join(run_target.DEFAULT_TIERS)} through `conformance run`, every tier through pytest); "
                      "combines with -m and -k", action="append", metavar="TIER"),
    _option("--model", "local gpt-oss checkpoint directory (default: the tiny generated one)"),
    _option("--engine", "engine under test (default per target; data/engines.toml)",
            choices=list(run_target.engine_names())),
    _option("--dtype", "float32 | bfloat16 | float16 (default per target; data/targets.toml)"),
    _option("--combo", "matrix combination id (ci/matrix.toml) recorded in the run"),
    _option("--server", "URL of a running OpenAI-compatible server to test instead of starting one, with or without "
                        "/v1 (alone: $OPENAI_BASE_URL; key: $CONFORMANCE_SERVER_API_KEY or $OPENAI_API_KEY)",
            nargs="?", const=SERVER_FROM_ENV),
    _option("--tokenizer-vocab", "o200k_base.tiktoken file or folder (offline vocab; nothing is downloaded)"),
    _option("--eval-data", "folder of local eval datasets (gsm8k, GPQA, AIME) for the P3 accuracy checks"),
    _option("--history-db", "history store for the serving drift (default reports/history.sqlite); the pinned "
                            "baselines are baselines.json beside it, or $CONFORMANCE_BASELINES"),
    _option("--profile", "serving profile NAME[:BACKEND] from data/profiles.toml (default: the production profile of "
                         "the detected SKU and model; `cpu` on the CPU default); NAME:all (`conformance run` only) "
                         "runs once per backend row, the rows after the first the engine-level checks"),
    _option("--health-policy", "machine-health policy TOML (default: the suite's data/health.toml)"),
    _option("--fresh-reference", "compute every fp64 reference result again: by default a result already computed "
                                 "for the same checkpoint bytes, token ids, options and reference source is read "
                                 "from the cache", action="store_true"),
    _option("--reference-pack", "fp64 reference results keyed by model, prompt set and reference version: read where "
                                "the pack exists, written at the run's end, so another node skips computing them; a "
                                "FILE made for another prompt set or reference version is refused before anything "
                                "runs, one made for another model in the check that first needs it",
            metavar="FILE|DIR"),
    _option("--compile-cache", "a fleet's shared compiler caches (vLLM's torch.compile artifacts, Inductor's and "
                               "Triton's kernels) in DIR/vllm, DIR/inductor, DIR/triton: a node that finds them filled "
                               "loads the kernels the first node built; the run records whether it did", metavar="DIR"),
    _option("--planted-fault", "negative controls only: plant this fault of conformance/engines/faults.py in the "
                               "engine under test; the run is recorded as a control, never as a platform result"),
    _option("--reports-dir", "where runs are written (default reports/runs)", default="reports/runs"),
)


def target_flags() -> tuple[Option, ...]:
    """`--cpu`, `--cuda`, `--rocm`: one flag per target of data/targets.toml, each the same as `--target NAME`."""
    return tuple(_option(f"--{name}", f"assert the {name} stack and test it (same as --target {name})",
                         dest="target", action="store_const", const=name) for name in run_target.names())


# -- drill -----------------------------------------------------------------------------------------------------------


FAULTS_FILE = datafiles.DATA / "faults.toml"
CAUGHT, BLIND, NOT_RUN = "caught", "blind", "could not run"


@dataclass(frozen=True)
class Fault:
    name: str
    engines: tuple[str, ...]
    caught_by: tuple[str, ...]
    tier: str = "p0"  # the tier of its checks: the run's --tier where the drill's options give none

    def keyword(self) -> str:
        return " or ".join(self.caught_by)


def faults(path: Path = FAULTS_FILE) -> list[Fault]:
    """The faults of `path`; DataError, one sentence, where an entry lacks its engines or checks."""
    out = []
    for name, row in datafiles.load_toml(path).get("faults", {}).items():
        engines, checks = row.get("engines"), row.get("caught_by")
        if not engines or not checks or not all(isinstance(x, str) for x in [*engines, *checks]):
            raise datafiles.DataError(f"{path}: [faults.{name}] needs `engines` and `caught_by`, lists of names.")
        out.append(Fault(name, tuple(engines), tuple(checks), str(row.get("tier", "p0"))))
    return out


@dataclass
class Outcome:
    fault: str
    verdict: str
    run_id: str = "-"
    failed: list[str] = field(default_factory=list)
    why: str = ""
    wall_s: float | None = None  # the fault's run, start to exit


def _name(check_id: str) -> str:
    return check_id.split("::")[-1].split("[")[0]


def judge(fault: Fault, record: dict[str, Any] | None) -> Outcome:
    """The verdict of one fault's run from its results.json (None: the run wrote none)."""
    if record is None:
        return Outcome(fault.name, NOT_RUN, why="the run wrote no results.json")
    out = Outcome(fault.name, NOT_RUN, str(record.get("run_id", "-")))
    if record.get("planted_fault") != fault.name:
        out.why = f"the run carried fault {record.get('planted_fault')!r}, not {fault.name!r}"
        return out
    checks = [c for c in record.get("checks", []) if _name(str(c.get("id", ""))) in fault.caught_by]
    out.failed = [c["id"].split("::")[-1] for c in checks
                  if c.get("outcome") == "failed" and VERDICT_FAILURE.match(str(c.get("message", "")))]
    if out.failed:
        out.verdict = CAUGHT
        return out
    ran = [c for c in checks if c.get("outcome") != "skipped"]
    if not record.get("complete"):
        out.why = "the run did not complete"
    elif not checks:
        out.why = f"none of {', '.join(fault.caught_by)} ran"
    elif ran and all(c.get("outcome") == "passed" for c in ran):
        out.verdict, out.why = BLIND, "every check that should catch it passed"
    else:
        first = next(c for c in checks if c.get("outcome") != "passed")
        out.why = f"{first['id'].split('::')[-1]} {first.get('outcome')}: {str(first.get('message', ''))[:160]}"
    return out


def _engine(ns: argparse.Namespace) -> str:
    """The engine a run with these options tests: --engine, else its target's default (data/targets.toml)."""
    from conformance.run import run_target

    if ns.engine:
        return str(ns.engine)
    target = run_target.resolve(ns.target or "auto").resolved
    return str(run_target.data()[target]["default_engine"])


def _record(reports: Path, before: set[str], fault: str) -> dict[str, Any] | None:
    for run_dir in sorted(set(p.name for p in reports.iterdir() if p.is_dir()) - before, reverse=True):
        path = reports / run_dir / "results.json"
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if record.get("planted_fault") == fault:
            return record
    return None


def table(outcomes: list[Outcome]) -> str:
    rows = [("fault", "verdict", "run", "wall", "failed checks / why")] + [
        (o.fault, o.verdict, o.run_id, "-" if o.wall_s is None else f"{o.wall_s:.0f} s", ", ".join(o.failed) or o.why)
        for o in outcomes]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join("  ".join(f"{cell:{w}s}" for cell, w in zip(r[:4], widths, strict=True)) + f"  {r[4]}"
                     for r in rows)


def drill_main(argv: list[str], run_parser: Callable[[Any], None]) -> int:
    """`run_parser` adds the `run` subcommand's options to a subparsers object (conformance.run.cli.run_parser): the
    drill reads the same options, to know the engine under test and to refuse -k and --planted-fault."""
    parser = argparse.ArgumentParser(prog="conformance drill", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--faults", help="comma-separated fault names (default: every fault of the engine under test)")
    parser.add_argument("--faults-file", type=Path, default=FAULTS_FILE,
                        help="which checks must catch each fault (default: the suite's data/faults.toml)")
    parser.add_argument("--junit-xml", type=Path, help="also write the drill as JUnit XML: a test case per fault "
                                                        "(caught passes, blind fails, could not run errors)")
    parser.add_argument("--first-catch", action="store_true",
                        help="end each fault's run at its first failed check (pytest --maxfail=1): the fault is caught "
                             "once, and the costlier checks after it do not run (at gpt-oss-120b's size, the per-layer "
                             "probe and the float32 twin after greedy parity); the table then names one check a fault")
    ns, rest = parser.parse_known_args(argv)
    holder = argparse.ArgumentParser(prog="conformance drill", add_help=False)
    run_parser(holder.add_subparsers(dest="command"))
    run_ns = holder.parse_args(["run", *rest])
    if run_ns.keyword or run_ns.planted_fault:
        parser.error("the drill chooses -k and --planted-fault itself, one run per fault: give neither")
    if str(run_ns.profile or "").endswith(":all"):
        parser.error("the drill plants each fault in one run: give one backend row (--profile NAME:ROW), not :all")
    try:
        table_faults = faults(ns.faults_file)
        engine = _engine(run_ns)
    except (datafiles.DataError, KeyError) as exc:
        parser.error(str(exc))
    chosen = [f for f in table_faults if engine in f.engines]
    if ns.faults:
        wanted = [n.strip() for n in ns.faults.split(",") if n.strip()]
        unknown = [n for n in wanted if n not in {f.name for f in chosen}]
        if unknown:
            parser.error(f"no fault {', '.join(unknown)} for the {engine} engine in {ns.faults_file} (it has "
                         f"{', '.join(f.name for f in chosen)})")
        chosen = [f for f in chosen if f.name in wanted]
    if not chosen:
        parser.error(f"{ns.faults_file} has no fault for the {engine} engine")
    reports = Path(run_ns.reports_dir)
    reports.mkdir(parents=True, exist_ok=True)
    outcomes, interrupted = [], False
    child.interrupt_on_sigterm()  # nox passes SIGTERM on: stop as on Ctrl-C, the run recording itself
    print(f"drill: {len(chosen)} fault{'s' * (len(chosen) != 1)} for the {engine} engine, one run each: "
          f"{', '.join(f.name for f in chosen)}", flush=True)
    options, pytest_args = (rest[:rest.index("--")], rest[rest.index("--") + 1:]) if "--" in rest else (rest, [])
    pytest_args += ["--maxfail=1"] if ns.first_catch else []
    for n, fault in enumerate(chosen, start=1):
        tier = [] if run_ns.tier else ["--tier", fault.tier]  # where its checks are (faults.toml)
        cmd = [sys.executable, "-m", "conformance", "run", *tier, *options, "--planted-fault", fault.name,
               "-k", fault.keyword(), *(["--", *pytest_args] if pytest_args else [])]
        print(f"drill: fault {n} of {len(chosen)}: {fault.name}: {shlex.join(cmd[2:])}", flush=True)
        before = {p.name for p in reports.iterdir() if p.is_dir()}
        started = time.monotonic()
        interrupted = _run(cmd)
        outcomes.append(judge(fault, _record(reports, before, fault.name)))
        outcomes[-1].wall_s = time.monotonic() - started
        print(f"drill: {fault.name}: {outcomes[-1].verdict}", flush=True)
        if interrupted:
            break
    print(f"\ndrill summary: {engine} engine, run options {shlex.join(rest)}"
          f"{', first catch only' if ns.first_catch else ''}\n{table(outcomes)}")
    if ns.junit_xml:
        write_junit(ns.junit_xml, outcomes, engine)
    caught = sum(o.verdict == CAUGHT for o in outcomes)
    print(f"drill: {caught} of {len(outcomes)} faults caught"
          + (f"; interrupted, {len(chosen) - len(outcomes)} not run" if interrupted else ""))
    if any(o.verdict == BLIND for o in outcomes):
        return 1
    return 2 if interrupted or caught < len(outcomes) else 0


def write_junit(path: Path, outcomes: list[Outcome], engine: str) -> None:
    """One <testcase> per fault: caught passes, blind is a <failure>, could not run an <error>."""
    import xml.etree.ElementTree as ET

    suite = ET.Element("testsuite", name=f"conformance drill ({engine})", tests=str(len(outcomes)),
                       failures=str(sum(o.verdict == BLIND for o in outcomes)),
                       errors=str(sum(o.verdict == NOT_RUN for o in outcomes)))
    for o in outcomes:
        case = ET.SubElement(suite, "testcase", classname="conformance.drill", name=o.fault)
        ET.SubElement(case, "properties").append(ET.Element("property", name="run_id", value=o.run_id))
        if o.verdict == BLIND:
            ET.SubElement(case, "failure", message=f"planted fault {o.fault} went unseen: {o.why}")
        elif o.verdict == NOT_RUN:
            ET.SubElement(case, "error", message=f"planted fault {o.fault} could not be judged: {o.why}")
    root = ET.Element("testsuites")
    root.append(suite)
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


def _run(cmd: list[str]) -> bool:
    """Run one fault's `conformance run`; True where the drill was interrupted meanwhile: the run was passed the
    interrupt and recorded itself incomplete (env_checks.child)."""
    return child.wait_recording(subprocess.Popen(cmd)) is None


# -- profile rows ----------------------------------------------------------------------------------------------------


ALL_ROWS = "all"


@dataclass(frozen=True)
class Row:
    label: str            # the --profile value of this run: NAME:ROW
    engine_level_only: bool


def expand_rows(requested: str | None, table: dict[str, Any] | None = None) -> list[Row] | None:
    """The runs of `--profile NAME:all`, or None when `requested` names one row (or no profile)."""
    if not requested:
        return None
    name, _, row = requested.partition(":")
    if row != ALL_ROWS:
        return None
    chosen = profiles.profile(name, None, table)  # ProfileError in one sentence for an unknown NAME
    return [Row(f"{name}:{r}", i > 0) for i, r in enumerate(chosen.matrix)]


def engine_level_checks(checks_dir: Path, table: dict[str, Any] | None = None) -> list[str]:
    files = list((table or profiles.data())["row_expansion"]["checks"])
    missing = [f for f in files if not (checks_dir / f).is_file()]
    if missing:
        raise profiles.ProfileError(f"profiles.toml [row_expansion] names check modules that do not exist: "
                                    f"{', '.join(missing)}")
    return [str(checks_dir / f) for f in files]


def row_args(args: list[str], checks_dir: Path, row: Row, table: dict[str, Any] | None = None) -> list[str]:
    """The pytest arguments of one row: its --profile, and the engine-level modules instead of the whole
    checks folder for every row but the first."""
    out = [f"--profile={row.label}" if a.startswith("--profile=") else a for a in args]
    if row.engine_level_only:
        at = out.index(str(checks_dir))
        out[at:at + 1] = engine_level_checks(checks_dir, table)
    return out


SEVERITY = (0, 4, 1, 2, 3)  # passed < narrowed (passed, not whole) < failed < usage/interrupted < internal error


def worst_exit(codes: list[int]) -> int:
    """The most severe exit code of the rows (SEVERITY); an unknown code counts as an internal error."""
    return max(codes, key=lambda c: SEVERITY.index(c) if c in SEVERITY else len(SEVERITY), default=3)


def run_rows(rows: list[Row], args: list[str], checks_dir: Path, run_one: Callable[[list[str]], int],
             say: Callable[[str], None] = print) -> int:
    codes = []
    for n, row in enumerate(rows, 1):
        say(f"conformance: profile row {n}/{len(rows)}: {row.label}"
            f"{' (engine-level checks)' if row.engine_level_only else ''}")
        codes.append(run_one(row_args(args, checks_dir, row)))
        if codes[-1] == 2:  # interrupted or bad usage: the other rows would say the same
            break
    say("conformance: profile rows: " + ", ".join(f"{r.label} -> exit {c}" for r, c in zip(rows, codes)))
    return worst_exit(codes)


# -- cli -------------------------------------------------------------------------------------------------------------


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
    for flag in target_flags():  # data/targets.toml
        flag.add_to(target.add_argument)
    for option in OPTIONS:  # declared once, with the plugin (conformance/run/cli.py)
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
    args += [a for option in OPTIONS for a in option.relayed(values[option.dest])]  # one table, both sides
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

        return drill_main(argv[1:], run_parser)
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
        from conformance.verdicts import profiles

        try:
            rows = expand_rows(ns.profile)  # --profile NAME:all: one run per backend row
        except profiles.ProfileError as exc:
            print(f"conformance: {exc}", file=sys.stderr)
            return 2
        if rows:
            return run_rows(rows, build_pytest_args(ns), CHECKS,
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
