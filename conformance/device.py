"""Verdict helpers for the device checks: which SKU this is (data/devices.toml), whether the build
carries code for its ISA, and how far a device GEMM is from fp64 on the same inputs."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch

from conformance import settings


def devices() -> dict[str, Any]:
    return settings.load_toml(settings.DATA / "devices.toml")


def sku_for(name: str | None) -> dict[str, Any] | None:
    for d in devices()["device"]:
        if name and re.search(d["match"], name):
            return d
    return None


def isa_problems(isa: str | None, arch_list: list[str], required: str | None) -> list[str]:
    """The device's ISA is the one the SKU needs, and the torch build carries code objects for it."""
    problems = []
    if not isa:
        problems.append("the device reported no ISA (gcnArchName / compute capability)")
        return problems
    if required and isa != required:
        problems.append(f"the device is {isa} but this SKU requires {required}")
    if not any(a.split(":")[0] == isa or a == f"compute_{isa.removeprefix('sm_')}" for a in arch_list):
        problems.append(f"torch was built for {', '.join(arch_list) or 'no GPU arch'}, without {isa} code objects: "
                        f"kernels will fail with 'invalid device function' / 'no kernel image'")
    return problems


@dataclass
class GemmVerdict:
    dtype: str
    rel_err: float
    tolerance: float

    @property
    def ok(self) -> bool:
        return self.rel_err <= self.tolerance  # NaN fails

    def message(self) -> str:
        return (f"{self.dtype} GEMM: relative error {self.rel_err:.3g} against fp64 on the same inputs, "
                f"tolerance {self.tolerance:.3g}")


def gemm_verdict(dtype: str, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> GemmVerdict:
    exact = a.double() @ b.double()
    rel = ((c.double() - exact).norm() / exact.norm()).item()
    return GemmVerdict(dtype, rel, float(devices()["gemm_numerics"][dtype]))
