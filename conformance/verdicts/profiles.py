"""Serving profiles (data/profiles.toml): which engine configuration a run certifies.

`select` turns `--profile NAME[:BACKEND]`, the detected devices and the model under test into one
`Profile`; `engine_options` / `engine_env` merge it over targets.toml. Platform knowledge stays in the
data file; this module only matches and merges."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any

from conformance import datafiles

MODELS = ("tiny", "gpt-oss-20b", "gpt-oss-120b")


class ProfileError(ValueError):
    """A profile that does not exist or does not fit this run: one sentence."""


@dataclass(frozen=True)
class Backend:
    name: str
    label: str
    vllm: dict[str, Any]
    env: dict[str, str]
    dtypes: tuple[str, ...]


@dataclass(frozen=True)
class Profile:
    name: str
    sku: str
    target: str
    model: str
    production: bool
    matrix: tuple[str, ...]
    backend: Backend
    vllm: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    fit: dict[str, Any] = field(default_factory=dict)
    long_context: dict[str, Any] = field(default_factory=dict)
    gate: dict[str, Any] = field(default_factory=dict)  # profiles.toml [gate] vllm, where a gate-only run took it

    @property
    def label(self) -> str:
        """NAME, or NAME:BACKEND when the row is not the profile's default."""
        return self.name if self.backend.name == self.matrix[0] else f"{self.name}:{self.backend.name}"

    def engine_options(self) -> dict[str, Any]:
        """What the profile and its backend row set on the vLLM engine (merged over targets.toml)."""
        return dict(self.vllm) | dict(self.backend.vllm)

    def for_gate(self, table: dict[str, Any] | None = None) -> Profile:
        """This profile as a run of the gate alone (`--tier p0`) takes it: profiles.toml [gate] vllm merged over its
        options (a table such as compilation_config key by key) where [gate] names its model; itself elsewhere."""
        gate = (table or data()).get("gate", {})
        if self.model not in gate.get("models", ()):
            return self
        extra = dict(gate.get("vllm", {}))
        merged = dict(self.vllm)
        for key, value in extra.items():
            merged[key] = dict(merged.get(key, {})) | value if isinstance(value, dict) else value
        cap = gate.get("gpu_memory_utilization_at_most")
        if cap is not None and float(merged.get("gpu_memory_utilization", 0.0)) > cap:
            merged["gpu_memory_utilization"] = extra["gpu_memory_utilization"] = cap
        return replace(self, vllm=merged, gate=extra)

    def engine_env(self) -> dict[str, str]:
        return {k: str(v) for k, v in (dict(self.env) | dict(self.backend.env)).items()}

    def serving(self, dtype: str) -> Profile:
        """This profile on a row that serves `dtype`: its own row where it does, else the first row of its matrix
        that does, as a run of that dtype would take (a GPTQ engine in fp16 beside a bf16 run on the H200: FA3 takes
        gpt-oss's sinks in bf16 only); itself where no row does."""
        if _serves(self.backend, dtype):
            return self
        row = next((b for b in map(backend, self.matrix) if _serves(b, dtype)), None)
        return self if row is None else replace(self, backend=row)

    def record(self) -> dict[str, Any]:
        """The `profile_settings` of results.json."""
        return {"name": self.name, "sku": self.sku, "model": self.model, "production": self.production,
                "backend": self.backend.name, "backend_label": self.backend.label, "matrix": list(self.matrix),
                "vllm": self.engine_options(), "env": self.engine_env(), "gate": dict(self.gate)}


@cache
def data() -> dict[str, Any]:
    return datafiles.load_toml(datafiles.DATA / "profiles.toml")


def backend(name: str, table: dict[str, Any] | None = None) -> Backend:
    rows = (table or data())["backend"]
    if name not in rows:
        raise ProfileError(f"profiles.toml names backend {name!r}, which has no [backend.{name}] table")
    row = rows[name]
    return Backend(name, row["label"], dict(row.get("vllm", {})), dict(row.get("env", {})),
                   tuple(row.get("dtypes", ())))


def _serves(row: Backend, dtype: str | None) -> bool:
    """Whether a backend row serves `dtype` (a row that lists no dtypes serves any; None: any dtype)."""
    return dtype is None or not row.dtypes or dtype in row.dtypes


def profile(name: str, backend_name: str | None = None, table: dict[str, Any] | None = None,
            dtype: str | None = None) -> Profile:
    """Profile `name` on row `backend_name`; without one, the first row of its matrix that serves `dtype` (the
    first row when `dtype` is None or no row serves it: `select` then names the mismatch)."""
    table = table or data()
    profiles = table["profile"]
    if name not in profiles:
        raise ProfileError(f"there is no serving profile {name!r}: pick one of {', '.join(sorted(profiles))} "
                           "(data/profiles.toml)")
    row = profiles[name]
    matrix = tuple(row["matrix"])
    serving = [b for b in matrix if _serves(backend(b, table), dtype)]
    chosen = backend_name or (serving or matrix)[0]
    if chosen not in matrix:
        raise ProfileError(f"profile {name!r} has no backend row {chosen!r}: its matrix is {', '.join(matrix)}")
    sku = table["sku"][row["sku"]]
    return Profile(name, row["sku"], sku["target"], row["model"], bool(row["production"]), matrix,
                   backend(chosen, table), dict(row.get("vllm", {})), dict(row.get("env", {})),
                   dict(row.get("fit", {})), dict(row.get("long_context", {})))


