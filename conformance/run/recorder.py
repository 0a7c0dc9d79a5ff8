"""Writes the run (results.json, fingerprint.json beside pytest's junit.xml) and prints the
closing summary table. A failure here must never hide the verdict, so the fingerprint is
collected defensively and the writer's own errors are shown, not swallowed.

The run header: the first lines of every run name what is being tested (target, the stack's versions,
the GPUs, engine, dtype, profile, tiers) and where the run is written (run id and folder); where another process
already holds a GPU as the run starts, a line names it; on ROCm, a line counts the raw AMDGPU code objects of the
installed libraries per ISA and names each library the GPU cannot run.

pytest prints `pytest_report_header` lines only with its own header, which `-q` (what `conformance run`
uses) and `--no-header` hide; the plugin then prints these lines itself as the session starts.

The least a run must have passed to count as a pass (data/run_minimum.toml): a run whose selected checks
all skipped judged nothing, and a P0 run without its identity, engine, parity and tokenizer verdicts is no
gate. The plugin turns a shortfall into a failed run with one sentence."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from conformance import datafiles
from conformance.engines import compile_cache, gpu_sharers
from conformance.monitor import machine_health
from conformance.reference import cache as reference_cache
from conformance.run import runrecord
from conformance.run.runcontext import RunContext
from env_checks.record.fingerprint import package_versions
from env_checks.signatures import diagnose

# -- runheader -------------------------------------------------------------------------------------------------------


HEADER_PREFIX = "conformance:"


def _version(packages: Mapping[str, str | None], key: str) -> str:
    return packages.get(key) or "not installed"


def busy_line(listing: list[gpu_sharers.GpuProcess] | None) -> str | None:
    """The header's line for processes other than the suite's that hold a GPU as the run starts (`listing` as
    gpu_sharers.listed()), or None. The suite holds no GPU yet, so every other process listed is another job."""
    own = gpu_sharers.own_pids()
    others = [p for p in listing or [] if p.pid not in own]
    if not others:
        return None
    return (f"{HEADER_PREFIX} the GPU is already in use: {'; '.join(p.describe() for p in others)}. Correctness checks "
            "are not affected; a serving level or device floor that misses its mark while it runs fails as shared_gpu")


def run_header_lines(ctx: Any, tiers: Sequence[str] = (), packages: Mapping[str, str | None] | None = None,
          gpu_processes: list[gpu_sharers.GpuProcess] | None = None) -> list[str]:
    """The header of the run `ctx` (a RunContext); `packages` as env_checks.fingerprint.package_versions(),
    `gpu_processes` as gpu_sharers.listed() (read here on a GPU target when not given)."""
    packages = package_versions() if packages is None else packages
    t = ctx.resolved()
    if gpu_processes is None and t.devices:
        gpu_processes = gpu_sharers.listed()
    gpu = f"{len(t.devices)} x {t.devices[0]}" if t.devices else "no GPU"
    arch = f" ({', '.join(sorted(set(t.gcn_arch)))})" if t.gcn_arch else ""
    vllm = _version(packages, "vllm")
    if packages.get("vllm_distribution") not in (None, "vllm"):
        vllm += f" ({packages['vllm_distribution']})"
    profile = getattr(ctx, "profile", None) or "default"
    return [
        f"{HEADER_PREFIX} target {t.resolved} (asked: {t.requested}); torch {t.torch_version or 'not installed'} "
        f"[{t.torch_flavour or '?'}]; vLLM {vllm}; transformers {_version(packages, 'transformers')}; {gpu}{arch}",
        f"{HEADER_PREFIX} engine {ctx.engine}, dtype {ctx.dtype_name}, profile {profile}, "
        f"model {ctx.model_arg or 'tiny-gpt-oss'}" + (f"; tiers {', '.join(tiers)}" if tiers else ""),
        f"{HEADER_PREFIX} run {ctx.run_id} -> {ctx.run_dir}",
    ] + ([line] if (line := busy_line(gpu_processes)) else []) + compile_cache_lines() + code_object_lines(ctx)


def compile_cache_lines() -> list[str]:
    """Where --compile-cache points the compilers, and whether an earlier run (a fleet's first node) filled it."""
    from conformance.engines import compile_cache

    shared = compile_cache.summary()
    if shared is None:
        return []
    found = (f"{shared['files_at_start']} file(s) from earlier runs, loaded where they match this stack"
             if shared["warm"] else "empty, this run fills it")
    return [f"{HEADER_PREFIX} compile cache {shared['path']}: {found}"]


def code_object_lines(ctx: Any) -> list[str]:
    """On a target whose GPUs load raw AMDGPU code objects (devices.toml [isa.code_objects] platforms): what the
    installed libraries and caches hold per ISA, and each library the GPU cannot run, named before any engine
    starts. The scan (env_checks.code_object_scan) is kept: the fingerprint and the device ISA check read it."""
    from conformance import datafiles
    from env_checks.probes import code_object_scan, code_object_verdict

    cfg = datafiles.load_toml(datafiles.DATA / "devices.toml")["isa"]["code_objects"]
    t = ctx.resolved()
    if t.resolved not in cfg["platforms"]:
        return []
    loaded_by = cfg["loaded_by"].get(ctx.engine, [])
    summary = code_object_verdict.summary(code_object_scan.installed(), t.gcn_arch, loaded_by)
    return [f"{HEADER_PREFIX} {line}" for line in summary]


def pytest_shows_header(config: Any) -> bool:
    """Whether pytest prints its own header (and so the report-header lines) for this session."""
    return config.option.verbose >= 0 and not getattr(config.option, "no_header", False)


# -- run minimum -----------------------------------------------------------------------------------------------------


def minimum_table() -> dict[str, Any]:
    return datafiles.load_toml(datafiles.DATA / "run_minimum.toml")


def _name(check_id: str) -> str:
    """conformance/checks/test_x.py::test_y[param] -> test_x.py::test_y"""
    return check_id.rsplit("/", 1)[-1].split("[", 1)[0]


def shortfall(records: Iterable[Any], table: dict[str, Any] | None = None) -> str | None:
    """One sentence saying what the run lacks, or None. records: CheckRecord-like (id, tier, outcome)."""
    table = table if table is not None else minimum_table()
    records = list(records)
    if records and not any(r.outcome == "passed" for r in records):
        outcomes = sorted({r.outcome for r in records})
        return (f"no check passed ({len(records)} selected, all {'/'.join(outcomes)}): a run that judged nothing "
                "is not a pass.")
    for tier in sorted({r.tier for r in records}):
        rule = table.get(tier, {})
        mine = [r for r in records if r.tier == tier]
        passed = sum(r.outcome == "passed" for r in mine)
        if passed < int(rule.get("min_passed", 0)):
            return (f"{tier.upper()}: {passed} of {len(mine)} selected checks passed, at least "
                    f"{rule['min_passed']} must (data/run_minimum.toml): a tier that judged nothing is not a pass.")
        by_name: dict[str, list[str]] = {}
        for r in mine:
            by_name.setdefault(_name(r.id), []).append(r.outcome)
        unmet = [f"{name} ({'/'.join(sorted(set(by_name[name])))})" for name in rule.get("required", [])
                 if name in by_name and not all(o in ("passed", "xfailed") for o in by_name[name])]
        if unmet:
            return (f"{tier.upper()} requires {', '.join(unmet)} to pass (data/run_minimum.toml): without "
                    "them the tier is no verdict.")
    return None


# -- recorder --------------------------------------------------------------------------------------------------------


def fingerprint(ctx: RunContext) -> dict[str, Any]:
    t = ctx.resolved()
    extra = {"torch_version": t.torch_version, "torch_hip_version": t.hip_version,
             "torch_cuda_version": t.cuda_version, "target": t.as_dict(), "engine": ctx.engine_info}
    try:
        from env_checks.record.fingerprint import collect

        return collect(extra=extra)
    except Exception as exc:  # noqa: BLE001 - a broken probe must not lose the run
        return {"error": f"fingerprint collection failed: {type(exc).__name__}: {exc}", "runtime": extra}


ROOT = str(Path(__file__).resolve().parents[2]) + "/"


def _relative_paths(text: str) -> str:
    """Shared reports should not carry a machine's layout: checkout-relative paths, ~ for home."""
    return text.replace(ROOT, "").replace(str(Path.home()) + "/", "~/")


def suite_identity() -> dict[str, Any]:
    """What judged the run: the suite's package version, its git commit when it runs from a checkout (with
    `+dirty` when the checkout has changes), and a sha256 over every data table (conformance/data/**/*.toml), so
    a kept run says which limits and expectations judged it."""
    import hashlib
    import subprocess
    from importlib import metadata

    from conformance import datafiles

    try:
        version: str | None = metadata.version("gpu-llm-conformance")
    except metadata.PackageNotFoundError:
        version = None
    digest = hashlib.sha256()
    data = Path(str(datafiles.DATA))
    for path in sorted(data.rglob("*.toml")):
        digest.update(path.relative_to(data).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    commit = None
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / ".git").exists():
        try:
            head = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True,
                                  timeout=10)
            dirty = subprocess.run(["git", "-C", str(checkout), "status", "--porcelain", "--untracked-files=no"],
                                   capture_output=True, text=True, timeout=10)
            if head.returncode == 0:
                commit = head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
        except (OSError, subprocess.TimeoutExpired):
            commit = None
    return {"version": version, "commit": commit, "data_hash": digest.hexdigest()}


