"""Validation of a user's `--model DIR` before any engine touches it: one sentence per problem.

The safetensors header is checked against the data it describes (dtype × shape = byte span), so a
checkpoint whose header names the wrong dtype is refused here rather than loaded as garbage."""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
               "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "U32": 4, "U64": 8}


class ModelDirError(ValueError):
    """The model directory cannot be tested as it is."""


@dataclass(frozen=True)
class ModelInfo:
    path: Path
    config: dict
    num_params: int
    dtypes: frozenset[str]


def read_safetensors_header(path: Path) -> dict:
    size = path.stat().st_size
    with path.open("rb") as fh:
        raw = fh.read(8)
        if len(raw) < 8:
            raise ModelDirError(f"{path} is truncated (no header): re-copy the checkpoint.")
        (n,) = struct.unpack("<Q", raw)
        if n > min(size - 8, 100 << 20):
            raise ModelDirError(f"{path} has a header length of {n} bytes, larger than the file: it is "
                                f"truncated or not a safetensors file; re-copy the checkpoint.")
        try:
            header = json.loads(fh.read(n))
        except ValueError:
            raise ModelDirError(f"{path} has a header that is not JSON: re-copy the checkpoint.") from None
    header.pop("__metadata__", None)
    data_len = size - 8 - n
    for name, t in header.items():
        dtype, shape, (start, end) = t.get("dtype"), t.get("shape"), t.get("data_offsets", (0, -1))
        if dtype not in DTYPE_BYTES:
            raise ModelDirError(f"{path}: tensor {name} has unknown dtype {dtype!r}: the header is damaged.")
        want = math.prod(shape) * DTYPE_BYTES[dtype]
        if end - start != want:
            raise ModelDirError(
                f"{path}: tensor {name} is declared {dtype} {shape} ({want} bytes) but spans {end - start} "
                f"bytes: the header's dtype or shape is wrong; re-export the checkpoint.")
        if end > data_len:
            raise ModelDirError(f"{path}: tensor {name} ends at byte {end} of a {data_len}-byte data section: "
                                f"the file is truncated; re-copy the checkpoint.")
    return header


def inspect_model_dir(path: Path) -> ModelInfo:
    if not path.is_dir():
        raise ModelDirError(f"--model {path} is not a directory: give a local gpt-oss checkpoint directory.")
    cfg_path = path / "config.json"
    try:
        config = json.loads(cfg_path.read_text())
    except FileNotFoundError:
        raise ModelDirError(f"{path} has no config.json: point --model at the checkpoint's top directory.") from None
    except ValueError as exc:
        raise ModelDirError(f"{cfg_path} is not valid JSON ({exc}): fix or re-copy it.") from None
    if config.get("model_type") != "gpt_oss":
        raise ModelDirError(f"{cfg_path} says model_type {config.get('model_type')!r}, not 'gpt_oss': "
                            f"this suite tests gpt-oss checkpoints.")
    shards = sorted(path.glob("*.safetensors"))
    if not shards:
        raise ModelDirError(f"{path} holds no *.safetensors files: the weights are missing.")
    params, dtypes = 0, set()
    for shard in shards:
        for t in read_safetensors_header(shard).values():
            params += math.prod(t["shape"])
            dtypes.add(t["dtype"])
    return ModelInfo(path, config, params, frozenset(dtypes))
