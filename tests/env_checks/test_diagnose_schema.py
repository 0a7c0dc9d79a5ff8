"""The `diagnose --json` object against the schema documented in docs/diagnose.md (its two tables are the schema):
every recording alone, merged sets of several, and the CLI's own output with several files."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from env_checks.diagnose import diagnose_text, merge_reports

REPO = Path(__file__).resolve().parents[2]
TOOLS = REPO / "fixtures" / "tools"
DOC = (REPO / "docs" / "diagnose.md").read_text()


def _table(after: str) -> dict[str, str]:
    """`| `key` | type | meaning |` rows of the first table after the line starting with `after`."""
    section = DOC[DOC.index(after):]
    rows: dict[str, str] = {}
    started = False
    for line in section.splitlines():
        row = re.match(r"^\| `([^`]+)` \| ([^|]+?) \|", line)
        if row:
            rows[row.group(1)] = row.group(2).strip()
            started = True
        elif started and not line.startswith("|"):
            break
    return rows


SCHEMA = _table("## `diagnose --json`: schema")
FACTS = _table("Facts (`facts` and `inputs[].facts`)")
TOP = {k for k in SCHEMA if "." not in k}
ITEMS = {parent: {k.split(".", 1)[1] for k in SCHEMA if k.startswith(parent + "[].")}
         for parent in ("signatures", "contradictions", "inputs")}


def is_type(value: Any, kind: str) -> bool:
    if kind.endswith("?"):
        return value is None or is_type(value, kind[:-1])
    simple = {"str": str, "float": (float, int), "object": dict}
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind in simple:
        return isinstance(value, simple[kind])
    inner = re.fullmatch(r"(list|object)\[(\w+)\]", kind)
    assert inner, f"the documented type {kind!r} is not one the validator knows"
    if inner.group(1) == "list":
        return isinstance(value, list) and all(is_type(v, inner.group(2)) for v in value)
    return isinstance(value, dict) and all(is_type(v, inner.group(2)) for v in value.values())


def validate(out: dict[str, Any]) -> list[str]:
    errors = []
    if set(out) != TOP:
        errors.append(f"top-level keys {sorted(set(out) ^ TOP)} differ from the documented ones")
    for key in TOP & set(out):
        if not is_type(out[key], SCHEMA[key]):
            errors.append(f"{key} is not {SCHEMA[key]}")
    for parent, keys in ITEMS.items():
        for item in out.get(parent, []):
            if set(item) != keys:
                errors.append(f"{parent}[] keys {sorted(set(item) ^ keys)} differ from the documented ones")
            errors += [f"{parent}[].{k} is not {SCHEMA[parent + '[].' + k]}" for k in keys & set(item)
                       if not is_type(item[k], SCHEMA[f"{parent}[].{k}"])]
    for facts in [out.get("facts", {})] + [i.get("facts", {}) for i in out.get("inputs", [])]:
        for key, value in facts.items():
            if key not in FACTS:
                errors.append(f"fact {key} is not documented")
            elif not is_type(value, FACTS[key]):
                errors.append(f"fact {key}={value!r} is not {FACTS[key]}")
    return errors


def test_the_documented_schema_is_complete() -> None:
    assert TOP == {"kinds", "facts", "unread", "signatures", "contradictions", "inputs", "exit_code"}
    assert all(ITEMS.values()) and len(FACTS) > 50


ALL = sorted(p for p in TOOLS.rglob("*") if p.is_file() and p.name != "SOURCES.md" and "isa" not in p.parts)


@pytest.mark.parametrize("path", ALL, ids=[str(p.relative_to(TOOLS)) for p in ALL])
def test_each_recording_alone_meets_the_schema(path: Path) -> None:
    report = merge_reports([(path.name, diagnose_text(path.read_bytes().decode("utf-8", errors="replace")))])
    assert validate(report.as_dict()) == []


MERGED = [
    ("rocminfo_mi250x_rocm5.7.txt", "amd-smi_firmware_mi300a_rocm6.3.3.txt",
     "amd-smi_default/amd-smi_default_mi300a-x4_amdsmi-docs.txt", "issues/modinfo_amdgpu_dkms_legacy-1584.excerpt.txt"),
    ("issues/dmesg_ring-timeout_mes_gpu-reset_legacy-6273.excerpt.txt", "rocm-smi_a_json_mi210_wandb.json",
     "amd-smi_xgmi/amd-smi_xgmi_mi300x-x8_short-bdf_rocm-blog.txt",
     "kfd_mem_banks/kfd_mem_banks_node3_mi300x-cpx_rocm-4750.txt",
     "collect_env_cuda13/collect_env_torch2.9.0-cu13.0_h100_pytorch-165892.excerpt.txt"),
]


@pytest.mark.parametrize("names", MERGED, ids=["contradicting", "mixed"])
def test_merged_outputs_meet_the_schema(names: tuple[str, ...]) -> None:
    named = [(Path(n).name, diagnose_text((TOOLS / n).read_bytes().decode("utf-8", errors="replace"))) for n in names]
    out = merge_reports(named).as_dict()
    assert validate(out) == [] and len(out["inputs"]) == len(names)


def test_the_cli_json_of_several_files_meets_the_schema() -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "conformance", "diagnose", "--json",
                           *(str(TOOLS / n) for n in MERGED[0])], capture_output=True, env=env, cwd=REPO, timeout=120)
    out = json.loads(proc.stdout)
    assert validate(out) == [] and out["contradictions"] and proc.returncode == out["exit_code"]


def test_the_validator_catches_an_undocumented_key_and_a_wrong_type() -> None:
    out = diagnose_text((TOOLS / "rocminfo_mi300x_8gpu_rocm6.2.3.txt").read_text()).as_dict()
    out["facts"]["gpu_count"] = "8"
    out["facts"]["made_up"] = 1
    out["extra"] = []
    errors = validate(out)
    assert any("gpu_count" in e for e in errors) and any("made_up" in e for e in errors)
    assert any("top-level" in e for e in errors)
