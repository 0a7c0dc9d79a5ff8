"""Pin manifests (TOML data, one per platform) and their evaluation against a fingerprint.

A manifest lists `[[pin]]` entries, each naming a fact of the fingerprint by dotted path
(`platform.gfx_targets`, `packages.vllm`, `runtime.torch_hip_version`) and exactly one check:

    range = ">=6.4,<8"          version range (every element, for a per-GPU list)
    min = 177                   number or version floor (the smallest element, for a list)
    max = 64                    number ceiling (the largest element, for a list)
    equals = 0 / one_of = [..]  plain values
    all_equal = "gfx942"        every element of a non-empty list
    all_contain = "H200"        every element of a non-empty list contains the text
    all_in = ["0x74a1"]         every element of a non-empty list is one of these
    table = { SPX = 1, CPX = 8 } with keyed_by = "platform.compute_partition": the value the table gives for
                                that other fact (a partition mode decides the device count)
    contains_all = ["video"]    a list fact holds all of these
    same_release_as = "platform.rocm_version" (with parts = 2)   major.minor agree

plus `reason`, optional `link`, `severity` ("required", the default, or "recommended") and `unless_env`
(a table of environment values that waive the pin, e.g. HSA_NO_SCRATCH_RECLAIM = "1" for old MEC
firmware), `when` (a table of facts that must hold for the pin to apply, e.g. platform.virtualization =
"bare_metal" for what a VF cannot show; otherwise the pin is "n/a") and `default` (the value of a fact that
is absent, e.g. a kernel option not given on the command line). `[[known_bad]]` entries name a fact, a
`versions` range, a reason and a link.

Which machines a manifest describes is data too, its `[match]` table (see `matches`): a new SKU is a new
manifest file, no code.

A fact that is missing (tool not installed, output unparseable) gives "unknown", never "ok": the caller
fails closed. The fingerprint explains each missing platform fact under `platform.why_missing`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, published as tomli
    import tomli as tomllib

from env_checks.versions import InvalidVersion, Version, compare, in_range

PINS_DIR = resources.files("env_checks") / "pins"  # package data
CHECKS = ("range", "min", "max", "equals", "one_of", "all_equal", "all_contain", "all_in", "contains_all",
          "same_release_as", "table")
SEVERITIES = ("required", "recommended")


class PinManifestError(ValueError):
    """A manifest that cannot be used; the message is one sentence: file, problem, remedy."""


@dataclass
class Pin:
    name: str
    fact: str
    check: str
    expected: Any
    reason: str
    link: str | None = None
    severity: str = "required"
    unless_env: dict[str, str] = field(default_factory=dict)
    parts: int = 2
    when: dict[str, Any] = field(default_factory=dict)
    default: Any = None
    keyed_by: str | None = None


@dataclass
class KnownBad:
    name: str
    fact: str
    versions: str
    reason: str
    link: str


@dataclass
class PinManifest:
    path: Path
    platform: str
    description: str
    pins: list[Pin]
    known_bad: list[KnownBad]
    match: dict[str, Any] = field(default_factory=dict)


@dataclass
class PinVerdict:
    name: str
    status: str  # "ok" | "violation" | "unknown" | "n/a" (its `when` does not hold here)
    expected: str
    found: Any
    reason: str
    link: str | None = None
    severity: str = "required"
    fact: str = ""


def _need(path: Path, where: str, table: dict[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    if key not in table:
        raise PinManifestError(
            f"Pin manifest {path} has {where} without the required key '{key}'; add it "
            f"(see the module docstring of env_checks.pins for the format)."
        )
    if not isinstance(table[key], kind):
        raise PinManifestError(
            f"Pin manifest {path} has {where} whose '{key}' is a {type(table[key]).__name__}; "
            f"give it as {getattr(kind, '__name__', 'the documented type')}."
        )
    return table[key]


def _load_pin(path: Path, index: int, raw: dict[str, Any]) -> Pin:
    where = f"[[pin]] #{index + 1} ({raw.get('name', 'unnamed')})"
    checks = [c for c in CHECKS if c in raw]
    if len(checks) != 1:
        raise PinManifestError(
            f"Pin manifest {path} has {where} with {len(checks)} checks ({', '.join(checks) or 'none'}); "
            f"give exactly one of {', '.join(CHECKS)}."
        )
    severity = raw.get("severity", "required")
    if severity not in SEVERITIES:
        raise PinManifestError(
            f"Pin manifest {path} has {where} with severity {severity!r}; use 'required' or 'recommended'."
        )
    if checks[0] == "range":
        try:
            if not isinstance(raw["range"], str):
                raise InvalidVersion(f"range must be a string such as '>=6.4,<8', not {raw['range']!r}")
            in_range("0", raw["range"])
        except InvalidVersion as exc:
            raise PinManifestError(
                f"Pin manifest {path} has {where} with a bad range: {exc}; fix it.") from None
    return Pin(
        name=_need(path, where, raw, "name", str),
        fact=_need(path, where, raw, "fact", str),
        check=checks[0],
        expected=raw[checks[0]],
        reason=_need(path, where, raw, "reason", str),
        link=raw.get("link"),
        severity=severity,
        unless_env={str(k): str(v) for k, v in raw.get("unless_env", {}).items()},
        parts=int(raw.get("parts", 2)),
        when=dict(raw.get("when", {})),
        default=raw.get("default"),
        keyed_by=_need(path, where, raw, "keyed_by", str) if checks[0] == "table" else None,
    )


def load_manifest(path: str | Path) -> PinManifest:
    """Read and validate a pin manifest; raises PinManifestError with a one-sentence message."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise PinManifestError(
            f"Pin manifest {path} cannot be read ({exc.strerror}); check the path.") from None
    except tomllib.TOMLDecodeError as exc:
        raise PinManifestError(f"Pin manifest {path} is not valid TOML: {exc}; fix that line.") from None
    if data.get("schema_version") != 1:
        raise PinManifestError(
            f"Pin manifest {path} lacks schema_version = 1; add it at the top of the file.")
    pins = [_load_pin(path, i, raw) for i, raw in enumerate(data.get("pin", []))]
    known_bad = []
    for i, raw in enumerate(data.get("known_bad", [])):
        where = f"[[known_bad]] #{i + 1} ({raw.get('name', 'unnamed')})"
        known_bad.append(KnownBad(*(_need(path, where, raw, k, str)
                                    for k in ("name", "fact", "versions", "reason", "link"))))
    if not pins and not known_bad:
        raise PinManifestError(f"Pin manifest {path} has no [[pin]] or [[known_bad]] entries; add some.")
    match = data.get("match", {})
    unknown = set(match) - set(MATCH_KEYS) if isinstance(match, dict) else {"(not a table)"}
    if unknown:
        raise PinManifestError(f"Pin manifest {path} has [match] keys {', '.join(sorted(unknown))}; "
                               f"use {', '.join(MATCH_KEYS)}.")
    return PinManifest(
        path=path,
        platform=_need(path, "its top level", data, "platform", str),
        description=str(data.get("description", "")),
        pins=pins,
        known_bad=known_bad,
        match=match,
    )


