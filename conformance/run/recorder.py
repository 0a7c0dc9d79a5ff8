"""Writes the run (results.json, fingerprint.json beside pytest's junit.xml) and prints the
closing summary table. A failure here must never hide the verdict, so the fingerprint is
collected defensively and the writer's own errors are shown, not swallowed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conformance.reference import cache as reference_cache
from conformance.run import compile_cache, machine_health, phases, runrecord
from conformance.run.runcontext import RunContext
from env_checks.signatures import diagnose


def fingerprint(ctx: RunContext) -> dict[str, Any]:
    t = ctx.resolved()
    extra = {"torch_version": t.torch_version, "torch_hip_version": t.hip_version,
             "torch_cuda_version": t.cuda_version, "target": t.as_dict(), "engine": ctx.engine_info}
    try:
        from env_checks.fingerprint import collect

        return collect(extra=extra)
    except Exception as exc:  # noqa: BLE001 - a broken probe must not lose the run
        return {"error": f"fingerprint collection failed: {type(exc).__name__}: {exc}", "runtime": extra}


ROOT = str(Path(__file__).resolve().parents[2]) + "/"


def _relative_paths(text: str) -> str:
    """Shared reports should not carry a machine's layout: checkout-relative paths, ~ for home."""
    return text.replace(ROOT, "").replace(str(Path.home()) + "/", "~/")


def evidence_of(complete: bool, exit_status: int, planted_fault: str | None, narrowed_by: str | None,
                refused: bool = False) -> bool:
    """Whether a run is platform evidence: complete, judged (exit 0 or 1, not interrupted), of the target it claims
    (not refused: `--rocm` on a CUDA torch is a usage mistake, no ROCm result), of the stack as it is (no planted
    fault) and of every check of its tiers (not narrowed by -k/-m)."""
    return bool(complete and exit_status in (0, 1) and not planted_fault and not narrowed_by and not refused)


def build(ctx: RunContext, exit_status: int, complete: bool, fp: dict[str, Any]) -> dict[str, Any]:
    records = list(ctx.records.values())
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
        "evidence": evidence_of(complete, exit_status, getattr(ctx, "planted_fault", None),
                                getattr(ctx, "narrowed_by", None), bool(ctx.resolved().problems)),
        "profile": ctx.profile,
        "profile_settings": ctx.target.profile.record() if ctx.target.profile is not None else None,
        "tiers": sorted({r.tier for r in records}),
        "model": model_record(ctx.model_meta),
        "fingerprint": fp,
        "summary": runrecord.summary_of(records),
        "checks": [r.as_dict() for r in records],
        "unmatched_expectations": ctx.unmatched_expectations,
        "phases": phases.snapshot(ctx.startups),
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
    from env_checks.results import write_run

    fp = ctx.fingerprint if ctx.fingerprint is not None else fingerprint(ctx)
    write_run(ctx.run_dir, build(ctx, exit_status, complete, fp), None, fp)
    # pytest's junit.xml (written before this trylast hook) names skip locations by absolute path
    junit = ctx.run_dir / "junit.xml"
    if junit.is_file():
        text = junit.read_text(encoding="utf-8")
        if _relative_paths(text) != text:
            junit.write_text(_relative_paths(text), encoding="utf-8")


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
    shortfall = getattr(ctx, "shortfall", None)  # conformance/run/run_minimum.py: what the run lacks to be a pass
    if shortfall:
        tr.write_line(f"not a pass: {shortfall}", red=True)
    if not records:  # a -k / -m that selects none is refused before this (preflight.selection)
        tr.write_line("no check ran: nothing was judged", red=True)
    narrowed = getattr(ctx, "narrowed_by", None)
    if narrowed:  # recorded with evidence false; the console says it too, beside a verdict that reads like any other
        tr.write_line(f"not a platform result: the run was narrowed ({narrowed}); its verdict judges the checks "
                      "that ran", yellow=True)
    verdict = "PASS" if records and counts["failed"] + counts["error"] == 0 and not machine_health.failed() \
        and not shortfall else "FAIL"
    tr.write_line(f"verdict: {verdict}   run written to {ctx.run_dir}/", bold=True,
                  green=verdict == "PASS", red=verdict == "FAIL")
