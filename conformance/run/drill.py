"""`conformance drill`: prove, on the stack installed here and in the run's dtype, that the suite sees each planted
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
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conformance import datafiles
from env_checks import child
from env_checks.record.results import VERDICT_FAILURE

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


def main(argv: list[str], run_parser: Callable[[Any], None]) -> int:
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
