"""The P0 pin verdict: the platform's pin manifest (env_checks/pins/*.toml) evaluated on the run's
fingerprint. A violated or unknown required pin fails: a fact the suite could not read is not ok."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from conformance.verdicts.verdict import Verdict
from env_checks import pins


@dataclass
class PinReport(Verdict):
    manifest: str | None
    checked: int = 0
    problems: list[str] = field(default_factory=list)
    advisories: list[str] = field(default_factory=list)

    def failure_message(self) -> str:
        return f"manifest {self.manifest}: " + "; ".join(self.problems)


# pins on these facts concern that engine only: advisory when another engine is under test
ENGINE_FACTS = {"vllm": ("packages.vllm", "packages.vllm_distribution")}


def pin_report(fingerprint: dict, manifest_path: Path | None = None, engine: str = "vllm") -> PinReport:
    path = manifest_path or pins.manifest_for(fingerprint)
    if path is None:
        return PinReport(None, problems=["no pin manifest matches this platform: add one under env_checks/pins/"])
    manifest = pins.load_manifest(path)
    verdicts = pins.evaluate(manifest, fingerprint)
    report = PinReport(Path(path).name, checked=len(verdicts))
    hard = {id(v) for v in pins.failed(verdicts)}
    for v in verdicts:
        if v.status in ("ok", "n/a"):
            continue
        line = f"{v.name} {v.status}: expected {v.expected}, found {v.found!r} ({v.reason})"
        other_engine = any(name != engine and v.fact in facts for name, facts in ENGINE_FACTS.items())
        (report.problems if id(v) in hard and not other_engine else report.advisories).append(line)
    return report
