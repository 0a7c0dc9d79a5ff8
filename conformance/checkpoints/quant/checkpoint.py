"""Quantized tiny gpt-oss checkpoints (GPTQ, AWQ, FP8) written from the known float weights, cached like the
tiny model; their dequantized plain copies for the fp64 reference; and the check that a checkpoint's
dequantized weights are the known weights to within the format's step (what catches a writer bug).

The reference reads the dequantized copy, not the quantized file: the copy is made here by the suite's own
dequantizers (conformance/checkpoints/quant/{gptq,awq,fp8}.py), so the reference stays plain fp64 math on HF names."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from conformance.checkpoints.models import WEIGHTS_FILE, TinySpec, _weights, hf_config
from conformance.checkpoints.quant.formats import FORMATS, QuantFormat, format_of, is_quantized_module, quantized_stems
from conformance.datafiles import cache_root
from conformance.verdicts.compare import VerdictReport

QUANT_VERSION = 1  # bumped whenever a writer changes what it writes
MODEL_DTYPE = torch.bfloat16  # what the real tools save unquantized tensors in


def write_quantized_checkpoint(fmt_name: str, spec: TinySpec, out_dir: Path, bug: str | None = None) -> Path:
    """The tiny model with its attention projections in `fmt_name`, everything else in bf16.
    `bug` plants a writer bug (formats.WRITER_BUGS) for negative controls."""
    from safetensors.torch import save_file

    fmt = FORMATS[fmt_name]
    out_dir.mkdir(parents=True, exist_ok=True)
    weights: dict[str, torch.Tensor] = {}
    for name, t in _weights(spec).items():
        stem = name.removesuffix(".weight").removesuffix(".bias")
        if is_quantized_module(stem) and name.endswith(".weight"):
            weights |= {f"{stem}.{k}": v for k, v in fmt.write(t, bug).items()}
        elif is_quantized_module(stem):
            weights[name] = t.to(fmt.bias_dtype)
        else:
            weights[name] = t.to(MODEL_DTYPE)
    config = hf_config(spec) | {"torch_dtype": "bfloat16", "dtype": "bfloat16",
                                "quantization_config": fmt.config()}
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    (out_dir / "generation_config.json").write_text(
        json.dumps({"eos_token_id": config["eos_token_id"], "pad_token_id": config["pad_token_id"]}))
    save_file({k: v.contiguous() for k, v in weights.items()}, str(out_dir / WEIGHTS_FILE),
              metadata={"format": "pt"})
    return out_dir


def _cached(final: Path, make: Callable[[Path], object]) -> Path:
    if (final / WEIGHTS_FILE).is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".quant-", dir=final.parent))
    make(tmp)
    try:
        tmp.rename(final)
    except OSError:  # a concurrent run made it first
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def quantized(fmt_name: str, spec: TinySpec | None = None, root: Path | None = None) -> Path:
    """The cached tiny checkpoint in `fmt_name`."""
    spec = spec or TinySpec()
    final = (root or cache_root()) / f"quant-{fmt_name}-{spec.key()}-v{QUANT_VERSION}"
    return _cached(final, lambda tmp: write_quantized_checkpoint(fmt_name, spec, tmp))


def read_linear(tensors: dict[str, torch.Tensor], stem: str, fmt: QuantFormat) -> dict[str, torch.Tensor]:
    missing = [k for k in fmt.tensors if f"{stem}.{k}" not in tensors]
    if missing:
        raise KeyError(f"{stem} lacks {', '.join(missing)}")
    return {k: tensors[f"{stem}.{k}"] for k in fmt.tensors}


def dequantized_weights(model_dir: Path, misread: str | None = None) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint under its plain HF name, quantized linears dequantized to fp64."""
    from safetensors.torch import load_file

    config = json.loads((model_dir / "config.json").read_text())
    fmt = format_of(config["quantization_config"])
    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(model_dir.glob("*.safetensors")):
        tensors |= load_file(str(shard))
    stems = quantized_stems(tensors, fmt)
    out = {f"{stem}.weight": fmt.read(read_linear(tensors, stem, fmt), misread) for stem in stems}
    owned = {f"{stem}.{k}" for stem in stems for k in fmt.tensors}
    out |= {k: v.to(torch.float64) for k, v in tensors.items() if k not in owned}
    return out


def dequantized_copy(src: Path, dst: Path | None = None, misread: str | None = None) -> Path:
    """A plain (unquantized, fp64) checkpoint holding exactly what `src` dequantizes to; cached beside
    src unless a misread (negative control) or an explicit destination is asked for."""
    from safetensors.torch import save_file

    def make(out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        config = json.loads((src / "config.json").read_text())
        config.pop("quantization_config", None)
        (out / "config.json").write_text(json.dumps(config | {"torch_dtype": "float64"}, indent=2, sort_keys=True))
        save_file({k: v.contiguous() for k, v in dequantized_weights(src, misread).items()},
                  str(out / WEIGHTS_FILE), metadata={"format": "pt"})

    if dst is not None or misread is not None:
        out = dst or Path(tempfile.mkdtemp(prefix=f"dequant-{misread}-"))
        make(out)
        return out
    return _cached(src.parent / (src.name + "-dequantized"), make)


def known_weights_match(model_dir: Path, spec: TinySpec | None = None) -> VerdictReport:
    """The checkpoint dequantizes to the tiny model's known weights: quantized linears within the format's
    step of the float originals, everything else equal to the originals in bf16."""
    spec = spec or TinySpec()
    r = VerdictReport("checkpoint against the known float weights")
    config = json.loads((model_dir / "config.json").read_text())
    fmt = format_of(config["quantization_config"])
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(model_dir.glob("*.safetensors")):
        tensors |= load_file(str(shard))
    worst_steps, worst_abs, checked = 0.0, 0.0, 0
    for name, original in _weights(spec).items():
        stem = name.removesuffix(".weight")
        if name.endswith(".weight") and is_quantized_module(stem):
            t = read_linear(tensors, stem, fmt)
            err = (fmt.read(t, None) - original.to(torch.float64)).abs()
            ratio = (err / fmt.step_bound(original, t)).max().item()
            worst_steps, worst_abs = max(worst_steps, ratio), max(worst_abs, err.max().item())
            checked += 1
            if not ratio <= 1.0:
                r.problems.append(f"{stem}: dequantized weights are {ratio:.3g} x the format's step bound away "
                                  f"from the known weights (max |err| {err.max().item():.3g})")
        elif name not in tensors:
            r.problems.append(f"{name} is missing from the checkpoint")
        else:
            want = original.to(fmt.bias_dtype if is_quantized_module(name.removesuffix(".bias")) else MODEL_DTYPE)
            if tensors[name].shape != want.shape or not torch.equal(tensors[name].to(want.dtype), want):
                r.problems.append(f"{name} differs from the known weight")
    if checked == 0:
        r.problems.append(f"no {fmt.name} linear layer was found in {model_dir}")
    r.measured = {"quantized_linears": float(checked), "max_weight_error_in_steps": worst_steps,
                 "max_abs_weight_error": worst_abs}
    return r
