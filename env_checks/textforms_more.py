"""Tolerant readers, continued: nvidia-smi (table, -q, -q -x, --query-gpu CSV), collect_env, hipconfig,
modinfo amdgpu, kernel logs, vLLM server logs and error traces. See `textforms` for the fact vocabulary."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from env_checks.textforms import Reading, colon_pairs, first_values, is_version, normalise_gfx

# ---------------------------------------------------------------- nvidia-smi


def read_nvidia_table(text: str) -> Reading:
    r = Reading("nvidia-smi")
    head = re.search(r"NVIDIA-SMI\s+(\S+)\s+(?:Driver|KMD) Version:\s*(\S+)\s+(?:CUDA(?: UMD)? Version:\s*(\S+))?",
                     text)
    if head:
        r.put("driver_version", head.group(2))
        r.put("cuda_version", head.group(3))
    rows = re.findall(r"^\|\s+(\d+)\s+(.+?)\s{2,}(On|Off)\s+\|\s+(\S+)\s", text, re.MULTILINE)
    for _index, name, _persistence, _bus in rows:
        r.add("gpu_models", name)
    totals = re.findall(r"\d+MiB\s*/\s*(\d+)MiB", text)
    if totals:
        r.put("vram_total_mib", int(totals[0]))
    complete = bool(re.search(r"Processes:|No running processes found", text))
    r.count(len({index for index, *_ in rows}), complete)
    if rows and not complete:
        r.unread.append("The nvidia-smi table is cut before its 'Processes' section, so GPUs after the last row "
                        "shown may be missing.")
    if not head:
        r.unread.append("The nvidia-smi header line is missing, so the driver and CUDA versions could not be read.")
    return r


def read_nvidia_q(text: str) -> Reading:
    r = Reading("nvidia-smi -q")
    pairs = colon_pairs(text)
    top = {k: v for indent, k, v in pairs if indent == 0}
    r.put("driver_version", top.get("driver version"))
    r.put("cuda_version", top.get("cuda version"))
    attached = top.get("attached gpus", "")
    gpus = re.findall(r"^GPU [0-9A-Fa-f]{8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d\s*$", text, re.MULTILINE)
    parents: dict[int, str] = {}
    for indent, key, value in pairs:
        parent = parents.get(indent - 4, "")
        if not value:
            parents[indent] = key
        if key == "product name":
            r.add("gpu_models", value)
        elif key == "vbios version":
            r.put("vbios_version", value)
        elif key == "virtualization mode":
            r.put("virtualization", value)
        elif parent == "mig mode" and key == "current":
            r.put("mig_mode", value)
        elif parent == "ecc mode" and key == "current":
            r.put("ecc_mode", value)
        elif key in ("dram uncorrectable", "double bit ecc", "uncorrectable error") and value.isdigit():
            ecc = r.facts.setdefault("ecc", {})
            name = f"{parent.replace(' ', '_')}.{key.replace(' ', '_')}" if parent else key.replace(" ", "_")
            ecc[name] = ecc.get(name, 0) + int(value)
    if attached.isdigit():
        r.put("gpu_count", int(attached))
        if len(gpus) < int(attached):
            r.unread.append(f"The report states {attached} GPUs but shows {len(gpus)} GPU section(s): the rest "
                            "was cut off.")
    else:
        r.count(len(gpus), False)
        r.unread.append("The 'Attached GPUs' line is missing, so the GPU count is only what the paste shows.")
    return r


def read_nvidia_xml(text: str) -> Reading:
    r = Reading("nvidia-smi -q -x")
    start = text.find("<nvidia_smi_log")
    try:
        root = ET.fromstring(text[text.find("<?xml"):] if "<?xml" in text else text[start:])
    except ET.ParseError as exc:
        r.unread.append(f"The XML is cut or damaged ({exc}); facts were read from the complete elements before "
                        "that point.")
        root = None
    if root is not None:
        r.put("driver_version", root.findtext("driver_version"))
        r.put("cuda_version", root.findtext("cuda_version"))
        gpus = root.findall("gpu")
        for gpu in gpus:
            r.add("gpu_models", gpu.findtext("product_name"))
            r.put("vbios_version", gpu.findtext("vbios_version"))
            r.put("virtualization", gpu.findtext("gpu_virtualization_mode/virtualization_mode"))
            r.put("mig_mode", gpu.findtext("mig_mode/current_mig"))
        attached = root.findtext("attached_gpus")
        r.count(int(attached) if attached and attached.isdigit() else len(gpus), True)
        return r
    for tag in ("driver_version", "cuda_version"):
        found = re.search(rf"<{tag}>([^<]+)</{tag}>", text)
        r.put(tag, found.group(1) if found else None)
    for name in re.findall(r"<product_name>([^<]+)</product_name>", text):
        r.add("gpu_models", name)
    attached = re.search(r"<attached_gpus>(\d+)</attached_gpus>", text)
    if attached:
        r.put("gpu_count", int(attached.group(1)))
    return r


def read_nvidia_csv(text: str) -> Reading:
    r = Reading("nvidia-smi --query-gpu")
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("$")]
    header = [re.sub(r"\s*\[.*?\]", "", h).strip().lower() for h in lines[0].split(",")] if lines else []
    if "name" not in header and "driver_version" not in header:
        r.unread.append("The CSV has no header line (--format=csv,noheader), so its columns could not be named.")
        return r
    rows = [[c.strip() for c in line.split(",")] for line in lines[1:]]
    whole = [row for row in rows if len(row) == len(header)]
    for row in whole:
        fields = dict(zip(header, row))
        r.add("gpu_models", fields.get("name"))
        r.put("driver_version", fields.get("driver_version"))
        r.put("vbios_version", fields.get("vbios_version"))
        r.put("mig_mode", fields.get("mig.mode.current"))
        r.put("compute_capability", fields.get("compute_cap"))
        total = re.match(r"^(\d+)", fields.get("memory.total", ""))
        if total:
            r.put("vram_total_mib", int(total.group(1)))
    r.count(len(whole), None if len(whole) == len(rows) else False)
    if not rows:
        r.unread.append("The CSV has a header but no data rows.")
    if len(whole) < len(rows):
        r.unread.append(f"{len(rows) - len(whole)} CSV row(s) have fewer fields than the header and were not read.")
    return r


# ---------------------------------------------------------------- collect_env, hipconfig, modinfo


def read_collect_env(text: str) -> Reading:
    r = Reading("collect_env")
    fields = first_values(text)
    r.put("torch_version", fields.get("pytorch version"))
    cuda_build, rocm_build = fields.get("cuda used to build pytorch"), fields.get("rocm used to build pytorch")
    r.put("torch_cuda_build", cuda_build)
    r.put("torch_rocm_build", rocm_build)
    r.put("hip_version", fields.get("hip runtime version"))
    r.put("rocm_version", fields.get("rocm version"))
    r.put("vllm_version", (fields.get("vllm version") or "").split(" (")[0] or None)
    r.put("os", fields.get("os"))
    platform = fields.get("python platform", "")
    kernel = re.match(r"Linux-(\d.+?)-(?:x86_64|aarch64|ppc64le|s390x)-with", platform)
    r.put("kernel_release", kernel.group(1) if kernel else None)
    driver = fields.get("nvidia driver version")
    if is_version(driver):
        r.put("nvidia_driver_version", driver)
    gpu_text = fields.get("gpu models and configuration", "")
    lines = [gpu_text] if gpu_text else []
    at = text.find("GPU models and configuration")
    if at >= 0:
        lines += re.findall(r"^GPU \d+: (.+)$", text[at:at + 4000], re.MULTILINE)
    for line in lines:
        line = re.sub(r"^GPU \d+:\s*", "", line.strip())
        if not line or line.lower().startswith("could not"):
            continue
        name = re.sub(r"\s*\(gfx[^)]*\)\s*$", "", line)
        r.add("gpu_models", name)
        r.add("gfx_targets", normalise_gfx(line))
    numbered = re.findall(r"^GPU (\d+): ", text[at:at + 4000] if at >= 0 else "", re.MULTILINE)
    if numbered:
        r.put("gpu_count", len(set(numbered)))
    if "Versions of relevant libraries" not in text and "Environment Variables" not in text:
        r.unread.append("The collect_env output ends before its library list, so package versions after the "
                        "cut could not be read.")
    return r


def read_hipconfig(text: str) -> Reading:
    r = Reading("hipconfig")
    version = re.search(r"HIP version\s*:\s*(\S+)", text)
    r.put("hip_version", version.group(1) if version else None)
    platform = re.search(r"HIP_PLATFORM\s*:\s*(\S+)", text)
    r.put("hip_platform", platform.group(1) if platform else None)
    clang = re.search(r"AMD clang version (\S+)", text)
    r.put("amd_clang_version", clang.group(1) if clang else None)
    rocm = re.search(r"ROCM_PATH\s*:\s*\S*?rocm-(\d+\.\d+\.\d+)", text)
    r.put("rocm_version", rocm.group(1) if rocm else None)
    return r


def read_modinfo(text: str) -> Reading:
    r = Reading("modinfo amdgpu")
    fields = first_values(text)
    r.put("driver_version", fields.get("version") if is_version(fields.get("version")) else None)
    vermagic = fields.get("vermagic", "").split()
    r.put("kernel_release", vermagic[0] if vermagic else None)
    filename = fields.get("filename", "")
    r.put("driver_source", "DKMS (amdgpu-dkms)" if "/dkms/" in filename or "/updates/" in filename
          else ("in-tree kernel module" if filename else None))
    r.put("firmware_files", len(re.findall(r"^firmware:", text, re.MULTILINE)) or None)
    if not vermagic:
        r.unread.append("The modinfo output has no 'vermagic' line, so the kernel it was built for is unknown.")
    return r


# ---------------------------------------------------------------- logs and traces


def read_kernel_log(text: str) -> Reading:
    r = Reading("kernel log")
    lines = [line for line in text.splitlines() if line.strip()]
    r.put("lines", len(lines))
    release = re.search(r"Linux version (\S+)", text)
    r.put("kernel_release", release.group(1) if release else None)
    amdgpu = {m.lower() for m in re.findall(r"amdgpu (\d{4}:[0-9a-f]{2}:[0-9a-f]{2}\.\d)", text, re.IGNORECASE)}
    nvidia = {m.lower() for m in re.findall(r"NVRM: (?:Xid \()?(?:GPU at )?PCI:(\d{4}:[0-9a-f]{2}:[0-9a-f]{2})",
                                            text, re.IGNORECASE)}
    if amdgpu or nvidia:
        r.put("gpus_named_in_log", len(amdgpu | nvidia))
    nv = re.search(r"NVRM: loading NVIDIA UNIX \S+ Kernel Module\s+(\S+)", text)
    r.put("driver_version", nv.group(1) if nv else None)
    init = re.search(r"Initialized amdgpu (\S+)", text)
    r.put("amdgpu_drm_version", init.group(1) if init else None)
    try:  # the health module's parser (when present) gives the time span the paste covers
        from env_checks.probes import kernel_log

        parsed = kernel_log.parse(text)
        stamps = [line.boot_s for line in parsed if getattr(line, "boot_s", None) is not None]
        if stamps:
            r.put("span_s", round(max(stamps) - min(stamps), 3))
    except Exception:  # noqa: BLE001 - optional enrichment only; the signature scan below does not need it
        pass
    return r


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


def read_trace(text: str) -> Reading:
    r = Reading("error trace")
    errors = re.findall(r"\b([A-Z]\w*(?:Error|Exception)):\s*(.*)$", text, re.MULTILINE)
    if errors:
        kind, message = errors[-1]
        r.put("exception", f"{kind}: {message[:160]}")
    r.put("frames", len(re.findall(r'^\s*File "[^"]+", line \d+', text, re.MULTILINE)) or None)
    gfx = normalise_gfx(text) if re.search(r"gfx\d", text) else None
    if gfx:
        r.add("gfx_targets", gfx)
    return r