MATCH_KEYS = ("accelerator", "gfx_targets", "names", "not_names", "device_ids", "vram_gib")
IDENTITY_KEYS = ("names", "device_ids", "vram_gib")


def _criterion(key: str, want: Any, platform: dict) -> bool | None:
    """True / False, or None when the fact it needs is unknown."""
    if key == "accelerator":
        return platform.get("accelerator") == want
    if key == "gfx_targets":
        have = platform.get("gfx_targets") or []
        return all(g in want for g in have) if have else None
    if key in ("names", "not_names"):
        names = [n.upper() for n in platform.get("gpu_names") or []]
        if not names:
            return None
        hits = [any(w.upper() in n for w in want) for n in names]
        return all(hits) if key == "names" else not any(hits)
    if key == "device_ids":
        ids = [str(i).lower() for i in platform.get("device_ids") or []]
        return all(i in [w.lower() for w in want] for i in ids) if ids else None
    if platform.get("compute_partition") not in (None, "SPX"):
        return None  # a partitioned device sees a share of the GPU's memory, not the SKU's size
    sizes = [v / 1024 for v in platform.get("vram_mib") or [] if isinstance(v, (int, float))]
    return all(want[0] <= v <= want[1] for v in sizes) if sizes else None


def matches(manifest: PinManifest, fingerprint: dict) -> bool:
    """Whether the manifest's [match] table describes this machine: no criterion contradicts it, and (when it
    has identity criteria: names, device ids, VRAM size) at least one of those is known to hold. An empty
    [match] matches nothing (a manifest only for --pins FILE)."""
    if not manifest.match:
        return False
    platform = fingerprint.get("platform") or {}
    results = {k: _criterion(k, v, platform) for k, v in manifest.match.items()}
    if any(r is False for r in results.values()) or results.get("accelerator") is None and "accelerator" in results:
        return False
    identity = [results[k] for k in IDENTITY_KEYS if k in results and k != "not_names"]
    return not identity or any(r is True for r in identity)