def _relative_fingerprint(fp: dict[str, Any]) -> dict[str, Any]:
    """The fingerprint without the machine's layout: paths checkout-relative, ~ for home (as in messages)."""
    import json

    return json.loads(_relative_paths(json.dumps(fp, default=str)))


def evidence_of(complete: bool, exit_status: int, planted_fault: str | None, not_run: list[str],
                refused: bool = False, foreign_server: str | None = None) -> bool:
    """Whether a run is platform evidence: complete, judged (exit 0 or 1, not interrupted), of the target it claims
    (not refused: `--rocm` on a CUDA torch is a usage mistake, no ROCm result), of the stack as it is (no planted
    fault), of every check of its tiers: `not_run` (coverage.Ledger, computed from what ran, whatever narrowed
    the run) is empty, and of this machine's stack only (`foreign_server`: why a user's server the serving checks
    judged is not it, `foreign_server_of`)."""
    return bool(complete and exit_status in (0, 1) and not planted_fault and not not_run and not refused
                and not foreign_server)


def foreign_server_of(ctx: RunContext, fp: dict[str, Any]) -> str | None:
    """Why the server the run's serving checks judged is not the stack its fingerprint describes, or None (the
    suite's own server, or none judged). A server the user runs (`--server`, $CONFORMANCE_SERVER_URL) may be any
    stack anywhere: it counts only where it reports, at vLLM's GET /version, the vLLM release this machine has."""
    server = getattr(ctx, "external_server", None)
    if server is None:
        return None
    theirs, mine = server.get("vllm"), (fp.get("packages") or {}).get("vllm")
    how = "a server the suite did not start (--server or $CONFORMANCE_SERVER_URL)"
    if theirs is None:
        return (f"the serving checks judged {how} that reports no vLLM version at GET /version: its stack cannot be "
                "held to this machine's fingerprint")
    if str(theirs).split("+")[0] != str(mine).split("+")[0]:  # a local label (+cpu, +hopper) is the same release
        return (f"the serving checks judged {how} that reports vLLM {theirs}, while this machine's fingerprint has "
                f"vLLM {mine}: its results are another stack's")
    return None


