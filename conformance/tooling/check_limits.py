"""A check's `Limits:` line: the data tables it is judged by, read from the data so the reference cannot drift.

    Limits: tolerances.toml [logprobs.<dtype>]; gpt_oss.toml [tolerances.moe.router_tie_ulps.<dtype>]
    Limits: devices.toml [device] name, floor_tflops (a floor per SKU)

Entries are separated by `;`. Each names a file of conformance/data and a table path in brackets; a segment in angle
brackets stands for every key the table has there: `<dtype>` for each dtype it names (DTYPES), any other (`<fmt>`,
`<target>`) for each of its sub-tables; so the reference lists one row per dtype (per format, per target) with that
row's values. An array of tables (`[[floor]]`) gives one row per
entry. Names after the bracket keep only those keys of each row; a parenthesis at the end is a note shown beside
the values (where the limit was measured: a notebook section). A check that judges by no data limit has no
`Limits:` line; a check that takes the run's `limits`, `tolerance` or `exact_limits` fixture must have one (the
plugin's metadata lint, conformance/run/runrecord.py).

Standard library only: the reference generator and the lint both read it."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
FIELD = "Limits"
# the fixtures that hand a check the run's limits (conformance/run/fixtures.py): a check taking one judges by data
LIMIT_FIXTURES = ("limits", "tolerance", "exact_limits")
NO_LIMIT = "no numeric limit (exact/closed-form)"
DTYPES = ("float32", "tf32", "bfloat16", "float16", "float8")  # what `<dtype>` stands for, where a table has it

_ENTRY = re.compile(r"^(?P<file>[\w.-]+\.toml)\s*\[(?P<path>[^\]]+)\]\s*(?P<keys>[\w\s,]*?)\s*(?:\((?P<note>.*)\))?$")


class LimitsError(ValueError):
    """A `Limits:` entry that is malformed or names a table the data does not have."""


@dataclass(frozen=True)
class LimitTable:
    """One entry of a `Limits:` line."""

    file: str  # tolerances.toml
    path: tuple[str, ...]  # ("logprobs", "<dtype>")
    keys: tuple[str, ...] = ()  # keep only these keys of each row
    note: str = ""

    @property
    def name(self) -> str:
        return f"{self.file} [{'.'.join(self.path)}]" + (f" {', '.join(self.keys)}" if self.keys else "")

    @property
    def placeholders(self) -> tuple[str, ...]:
        return tuple(p[1:-1] for p in self.path if p.startswith("<") and p.endswith(">"))


@dataclass(frozen=True)
class LimitRow:
    """The values of one instance of a table: `key` names it (the dtype, the format …; "" for a plain table)."""

    key: str
    values: dict[str, Any]


def parse(text: str) -> list[LimitTable]:
    """The entries of a `Limits:` value; LimitsError says which entry is malformed."""
    out = []
    for entry in (e.strip() for e in text.split(";")):
        if not entry:
            continue
        m = _ENTRY.match(entry)
        if not m:
            raise LimitsError(f"has a '{FIELD}:' entry {entry!r} that is not FILE.toml [table.path] (e.g. "
                              "tolerances.toml [logprobs.<dtype>])")
        keys = tuple(k for k in re.split(r"[\s,]+", m.group("keys")) if k)
        out.append(LimitTable(m.group("file"), tuple(m.group("path").strip().split(".")), keys,
                              (m.group("note") or "").strip()))
    if not out:
        raise LimitsError(f"has an empty '{FIELD}:' line")
    return out


@lru_cache(maxsize=32)
def _data(path: Path, mtime_ns: int) -> dict[str, Any]:
    return tomllib.loads(path.read_text())


def load(file: str, data_dir: Path = DATA_DIR) -> dict[str, Any]:
    path = data_dir / file
    if not path.is_file():
        raise LimitsError(f"names {file}, which conformance/data does not have")
    try:
        return _data(path, path.stat().st_mtime_ns)
    except tomllib.TOMLDecodeError as exc:
        raise LimitsError(f"names {file}, which is not valid TOML ({exc})") from None


def _walk(node: Any, path: tuple[str, ...], key: tuple[str, ...]) -> list[tuple[tuple[str, ...], Any]]:
    """Every (placeholder values, node) the path reaches from `node`."""
    if not path:
        return [(key, node)]
    head, rest = path[0], path[1:]
    if head.startswith("<") and head.endswith(">"):
        if not isinstance(node, dict):
            return []
        keys = [k for k in node if (k in DTYPES if head == "<dtype>" else isinstance(node[k], dict))]
        return [hit for k in keys for hit in _walk(node[k], rest, (*key, k))]
    if isinstance(node, dict) and head in node:
        return _walk(node[head], rest, key)
    return []


def _scalars(value: Any, keys: tuple[str, ...]) -> dict[str, Any]:
    """A row's values: a table's entries (inline tables flattened to `a.b`), or the value itself under ''."""
    if not isinstance(value, dict):
        return {"": value}
    out: dict[str, Any] = {}
    for k, v in value.items():
        if keys and k not in keys:
            continue
        if isinstance(v, dict):
            out.update({f"{k}.{kk}": vv for kk, vv in v.items() if not isinstance(vv, (dict, list))})
        else:
            out[k] = v
    return out


def resolve(table: LimitTable, data_dir: Path = DATA_DIR) -> list[LimitRow]:
    """The rows of one entry, read from the data now; LimitsError where the data has no such table."""
    hits = _walk(load(table.file, data_dir), table.path, ())
    rows = []
    for key, node in hits:
        items = node if isinstance(node, list) and all(isinstance(n, dict) for n in node) else [node]
        for n, item in enumerate(items):
            own = item.get("name") if isinstance(item, dict) and isinstance(item.get("name"), str) else str(n + 1)
            label = ".".join(key) if len(items) == 1 and node is item else ".".join((*key, own))
            values = _scalars(item, table.keys)
            if values:
                rows.append(LimitRow(label, values))
    if not rows:
        raise LimitsError(f"names {table.name}, which {table.file} does not have")
    return rows


def problems(text: str | None, fixtures: tuple[str, ...] | list[str] = (), data_dir: Path = DATA_DIR) -> list[str]:
    """Why a check's `Limits:` line does not name tables the data has (empty when it does), and whether a check
    that takes the run's limits lacks the line."""
    if text is None:
        taken = [f for f in LIMIT_FIXTURES if f in fixtures]
        return [f"takes the {taken[0]!r} fixture but has no '{FIELD}:' line naming the tables it is judged by "
                "(e.g. tolerances.toml [logprobs.<dtype>])"] if taken else []
    try:
        tables = parse(text)
    except LimitsError as exc:
        return [str(exc)]
    out = []
    for table in tables:
        try:
            resolve(table, data_dir)
        except LimitsError as exc:
            out.append(f"has a '{FIELD}:' entry that {exc}")
    return out
