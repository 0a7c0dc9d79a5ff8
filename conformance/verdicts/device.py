"""Verdict helpers for the device checks: which SKU this is (data/devices.toml), whether the build carries code
for its ISA (torch's arch list, the code objects in the native libraries, env_checks.isa, and the raw AMDGPU code
objects libraries load at run time, env_checks.code_object_scan), and how far a device GEMM is from fp64 on the
same inputs (the shapes, the sample of entries and the tolerances are data)."""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from conformance import datafiles
from conformance.engines import registry
from conformance.verdicts.verdict import FigureLimit, Verdict
from env_checks.probes import code_object_scan, code_object_verdict, isa

ISA_KIND = {"rocm": "hip", "cuda": "cuda"}


def devices() -> dict[str, Any]:
    return datafiles.load_toml(datafiles.DATA / "devices.toml")


def sku_for(name: str | None) -> dict[str, Any] | None:
    for d in devices()["device"]:
        if name and re.search(d["match"], name):
            return d
    return None


def isa_problems(isa_name: str | None, arch_list: list[str], required: str | None) -> list[str]:
    """The device's ISA is the one the SKU needs, and torch's build (its arch list) carries code for it."""
    problems = []
    if not isa_name:
        problems.append("the device reported no ISA (gcnArchName / compute capability)")
        return problems
    if required and isa_name != required:
        problems.append(f"the device is {isa_name} but this SKU requires {required}")
    if not any(a.split(":")[0] == isa_name or a == f"compute_{isa_name.removeprefix('sm_')}" for a in arch_list):
        problems.append(f"torch was built for {', '.join(arch_list) or 'no GPU arch'}, without {isa_name} code "
                        f"objects: kernels will fail with 'invalid device function' / 'no kernel image'")
    return problems


def library_isa(info: dict[str, Any], engine: str, scan: Any = None) -> isa.IsaVerdict:
    """The torch and vLLM native libraries carry code objects that run on this device (info from the device
    probe). vLLM's findings fail the check only when vLLM is the engine under test. `scan(kind, timeout_s)`
    replaces env_checks.isa.scan_installed in the negative controls."""
    cfg = devices()["isa"]
    device = info.get("isa_full") or info.get("isa") or ""
    scans, facts = (scan or isa.scan_installed)(ISA_KIND[info["platform"]], timeout_s=float(cfg["tool_timeout_s"]))
    strict = ("torch", *registry.kind(engine).native_libraries)  # data/engines.toml native_libraries
    other = dict(cfg.get("other_generation", {}))  # data: libraries vLLM builds for another GPU generation only
    v = isa.verdict(scans, device, info.get("arch_list") or None, strict=strict, other_generation=other)
    v.notes += [f"{label}: {why}" for label, why in other.items()]
    v.notes = facts + v.notes
    return v


def raw_code_object_isa(info: dict[str, Any], engine: str,
                        scan: Callable[[], code_object_scan.CodeObjectScan] | None = None
                        ) -> code_object_verdict.CodeObjectVerdict:
    """The raw AMDGPU code objects of AITER, Triton, vLLM and their caches run on this device (info from the
    device probe), on the platforms devices.toml [isa.code_objects] names; elsewhere not applicable. The scan is the
    one the run header read before any engine started (code_object_scan.installed); `scan()` replaces it in the
    negative controls. Libraries the engine loads (loaded_by) fail the check; the others advise."""
    cfg = devices()["isa"]["code_objects"]
    platform = info.get("platform", "cpu")
    if platform not in cfg["platforms"]:
        return code_object_verdict.CodeObjectVerdict(
            "", not_applicable=f"raw AMDGPU code objects: not applicable on {platform} (devices.toml "
                               f"[isa.code_objects] platforms = {cfg['platforms']})")
    device = info.get("isa_full") or info.get("isa")
    return code_object_verdict.judge((scan or code_object_scan.installed)(), device,
                                     cfg["loaded_by"].get(engine, []))


# ---- GEMM numerics ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GemmTolerance:
    rel_fro: float  # ||C - C64||_F / ||C64||_F over the checked entries
    entry: float    # max |C - C64| / (|C64| + rms(C64)): one wrong tile or tail


def gemm_tolerance(dtype: str) -> GemmTolerance:
    row = devices()["gemm_numerics"]["tolerance"][dtype]
    return GemmTolerance(float(row["rel_fro"]), float(row["entry"]))


@dataclass
class GemmPlan:
    """What one numerics check runs: shapes (M, K, N), the dtype handed to the probe, and why not, if skipped."""

    shapes: list[tuple[int, int, int]] = field(default_factory=list)
    probe_dtype: str = ""
    tf32: bool = False
    skip: str | None = None
    not_applicable: list[tuple[int, int, int]] = field(default_factory=list)


def gemm_plan(dtype: str, info: dict[str, Any]) -> GemmPlan:
    cfg = devices()["gemm_numerics"]
    gpu = info.get("platform", "cpu") != "cpu"
    where = "gpu" if gpu else "cpu"
    grid = cfg["shapes"][where]
    shapes = [(m, k, n) for m in grid["m"] for k in grid["k"] for n in grid["n"]]
    shapes += [tuple(s) for s in cfg["shapes"][f"odd_{where}"]]
    name = info.get("name") or "the CPU"
    if dtype == "tf32":
        if not gpu:
            return GemmPlan(skip="TF32 is a tensor-core mode of the GPU: not applicable on the CPU")
        return GemmPlan(shapes, "float32", tf32=True)
    if dtype == "float8":
        sku = sku_for(info.get("name")) if gpu else None
        if not sku or not sku.get("fp8"):
            return GemmPlan(skip=f"no FP8 GEMM format for {name} in devices.toml")
        mult = int(cfg["fp8_multiple"])
        fits = [s for s in shapes if s[1] % mult == 0 and s[2] % mult == 0]
        return GemmPlan(fits, f"float8_{sku['fp8']}", not_applicable=[s for s in shapes if s not in fits])
    return GemmPlan(shapes, dtype)


