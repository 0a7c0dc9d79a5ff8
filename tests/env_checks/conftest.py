"""Fixtures for the env_checks self-tests: recorded tool outputs and probe results built from them.

Helpers are handed out as fixtures (not imported from here) so that this conftest never clashes with
another one of the suite under pytest's default import mode.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# The suite may not be installed into the interpreter running the tests; its sources are.
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from env_checks.probes.facts import NOT_INSTALLED, ProbeFailure  # noqa: E402

PROBE_NAMES = ("rocminfo", "rocm_version", "amdgpu_version", "amd_smi_static", "amd_smi_firmware",
               "amd_smi_bad_pages", "nvidia_smi", "cmdline", "numa_balancing", "device_access", "cpuinfo",
               "mem_total_kib", "os_release")


@pytest.fixture
def tools_dir() -> Path:
    return REPO / "fixtures" / "tools"


@pytest.fixture
def recorded(tools_dir) -> Callable[[str], str]:
    """Text of a recorded tool output under fixtures/tools (see SOURCES.md there)."""
    return lambda name: (tools_dir / name).read_text()


@pytest.fixture
def probes() -> Callable[..., dict]:
    """Probe results where every probe not given reads as 'not installed'."""
    def build(**given):
        out = {name: ProbeFailure(name, NOT_INSTALLED, f"{name} not installed (not on PATH)")
               for name in PROBE_NAMES}
        out.update(given)
        return out
    return build


@pytest.fixture
def no_tools_on_path(tmp_path, monkeypatch) -> Path:
    """A PATH holding nothing: every GPU tool reads as not installed."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    return empty


@pytest.fixture
def fake_tool(tmp_path, monkeypatch) -> Callable[[str, str], Path]:
    """Put an executable `name` running the given sh body first on PATH (a stand-in for a real tool)."""
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")

    def make(name: str, body: str) -> Path:
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)
        return path
    return make
