"""The first layers of a checkpoint, as a checkpoint of its own: the same embeddings, final norm, lm_head and
quantisation, the same tensors for layers 0..n-1, `num_hidden_layers = n` (and `layer_types` cut to match).

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
from pathlib import Path

from conformance.datafiles import DataError, cache_root

_LAYER = re.compile(r"^model\.layers\.(\d+)\.")
INDEX = "model.safetensors.index.json"


def _kept(name: str, layers: int) -> bool:
    match = _LAYER.match(name)
    return match is None or int(match.group(1)) < layers


def slice_layers(model_dir: Path, layers: int, key: str, root: Path | None = None) -> Path:
    """The checkpoint of `model_dir`'s first `layers` layers (cached by `key`, the source's content hash). DataError,
    in one sentence, for a layer count the model does not have or a checkpoint without safetensors."""
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
    final = (root or cache_root()) / f"slice-{key[:16]}-{layers}-of-{total}"
    if (final / "config.json").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".slice-", dir=final.parent))
    try:
        for item in model_dir.iterdir():  # tokenizer, generation config, chat template: as they are
            if item.is_file() and item.suffix != ".safetensors" and item.name not in ("config.json", INDEX):
                shutil.copy2(item, tmp / item.name)
        weight_map = {}
        for shard in shards:
            with safe_open(str(shard), "pt") as f:
                names = [n for n in f.keys() if _kept(n, layers)]
                if names:
                    save_file({n: f.get_tensor(n) for n in names}, str(tmp / shard.name), metadata=f.metadata())
                    weight_map.update({n: shard.name for n in names})
        if (model_dir / INDEX).is_file():
            index = json.loads((model_dir / INDEX).read_text())
            index["weight_map"] = {n: s for n, s in index.get("weight_map", {}).items() if n in weight_map}
            (tmp / INDEX).write_text(json.dumps(index, indent=2))
        config["num_hidden_layers"] = layers
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
