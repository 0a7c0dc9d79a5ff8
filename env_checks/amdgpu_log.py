"""Facts of an amdgpu kernel log that `textforms_faults.enrich_kernel_log` leaves unread: the PCI device id amdgpu
prints when it starts on a GPU (`initializing kernel modesetting (IP DISCOVERY 0x1002:0x74A1 ...)`, found among the
lines of other drivers in a boot log), the rings that timed out and whose reset failed (the hung IP a MES or ring reset
was about), the MES messages that went unanswered, the reset method (BACO, MODE1, MODE2), the IP blocks that failed
to suspend and the KFD's `qcm fence wait loop timeout` count.

Same contract as `textforms`: every value is copied from the text as it stands.
"""

from __future__ import annotations

import re

from env_checks.textforms import Reading

_IP_DISCOVERY = re.compile(r"initializing kernel modesetting \(IP DISCOVERY (0x[0-9a-fA-F]{4}):(0x[0-9a-fA-F]{4}) "
                           r"(0x[0-9a-fA-F]{4}):(0x[0-9a-fA-F]{4}) (0x[0-9a-fA-F]{2})\)")
_RING_TIMEOUT = re.compile(r"ring (\S+) timeout, signaled seq=\d+, emitted seq=\d+")
_RING_RESET = re.compile(r"Ring (\S+) reset (succeeded|failed)")
_MES = re.compile(r"MES failed to respon\w* (?:to )?msg=(\w+)")
_RESET_METHOD = re.compile(r"(?:GPU |amdgpu: )(BACO|MODE1|MODE2) reset\b")
_SUSPEND = re.compile(r"suspend of IP block <(\w+)> failed (-?\d+)")


def enrich_amdgpu_log(text: str, r: Reading) -> None:
    for _vendor, device, _sub_vendor, _sub_device, _revision in _IP_DISCOVERY.findall(text):
        r.add("device_ids", device)
    for ring in _RING_TIMEOUT.findall(text):
        r.add("timed_out_rings", ring)
    for ring, outcome in _RING_RESET.findall(text):
        r.add("ring_resets_failed" if outcome == "failed" else "ring_resets_succeeded", ring)
    for message in _MES.findall(text):
        r.add("mes_unanswered_messages", message)
    for method in _RESET_METHOD.findall(text):
        r.add("gpu_reset_methods", method)
    for block, code in _SUSPEND.findall(text):
        r.add("ip_suspend_failures", f"{block} {code}")
    fences = len(re.findall(r"qcm fence wait loop timeout expired", text))
    r.put("qcm_fence_timeouts", fences or None)
