"""collect_env, pasted: PyTorch's `python -m torch.utils.collect_env` and vLLM's `collect_env.py` (CUDA 12/13 and
ROCm, the flat layout and the sectioned one of torch 2.9+/vLLM), whole; cut before its `PyTorch version` line; a
tail that begins after it (the libraries list, `vLLM Info`); or a tail that begins inside the `GPU Topology` section,
where vLLM on ROCm prints `rocm-smi --showtopo` (`Weight`/`Hops`/`Link Type between two GPUs` matrices).

Facts: torch version and its CUDA/ROCm build, HIP and ROCm versions, vLLM version, OS, kernel release, NVIDIA driver,
GPU models and gfx targets, the GPU count; then the MIOpen and CUDA runtime versions and full target ids
(`gfx942:sramecc+:xnack-`); of a part, the sections it shows; of a topology tail, the link weights, hops and types.
"""

from __future__ import annotations

import re

from env_checks.pasted.reading import Reading, add_target_ids, first_values, is_version
from env_checks.tool_text import normalise_gfx

SECTIONS = ("System Info", "PyTorch Info", "Python Environment", "CUDA / GPU Info", "CPU Info",
            "Versions of relevant libraries", "vLLM Info", "Environment Variables")
_BANNER = re.compile(r"^={20,}\n\s*(" + "|".join(re.escape(s) for s in SECTIONS) + r")\s*\n={20,}\s*$", re.MULTILINE)
_PIP = re.compile(r"^\[(?:pip3?|conda)\] (\S+?)==(\S+)\s*$", re.MULTILINE)
_MATRIX_HEAD = re.compile(r"^\s+GPU0(?:\s+GPU\d+)+\s*$", re.MULTILINE)
_MATRIX_TITLE = re.compile(r"^=+ (Weight|Hops|Link Type) between two GPUs =+\s*$", re.MULTILINE)
_WHOLE = re.compile(r"^(PyTorch version|Is debug build|ROCM used to build PyTorch)\s*:", re.MULTILINE)
# collect_env of torch 2.10+ names the ROCm build "ROCm SDK used to build PyTorch" / "HIP used to build PyTorch"
_NEW_WHOLE = re.compile(r"^(ROCm SDK|HIP|CUDA) used to build PyTorch\s*:", re.MULTILINE)


def is_collect_env(text: str) -> bool:
    return bool(_WHOLE.search(text)) or bool(_NEW_WHOLE.search(text))


def read_collect_env(text: str) -> Reading:
    return _read(text, part=False)


def read_collect_env_part(text: str) -> Reading:
    """The facts of the sections the paste holds; one sentence naming the sections it lacks."""
    return _read(text, part=True)


def _read(text: str, part: bool) -> Reading:
    r = Reading("collect_env (part)" if part else "collect_env")
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
    if part:
        _sections_of_a_part(text, fields, r)
    elif "Versions of relevant libraries" not in text and "Environment Variables" not in text:
        r.unread.append("The collect_env output ends before its library list, so package versions after the "
                        "cut could not be read.")
    _miopen_and_cuda_runtime(text, r)
    add_target_ids(text, r)
    return r


def _miopen_and_cuda_runtime(text: str, r: Reading) -> None:
    """MIOpen and the CUDA runtime version (both in the PyTorch and in vLLM's padded `key   : value` layouts)."""
    for fact, label in (("miopen_version", "MIOpen runtime version"), ("cuda_runtime_version", "CUDA runtime version")):
        found = re.search(rf"^{label}\s*:\s*(\S.*?)\s*$", text, re.MULTILINE)
        if found and re.match(r"^\d+(\.\d+)+", found.group(1)):
            r.put(fact, found.group(1))


# ---------------------------------------------------------------- a part, or a tail in the GPU topology

def is_collect_env_part(text: str) -> bool:
    """A collect_env paste without the `PyTorch version` line the whole-output detector needs."""
    if _WHOLE.search(text):
        return False
    return bool(_BANNER.search(text)) or bool(re.search(r"^vLLM Version\s*:", text, re.MULTILINE)) \
        or (bool(_PIP.search(text)) and "GPU Topology:" in text)


def is_topology_tail(text: str) -> bool:
    """GPU-by-GPU matrices of `rocm-smi --showtopo` without the rest of the output they were printed in."""
    return bool(_MATRIX_HEAD.search(text) or _MATRIX_TITLE.search(text)) \
        and bool(re.search(r"^GPU0\s+0\s", text, re.MULTILINE)) \
        and "ROCm System Management Interface" not in text and not _WHOLE.search(text)


def _sections_of_a_part(text: str, fields: dict[str, str], r: Reading) -> None:
    r.put("vllm_version", (fields.get("vllm version") or "").split(" (")[0] or None)
    r.put("rocm_version", fields.get("rocm version"))
    packages = dict(_PIP.findall(text))
    if "torch_version" not in r.facts and "torch" in packages:
        r.put("torch_version", packages["torch"])
    shown = [s for s in SECTIONS if re.search(rf"^\s*{re.escape(s)}\s*$", text, re.MULTILINE)]
    missing = [s for s in SECTIONS if s not in shown]
    r.put("collect_env_sections", shown)
    r.unread.append(f"This is part of a collect_env output ({', '.join(shown) or 'no section header'} shown): "
                    f"what its {', '.join(missing)} section(s) state could not be read.")


def _matrix(text: str, title: str) -> list[list[str]]:
    """Rows (cells after the GPU name) of the matrix under `title`, or of the first matrix when it has no title."""
    at = 0
    if title:
        found = re.search(rf"^=+ {title} between two GPUs =+\s*$", text, re.MULTILINE)
        if not found:
            return []
        at = found.end()
    head = _MATRIX_HEAD.search(text, at)
    if not head:
        return []
    rows = []
    for line in text[head.end():].lstrip("\n").splitlines():
        cells = line.split()
        if not cells or not re.fullmatch(r"GPU\d+", cells[0]):
            break
        rows.append(cells[1:])
    return rows


def _off_diagonal(rows: list[list[str]]) -> list[str]:
    values: list[str] = []
    for i, row in enumerate(rows):
        for j, cell in enumerate(row):
            if i != j and cell not in values:
                values.append(cell)
    return values


def read_topology_tail(text: str) -> Reading:
    """The GPU count and the link weights, hops and types of the `rocm-smi --showtopo` matrices shown."""
    r = Reading("collect_env (tail: GPU topology)")
    first_title = _MATRIX_TITLE.search(text)
    before = text[:first_title.start()] if first_title else text
    # the paste may begin inside the first matrix, after its title and even its GPU header line
    untitled = [line.split()[1:] for line in before.splitlines() if re.match(r"^GPU\d+\s", line)]
    weights = untitled or _matrix(text, "Weight")
    width = max((len(row) for row in weights), default=0)
    r.put("gpu_link_weights", _off_diagonal(weights))
    r.put("gpu_link_hops", _off_diagonal(_matrix(text, "Hops")))
    r.put("gpu_link_types", _off_diagonal(_matrix(text, "Link Type")))
    complete = bool(weights) and len(weights) == width
    if weights:
        r.count(len(weights), True if complete else False)
    r.unread.append("This paste begins inside the GPU topology section (`rocm-smi --showtopo`, as collect_env prints "
                    "it on ROCm): the versions, OS and GPU models printed before it could not be read.")
    hops = _matrix(text, "Hops")
    if hops and len(hops) < len(hops[0]):
        r.unread.append(f"The 'Hops between two GPUs' matrix is cut after {len(hops)} of its {len(hops[0])} rows.")
    return r
