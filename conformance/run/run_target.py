"""The run's target, resolved once: one frozen `RunTarget` built from data/targets.toml and what torch sees.

`targets.resolve` decides which target a run tests (`--target auto` = the GPU torch sees, else the CPU) and
what is wrong with the installed stack; `build` turns that and the target's table into one typed object, kept
on the run (`RunContext.spec`) and handed to checks and fixtures as the `target` fixture, so no check reads
`settings.targets()[...]` itself. The names of the targets (`--target`, `--cpu/--cuda/--rocm`, the noxfile's
GPU flags, the matrix) come from the same file, the engine names from data/engines.toml: adding a platform or
an engine adds a table there, no choice list in code.

Standard library only at import (the CLI and the noxfile read the target names from here)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

if TYPE_CHECKING:
    from conformance.run.targets import TargetReport

TARGETS_TOML: Path = resources.files("conformance") / "data" / "targets.toml"  # type: ignore[assignment]
ENGINES_TOML: Path = resources.files("conformance") / "data" / "engines.toml"  # type: ignore[assignment]
AUTO = "auto"
# the per-engine option tables of a target (engine name -> options; "device" configures the device checks)
OPTION_TABLES = ("vllm", "transformers", "device")


class TargetDataError(ValueError):
    """targets.toml lacks what a run needs of its target."""


@cache
def _table() -> dict[str, Any]:
    try:
        return tomllib.loads(TARGETS_TOML.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise TargetDataError(f"{TARGETS_TOML} is not valid TOML ({exc}): fix that line and run again.") from None


def names() -> tuple[str, ...]:
    """The targets targets.toml declares (a table with `torch_flavours`), in its order."""
    return tuple(k for k, v in _table().items() if isinstance(v, dict) and "torch_flavours" in v)


def engine_names() -> tuple[str, ...]:
    """The `--engine` choices: the [engines.NAME] tables of data/engines.toml (conformance/run/capabilities.py)."""
    try:
        return tuple(tomllib.loads(ENGINES_TOML.read_text()).get("engines", {}))
    except tomllib.TOMLDecodeError as exc:
        raise TargetDataError(f"{ENGINES_TOML} is not valid TOML ({exc}): fix that line and run again.") from None


def choices() -> list[str]:
    """The `--target` choices: auto, then every declared target."""
    return [AUTO, *names()]


def _frozen(table: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType({k: _frozen(v) if isinstance(v, dict) else v for k, v in table.items()})


@dataclass(frozen=True)
class Timeouts:
    engine_start_s: float
    engine_call_s: float
    check_s: float


@dataclass(frozen=True)
class RunTarget:
    """What the run tests, read once: its target's table (data/targets.toml) resolved against the stack."""

    name: str                        # cpu | cuda | rocm (what `--target auto` became)
    requested: str
    description: str
    needs_device: bool
    vllm_platform: str
    engine: str                      # the engine under test: --engine, else the target's default_engine
    dtype: str                       # the run's dtype: --dtype, else the target's dtype
    exact_dtype: str | None          # the dtype of the exact verdict run beside it (None: none)
    engine_start: str                # how engine children start: forkserver | spawn
    engine_start_by_kind: Mapping[str, str]  # the engine kinds that start otherwise ([<target>] engine_start_by_kind)
    env: Mapping[str, str]           # the engines' environment ([<target>.env])
    engine_options: Mapping[str, Mapping[str, Any]]  # [<target>.vllm], [<target>.transformers], [<target>.device]
    timeouts: Timeouts
    table: Mapping[str, Any]         # the whole [<target>] table (server start settings and the rest)
    suite: Mapping[str, Any]         # the suite-wide tables of targets.toml: [soak], [random_mix], ...
    report: TargetReport | None = field(default=None, compare=False)  # torch's facts, the stack's problems

    @property
    def problems(self) -> list[str]:
        return list(self.report.problems) if self.report else []

    @property
    def devices(self) -> list[str]:
        return list(self.report.devices) if self.report else []

    @property
    def gcn_arch(self) -> list[str]:
        return list(self.report.gcn_arch) if self.report else []

    def start_method(self, kind: str) -> str:
        """How an engine of this kind starts: its entry in engine_start_by_kind, else engine_start."""
        return str(self.engine_start_by_kind.get(kind, self.engine_start))

    @property
    def forks_engines(self) -> bool:
        """Whether any engine kind forks from the run's forkserver."""
        return "forkserver" in {self.engine_start, *self.engine_start_by_kind.values()}

    def options_for(self, kind: str) -> dict[str, Any]:
        """The target's options for this engine kind (a fresh dict)."""
        return dict(self.engine_options.get(kind, {}))


def environment(row: Mapping[str, Any]) -> dict[str, str]:
    """The engines' environment: [<target>.env], plus [<target>.env_without_modules.MODULE] where MODULE is not
    installed (found, not imported): vLLM's default path on CUDA imports FlashInfer's sampler, which a node may lack."""
    import importlib.util

    env = dict(row.get("env", {}))
    for module, extra in row.get("env_without_modules", {}).items():
        if importlib.util.find_spec(module) is None:
            env |= dict(extra)
    return env


def build(name: str, engine: str | None = None, dtype: str | None = None, report: TargetReport | None = None,
          requested: str | None = None) -> RunTarget:
    """The RunTarget of target `name` with the run's --engine / --dtype (None: the target's defaults)."""
    data = _table()
    if name not in names():
        raise TargetDataError(f"targets.toml has no [{name}] target (it has {', '.join(names())}): "
                              "add its table first.")
    row = data[name]
    try:
        t = data["timeouts"]
        timeouts = Timeouts(float(t["engine_start_s"]), float(t["engine_call_s"]), float(t["check_s"]))
        return RunTarget(
            name=name, requested=requested or name, description=str(row.get("description", "")),
            needs_device=bool(row["needs_device"]), vllm_platform=str(row["vllm_platform"]),
            engine=engine or str(row["default_engine"]), dtype=dtype or str(row["dtype"]),
            exact_dtype=row.get("exact_dtype"), engine_start=str(row["engine_start"]),
            engine_start_by_kind=_frozen(row.get("engine_start_by_kind", {})),
            env=_frozen(environment(row)),
            engine_options=_frozen({k: row.get(k, {}) for k in OPTION_TABLES}),
            timeouts=timeouts, table=_frozen(row),
            suite=_frozen({k: v for k, v in data.items() if isinstance(v, dict) and k not in names()}),
            report=report)
    except KeyError as exc:
        raise TargetDataError(f"targets.toml lacks {exc.args[0]!r} for [{name}] (or [timeouts]): add it.") from None


def of(run: Any) -> RunTarget:
    """The run's target, built once and kept on the run context."""
    report = run.resolved()
    key = (id(report), run.engine_kind, run.dtype)
    cached = getattr(run, "_spec", None)
    if cached is None or cached[0] != key:  # built again only if the run's target or options were replaced
        cached = (key, build(report.resolved, run.engine_kind, run.dtype, report, run.requested_target))
        run._spec = cached
    return cached[1]
