"""Validation of a user's `--model DIR` before any engine touches it: one sentence per problem.

Each shard is opened with the `safetensors` library itself (`safe_open`: the header's JSON, its dtypes
and shapes, and that every tensor's dtype x shape is exactly the byte span it claims, inside the file),
so every dtype the installed library knows is accepted, F8_E8M0 and F4 among them. When the library
refuses a shard, the header is read by hand only to say which tensor is wrong and how, in one sentence."""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

# Bits per element, to explain a refusal (safetensors' own table decides what is valid).
DTYPE_BITS = {"BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8,
              "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
              "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64, "I64": 64, "U64": 64}
MAX_HEADER_BYTES = 100 << 20  # the library's own limit
# config.json `torch_dtype` values a gpt-oss checkpoint may carry: the float dtypes its unquantized tensors are held in
# (MXFP4 expert weights are U8 blocks beside them, described by quantization_config, not by torch_dtype)
STORED_DTYPES = ("float32", "bfloat16", "float16")


class ModelDirError(ValueError):
    """The model directory cannot be tested as it is."""


@dataclass(frozen=True)
class ModelInfo:
    path: Path
    config: dict
    num_params: int
    dtypes: frozenset[str]


def read_safetensors(path: Path) -> tuple[dict[str, dict], dict[str, str]]:
    """The tensors of one shard ({name: {"dtype", "shape"}}) and its `__metadata__`, as safetensors reads
    them; ModelDirError (one sentence) for a shard it refuses."""
    try:
        from safetensors import SafetensorError, safe_open
    except ImportError as exc:
        raise ModelDirError(f"cannot read {path}: the safetensors package is not installed ({exc}).") from None
    try:
        with safe_open(str(path), framework="np") as f:
            metadata = dict(f.metadata() or {})
            tensors = {}
            for name in f.keys():
                view = f.get_slice(name)
                tensors[name] = {"dtype": view.get_dtype(), "shape": list(view.get_shape())}
    except (SafetensorError, OSError, ValueError) as exc:
        raise ModelDirError(_why_refused(path, exc)) from None
    return tensors, metadata


def read_safetensors_header(path: Path) -> dict:
    """{tensor name: {"dtype", "shape"}} of one shard (see read_safetensors)."""
    return read_safetensors(path)[0]


def _library_says(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 200 else text[:197] + "..."


def _why_refused(path: Path, exc: BaseException) -> str:
    """One sentence for a shard safetensors refused: the hand-read header names the tensor where it can."""
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            raw = fh.read(8)
            if len(raw) < 8:
                return f"{path} is truncated (no header): re-copy the checkpoint."
            (n,) = struct.unpack("<Q", raw)
            if n > min(size - 8, MAX_HEADER_BYTES):
                return (f"{path} has a header length of {n} bytes, larger than the file: it is truncated or not a "
                        f"safetensors file; re-copy the checkpoint.")
            header = json.loads(fh.read(n))
    except OSError as err:
        return f"cannot read {path} ({err.strerror or err}): check the file and its permissions."
    except ValueError:
        return f"{path} has a header that is not JSON: re-copy the checkpoint."
    if not isinstance(header, dict):
        return f"{path} has a header that is not a JSON table of tensors: re-copy the checkpoint."
    header.pop("__metadata__", None)
    data_len = size - 8 - n
    for name, t in header.items():
        t = t if isinstance(t, dict) else {}
        dtype, shape, offsets = t.get("dtype"), t.get("shape"), t.get("data_offsets")
        if dtype not in DTYPE_BITS:
            import safetensors

            return (f"{path}: tensor {name} has dtype {dtype!r}, which safetensors {safetensors.__version__} does not "
                    f"know: the header is damaged, or newer than the installed safetensors (upgrade it).")
        if not (isinstance(shape, list) and isinstance(offsets, list) and len(offsets) == 2
                and all(isinstance(x, int) for x in [*shape, *offsets])):
            return f"{path}: tensor {name} has no integer shape and data_offsets: the header is damaged."
        start, end = offsets
        want = (math.prod(shape) * DTYPE_BITS[dtype] + 7) // 8
        if end - start != want:
            return (f"{path}: tensor {name} is declared {dtype} {shape} ({want} bytes) but spans {end - start} "
                    f"bytes: the header's dtype or shape is wrong; re-export the checkpoint.")
        if end > data_len:
            return (f"{path}: tensor {name} ends at byte {end} of a {data_len}-byte data section: the file is "
                    f"truncated; re-copy the checkpoint.")
    return f"{path} is refused by safetensors ({_library_says(exc)}): re-copy or re-export the checkpoint."


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
    stored = config.get("torch_dtype", config.get("dtype"))  # transformers 5 writes `dtype`
    if stored is not None and stored not in STORED_DTYPES:
        raise ModelDirError(f"{cfg_path} says its weights are {stored!r} (torch_dtype), which is no dtype a gpt-oss "
                            f"checkpoint is stored in ({', '.join(STORED_DTYPES)}): fix config.json or re-export "
                            "the checkpoint.")
    shards = sorted(path.glob("*.safetensors"))
    if not shards:
        raise ModelDirError(f"{path} holds no *.safetensors files: the weights are missing.")
    params, dtypes = 0, set()
    for shard in shards:
        header = read_safetensors_header(shard)
        for name, t in header.items():
            stem = name.removesuffix("_scales")
            if stem != name and stem + "_blocks" in header:
                continue  # an MXFP4 block's scale: not a parameter
            # MXFP4 blocks hold two E2M1 values a byte: the parameters the model has (and a float32 copy holds)
            params += math.prod(t["shape"]) * (2 if name.endswith("_blocks") and t["dtype"] == "U8" else 1)
            dtypes.add(t["dtype"])
    return ModelInfo(path, config, params, frozenset(dtypes))
