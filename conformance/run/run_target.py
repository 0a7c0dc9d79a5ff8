"""The run's target, resolved once: one frozen `RunTarget` built from data/targets.toml and what torch sees.

`resolve` decides which target a run tests (`--target auto` = the GPU torch sees, else the CPU) and what is
wrong with the installed stack; `build` turns that and the target's table into one typed object, kept on the
run and handed to checks and fixtures as the `target` fixture. `data()` is the one reader of targets.toml (the
noxfile asks it too): the names of the targets (`--target`, `--cpu/--cuda/--rocm`, the noxfile's GPU flags,
the matrix) come from it, the engine names from data/engines.toml: adding a platform or an engine adds a table
there, no choice list in code.

Standard library only at import (the CLI and the noxfile read the target names from here).

The check tiers, declared once: the CLI's `--tier` choices, the plugin's `--tier` option and tier markers,
the run record and the matrix all read them from here (standard library only: nox imports it).

What torch says of the stack a run tests: `TargetReport`, the torch facts and the problems of the target
asked for against the one installed (`run_target.resolve` writes it; the requirements per target are data)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cache
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from conformance.datafiles import DATA, DataError, load_toml
from conformance.engines import registry
from conformance.engines.forkserver import environment

if TYPE_CHECKING:
    from conformance.verdicts.profiles import Profile

from collections.abc import Iterable, Sequence
from dataclasses import asdict

from conformance.verdicts.verdict import Verdict

# -- tiers -----------------------------------------------------------------------------------------------------------


# name -> what the tier is for (the marker's description)
TIER_INFO: dict[str, str] = {
    "p0": "the gate",
    "p1": "production",
    "p2": "performance",
    "p3": "extended",
}
TIERS: tuple[str, ...] = tuple(TIER_INFO)
DEFAULT_TIERS: tuple[str, ...] = ("p0",)


def tier_marker_lines() -> list[str]:
    """The `markers` ini lines that declare the tier markers."""
    return [f"{tier}: tier {tier.upper()}, {what}" for tier, what in TIER_INFO.items()]


def tiers_asked(asked: Sequence[str] | None) -> tuple[str, ...]:
    """The tiers asked for (repeatable `--tier`; each value may also be a comma list such as `p0,p1`), in
    declaration order and without repeats; none asked = every tier. ValueError names an unknown tier."""
    if not asked:
        return TIERS
    names = {part.strip().lower() for value in asked for part in value.split(",") if part.strip()}
    unknown = sorted(names - set(TIERS))
    if unknown:
        raise ValueError(f"unknown tier {', '.join(unknown)}: the tiers are {', '.join(TIERS)}.")
    return tuple(t for t in TIERS if t in names)


def tier_of(marker_names: Iterable[str]) -> str | None:
    """The tier among a check's marker names (None when it has none)."""
    return next((name for name in marker_names if name in TIER_INFO), None)


# -- targets ---------------------------------------------------------------------------------------------------------


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


# -- run target ------------------------------------------------------------------------------------------------------


AUTO = "auto"
# the per-engine option tables of a target (engine name -> options; "device" configures the device checks)
OPTION_TABLES = ("vllm", "transformers", "device")


@cache
def data() -> dict[str, Any]:
    """data/targets.toml, read once per process: the one reader of that file (tests may patch a table of it)."""
    return load_toml(DATA / "targets.toml")


def names() -> tuple[str, ...]:
    """The targets targets.toml declares (a table with `torch_flavours`), in its order."""
    return tuple(k for k, v in data().items() if isinstance(v, dict) and "torch_flavours" in v)