def evidence_problems(ctx: RunContext, complete: bool, exit_status: int, foreign: str | None) -> list[str]:
    """Why the run is not platform evidence, one sentence each ([] when it is); `foreign`: foreign_server_of's."""
    out = [] if complete and exit_status != 2 else ["the run was interrupted (complete: false)"]
    if getattr(ctx, "planted_fault", None):
        out.append(f"a negative control: fault {ctx.planted_fault} was planted in the engine")
    if ctx.resolved().problems:
        out.append("refused: " + "; ".join(ctx.resolved().problems))
    return out + ([foreign] if foreign else []) + ctx.ledger.problems(ctx.narrowed_by)


def build(ctx: RunContext, exit_status: int, complete: bool, fp: dict[str, Any]) -> dict[str, Any]:
    records = list(ctx.records.values())
    foreign = foreign_server_of(ctx, fp)
    for r in records:
        if r.duration_s == 0 and r.outcome == "error" and not r.message:
            r.message = "did not run (the run was interrupted or stopped first)"
        r.message = _relative_paths(r.message)
        known = diagnose(r.message) if r.outcome in ("failed", "error") else None
        if known and known.signature.failure_class:
            r.failure_class = known.signature.failure_class  # e.g. a capability gap, not a new failure
            r.bug_link = r.bug_link or known.signature.link
    return {
        "schema_version": 1,
        "run_id": ctx.run_id,
        "suite": suite_identity(),
        "started_at": ctx.started_at,
        "finished_at": runrecord.now_iso(),
        "complete": complete,
        "exit_status": exit_status,
        "target": ctx.target.name,
        "engine": ctx.engine,
        "dtype": ctx.dtype_name,
        "combo": ctx.combo,
        # a negative-control run: the stack was made wrong on purpose, so its outcome is no platform result
        "planted_fault": getattr(ctx, "planted_fault", None),
        "narrowed_by": getattr(ctx, "narrowed_by", None),
        # what a release decision may count: a whole, uninterrupted run of the stack as installed
        "evidence": evidence_of(complete, exit_status, getattr(ctx, "planted_fault", None), ctx.ledger.not_run(),
                                bool(ctx.resolved().problems), foreign),
        "evidence_problems": evidence_problems(ctx, complete, exit_status, foreign),
        "not_run": ctx.ledger.not_run(),  # every check of the tiers that did not run (runrecord.Ledger)
        "profile": ctx.profile,
        "profile_settings": ctx.target.profile.record() if ctx.target.profile is not None else None,
        "tiers": sorted({r.tier for r in records}),
        "model": model_record(ctx.model_meta),
        "fingerprint": fp,
        "summary": runrecord.summary_of(records),
        "checks": [r.as_dict() for r in records],
        "unmatched_expectations": ctx.unmatched_expectations,
        "phases": ctx.phases.snapshot(ctx.startups),
        "reference_results": reference_cache.run_summary(),
        "compile_cache": compile_cache.summary(),  # --compile-cache: whether the run found a fleet's kernels there
        "compile_keys": compile_cache.keys(),  # each vLLM start's torch.compile key and what it hashed
        **machine_health.results_fields(),
    }