def fresh_seed() -> int:
    """A new seed for every run (inputs differ run to run); recorded as a figure for the repro."""
    return random.SystemRandom().randrange(2**31)


def sample_indices(size: int, limit: int, edge: int, rng: random.Random) -> list[int]:
    """All of range(size) if it is at most `limit` long, else the first and last `edge` (where tile tails live)
    and random others, `limit` in all, sorted."""
    if size <= limit:
        return list(range(size))
    chosen = set(range(edge)) | set(range(size - edge, size))
    chosen |= set(rng.sample(range(edge, size - edge), limit - len(chosen)))
    return sorted(chosen)


def gemm_sample(shape: tuple[int, int, int], seed: int) -> tuple[list[int], list[int]]:
    """The rows and columns of C the fp64 reference checks for this shape and seed."""
    cfg = devices()["gemm_numerics"]
    rng = random.Random(seed)
    m, _, n = shape
    return (sample_indices(m, int(cfg["rows"]), int(cfg["edge"]), rng),
            sample_indices(n, int(cfg["cols"]), int(cfg["edge"]), rng))


@dataclass
class GemmVerdict(Verdict):
    dtype: str
    rel_err: float
    entry_err: float
    tolerance: GemmTolerance
    shape: tuple[int, int, int] = (0, 0, 0)
    entries: int = 0
    nonfinite: int = 0

    @property
    def ok(self) -> bool:
        # comparisons with NaN are False: a NaN figure fails
        return (self.nonfinite == 0 and self.rel_err <= self.tolerance.rel_fro
                and self.entry_err <= self.tolerance.entry)

    @property
    def problems(self) -> list[str]:
        return [] if self.ok else [self.failure_message()]

    def failure_message(self) -> str:
        """The shape's figures against the tolerance, whether it passed or not."""
        m, k, n = self.shape
        return (f"{self.dtype} GEMM M={m} K={k} N={n}: relative error {self.rel_err:.3g} (tolerance "
                f"{self.tolerance.rel_fro:.3g}), worst entry {self.entry_err:.3g} (tolerance "
                f"{self.tolerance.entry:.3g}), {self.nonfinite} non-finite, over {self.entries} entries checked "
                f"against fp64 on the same inputs")


def gemm_verdict(dtype: str, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor,
                 shape: tuple[int, int, int] | None = None, tolerance: GemmTolerance | None = None) -> GemmVerdict:
    """c (rows x cols, from the device) against a @ b in fp64 on the CPU; a and b hold the inputs exactly as
    the device saw them (already rounded to the dtype)."""
    exact = a.double() @ b.double()
    got = c.double()
    nonfinite = int((~torch.isfinite(got)).sum())
    diff = got - exact
    rms = exact.pow(2).mean().sqrt()
    rel = (diff.norm() / exact.norm()).item()
    entry = (diff.abs() / (exact.abs() + rms)).max().item() if diff.numel() else 0.0
    return GemmVerdict(dtype, rel, entry, tolerance or gemm_tolerance(dtype),
                       shape or (a.shape[0], a.shape[1], b.shape[1]), c.numel(), nonfinite)


@dataclass
class GemmReport(Verdict):
    """Every shape of one dtype: the worst figures, and a message naming each failing shape and the seed."""

    dtype: str
    seed: int
    verdicts: list[GemmVerdict]
    not_applicable: list[tuple[int, int, int]] = field(default_factory=list)

    def figures(self) -> dict[str, float]:
        def worst(values: list[float]) -> float:
            return float("nan") if any(x != x for x in values) else max(values, default=float("nan"))

        # the dashboard shows a check's first figure: the error comes first
        return {"gemm_rel_err": worst([v.rel_err for v in self.verdicts]),
                "gemm_entry_err": worst([v.entry_err for v in self.verdicts]),
                "entries_checked": sum(v.entries for v in self.verdicts), "shapes": len(self.verdicts),
                "shapes_not_applicable": len(self.not_applicable), "seed": self.seed}

    def limits(self) -> dict[str, FigureLimit]:
        if not self.verdicts:
            return {}
        tol, where = self.verdicts[0].tolerance, f"devices.toml gemm_numerics.tolerance.{self.dtype}"
        return {"gemm_rel_err": FigureLimit(tol.rel_fro, "max", f"{where}.rel_fro"),
                "gemm_entry_err": FigureLimit(tol.entry, "max", f"{where}.entry")}

    @property
    def problems(self) -> list[str]:
        if not self.verdicts:
            return [f"no {self.dtype} GEMM shape was checked (seed {self.seed})"]
        return [p for v in self.verdicts for p in v.problems]

    def failure_message(self) -> str:
        bad = [v for v in self.verdicts if not v.ok]
        if not bad:
            return "; ".join(self.problems)
        head = f"{len(bad)} of {len(self.verdicts)} {self.dtype} GEMM shapes out of tolerance (seed {self.seed})"
        return "; ".join([head, *self.problems])
