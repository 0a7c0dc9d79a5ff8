"""NVIDIA probes: `nvidia-smi --query-gpu ... --format=csv` and `nvidia-smi -q -x`.

The CSV query is the cheap, stable interface (fixed field names); the XML report adds what the query
cannot give, notably the CUDA version the driver supports. Both are parsed into the same per-GPU record
so that a fingerprint reads the same whichever one answered.
"""

from __future__ import annotations

import csv
import io
import xml.etree.ElementTree as ET
from dataclasses import dataclass

from env_checks.probes.facts import NOT_INSTALLED, ProbeFailure, Unparseable, int_or_none, parse_with, run_tool

QUERY_FIELDS = (
    "name", "driver_version", "vbios_version", "memory.total", "ecc.mode.current", "mig.mode.current",
    "compute_cap", "pci.bus_id",
)
# Asked for too, not required of a recorded answer: which physical GPU this is (two nodes that fingerprint alike
# can serve at 0.7 of each other; the UUID says whether a comparison is of one GPU with itself).
OPTIONAL_FIELDS = ("uuid",)


@dataclass
class NvidiaGpu:
    """One NVIDIA GPU: identity, driver-facing versions, and the modes a platform team pins."""

    index: int
    name: str
    driver_version: str | None
    vbios_version: str | None
    memory_total_mib: int | None
    ecc_mode: str | None
    mig_mode: str | None
    compute_cap: str | None
    pci_bus_id: str | None
    uuid: str | None = None


@dataclass
class NvidiaSmi:
    driver_version: str | None
    cuda_version: str | None
    gpus: list[NvidiaGpu]


def _clean(value: str | None) -> str | None:
    if value is None:
        return None
    value = value.strip()
    return None if value in {"", "N/A", "[N/A]", "[Not Supported]"} else value


def _mib(value: str | None) -> int | None:
    value = _clean(value)
    return int_or_none(value.split()[0]) if value else None


def parse_query_csv(text: str) -> NvidiaSmi:
    """Parse `nvidia-smi --query-gpu=<QUERY_FIELDS...> --format=csv` (with its header line)."""
    rows = [row for row in csv.reader(io.StringIO(text), skipinitialspace=True) if row]
    if len(rows) < 2:
        raise Unparseable("no header and data rows")
    # Header cells carry units ("memory.total [MiB]"): match on the field name before the bracket.
    header = [cell.split(" [")[0].strip() for cell in rows[0]]
    missing = [f for f in QUERY_FIELDS if f not in header]
    if missing:
        raise Unparseable(f"header lacks {', '.join(missing)}")
    gpus = []
    for index, row in enumerate(rows[1:]):
        if len(row) != len(header):
            raise Unparseable(f"row {index} has {len(row)} fields, header has {len(header)}")
        cell = dict(zip(header, row, strict=True))
        gpus.append(NvidiaGpu(
            index=index,
            name=cell["name"].strip(),
            driver_version=_clean(cell["driver_version"]),
            vbios_version=_clean(cell["vbios_version"]),
            memory_total_mib=_mib(cell["memory.total"]),
            ecc_mode=_clean(cell["ecc.mode.current"]),
            mig_mode=_clean(cell["mig.mode.current"]),
            compute_cap=_clean(cell["compute_cap"]),
            pci_bus_id=_clean(cell["pci.bus_id"]),
            uuid=_clean(cell.get("uuid")),
        ))
    drivers = {g.driver_version for g in gpus}
    driver = drivers.pop() if len(drivers) == 1 else None
    return NvidiaSmi(driver_version=driver, cuda_version=None, gpus=gpus)


def parse_query_xml(text: str) -> NvidiaSmi:
    """Parse `nvidia-smi -q -x`."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise Unparseable(f"invalid XML ({exc})") from None
    if root.tag != "nvidia_smi_log":
        raise Unparseable(f"root element is <{root.tag}>, not <nvidia_smi_log>")
    driver = _clean(root.findtext("driver_version"))
    gpus = []
    for index, gpu in enumerate(root.findall("gpu")):
        name = _clean(gpu.findtext("product_name"))
        if name is None:
            raise Unparseable(f"GPU {index} has no product_name")
        gpus.append(NvidiaGpu(
            index=index,
            name=name,
            driver_version=driver,
            vbios_version=_clean(gpu.findtext("vbios_version")),
            memory_total_mib=_mib(gpu.findtext("fb_memory_usage/total")),
            ecc_mode=_clean(gpu.findtext("ecc_mode/current_ecc")),
            mig_mode=_clean(gpu.findtext("mig_mode/current_mig")),
            compute_cap=_clean(gpu.findtext("compute_cap")),
            pci_bus_id=gpu.get("id"),
            uuid=_clean(gpu.findtext("uuid")),
        ))
    return NvidiaSmi(driver_version=driver, cuda_version=_clean(root.findtext("cuda_version")), gpus=gpus)


def merge(query: NvidiaSmi | ProbeFailure, report: NvidiaSmi | ProbeFailure) -> NvidiaSmi | ProbeFailure:
    """The CSV query's GPUs (with compute_cap, which recent -q -x reports omit) and the XML's CUDA version, and its
    GPU UUIDs where the query gave none."""
    if isinstance(query, ProbeFailure):
        return report if not isinstance(report, ProbeFailure) else query
    if not isinstance(report, ProbeFailure):
        query.cuda_version = report.cuda_version
        for gpu, other in zip(query.gpus, report.gpus, strict=False):
            gpu.uuid = gpu.uuid or other.uuid
    return query


def probe_nvidia_smi() -> NvidiaSmi | ProbeFailure:
    argv = ["nvidia-smi", f"--query-gpu={','.join(QUERY_FIELDS + OPTIONAL_FIELDS)}", "--format=csv"]
    query = parse_with("nvidia-smi", parse_query_csv, run_tool(argv))
    if isinstance(query, ProbeFailure) and query.kind == NOT_INSTALLED:
        return query
    return merge(query, parse_with("nvidia-smi", parse_query_xml, run_tool(["nvidia-smi", "-q", "-x"])))
