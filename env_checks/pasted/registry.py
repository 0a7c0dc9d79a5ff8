"""The one table `conformance diagnose` reads pasted outputs by: each family's name, its detector and its reader, in
the order they are tried. Every family whose detector fires on a text contributes its reader's facts (see
`env_checks.diagnose`); the order decides which statement of a fact comes first, and where one family's detector
must stand back for another's (a process table is no amd-smi GPU block), the detector itself says so.

To add a family: a module named by the tool it reads, with `is_<form>(text) -> bool` and `read_<form>(text) ->
Reading`, and one row here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from env_checks.pasted import (
    amd_smi,
    amd_smi_tables,
    collect_env,
    hip_cuda_errors,
    hipconfig,
    kernel_log,
    modinfo,
    nvidia_smi,
    rocm_smi,
    rocminfo,
    sysfs,
    update_alternatives,
    vllm_log,
)
from env_checks.pasted.reading import Reading


class Family(NamedTuple):
    name: str  # as diagnose names the family when its reader fails
    detect: Callable[[str], bool]
    read: Callable[[str], Reading]


FAMILIES: tuple[Family, ...] = (
    Family("amd-smi (default view)", amd_smi_tables.is_amd_smi_default, amd_smi_tables.read_amd_smi_default),
    Family("amd-smi partition", amd_smi_tables.is_amd_smi_partition, amd_smi_tables.read_amd_smi_partition),
    Family("amdgpu_firmware_info", sysfs.is_amdgpu_firmware_info, sysfs.read_amdgpu_firmware_info),
    Family("update-alternatives --display rocm", update_alternatives.is_update_alternatives,
           update_alternatives.read_update_alternatives),
    Family("amd-smi process (--csv)", amd_smi_tables.is_amd_smi_process_table,
           amd_smi_tables.read_amd_smi_process_table),
    Family("amd-smi process (--json)", amd_smi_tables.is_amd_smi_process_json,
           amd_smi_tables.read_amd_smi_process_json),
    Family("amd-smi JSON fragment (jq)", amd_smi.is_amd_smi_json_fragment, amd_smi.read_amd_smi_json_fragment),
    Family("KFD topology mem_banks properties", sysfs.is_kfd_mem_banks, sysfs.read_kfd_mem_banks),
    Family("amd-smi xgmi", amd_smi_tables.is_amd_smi_xgmi, amd_smi_tables.read_amd_smi_xgmi),
    Family("HIP runtime log", hip_cuda_errors.is_hip_log, hip_cuda_errors.read_hip_log),
    Family("collect_env (part)", collect_env.is_collect_env_part, collect_env.read_collect_env_part),
    Family("collect_env (tail: GPU topology)", collect_env.is_topology_tail, collect_env.read_topology_tail),
    Family("rocminfo (part of an agent block)", rocminfo.is_rocminfo_fragment, rocminfo.read_rocminfo_fragment),
    Family("nvidia-smi -q -x", nvidia_smi.is_nvidia_xml, nvidia_smi.read_nvidia_xml),
    Family("nvidia-smi -q", nvidia_smi.is_nvidia_q, nvidia_smi.read_nvidia_q),
    Family("nvidia-smi", nvidia_smi.is_nvidia_table, nvidia_smi.read_nvidia_table),
    Family("nvidia-smi --query-gpu", nvidia_smi.is_nvidia_csv, nvidia_smi.read_nvidia_csv),
    Family("collect_env", collect_env.is_collect_env, collect_env.read_collect_env),
    Family("rocminfo", rocminfo.is_rocminfo, rocminfo.read_rocminfo),
    Family("rocm-smi", rocm_smi.is_rocm_smi, rocm_smi.read_rocm_smi),
    Family("amd-smi", amd_smi.is_amd_smi, amd_smi.read_amd_smi),
    Family("hipconfig", hipconfig.is_hipconfig, hipconfig.read_hipconfig),
    Family("modinfo amdgpu", modinfo.is_modinfo, modinfo.read_modinfo),
    Family("kernel log", kernel_log.is_kernel_log, kernel_log.read_kernel_log),
    Family("vLLM log", vllm_log.is_vllm_log, vllm_log.read_vllm_log),
    Family("error trace", hip_cuda_errors.is_error_trace, hip_cuda_errors.read_trace),
)