def default_profile(target: str) -> Profile:
    """A GPU no SKU matches: targets.toml as it is."""
    return Profile(f"{target}-default", "unknown", target, "any", False, ("auto",), backend("auto"))


def detect_sku(devices: list[str], table: dict[str, Any] | None = None) -> str | None:
    """The SKU whose regex matches the device name torch reports (the first device's)."""
    if not devices:
        return None
    for sku, row in (table or data())["sku"].items():
        if row["match"] and re.search(row["match"], devices[0]):
            return sku
    return None


def model_key(config: dict[str, Any] | None) -> str:
    """tiny | gpt-oss-20b | gpt-oss-120b, from config.json (the real models: hidden 2880, 32 or 128 experts)."""
    if not config or int(config.get("hidden_size", 0)) != 2880:
        return "tiny"
    return {32: "gpt-oss-20b", 128: "gpt-oss-120b"}.get(int(config.get("num_local_experts", 0)), "tiny")


def read_config(model_arg: str | None) -> dict[str, Any] | None:
    if not model_arg:
        return None
    path = Path(model_arg) / "config.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # the model fixture reports a bad model dir in its own sentence


def select(requested: str | None, target: str, devices: list[str], model: str, dtype: str | None,
           table: dict[str, Any] | None = None) -> Profile:
    """The profile of this run: `--profile NAME[:BACKEND]`, else the production profile of the SKU and model."""
    table = table or data()
    if requested:
        name, _, row = requested.partition(":")
        chosen = profile(name, row or None, table, dtype)
        if chosen.target != target:
            raise ProfileError(f"profile {name!r} is for the {chosen.target} target ({chosen.sku}), but this run "
                               f"tests {target}: drop --profile or pick a {target} profile")
    else:
        sku = "cpu" if target == "cpu" else detect_sku(devices, table)
        if sku is None:
            return default_profile(target)
        matches = [n for n, r in table["profile"].items() if r["sku"] == sku and r["model"] == model
                   and r["production"]]
        if not matches:
            return default_profile(target)
        chosen = profile(matches[0], None, table, dtype)
    if dtype is not None and chosen.backend.dtypes and dtype not in chosen.backend.dtypes:
        raise ProfileError(f"backend {chosen.backend.name!r} ({chosen.backend.label}) of profile {chosen.name!r} "
                           f"serves {', '.join(chosen.backend.dtypes)}, not {dtype}: pick another --dtype or row")
    return chosen


def kv_fp8_format(target: str, gcn_arch: list[str] | None = None, table: dict[str, Any] | None = None) -> str:
    """The fp8 format kv_cache_dtype='fp8' stores on this target (fnuz on gfx942)."""
    row = (table or data())["kv_fp8"][target]
    for arch in gcn_arch or []:
        base = arch.split(":")[0]
        if base in row.get("format_by_arch", {}):
            return str(row["format_by_arch"][base])
    return str(row["format"])


def kv_fp8_rounding(target: str, table: dict[str, Any] | None = None) -> str:
    """How this target's kernel rounds K and V to fp8: nearest_even unless the data says the kernel truncates."""
    return str((table or data())["kv_fp8"][target].get("rounding", "nearest_even"))


def kv_fp8_attention(target: str, engine_info: dict[str, Any], table: dict[str, Any] | None = None
                     ) -> dict[str, Any] | None:
    """What the fp8 engine's attention kernel rounds to fp8 beside K and V (longref.Fp8Attention's fields), from
    [kv_fp8.<target>.attention] keyed by the attention implementation the engine reports; None where the target
    describes nothing beyond the cache. ValueError, in one sentence, for an implementation the data does not list."""
    described = (table or data())["kv_fp8"].get(target, {}).get("attention")
    if described is None:
        return None
    impls = sorted({str(v) for k, v in (engine_info.get("backends") or {}).items() if k.startswith("attention.")})
    if len(impls) != 1 or impls[0] not in described:
        raise ValueError(f"profiles.toml [kv_fp8.{target}.attention] describes {', '.join(sorted(described))}, and the "
                         f"fp8 engine runs {', '.join(impls) or 'no attention implementation it reports'}: what that "
                         "kernel rounds to fp8 beside the cache is unknown, so the quantised reference cannot model it")
    return dict(described[impls[0]])


def kv_fp8_unsupported(target: str, cpu_isa: str, table: dict[str, Any] | None = None) -> str | None:
    """Why the engine cannot run an fp8 KV cache here (None when it can)."""
    row = (table or data())["kv_fp8"].get(target, {})
    return row.get("unsupported_isa", {}).get(cpu_isa)
