"""Fit preflight: does the profile's configuration fit the device before any engine starts?

Weights come from the checkpoint's real tensor sizes, read from the safetensors headers (the 8-byte
length and the JSON table at the front of each file: no weights are read); the KV cache from config.json
(layers, KV heads, head_dim, sliding layers holding only their window, the KV dtype and block size) for
the requested tokens per request and number of requests; both per GPU at the profile's tensor-parallel size,
against the device memory times gpu_memory_utilization. A configuration that cannot fit fails in one
sentence with the numbers, instead of an out-of-memory error minutes into engine start-up.

Per GPU at TP size n: weights / n (vLLM shards embeddings, lm_head, attention and experts; the replicated
norms and sinks are kilobytes), KV heads ceil(kv_heads / n) (replicated when n exceeds them)."""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conformance.reference import kv_model
from conformance.verdicts.verdict import Verdict

GB = 1e9

# safetensors dtype names -> bytes per element (https://github.com/huggingface/safetensors, format spec)
SAFETENSORS_BYTES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2,
                     "U16": 2, "U8": 1, "I8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1}
MAX_HEADER_BYTES = 100_000_000


class FitError(ValueError):
    """A checkpoint or config the preflight cannot read: one sentence."""


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        if self.dtype not in SAFETENSORS_BYTES:
            raise FitError(f"tensor {self.name} has dtype {self.dtype!r}, which the fit preflight has no size for")
        return math.prod(self.shape) * SAFETENSORS_BYTES[self.dtype]


