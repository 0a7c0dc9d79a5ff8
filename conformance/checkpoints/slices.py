"""The first layers of a checkpoint, as a checkpoint of its own: the same embeddings, final norm, lm_head and
quantisation, the same tensors for layers 0..n-1, `num_hidden_layers = n` (and `layer_types` cut to match).
With `dequantize`, MXFP4 experts are written dequantized in the unquantized HF layout (bf16, which holds every MXFP4
value exactly) and the quantization_config is dropped: the same weights, for an engine that serves MXFP4
only in a dtype other than the one asked (vLLM runs gpt_oss_mxfp4 in bf16 only; data/quant.toml `serves`).

The exact float32 verdict of a model too big to hold in float32 runs on such a slice: the real dimensions, the
real kernels and the real weights of its first layers, on the device beside the production run (#38,
docs/verdicts.md "Two dtypes per GPU run"). A slice is cached under the suite's cache root, keyed by the source
checkpoint's content hash and the layer count, and written atomically; every shard of the source keeps its name
(an index, if the source has one, maps only the tensors kept)."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from conformance.datafiles import DataError, cache_root

_LAYER = re.compile(r"^model\.layers\.(\d+)\.")
INDEX = "model.safetensors.index.json"
STALE_S = 3600.0  # a slice being written older than this was left by a run that stopped (a build takes a minute)


def _kept(name: str, layers: int) -> bool:
    match = _LAYER.match(name)
    return match is None or int(match.group(1)) < layers


MXFP4_EXPERTS = ("experts.gate_up_proj", "experts.down_proj")  # stored as <stem>_blocks and <stem>_scales


def _mxfp4_bf16(blocks: Any, scales: Any) -> Any:
    """reference.gpt_oss.dequant_mxfp4 computed in bf16: each byte's two E2M1 values (low nibble first) times the
    block's 2^(scale-127). Exact wherever it is finite: an E2M1 value has two significant bits and bf16 has seven,
    with fp32's exponent range and subnormals down to 2^-133; a product past bf16's range is inf (or NaN for 0)."""
    import torch

    from conformance.reference.gpt_oss import FP4_VALUES

    lut, byte = torch.tensor(FP4_VALUES, dtype=torch.bfloat16), torch.arange(256)
    pairs = torch.stack([lut[byte & 0x0F], lut[byte >> 4]], dim=-1)
    values = pairs[blocks.long()].reshape(*blocks.shape[:-1], 32)
    scale = torch.ldexp(torch.ones(()), scales.float() - 127.0).to(torch.bfloat16)
    return (values * scale.unsqueeze(-1)).flatten(-2)


def _dequantized_experts(f: Any, stem: str) -> Any:
    """`<stem>_blocks`/`_scales` [E, out, in/32, 16] / [E, out, in/32] as the unquantized HF tensor [E, in, out] in
    bf16, one expert at a time, computed in bf16 (in fp64, as the reference dequantizes, a 120b-dimension layer took
    74 s on two cores; in bf16 39 s). bf16 holds every E2M1 x 2^k exactly but a scale that overflows it: DataError."""
    import torch

    blocks, scales = f.get_slice(stem + "_blocks"), f.get_slice(stem + "_scales")
    experts, rows, nblocks, _ = blocks.get_shape()
    out = torch.empty(experts, nblocks * 32, rows, dtype=torch.bfloat16)
    for e in range(experts):
        out[e] = _mxfp4_bf16(blocks[e], scales[e]).T
        if not bool(torch.isfinite(out[e]).all()):
            raise DataError(f"{stem} expert {e} holds MXFP4 values bf16 cannot hold exactly (a scale past its range)")
    return out


def slice_path(key: str, layers: int, total: int, dequantize: bool, root: Path | None = None) -> Path:
    """Where `slice_layers` keeps the slice of a checkpoint of content hash `key` (complete once its config.json
    is there)."""
    return (root or cache_root()) / f"slice-{key[:16]}-{layers}-of-{total}{'-dequantized' if dequantize else ''}"


def slice_layers(model_dir: Path, layers: int, key: str, root: Path | None = None, dequantize: bool = False) -> Path:
    """The checkpoint of `model_dir`'s first `layers` layers (cached by `key`, the source's content hash), its MXFP4
    experts dequantized with `dequantize`. DataError, in one sentence, for a layer count the model does not have, a
    checkpoint without safetensors, or one to dequantize that is not MXFP4."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    model_dir = Path(model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    total = int(config["num_hidden_layers"])
    if not 1 <= layers <= total:
        raise DataError(f"{model_dir.name} has {total} layers: a slice of {layers} cannot be cut from it")
    shards = sorted(model_dir.glob("*.safetensors"))
    if not shards:
        raise DataError(f"{model_dir} holds no .safetensors files to slice")
    if dequantize and (config.get("quantization_config") or {}).get("quant_method") != "mxfp4":
        raise DataError(f"{model_dir.name} is not an MXFP4 checkpoint: the suite dequantizes only MXFP4 experts")
    final = slice_path(key, layers, total, dequantize, root)
    if (final / "config.json").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    for stale in final.parent.glob(".slice-*"):  # a build stopped with its run (15 GB at 120b's dimensions)
        if time.time() - stale.stat().st_mtime > STALE_S:
            shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=".slice-", dir=final.parent))
    try:
        for item in model_dir.iterdir():  # tokenizer, generation config, chat template: as they are
            if item.is_file() and item.suffix != ".safetensors" and item.name not in ("config.json", INDEX):
                shutil.copy2(item, tmp / item.name)
        weight_map = {}
        for shard in shards:
            with safe_open(str(shard), "pt") as f:
                names = [n for n in f.keys() if _kept(n, layers)]
                tensors = {}
                for n in names:
                    stem = n.removesuffix("_blocks")
                    if dequantize and stem.endswith(MXFP4_EXPERTS) and stem + "_scales" in names:
                        tensors[stem] = _dequantized_experts(f, stem)
                    elif not (dequantize and n.removesuffix("_scales").endswith(MXFP4_EXPERTS)):
                        tensors[n] = f.get_tensor(n)
                if tensors:
                    save_file(tensors, str(tmp / shard.name), metadata=f.metadata())
                    weight_map.update({n: shard.name for n in tensors})
        if (model_dir / INDEX).is_file():
            index = json.loads((model_dir / INDEX).read_text())
            index["weight_map"] = {n: s for n, s in index.get("weight_map", {}).items() if n in weight_map}
            (tmp / INDEX).write_text(json.dumps(index, indent=2))
        config["num_hidden_layers"] = layers
        if dequantize:
            config.pop("quantization_config", None)
        if isinstance(config.get("layer_types"), list):
            config["layer_types"] = config["layer_types"][:layers]
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        os.replace(tmp, final)
    except OSError:
        if not (final / "config.json").is_file():  # not another process's identical slice: a real failure
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already where os.replace moved it
    return final


def layers_that_fit(config: dict, num_params: int, budget_bytes: float, bytes_per_param: int = 4) -> int:
    """How many of the model's first layers fit `budget_bytes` at `bytes_per_param` (weights only: the embeddings
    and lm_head whole, each layer its share of the rest). 0 where not even one layer fits."""
    total = int(config["num_hidden_layers"])
    outside = 2 * int(config["vocab_size"]) * int(config["hidden_size"])  # embeddings + lm_head
    per_layer = max(1, (num_params - outside) // total)
    fit = int((budget_bytes / bytes_per_param - outside) // per_layer)
    return max(0, min(total, fit))
