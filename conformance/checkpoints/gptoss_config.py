"""Checks a checkpoint's config.json against the published gpt-oss architecture (data/gpt_oss.toml),
and counts parameters from the safetensors headers (MXFP4 blocks hold two values per byte)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conformance import datafiles
from conformance.checkpoints.modeldir import read_safetensors_header
from conformance.verdicts.verdict import Verdict


@dataclass
class ConfigReport(Verdict):
    variant: str | None
    problems: list[str] = field(default_factory=list)


def spec() -> dict[str, Any]:
    return datafiles.load_toml(datafiles.DATA / "gpt_oss.toml")


def _rope(cfg: dict) -> dict:
    return dict(cfg.get("rope_scaling") or cfg.get("rope_parameters") or {})


def _same(have: Any, want: Any) -> bool:
    if isinstance(want, float) or isinstance(have, float):
        return have is not None and math.isclose(float(have), float(want), rel_tol=1e-9)
    return have == want


def check_config(cfg: dict, params: int | None = None) -> ConfigReport:
    data = spec()
    variant = next((name for name, v in data["variants"].items()
                    if cfg.get("num_hidden_layers") == v["num_hidden_layers"]
                    and cfg.get("num_local_experts") == v["num_local_experts"]), None)
    report = ConfigReport(variant)
    expected = {k: v for k, v in data["shared"].items() if k != "rope_scaling"}
    if variant:
        expected |= {k: v for k, v in data["variants"][variant].items() if k != "params_billion"}
    for key, want in expected.items():
        have = cfg.get(key, (cfg.get("rope_parameters") or {}).get(key))
        if not _same(have, want):
            report.problems.append(f"{key} is {have!r}, gpt-oss has {want!r}")
    rope = _rope(cfg)
    rope.setdefault("rope_type", rope.get("type"))
    for key, want in data["shared"]["rope_scaling"].items():
        if not _same(rope.get(key), want):
            report.problems.append(f"rope_scaling.{key} is {rope.get(key)!r}, gpt-oss has {want!r}")
    n = int(cfg.get("num_hidden_layers", 0))
    types = cfg.get("layer_types") or []
    want_types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]
    if types and types != want_types:
        report.problems.append("layer_types do not alternate sliding (even) / full (odd)")
    for key in ("hidden_size", "intermediate_size", "head_dim"):
        if int(cfg.get(key, 0)) % 32:
            report.problems.append(f"{key} {cfg.get(key)} is not a multiple of 32 (MXFP4 blocks are 32 wide)")
    if variant and params is not None:
        want_b = data["variants"][variant]["params_billion"]
        if abs(params / 1e9 - want_b) > 0.05 * want_b:
            report.problems.append(f"the checkpoint holds {params / 1e9:.1f}B parameters, {variant} has {want_b}B")
    return report


def count_params(model_dir: Path) -> int:
    total = 0
    for shard in sorted(model_dir.glob("*.safetensors")):
        for name, t in read_safetensors_header(shard).items():
            if name.endswith("_scales"):
                continue
            n = math.prod(t["shape"])
            total += 2 * n if name.endswith("_blocks") else n
    return total
