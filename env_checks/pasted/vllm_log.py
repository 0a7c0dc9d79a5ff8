"""A vLLM server log, pasted: the vLLM version, the platform it detected, the model, the KV cache size (tokens and
blocks), the tensor-parallel size and the maximum model length."""

from __future__ import annotations

import re

from env_checks.pasted.reading import Reading

_VLLM_LINE = re.compile(r"^(INFO|WARNING|ERROR|DEBUG|\(\w+ pid=\d+\)) .*\[[\w./]+\.py:\d+\]", re.MULTILINE)


def is_vllm_log(text: str) -> bool:
    return bool(_VLLM_LINE.search(text)) or "vLLM API server version" in text


def read_vllm_log(text: str) -> Reading:
    r = Reading("vLLM log")
    version = re.search(r"vLLM API server version (\S+)|vllm version[ :=]+(\S+)", text, re.IGNORECASE)
    if version:
        r.put("vllm_version", (version.group(1) or version.group(2)).strip(",'\""))
    platform = re.search(r"Automatically detected platform (\w+)", text)
    r.put("platform", platform.group(1) if platform else None)
    model = re.search(r"model='([^']+)'|Starting to load model (\S+)", text)
    if model:
        r.put("model", (model.group(1) or model.group(2)).rstrip("."))
    kv = re.search(r"GPU KV cache size:\s*([\d,]+) tokens", text)
    if kv:
        r.put("kv_cache_tokens", int(kv.group(1).replace(",", "")))
    blocks = re.search(r"# (?:GPU|gpu) blocks:\s*(\d+)", text)
    if blocks:
        r.put("kv_cache_blocks", int(blocks.group(1)))
    tp = re.search(r"tensor_parallel_size['\"]?\s*[=:]\s*(\d+)|--tensor-parallel-size[ =](\d+)", text)
    if tp:
        r.put("tensor_parallel_size", int(tp.group(1) or tp.group(2)))
    max_len = re.search(r"Using max model len (\d+)", text)
    if max_len:
        r.put("max_model_len", int(max_len.group(1)))
    return r
