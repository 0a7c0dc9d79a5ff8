"""The run header: the first lines of every run name what is being tested (target, the stack's versions,
the GPUs, engine, dtype, profile, tiers) and where the run is written (run id and folder); where another process
already holds a GPU as the run starts, a line names it; on ROCm, a line counts the raw AMDGPU code objects of the
installed libraries per ISA and names each library the GPU cannot run.

pytest prints `pytest_report_header` lines only with its own header, which `-q` (what `conformance run`
uses) and `--no-header` hide; the plugin then prints these lines itself as the session starts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from conformance.engines import gpu_sharers
from env_checks.record.fingerprint import package_versions

PREFIX = "conformance:"


def _version(packages: Mapping[str, str | None], key: str) -> str:
    return packages.get(key) or "not installed"


def busy(listing: list[gpu_sharers.GpuProcess] | None) -> str | None:
    """The header's line for processes other than the suite's that hold a GPU as the run starts (`listing` as
    gpu_sharers.listed()), or None. The suite holds no GPU yet, so every other process listed is another job."""
    own = gpu_sharers.own_pids()
    others = [p for p in listing or [] if p.pid not in own]
    if not others:
        return None
    return (f"{PREFIX} the GPU is already in use: {'; '.join(p.describe() for p in others)}. Correctness checks "
            "are not affected; a serving level or device floor that misses its mark while it runs fails as shared_gpu")


def lines(ctx: Any, tiers: Sequence[str] = (), packages: Mapping[str, str | None] | None = None,
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
        f"{PREFIX} target {t.resolved} (asked: {t.requested}); torch {t.torch_version or 'not installed'} "
        f"[{t.torch_flavour or '?'}]; vLLM {vllm}; transformers {_version(packages, 'transformers')}; {gpu}{arch}",
        f"{PREFIX} engine {ctx.engine}, dtype {ctx.dtype_name}, profile {profile}, "
        f"model {ctx.model_arg or 'tiny-gpt-oss'}" + (f"; tiers {', '.join(tiers)}" if tiers else ""),
        f"{PREFIX} run {ctx.run_id} -> {ctx.run_dir}",
    ] + ([line] if (line := busy(gpu_processes)) else []) + compile_cache_lines() + code_object_lines(ctx)


def compile_cache_lines() -> list[str]:
    """Where --compile-cache points the compilers, and whether an earlier run (a fleet's first node) filled it."""
    from conformance.engines import compile_cache

    shared = compile_cache.summary()
    if shared is None:
        return []
    found = (f"{shared['files_at_start']} file(s) from earlier runs, loaded where they match this stack"
             if shared["warm"] else "empty, this run fills it")
    return [f"{PREFIX} compile cache {shared['path']}: {found}"]


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
    lines = code_object_verdict.summary(code_object_scan.installed(), t.gcn_arch, cfg["loaded_by"].get(ctx.engine, []))
    return [f"{PREFIX} {line}" for line in lines]


def pytest_shows_header(config: Any) -> bool:
    """Whether pytest prints its own header (and so the report-header lines) for this session."""
    return config.option.verbose >= 0 and not getattr(config.option, "no_header", False)