def read_header(path: Path) -> list[Tensor]:
    """The tensor table of one .safetensors file, from its header alone."""
    try:
        with path.open("rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                raise FitError(f"{path.name} is shorter than a safetensors header (8 bytes): a truncated download?")
            (size,) = struct.unpack("<Q", raw)
            if size > MAX_HEADER_BYTES:
                raise FitError(f"{path.name} declares a {size}-byte header: not a safetensors file")
            text = f.read(size)
    except OSError as exc:
        raise FitError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        table = json.loads(text)
        return [Tensor(name, str(row["dtype"]), tuple(int(d) for d in row["shape"]))
                for name, row in table.items() if name != "__metadata__"]
    except (ValueError, KeyError, TypeError, AttributeError):
        raise FitError(f"{path.name} has a malformed safetensors header (not a JSON table of dtype/shape "
                       "entries): a truncated or corrupt file?") from None


def checkpoint_tensors(model_dir: Path) -> list[Tensor]:
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FitError(f"{model_dir} holds no .safetensors files: the fit preflight cannot size the weights")
    return [t for f in files for t in read_header(f)]


def weight_bytes(tensors: list[Tensor]) -> int:
    return sum(t.nbytes for t in tensors)


def kv_bytes_per_gpu(config: dict[str, Any], tokens: int, requests: int, dtype_bytes: int, block_size: int,
                     tp: int) -> int:
    """KV cache bytes on one GPU for `requests` requests of `tokens` tokens each."""
    try:
        kinds = kv_model.layer_kinds(config)
        kv_heads = math.ceil(int(config["num_key_value_heads"]) / tp)
        head_dim = int(config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"])
        window = int(config.get("sliding_window") or 0)
    except (KeyError, TypeError, ValueError, kv_model.KVConfigError) as exc:
        raise FitError(f"config.json lacks what the KV estimate needs ({exc})") from None
    full_blocks = math.ceil(tokens / block_size)
    # a sliding layer holds the blocks that touch the last token's window (kv_model.blocks_needed)
    sliding_blocks = min(full_blocks, math.ceil(max(window - 1, 0) / block_size) + 1)
    blocks = sum(sliding_blocks if k == "sliding" else full_blocks for k in kinds)
    return requests * blocks * block_size * 2 * kv_heads * head_dim * dtype_bytes


@dataclass
class FitVerdict(Verdict):
    """Whether it fits, and the sentence with the sums either way (a misfit's one problem)."""

    fits: bool
    sentence: str
    measured: dict[str, float] = field(default_factory=dict)

    @property
    def problems(self) -> list[str]:
        return [] if self.fits else [self.sentence]

    def figures(self) -> dict[str, float]:
        return dict(self.measured)


def preflight(config: dict[str, Any], tensors: list[Tensor], *, device_bytes: float, utilization: float, tp: int,
              requests: list[tuple[int, int]], kv_dtype_bytes: int, block_size: int, overhead_bytes: float,
              what: str = "the model", device: str = "the device") -> FitVerdict:
    """Weights/TP + the largest KV requirement + overhead against utilization x device memory, per GPU."""
    if tp < 1 or not 0 < utilization <= 1 or device_bytes <= 0 or not requests:
        return FitVerdict(False, f"the fit preflight was given TP {tp}, utilisation {utilization}, "
                                 f"{device_bytes / GB:.1f} GB and {len(requests)} requirement(s): nothing to judge")
    weights = weight_bytes(tensors) / tp
    kv_need, (tokens, n) = max((kv_bytes_per_gpu(config, t, r, kv_dtype_bytes, block_size, tp), (t, r))
                               for t, r in requests)
    need = weights + kv_need + overhead_bytes
    budget = utilization * device_bytes
    figures = {"weights_gb_per_gpu": weights / GB, "kv_gb_per_gpu": kv_need / GB, "overhead_gb": overhead_bytes / GB,
               "need_gb_per_gpu": need / GB, "budget_gb_per_gpu": budget / GB, "tensor_parallel_size": float(tp),
               "gpu_memory_utilization": utilization}
    gpus = "one" if tp == 1 else f"each of {tp}"
    sums = (f"{weights / GB:.1f} GB of weights per GPU (TP {tp}) + {kv_need / GB:.1f} GB of KV cache for {n} "
            f"request(s) of {tokens} tokens + {overhead_bytes / GB:.1f} GB overhead = {need / GB:.1f} GB")
    where = f"gpu_memory_utilization {utilization:g} of {device_bytes / GB:.0f} GB on {gpus} {device}"
    if need > budget:
        return FitVerdict(False, f"{what} does not fit: {sums} > {budget / GB:.1f} GB ({where}).", figures)
    return FitVerdict(True, f"{what} fits: {sums} <= {budget / GB:.1f} GB ({where}).", figures)


def for_profile(profile: Any, config: dict[str, Any], tensors: list[Tensor], options: dict[str, Any],
                device_bytes: float, device: str, what: str) -> FitVerdict:
    """The preflight of a serving profile (profiles.Profile) with the engine options it merged."""
    dtype = str(options.get("dtype", "bfloat16"))
    kv_dtype = str(options.get("kv_cache_dtype") or "auto")
    try:
        kv_bytes = kv_model.kv_dtype_bytes(dtype, kv_dtype)
    except kv_model.KVConfigError as exc:
        return FitVerdict(False, str(exc))
    max_len = int(options.get("max_model_len") or config.get("max_position_embeddings") or 0)
    requests = [(int(t), int(n)) for t, n in profile.fit.get("requests", [[max_len, 1]])]
    return preflight(config, tensors, device_bytes=device_bytes,
                     utilization=float(options.get("gpu_memory_utilization", 0.9)),
                     tp=int(options.get("tensor_parallel_size", 1)), requests=requests, kv_dtype_bytes=kv_bytes,
                     block_size=int(options.get("block_size") or 16),
                     overhead_bytes=float(profile.fit.get("overhead_gb", 0.0)) * GB, what=what, device=device)


def cpu_kv_fits(config: dict[str, Any], options: dict[str, Any], requests: list[tuple[int, int]]) -> FitVerdict:
    """The CPU default: the KV requirement against kv_cache_memory_bytes (its fixed KV budget)."""
    budget = options.get("kv_cache_memory_bytes")
    if budget is None:
        return FitVerdict(True, "no fixed KV budget to check (kv_cache_memory_bytes unset)")
    kv_bytes = kv_model.kv_dtype_bytes(str(options.get("dtype", "float32")), options.get("kv_cache_dtype"))
    need, (tokens, n) = max((kv_bytes_per_gpu(config, t, r, kv_bytes, int(options.get("block_size") or 16), 1),
                             (t, r)) for t, r in requests)
    figures = {"kv_gb_per_gpu": need / GB, "budget_gb_per_gpu": budget / GB}
    if need > budget:
        return FitVerdict(False, f"the KV cache does not fit: {n} request(s) of {tokens} tokens need "
                                 f"{need / 2**20:.1f} MiB > kv_cache_memory_bytes {budget / 2**20:.1f} MiB.", figures)
    return FitVerdict(True, f"the KV cache fits: {need / 2**20:.1f} MiB <= {budget / 2**20:.1f} MiB", figures)


def device_memory_bytes(profile: Any) -> tuple[float, str]:
    """Total memory of GPU 0 as torch reports it, else the SKU's nominal capacity from profiles.toml."""
    from conformance.verdicts import profiles

    nominal = float(profiles.data()["sku"].get(profile.sku, {}).get("memory_gb", 0.0)) * GB
    try:
        import torch

        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            return float(props.total_memory), props.name
    except Exception:  # noqa: BLE001 - no torch or no device: the data's figure
        pass
    return nominal, profile.sku


def gate(target: Any, model_dir: Path, config: dict[str, Any], options: dict[str, Any], what: str) -> FitVerdict:
    """The session-start gate of the engines fixture: the run's profile (of `target`, the run's RunTarget) against
    this device."""

    profile = target.profile
    if target.name == "cpu":
        return cpu_kv_fits(config, options, [(int(t), int(n)) for t, n in profile.fit.get("requests", [])]
                           or [(int(options.get("max_model_len", 1024)), 1)])
    tensors = checkpoint_tensors(model_dir)
    device_bytes, device = device_memory_bytes(profile)
    return for_profile(profile, config, tensors, options, device_bytes, device, what)
