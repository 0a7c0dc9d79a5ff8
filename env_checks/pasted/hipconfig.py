"""hipconfig (`--full`), pasted: the HIP version and platform, the AMD clang version, the ROCm version of ROCM_PATH,
the paths it prints (HIP_PATH, ROCM_PATH, HIP_CLANG_PATH, HIP_RUNTIME, HIP_COMPILER) and the kernel release."""

from __future__ import annotations

import re

from env_checks.pasted.reading import Reading


def is_hipconfig(text: str) -> bool:
    return bool(re.search(r"^HIP version\s*:", text, re.M)) or "== hipconfig" in text


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
    for fact, label in (("hip_path", "HIP_PATH"), ("rocm_path", "ROCM_PATH"), ("hip_clang_path", "HIP_CLANG_PATH"),
                        ("hip_runtime", "HIP_RUNTIME"), ("hip_compiler", "HIP_COMPILER")):
        found = re.search(rf"^{label}\s*:\s*(\S.*?)\s*$", text, re.MULTILINE)
        r.put(fact, found.group(1) if found else None)
    kernel = re.search(r"^Linux \S+ (\d+\.\d+\.\d+\S*) #", text, re.MULTILINE)
    r.put("kernel_release", kernel.group(1) if kernel else None)
    return r
