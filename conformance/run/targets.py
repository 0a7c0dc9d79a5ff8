"""What torch says of the stack a run tests: `TargetReport`, the torch facts and the problems of the target
asked for against the one installed (`run_target.resolve` writes it; the requirements per target are data)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from conformance.verdicts.verdict import Verdict


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

    def failure_message(self) -> str:
        return self.sentence()
