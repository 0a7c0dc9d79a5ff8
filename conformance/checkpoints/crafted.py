"""Crafted variants of the tiny checkpoint that push one component to its extremes (sinks at +20
and at -inf), generated on first use beside the tiny model's cache."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from conformance.checkpoints.models import TinySpec, write_checkpoint
from conformance.datafiles import cache_root


def _set_sinks(value: float) -> Callable[[dict], dict]:
    def transform(weights: dict) -> dict:
        return {k: torch.full_like(v, value) if k.endswith("self_attn.sinks") else v for k, v in weights.items()}

    return transform


CRAFTED: dict[str, Callable[[dict], dict]] = {
    "sinks_plus20": _set_sinks(20.0),  # the sink takes ~all weight: attention output ~ 0
    "sinks_minus_inf": _set_sinks(float("-inf")),  # no sink at all: plain softmax
}


def crafted(name: str, spec: TinySpec | None = None, root: Path | None = None) -> Path:
    spec = spec or TinySpec()
    root = root or cache_root()
    final = root / f"crafted-{name}-{spec.key()}"
    if (final / "model.safetensors").is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".crafted-", dir=root))
    write_checkpoint(spec, tmp, weight_transform=CRAFTED[name])
    try:
        tmp.rename(final)
    except OSError:  # a concurrent run made it first
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def mxfp4(spec: TinySpec | None = None, root: Path | None = None) -> Path:
    """The tiny model written in the real gpt-oss on-disk MXFP4 layout (experts quantized)."""
    from conformance.checkpoints.quant.mxfp4 import write_mxfp4_checkpoint

    spec = spec or TinySpec()
    root = root or cache_root()
    final = root / f"crafted-mxfp4-{spec.key()}"
    if not (final / "model.safetensors").is_file():
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".crafted-", dir=root))
        write_mxfp4_checkpoint(spec, tmp)
        try:
            tmp.rename(final)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
    return final
