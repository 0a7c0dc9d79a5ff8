"""The run's shared state: one `RunContext` per pytest session, kept in the config's stash.

The plugin creates it (`pytest_configure`); fixtures, the serving fixtures and the recorder read it through
`ctx_of`. It lives in its own module so that none of them has to import the plugin (no import cycle)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from conformance.run import run_target
from conformance.run.phases import Phases
from conformance.run.run_target import TargetReport
from conformance.run.runrecord import CheckRecord, Ledger

RUN_KEY = pytest.StashKey["RunContext"]()


@dataclass
class Prestart:
    """The suite's server started in the background for the checks that will need it
    (serving_fixtures.prestart_server): its thread, the process while it starts, the server once it has."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    thread: threading.Thread | None = None
    proc: Any = None
    server: Any = None
    error: BaseException | None = None
    discarded: bool = False  # an interrupted run discarded it: the thread, still waiting, launches nothing


@dataclass(slots=True)  # slots: an attribute not declared here is an AttributeError, never patched on
class RunContext:
    """The run's mutable state; what the run tests is `target`, one frozen RunTarget built at configure."""

    run_id: str
    run_dir: Path
    started_at: str
    target: run_target.RunTarget
    combo: str | None = None
    planted_fault: str | None = None  # --planted-fault: a negative-control run (engines/faults.py), never evidence
    narrowed_by: str | None = None  # the options that narrowed the run (-k, -m, --lf, --deselect, node ids …)
    records: dict[str, CheckRecord] = field(default_factory=dict)
    model_meta: dict[str, Any] = field(default_factory=lambda: {"name": "tiny-gpt-oss", "content_hash": None})
    engine_info: dict[str, Any] = field(default_factory=dict)
    fingerprint: dict[str, Any] | None = None
    collected: int = 0
    unmatched_expectations: list[str] = field(default_factory=list)
    # (what, seconds) of each engine or server start-up: where a run's time goes (the summary's last lines)
    startups: list[tuple[str, float]] = field(default_factory=list)
    engine_factory: Any = None  # the run's EngineFactory while the engines fixture is set up (fixtures.py)
    shortfall: str | None = None  # what the run lacks of data/run_minimum.toml (recorder.shortfall), set at its end
    # a server the user runs, as the serving checks used it ({"vllm": the version its GET /version reports, or None});
    # None: the suite's own server, or none was judged (recorder.foreign_server_of)
    external_server: dict[str, Any] | None = None
    ledger: Ledger = field(default_factory=Ledger)  # the tiers' checks against what ran (runrecord.Ledger)
    # set by the plugin as a signal stops the run: what runs in the background (the server's prestart) launches
    # nothing after it
    stopping: threading.Event = field(default_factory=threading.Event)
    phases: Phases = field(default_factory=Phases)  # where the run's time goes (phases.py)
    prestart: Prestart = field(default_factory=Prestart)

    # Read-only views of `target` for the code that still takes the run (checks take the `target` fixture).
    @property
    def engine(self) -> str:
        return self.target.engine

    @property
    def dtype_name(self) -> str:
        return self.target.dtype

    @property
    def model_arg(self) -> str | None:
        return self.target.model

    @property
    def profile(self) -> str | None:
        return self.target.profile.label if self.target.profile else None

    def resolved(self) -> TargetReport:
        assert self.target.report is not None, "the run's target is built with torch's facts (pytest_configure)"
        return self.target.report


def ctx_of(config: pytest.Config) -> RunContext:
    return config.stash[RUN_KEY]
