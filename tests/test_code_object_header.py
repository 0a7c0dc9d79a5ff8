"""The run header names, before any engine starts, each library whose raw AMDGPU code objects the GPU cannot run
(conformance/run/recorder.py code_object_lines): on ROCm from the scan the ISA check judges later, on real code
objects of the amd-aiter wheel (fixtures/tools/isa/aiter); on CUDA and the CPU no scan and no line."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from conformance.run import recorder
from env_checks.probes import code_object_scan

AITER_META = Path(__file__).resolve().parent.parent / "fixtures" / "tools" / "isa" / "aiter" / "aiter_meta"


def ctx_of(target: str, gcn_arch: list[str]) -> SimpleNamespace:
    spec = SimpleNamespace(resolved=target, gcn_arch=gcn_arch)
    return SimpleNamespace(resolved=lambda: spec, engine="vllm")


def test_the_header_names_a_library_an_mi250_cannot_run(monkeypatch):
    scanned = code_object_scan.scan([code_object_scan.Root("aiter", str(AITER_META), "package")])
    monkeypatch.setattr(code_object_scan, "installed", lambda: scanned)
    count, problem = recorder.code_object_lines(ctx_of("rocm", ["gfx90a:sramecc+:xnack-"]))
    assert count.startswith("conformance: AMDGPU code objects: aiter 6 (gfx942 (4), gfx950 (2))")
    assert problem.startswith("conformance: aiter cannot run on gfx90a:sramecc+:xnack-: none of its 6 AMDGPU code "
                              "objects is for it, they are for gfx942 (4), gfx950 (2)")
    assert problem.endswith("(the device ISA check fails on it)")
    assert recorder.code_object_lines(ctx_of("rocm", ["gfx942:sramecc+:xnack-"])) == [count]


@pytest.mark.parametrize("target", ["cuda", "cpu"])
def test_no_scan_where_the_gpus_load_no_amdgpu_code_objects(monkeypatch, target):
    monkeypatch.setattr(code_object_scan, "installed", lambda: pytest.fail("scanned"))
    assert recorder.code_object_lines(ctx_of(target, [])) == []