def matching_manifests(fingerprint: dict, pins_dir: Path = PINS_DIR) -> list[Path]:
    return [p for p in sorted(Path(pins_dir).glob("*.toml")) if matches(load_manifest(p), fingerprint)]


def manifest_for(fingerprint: dict, pins_dir: Path = PINS_DIR) -> Path | None:
    """The one manifest under `pins_dir` whose [match] describes this machine; None when none or several do
    (an MI300A must not borrow the MI300X pins, nor an unnamed gfx942 pick one of them)."""
    found = matching_manifests(fingerprint, pins_dir)
    return found[0] if len(found) == 1 else None


def lookup(fingerprint: dict, dotted: str) -> Any:
    node: Any = fingerprint
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _why_missing(fingerprint: dict, dotted: str) -> str:
    why = (lookup(fingerprint, "platform.why_missing") or {}).get(dotted.removeprefix("platform."))
    if why:
        return why
    if dotted.startswith("packages."):
        return f"{dotted.removeprefix('packages.')} is not installed"
    return "not in the fingerprint"


def _is_missing(value: Any) -> bool:
    return value is None or value == [] or value == {}


def _check(pin: Pin, value: Any, fingerprint: dict) -> tuple[bool | None, str]:
    """(passed, expected-as-text); passed None means the comparison itself could not be made."""
    exp = pin.expected
    values = value if isinstance(value, list) else [value]
    if pin.check == "range":
        return all(in_range(str(v), exp) for v in values), f"{exp}"
    if pin.check == "min":
        # Firmware counters are integers; anything else (driver strings) is compared as a version.
        if all(isinstance(v, int) for v in values) and isinstance(exp, int):
            return min(values) >= exp, f">= {exp}"
        return all(compare(str(v), str(exp)) >= 0 for v in values), f">= {exp}"
    if pin.check == "max":
        return max(values) <= exp, f"<= {exp}"
    if pin.check == "all_in":
        return bool(values) and all(str(v).lower() in [str(e).lower() for e in exp] for v in values), f"each in {exp}"
    if pin.check == "table":
        key = lookup(fingerprint, pin.keyed_by or "")
        if _is_missing(key) or str(key) not in exp:
            return None, f"the value {pin.keyed_by} = {key!r} gives in {exp} (no entry for it)"
        return value == exp[str(key)], f"== {exp[str(key)]!r} for {pin.keyed_by} = {key}"
    if pin.check == "equals":
        return value == exp, f"== {exp!r}"
    if pin.check == "one_of":
        return value in exp, f"one of {exp}"
    if pin.check == "all_equal":
        return all(v == exp for v in values), f"{exp!r} on every device"
    if pin.check == "all_contain":
        return all(exp in str(v) for v in values), f"{exp!r} in every name"
    if pin.check == "contains_all":
        return set(exp) <= set(values), f"includes {exp}"
    other = lookup(fingerprint, exp)
    if _is_missing(other):
        return None, f"same first {pin.parts} release parts as {exp} (which is unknown)"
    ours, theirs = (Version.parse(str(v)).release[: pin.parts] for v in (value, other))
    return ours == theirs, f"same first {pin.parts} release parts as {exp} ({other})"


