"""Validation of a quantized checkpoint before any engine loads it: one sentence per problem, never a hang or
a model that loads as garbage.

Caught here: a safetensors header whose dtype or shape disagrees with the bytes it spans and a truncated shard
(both through modeldir.read_safetensors_header), a `quantization_config` naming a method the suite cannot
check, a quantized module missing one of its format's tensors (a scale, zeros, g_idx, MXFP4 scales), and a
format tensor stored in the wrong dtype. Only headers are read: a 120b checkpoint validates in seconds."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from conformance.checkpoints.modeldir import ModelDirError, read_safetensors_header

# quant_method -> {tensor suffix: allowed safetensors dtypes}; the first suffix marks a quantized module.
LAYOUTS: dict[str, dict[str, tuple[str, ...]]] = {
    "gptq": {"qweight": ("I32",), "qzeros": ("I32",), "scales": ("F16", "BF16", "F32"), "g_idx": ("I32",)},
    "awq": {"qweight": ("I32",), "qzeros": ("I32",), "scales": ("F16", "BF16", "F32")},
    "compressed-tensors": {"weight_scale": ("F32", "BF16", "F16"), "weight": ("F8_E4M3",)},
    "mxfp4": {"_blocks": ("U8",), "_scales": ("U8",)},
}
ALIASES = {"gpt_oss_mxfp4": "mxfp4", "auto_gptq": "gptq", "auto_awq": "awq"}


class QuantCheckpointError(ModelDirError):
    """A quantized checkpoint that cannot be loaded correctly as it is."""


@dataclass
class QuantCheckpoint:
    path: Path
    method: str | None
    quantized_modules: list[str] = field(default_factory=list)


def _join(stem: str, suffix: str) -> str:
    return stem + suffix if suffix.startswith("_") else f"{stem}.{suffix}"


def validate(model_dir: Path) -> QuantCheckpoint:
    """Raise QuantCheckpointError (one sentence) for the first problem found; return what was validated."""
    cfg_path = model_dir / "config.json"
    try:
        config = json.loads(cfg_path.read_text())
    except (OSError, ValueError) as exc:
        raise QuantCheckpointError(f"{cfg_path} cannot be read as JSON ({exc}): re-copy the checkpoint.") from None
    shards = sorted(model_dir.glob("*.safetensors"))
    if not shards:
        raise QuantCheckpointError(f"{model_dir} holds no *.safetensors files: the weights are missing.")
    header: dict[str, dict] = {}
    for shard in shards:
        try:
            header |= read_safetensors_header(shard)  # dtype x shape vs span, truncation: one sentence each
        except ModelDirError as exc:
            raise QuantCheckpointError(str(exc)) from None
    qcfg = config.get("quantization_config")
    if qcfg is None:
        return QuantCheckpoint(model_dir, None)
    raw = str(qcfg.get("quant_method", "")) if isinstance(qcfg, dict) else ""
    method = ALIASES.get(raw.lower(), raw.lower())
    if method not in LAYOUTS:
        raise QuantCheckpointError(
            f"{cfg_path} names quantization method {raw!r}, which the suite cannot check (known: "
            f"{', '.join(sorted(LAYOUTS))}): fix quantization_config.quant_method or use a supported format.")
    layout = LAYOUTS[method]
    first = next(iter(layout))
    if method == "compressed-tensors":  # FP8: the weight's dtype marks a quantized module, not the scale
        stems = sorted(n.removesuffix(".weight") for n, t in header.items()
                       if n.endswith(".weight") and t["dtype"] in layout["weight"])
    else:
        stems = sorted(n.removesuffix(first if first.startswith("_") else "." + first)
                       for n in header if n.endswith(first))
    if not stems:
        raise QuantCheckpointError(f"{model_dir} declares quant_method {raw!r} but holds no quantized tensors "
                                   f"(no *{first} found): the config and the weights disagree.")
    for stem in stems:
        for suffix, dtypes in layout.items():
            name = _join(stem, suffix)
            if name not in header:
                raise QuantCheckpointError(f"{stem} is {raw}-quantized but the checkpoint has no {name}: a scale or "
                                           f"zero tensor is missing; re-export the checkpoint.")
            if header[name]["dtype"] not in dtypes:
                raise QuantCheckpointError(f"{name} is stored as {header[name]['dtype']}, but {raw} stores it as "
                                           f"{' or '.join(dtypes)}: the checkpoint was written wrongly.")
    return QuantCheckpoint(model_dir, method, stems)
