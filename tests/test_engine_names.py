"""Engines are data (data/engines.toml, conformance/engines/registry.py): no module outside conformance/engines/
compares a value with an engine's name, and an engine declared only in data (its adapter class and its table) is
started by the suite's worker like any other."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from conformance import datafiles
from conformance.engines import registry
from conformance.engines.worker import EngineProcess
from conformance.run.capabilities import name_comparisons

ROOT = Path(__file__).resolve().parent.parent
# every module of the suite that must not know an engine by name: all but the engines' own wing
SCANNED = sorted(p for tree in ("conformance", "reports") for p in (ROOT / tree).rglob("*.py")
                 if "engines" not in p.relative_to(ROOT).parts[:2]) + [ROOT / "noxfile.py"]


def test_no_module_outside_the_engines_compares_an_engine_name():
    names = registry.under_test()
    found = [hit for path in SCANNED
             for hit in name_comparisons(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)), names)]
    assert found == [], "\n".join(found)


def test_the_scan_finds_a_comparison_with_an_engine_name():
    """The lint's control: each form an engine-name comparison takes is named, with its line."""
    source = 'if run.engine == "vllm":\n    pass\nok = kind in ("transformers", "tgi")\nfine = a == b\n'
    found = name_comparisons(source, "bad.py", registry.under_test())
    assert [f.split(":")[1] for f in found] == ["1", "3"], found


def test_every_engine_kind_names_an_adapter_that_imports():
    for kind in registry.kinds().values():
        module, _, cls = kind.adapter.partition(":")
        assert (ROOT / (module.replace(".", "/") + ".py")).is_file(), kind
        assert f"class {cls}" in (ROOT / (module.replace(".", "/") + ".py")).read_text(), kind


class FakeEngine:
    """An engine declared only in data: it answers what it was started with."""

    def __init__(self, model: str, options: dict) -> None:
        self.model, self.options_given = model, options

    def info(self) -> dict:
        return {"engine": "fake", "model": self.model}

    def options(self) -> dict:
        return self.options_given

    def close(self) -> None:
        pass


def test_an_engine_declared_only_in_data_starts_in_the_worker(tmp_path, monkeypatch):
    """docs/adding-an-engine.md: an adapter class and one engines.toml table; no other file changes."""
    data = tmp_path / "data"
    shutil.copytree(datafiles.DATA, data)
    (data / "engines.toml").write_text((data / "engines.toml").read_text() + '''
[engines.fake]
description = "a fake engine of the suite's own tests"
adapter = "tests.test_engine_names:FakeEngine"
packages = []
capabilities = []
''')
    monkeypatch.setattr(datafiles, "DATA", data)
    assert registry.kind("fake").adapter == "tests.test_engine_names:FakeEngine"
    with pytest.raises(ValueError, match="unknown engine 'tgi': engines.toml declares"):
        registry.kind("tgi")
    proc = EngineProcess("fake", "no-model", {"answer": 42}, {}, tmp_path / "engine-fake.log", 60.0)
    try:
        assert proc.info == {"engine": "fake", "model": "no-model"}
        assert proc.call("options", timeout_s=30) == {"answer": 42}
    finally:
        proc.close(5)
