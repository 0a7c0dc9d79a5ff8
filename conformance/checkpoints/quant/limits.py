"""Per-format limits of the quantized loading checks (data/quant.toml), and the labels of numerics that are not
reference numerics (MXFP4 with FP8 activations, MI355X style), found from the methods the engine chose."""

from __future__ import annotations

from dataclasses import dataclass, field

from conformance import datafiles
from conformance.verdicts.compare import LogprobTolerance, VerdictReport


@dataclass(frozen=True)
class FormatLimits:
    fmt: str
    dtype: str
    tolerance: LogprobTolerance
    top_k: int
    quantized_layers: dict[str, list[str]] = field(default_factory=dict)  # engine -> name patterns
    engine_dtype: dict[str, str] = field(default_factory=dict)  # engine -> dtype, where not `dtype`
    serves: dict[str, list[str]] = field(default_factory=dict)  # engine -> the only dtypes it runs the format in

    def dtype_for(self, engine: str) -> str:
        return self.engine_dtype.get(engine, self.dtype)

    def served_in(self, engine: str, dtype: str) -> bool:
        """Whether `engine` runs this format in `dtype` (an engine the data names no dtypes for runs it in any)."""
        return dtype in self.serves.get(engine, [dtype])


@dataclass(frozen=True)
class NumericsLabel:
    name: str
    text: str
    reference_numerics: bool
    limits: FormatLimits


def _table() -> dict:
    return datafiles.load_toml(datafiles.DATA / "quant.toml")


def _limits(fmt: str, row: dict, source: str) -> FormatLimits:
    tolerance = LogprobTolerance(float(row["max_abs"]), row.get("p99"), row.get("median"), source=source)
    return FormatLimits(fmt, str(row.get("dtype", "bfloat16")), tolerance, int(row["top_k"]),
                        {k: list(v) for k, v in row.get("quantized_layers", {}).items()},
                        dict(row.get("engine_dtype", {})), {k: list(v) for k, v in row.get("serves", {}).items()})


def format_limits(fmt: str) -> FormatLimits:
    table = _table().get("format", {})
    if fmt not in table:
        raise datafiles.DataError(f"quant.toml has no [format.{fmt}] table: add its dtype and limits first.")
    return _limits(fmt, table[fmt], f"quant.toml format.{fmt}")


def format_not_served(config: dict | None, engine: str, dtype: str) -> str | None:
    """The checkpoint's quantization format (its config.json `quantization_config`) where `engine` does not run it
    in `dtype` (quant.toml `serves`: vLLM runs MXFP4 in bf16 only); None otherwise, and for a format the data
    says nothing of (the engine is asked as it is)."""
    from conformance.checkpoints.quant.validate import ALIASES

    method = str(((config or {}).get("quantization_config") or {}).get("quant_method", "")).lower()
    if not method:
        return None
    fmt = ALIASES.get(method, method)
    try:
        limits = format_limits(fmt)
    except datafiles.DataError:
        return None
    return None if limits.served_in(engine, dtype) else fmt


def numerics_label(fmt: str, methods: dict[str, str]) -> NumericsLabel | None:
    """The first label whose backend patterns occur in a method the engine chose for a layer, if any."""
    for name, row in _table().get("label", {}).items():
        if fmt not in row.get("applies_to", [fmt]):
            continue
        if any(p.lower() in m.lower() for p in row.get("backends", []) for m in methods.values()):
            return NumericsLabel(name, str(row["text"]), bool(row.get("reference_numerics", False)),
                                 _limits(fmt, row, f"quant.toml label.{name}"))
    return None


def quantization_applied(methods: dict[str, str], patterns: list[str], engine: str) -> VerdictReport:
    """Every layer the patterns name reports a quantized method (not vLLM's Unquantized*, not a plain Linear),
    and at least one such layer exists when the data expects some: an accepted quantization_config that
    quantizes nothing is a failure, not a pass."""
    r = VerdictReport(f"quantization applied in {engine}")
    hit = {n: m for n, m in methods.items() if any(p in n for p in patterns)}
    plain = sorted(n for n, m in hit.items() if m.startswith("Unquantized") or m == "Linear")
    r.measured = {"quantized_layers": float(len(hit) - len(plain))}
    r.details = [f"{n}: {m}" for n, m in sorted(methods.items())[:12]]
    if patterns and not hit:
        r.problems.append(f"no layer named like {patterns} was reported: the engine's model layout changed")
    if plain:
        r.problems.append(f"{len(plain)} layer(s) that the checkpoint quantizes run unquantized: {plain[:4]}")
    return r
