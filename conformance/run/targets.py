"""Target resolution: what was asked for (cpu | cuda | rocm) against what is installed.

`--rocm` on a CUDA or CPU build of torch must fail P0 with one clear sentence; the requirements
per target are data (data/targets.toml)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from conformance.verdicts import settings
from conformance.verdicts.verdict import Verdict


def flavour_name(table: dict[str, Any], flavour: str) -> str:
    """How a sentence names a torch build of this flavour (targets.toml `flavour_name`)."""
    row = table.get(flavour)
    return str(row.get("flavour_name", flavour)) if isinstance(row, dict) else flavour


@dataclass
class TargetReport(Verdict):
    requested: str
    resolved: str
    torch_version: str | None = None
    torch_flavour: str | None = None
    hip_version: str | None = None
    cuda_version: str | None = None
    devices: list[str] = field(default_factory=list)
    gcn_arch: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def sentence(self) -> str:
        return " ".join(self.problems)

    @property
    def ok(self) -> bool:
        return not self.problems

    def failure_message(self) -> str:
        return self.sentence()


def _torch_facts() -> dict[str, Any]:
    try:
        import torch
    except ImportError as exc:
        return {"error": f"torch cannot be imported ({exc})"}
    hip, cuda = getattr(torch.version, "hip", None), getattr(torch.version, "cuda", None)
    facts: dict[str, Any] = {
        "torch_version": torch.__version__, "hip_version": hip, "cuda_version": cuda,
        "torch_flavour": "rocm" if hip else "cuda" if cuda else "cpu", "devices": [], "gcn_arch": [],
    }
    if facts["torch_flavour"] != "cpu" and torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            facts["devices"].append(props.name)
            if getattr(props, "gcnArchName", None):
                facts["gcn_arch"].append(props.gcnArchName)
    return facts


def resolve(requested: str, facts: dict[str, Any] | None = None) -> TargetReport:
    """Decide the target; `facts` can be given for a known-bad stack (negative controls)."""
    facts = facts if facts is not None else _torch_facts()
    table = settings.targets()
    if "error" in facts:
        return TargetReport(requested, "cpu" if requested == "auto" else requested,
                            problems=[f"{facts['error']}: install the stack under test first."])
    resolved = requested
    if requested == "auto":
        resolved = facts["torch_flavour"] if facts["devices"] else "cpu"
    report = TargetReport(requested, resolved, **{k: facts[k] for k in (
        "torch_version", "torch_flavour", "hip_version", "cuda_version", "devices", "gcn_arch")})
    need = table[resolved]
    flavour = facts["torch_flavour"]
    if flavour not in need["torch_flavours"]:
        report.problems.append(
            f"--{resolved} was requested but the installed torch {facts['torch_version']} is a "
            f"{flavour_name(table, flavour)} build, not a {flavour_name(table, resolved)} build: run inside the "
            f"stack you mean to test (such as the rocm/vllm container for ROCm) or drop --{resolved}.")
    elif need["needs_device"] and not facts["devices"]:
        report.problems.append(
            f"--{resolved} was requested and torch {facts['torch_version']} is a {resolved} build, but it sees "
            f"no GPU: check the driver, device nodes and *_VISIBLE_DEVICES.")
    return report