def engine_names() -> tuple[str, ...]:
    """The `--engine` choices: the [engines.NAME] tables of data/engines.toml (conformance/run/capabilities.py)."""
    return tuple(load_toml(DATA / "engines.toml").get("engines", {}))


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
    """What the run tests, read once at configure and validated there: its target's table (data/targets.toml)
    resolved against the stack, the engine, the dtypes, the serving profile and the model."""

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
    model: str | None = None         # --model: the checkpoint directory under test (None: the tiny one)
    profile: Profile | None = field(default=None, compare=False)  # the serving profile (data/profiles.toml)

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

    def inspects_vllm_in_an_interpreter(self, engine: str) -> bool:
        """Whether vLLM's model inspection runs ahead of the engines in a fresh interpreter (forkserver.py
        `inspect_in_a_fresh_interpreter`): where vLLM is the engine under test and its engines spawn (the forkserver
        leaves vLLM out). Where they fork, a child of the forkserver runs it (phases.forkserver_ready)."""
        return registry.kind(engine).inspects_model and self.start_method(engine) != "forkserver"

    @property
    def forks_engines(self) -> bool:
        """Whether any engine kind forks from the run's forkserver."""
        return "forkserver" in {self.engine_start, *self.engine_start_by_kind.values()}

    def options_for(self, kind: str) -> dict[str, Any]:
        """The target's options for this engine kind (a fresh dict)."""
        return dict(self.engine_options.get(kind, {}))

    def _profile(self, kind: str, dtype: str | None) -> Profile | None:
        """The serving profile a vLLM process of this dtype runs: the run's, on a row that serves the dtype."""
        serves = registry.kind(kind).serving_profile and self.profile is not None
        return self.profile.serving(dtype or self.dtype) if serves else None

    def process_options(self, kind: str, dtype: str | None = None) -> dict[str, Any]:
        """What every process of this engine kind starts with (the engines, the layer probe, the server): the
        target's options, then for vLLM the serving profile and its backend row, then the dtype (`dtype` None: the
        run's). One place: on the H200 the server, built apart, ran FA3 where the engines ran the profile's
        TRITON_ATTN row. An engine of another dtype than the run's takes the profile's row that serves it."""
        profile = self._profile(kind, dtype)
        return self.options_for(kind) | (profile.engine_options() if profile else {}) | {"dtype": dtype or self.dtype}

    def fork_env(self, env: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
        """(what a child must start with, what it may set after its fork): a variable the stack reads at run
        time, not at import (targets.toml `run_time_env`), set to another value than the target's own
        environment moves to the second, so a child that differs from the forkserver only there still forks from it
        (the float32 twin's TRITON_F32_DEFAULT: Triton reads it as it compiles a kernel)."""
        late_keys = set(self.table.get("run_time_env", ()))
        late = {k: v for k, v in env.items() if k in late_keys and self.env.get(k) != v}
        return {k: v for k, v in env.items() if k not in late}, late

    def process_env(self, kind: str, dtype: str | None = None) -> dict[str, str]:
        """The environment of a process of this engine kind: the target's, the profile's row's for vLLM, and the
        dtype's (`env_by_dtype`; `dtype` None: the run's)."""
        profile = self._profile(kind, dtype)
        return dict(self.env) | (profile.engine_env() if profile else {}) | dict(
            self.table.get("env_by_dtype", {}).get(dtype or self.dtype, {}))


def flavour_name(table: dict[str, Any], flavour: str) -> str:
    """How a sentence names a torch build of this flavour (targets.toml `flavour_name`)."""
    row = table.get(flavour)
    return str(row.get("flavour_name", flavour)) if isinstance(row, dict) else flavour


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
    """Decide the target (`--rocm` on a CUDA or CPU build of torch is one clear sentence); `facts` can be given for
    a known-bad stack (negative controls)."""

    facts = facts if facts is not None else _torch_facts()
    table = data()
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


class RunRefused(ValueError):
    """An option of the run that the data does not allow (--engine, --dtype, --profile): one sentence."""


def build(name: str, engine: str | None = None, dtype: str | None = None, report: TargetReport | None = None,
          requested: str | None = None, model: str | None = None, profile: str | None = None,
          gate_only: bool = False) -> RunTarget:
    """The RunTarget of target `name` with the run's --engine / --dtype / --model / --profile (None: the target's
    defaults, the tiny model and the production profile of the SKU); `gate_only`: the run selects P0 alone, and
    its profile takes profiles.toml [gate]. An engine, dtype or profile the data does not allow is RunRefused; a
    target table short of a key is DataError."""
    table = data()
    if name not in names():
        raise DataError(f"targets.toml has no [{name}] target (it has {', '.join(names())}): add its table first.")
    if engine is not None and engine not in engine_names():
        raise RunRefused(f"--engine {engine!r} is no engine of data/engines.toml: use one of "
                         f"{', '.join(engine_names())}.")
    row = table[name]
    try:
        t = table["timeouts"]
        timeouts = Timeouts(float(t["engine_start_s"]), float(t["engine_call_s"]), float(t["check_s"]))
        target = RunTarget(
            name=name, requested=requested or name, description=str(row.get("description", "")),
            needs_device=bool(row["needs_device"]), vllm_platform=str(row["vllm_platform"]),
            engine=engine or str(row["default_engine"]), dtype=dtype or str(row["dtype"]),
            exact_dtype=row.get("exact_dtype"), engine_start=str(row["engine_start"]),
            engine_start_by_kind=_frozen(row.get("engine_start_by_kind", {})),
            env=_frozen(environment(row)),
            engine_options=_frozen({k: row.get(k, {}) for k in OPTION_TABLES}),
            timeouts=timeouts, table=_frozen(row),
            suite=_frozen({k: v for k, v in table.items() if isinstance(v, dict) and k not in names()}),
            report=report, model=model)
    except KeyError as exc:
        raise DataError(f"targets.toml lacks {exc.args[0]!r} for [{name}] (or [timeouts]): add it.") from None
    from conformance.checkpoints.quant.limits import format_limits, format_not_served
    from conformance.verdicts import limits, profiles

    # the run's dtype and its exact one have every limit the checks read (the `limits` fixture)
    refused = limits.refusal(dtype, target.dtype, target.exact_dtype)
    if refused:
        raise RunRefused(refused)
    config = profiles.read_config(model)
    fmt = format_not_served(config, target.engine, target.dtype)
    if fmt:  # the engine's own config validation would refuse it at every start (quant.toml `serves`)
        served = ", ".join(format_limits(fmt).serves.get(target.engine, []))
        raise RunRefused(f"{target.engine} runs this checkpoint's {fmt} weights in {served} only, not "
                         f"{target.dtype} (data/quant.toml [format.{fmt}] serves): pass --dtype {served.split(',')[0]} "
                         f"or a checkpoint dequantized to {target.dtype}.")
    devices = list(report.devices) if report else []
    # the dtype a profile's vLLM attention backend must serve; other engines do not use that backend
    backend_dtype = target.dtype if registry.kind(target.engine).serving_profile else None
    try:
        chosen = profiles.select(profile, name, devices, profiles.model_key(config),
                                 backend_dtype)
    except profiles.ProfileError as exc:
        raise RunRefused(str(exc)) from None
    return replace(target, profile=chosen.for_gate() if gate_only else chosen)