def model_record(meta: dict[str, Any]) -> dict[str, Any]:
    """The record's `model`: --model's content hash, read in the background during the run, is taken here (read
    now if the run ended before it was; None if the files cannot be read)."""
    if meta.get("content_hash") is not None or not meta.get("path"):
        return dict(meta)
    from conformance.datafiles import content_hash

    try:
        digest: str | None = content_hash(Path(meta["path"]))
    except OSError:
        digest = None
    return dict(meta) | {"content_hash": digest}


def write(ctx: RunContext, exit_status: int, complete: bool) -> None:
    from env_checks.record.results import write_run

    if ctx.fingerprint is None:  # no check collected it: collected now, once (the summary reads it too)
        ctx.fingerprint = fingerprint(ctx)
    fp = _relative_fingerprint(ctx.fingerprint)
    write_run(ctx.run_dir, build(ctx, exit_status, complete, fp), None, fp)
    # pytest's junit.xml (written before this trylast hook) names skip locations by absolute path, and holds only the
    # checks that ran: each check of the tiers that did not run is added as an error, so a CI reading JUnit alone
    # never sees an interrupted or narrowed run as an empty, green suite
    junit = ctx.run_dir / "junit.xml"
    if junit.is_file():
        text = junit.read_text(encoding="utf-8")
        if _relative_paths(text) != text:
            junit.write_text(_relative_paths(text), encoding="utf-8")
        add_not_run_to_junit(junit, ctx.ledger.reasons(ctx.narrowed_by))


def add_not_run_to_junit(junit: Path, not_run: dict[str, str]) -> None:
    """One `<testcase>` with an `<error>` for each check id in `not_run` (-> its reason), and the suite's counts."""
    import xml.etree.ElementTree as ET

    if not not_run:
        return
    tree = ET.parse(junit)
    root = tree.getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    if suite is None:
        return
    for check_id, reason in sorted(not_run.items()):
        module, _, name = check_id.rsplit("/", 1)[-1].partition("::")
        case = ET.SubElement(suite, "testcase", classname=module.removesuffix(".py"), name=name, time="0")
        ET.SubElement(case, "error", message=reason).text = f"{check_id}: {reason}"
    for key in ("tests", "errors"):
        suite.set(key, str(int(suite.get(key, "0")) + len(not_run)))
    tree.write(junit, encoding="utf-8", xml_declaration=True)


def startup_line(startups: list[tuple[str, float]]) -> str | None:
    """Where a run's time went to start-ups, summed per kind: 'start-ups: 12 x vllm engine 48.2 s, ...'."""
    per: dict[str, list[float]] = {}
    for what, seconds in startups:
        per.setdefault(what, []).append(seconds)
    if not per:
        return None
    parts = [f"{len(v)} x {what} {sum(v):.1f} s" for what, v in sorted(per.items(), key=lambda kv: -sum(kv[1]))]
    return "start-ups: " + ", ".join(parts)


