"""The run's shared state: one `RunContext` per pytest session, kept in the config's stash.

The plugin creates it (`pytest_configure`); fixtures, the serving fixtures and the recorder read it through
`ctx_of`. It lives in its own module so that none of them has to import the plugin (no import cycle)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from conformance.run import run_target, targets
from conformance.run.runrecord import CheckRecord

RUN_KEY = pytest.StashKey["RunContext"]()


@dataclass
class RunContext:
    run_id: str
    run_dir: Path
    started_at: str
    requested_target: str
    engine_kind: str | None
    dtype: str | None
    model_arg: str | None
    combo: str | None
    target: targets.TargetReport | None = None
    records: dict[str, CheckRecord] = field(default_factory=dict)
    model_meta: dict[str, Any] = field(default_factory=lambda: {"name": "tiny-gpt-oss", "content_hash": None})
    engine_info: dict[str, Any] = field(default_factory=dict)
    fingerprint: dict[str, Any] | None = None
    collected: int = 0
    unmatched_expectations: list[str] = field(default_factory=list)
    # (what, seconds) of each engine or server start-up: where a run's time goes (the summary's last lines)
    startups: list[tuple[str, float]] = field(default_factory=list)
    # the serving profile (data/profiles.toml) the engines run under: its label, and the Profile itself
    profile: str | None = None
    serving_profile: Any = None
    narrowed_by: str | None = None  # a user's -k / -m: the run judged only part of its tiers
    planted_fault: str | None = None  # --planted-fault: a negative-control run (engines/faults.py), never evidence
    engine_factory: Any = None  # the run's EngineFactory while the engines fixture is set up (fixtures.py)

    def resolved(self) -> targets.TargetReport:
        if self.target is None:
            self.target = run_target.resolve(self.requested_target)
        return self.target

    @property
    def spec(self) -> run_target.RunTarget:
        """The run's target, resolved once into one frozen object (conformance/run/run_target.py)."""
        return run_target.of(self)

    @property
    def engine(self) -> str:
        return self.spec.engine

    @property
    def dtype_name(self) -> str:
        return self.spec.dtype


def ctx_of(config: pytest.Config) -> RunContext:
    return config.stash[RUN_KEY]
