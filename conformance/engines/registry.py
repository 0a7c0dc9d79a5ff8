"""What each engine kind is, as data (data/engines.toml): the class its child constructs, the distributions that are
it, and the roles it plays in a run. Adding an engine is an adapter class and a table there (docs/adding-an-engine.md);
no module outside conformance/engines/ compares an engine's name (tests/test_engine_names.py holds that)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from conformance import datafiles


@dataclass(frozen=True)
class EngineKind:
    """One [engines.NAME] (an engine under test) or [probes.NAME] (one the suite starts for itself) table."""

    name: str
    adapter: str  # module:Class
    packages: tuple[str, ...] = ()
    combo_version: str | None = None
    serving_profile: bool = False
    inspects_model: bool = False
    native_libraries: tuple[str, ...] = ()
    start_log: bool = False

    def construct(self, model: str, options: dict[str, Any]) -> Any:
        """The adapter, imported only in the child that runs it (vLLM and transformers are heavy imports)."""
        module, _, cls = self.adapter.partition(":")
        return getattr(importlib.import_module(module), cls)(model, options)


def _kinds(table: dict[str, Any]) -> dict[str, EngineKind]:
    out = {}
    for section in ("engines", "probes"):
        for name, row in table.get(section, {}).items():
            if "adapter" not in row:
                raise datafiles.DataError(f"engines.toml [{section}.{name}] names no adapter (module:Class)")
            out[name] = EngineKind(name, row["adapter"], tuple(row.get("packages", ())), row.get("combo_version"),
                                   bool(row.get("serving_profile")), bool(row.get("inspects_model")),
                                   tuple(row.get("native_libraries", ())), bool(row.get("start_log")))
    return out


def kinds() -> dict[str, EngineKind]:
    """Every engine kind of data/engines.toml, by name (datafiles.load_toml parses the file once per state)."""
    return _kinds(datafiles.load_toml(datafiles.DATA / "engines.toml"))


def under_test() -> frozenset[str]:
    """The engines a run can test (`--engine`): the [engines.NAME] tables, not the suite's own probes."""
    return frozenset(datafiles.load_toml(datafiles.DATA / "engines.toml").get("engines", {}))


def kind(name: str) -> EngineKind:
    """The kind `name`; ValueError naming the kinds there are for an unknown one."""
    found = kinds().get(name)
    if found is None:
        raise ValueError(f"unknown engine {name!r}: engines.toml declares {', '.join(sorted(kinds()))}")
    return found