def print_summary(tr: Any, ctx: RunContext) -> None:
    records = sorted(ctx.records.values(), key=lambda r: (r.tier, r.id))
    tr.write_sep("=", "conformance summary")
    name_w = max((len(r.id.split("::")[-1]) for r in records), default=10)
    tr.write_line(f"{'outcome':9s} {'tier':4s} {'area':12s} {'check':{name_w}s} {'time':>7s}  figures")
    for r in records:
        figs = ", ".join(f"{k}={v:.3g}" for k, v in r.figures.items() if isinstance(v, (int, float)))
        colour = {"passed": {"green": True}, "failed": {"red": True}, "error": {"red": True}}.get(r.outcome, {})
        tr.write_line(f"{r.outcome:9s} {r.tier:4s} {r.area[:12]:12s} {r.id.split('::')[-1]:{name_w}s} "
                      f"{r.duration_s:6.1f}s  {figs}", **colour)
        if r.outcome in ("failed", "error") and r.message:
            tr.write_line(f"{'':9s} -> {r.message.splitlines()[0][:300]}")
            known = diagnose(r.message)
            if known:
                tr.write_line(f"{'':9s}    known signature {known.signature.id}: {known.signature.cause} "
                              f"Remedy: {known.signature.remedy}", yellow=True)
    counts = runrecord.summary_of(records)
    tr.write_line(", ".join(f"{v} {k}" for k, v in counts.items() if v))
    startups = startup_line(ctx.startups)
    if startups:
        tr.write_line(startups)
    cached, from_pack = reference_cache.counts, reference_cache.run_summary()["from_pack"]
    if cached.hits:
        where = ("the reference pack" if from_pack == cached.hits else
                 f"the reference pack ({from_pack}) and the cache ({cached.hits - from_pack})" if from_pack else
                 "the cache")
        tr.write_line(f"reference: {cached.hits} of {cached.hits + cached.misses + cached.derived} fp64 results read "
                      f"from {where} "
                      "(the same checkpoint, token ids and options); --fresh-reference computes them all")
    if cached.derived:
        tr.write_line(f"reference: {cached.derived} fp64 result(s) cut from a longer path of this run through the same "
                      "prompt (its steps up to theirs), not computed again")
    parted = reference_cache.run_summary().get("pack_paths_parted")
    if parted:
        tr.write_line(f"reference: {len(parted)} result(s) not in the pack, which held their prompts along other "
                      f"paths: the engine's tokens parted from the pack's at decode step {', '.join(map(str, parted))}"
                      " (its greedy paths differ run to run, or node to node)", yellow=True)
    shared = compile_cache.summary()
    if shared:
        tr.write_line(f"compile cache: {shared['path']} held {shared['files_at_start']} file(s) at the start"
                      + (" (a fleet's kernels, loaded where they match this stack)" if shared["warm"] else
                         " (this run filled it)") + f", {shared['files_at_end']} now")
    for line in compile_cache.recompiled():
        tr.write_line(line, yellow=True)
    for u in ctx.unmatched_expectations:
        tr.write_line(f"expectation matched no check: {u}", yellow=True)
    for line, bad in machine_health.summary_lines():
        tr.write_line(line, **({"red": True} if bad else {}))
    shortfall = getattr(ctx, "shortfall", None)  # conformance/run/recorder.py: what the run lacks to be a pass
    if shortfall:
        tr.write_line(f"not a pass: {shortfall}", red=True)
    if not records:  # a -k / -m that selects none is refused before this (preflight.selection)
        tr.write_line("no check ran: nothing was judged", red=True)
    not_run = ctx.ledger.not_run()
    foreign = foreign_server_of(ctx, ctx.fingerprint or {})
    for sentence in [*([foreign] if foreign else []), *ctx.ledger.problems(ctx.narrowed_by)]:  # evidence false
        tr.write_line(f"not a platform result: {sentence}", yellow=True)
    verdict = "PASS" if records and counts["failed"] + counts["error"] == 0 and not machine_health.failed() \
        and not shortfall else "FAIL"
    if verdict == "PASS" and not_run:
        verdict = (f"NOT A PASS (narrowed: {len(not_run)} check(s) of the tiers did not run; the "
                   f"{counts['passed']} that ran passed; exit 4)")
    tr.write_line(f"verdict: {verdict}   run written to {ctx.run_dir}/", bold=True,
                  green=verdict == "PASS", red=verdict != "PASS")