def _evaluate_pin(pin: Pin, fingerprint: dict) -> PinVerdict:
    value = lookup(fingerprint, pin.fact)
    if _is_missing(value) and pin.default is not None:
        value = pin.default
    unmet = {k: lookup(fingerprint, k) for k, v in pin.when.items() if lookup(fingerprint, k) != v}
    if unmet:
        what = ", ".join(f"{k} is {v!r}" for k, v in unmet.items())
        return PinVerdict(pin.name, "n/a", f"applies when {pin.when}", value,
                          f"not applicable here ({what}). {pin.reason}", pin.link, pin.severity, pin.fact)
    env = fingerprint.get("env") or {}
    waiver = bool(pin.unless_env) and all(env.get(k) == v for k, v in pin.unless_env.items())
    waiver_text = " and ".join(f"{k}={v}" for k, v in pin.unless_env.items())
    verdict = PinVerdict(pin.name, "unknown", "", value, pin.reason, pin.link, pin.severity, pin.fact)
    if _is_missing(value):
        verdict.expected = f"{pin.fact} {pin.check} {pin.expected!r}"
        verdict.reason = f"{pin.fact} is unknown: {_why_missing(fingerprint, pin.fact)}. {pin.reason}"
    else:
        try:
            passed, verdict.expected = _check(pin, value, fingerprint)
        # A fact of an unexpected shape (a version string that is not one, a list where a scalar was
        # expected) is an unknown, not a crash of the gate.
        except (InvalidVersion, TypeError) as exc:
            passed, verdict.expected = None, f"{pin.fact} {pin.check} {pin.expected!r}"
            verdict.reason = f"{pin.fact} could not be compared: {exc}. {pin.reason}"
        verdict.status = {True: "ok", False: "violation", None: "unknown"}[passed]
    if pin.unless_env:
        verdict.expected += f" (or {waiver_text})"
    if verdict.status != "ok" and waiver:
        verdict.status = "ok"
        verdict.reason = f"waived because {waiver_text} is set. {pin.reason}"
    return verdict


def _evaluate_known_bad(bad: KnownBad, fingerprint: dict) -> PinVerdict:
    value = lookup(fingerprint, bad.fact)
    verdict = PinVerdict(bad.name, "unknown", f"{bad.fact} not {bad.versions}", value, bad.reason, bad.link,
                         fact=bad.fact)
    if _is_missing(value):
        verdict.reason = f"{bad.fact} is unknown: {_why_missing(fingerprint, bad.fact)}. {bad.reason}"
        return verdict
    try:
        verdict.status = "violation" if in_range(str(value), bad.versions) else "ok"
    except InvalidVersion as exc:
        verdict.reason = f"{bad.fact} could not be compared: {exc}. {bad.reason}"
    return verdict


def evaluate(manifest: PinManifest, fingerprint: dict) -> list[PinVerdict]:
    """One verdict per pin and per known-bad entry, in manifest order."""
    return [_evaluate_pin(p, fingerprint) for p in manifest.pins] + [
        _evaluate_known_bad(b, fingerprint) for b in manifest.known_bad
    ]


def failed(verdicts: list[PinVerdict]) -> list[PinVerdict]:
    """The verdicts that must stop a run: required pins that are violated or unknown (fail closed)."""
    return [v for v in verdicts if v.severity == "required" and v.status not in ("ok", "n/a")]
