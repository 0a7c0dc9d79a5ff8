"""Checkpoints for the tensor-parallel checks (data/distributed.toml [tp.models]): a tiny gpt-oss whose
head counts allow TP 8 (and need kv-head replication), and a one-layer slice with gpt-oss-120b's real
dims (2880 = 90 MXFP4 blocks, uneven at TP 4 and 8), each in the plain HF layout or the on-disk MXFP4
layout. Generated on first use with the tiny model's generator and cached beside it.

The MXFP4 writer quantizes expert by expert in row chunks: the one-shot writer of quant/mxfp4.py
would hold ~10 GB of temporaries for the 120b slice's experts.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

import torch

from conformance.checkpoints.models import WEIGHTS_FILE, TinySpec, write_checkpoint
from conformance.checkpoints.quant.mxfp4 import NOT_CONVERTED, quantize
from conformance.datafiles import cache_root
from conformance.distributed import data

WRITER_VERSION = 2  # bump when the files written here change
ROWS_PER_CHUNK = 256


def spec_of(name: str) -> TinySpec:
    return replace(TinySpec(), **data()["tp"]["models"][name]["spec"])


def _quantize_expert_stack(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """HF [E, in, out] -> on-disk ([E, out, in/32, 16], [E, out, in/32]), chunk by chunk."""
    blocks, scales = [], []
    for e in range(t.shape[0]):
        w = t[e].T.contiguous()  # [out, in]
        parts = [quantize(w[r:r + ROWS_PER_CHUNK]) for r in range(0, w.shape[0], ROWS_PER_CHUNK)]
        blocks.append(torch.cat([b for b, _ in parts]))
        scales.append(torch.cat([s for _, s in parts]))
    return torch.stack(blocks).contiguous(), torch.stack(scales).contiguous()


def _experts_to_mxfp4(weights: dict) -> dict:
    out = {}
    for name, t in weights.items():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            out[name + "_blocks"], out[name + "_scales"] = _quantize_expert_stack(t)
        else:
            out[name] = t
    return out


MXFP4_CONFIG = {"quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": NOT_CONVERTED}}


def tp_checkpoint(name: str, layout: str, root: Path | None = None) -> Path:
    """The cached checkpoint `name` ([tp.models.<name>]) in `layout` ("plain" or "mxfp4")."""
    if layout not in ("plain", "mxfp4"):
        raise ValueError(f"unknown layout {layout!r}: plain or mxfp4")
    spec = spec_of(name)
    root = root or cache_root()
    final = root / f"tp-{name}-{layout}-{spec.key()}-w{WRITER_VERSION}"
    if (final / WEIGHTS_FILE).is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tp-", dir=root))
    if layout == "mxfp4":
        write_checkpoint(spec, tmp, config_overrides=MXFP4_CONFIG, weight_transform=_experts_to_mxfp4)
    else:
        write_checkpoint(spec, tmp)
    try:
        tmp.rename(final)
    except OSError:  # a concurrent run made it first; its copy is identical
        shutil.rmtree(tmp, ignore_errors=True)
    return final
