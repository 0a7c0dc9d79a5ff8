"""Facts of a pasted `rocminfo` that its base reader (`textforms.read_rocminfo`) leaves unread: the KFD (ROCk module)
version of `ROCk module version 6.8.5 is loaded`, the runtime extension version, each GPU agent's full ISA name
(`amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-`) with the target id it carries, and, where the paste elides agents
(`...`), the agent and KFD node counts the agents shown imply (Agent 16 and Node 15: at least 16 of each).
"""

from __future__ import annotations

import re

from env_checks.textforms import ELIDED, Reading

_ISA = re.compile(r"^\s*Name:\s*(amdgcn-amd-amdhsa--(gfx[0-9a-f]+)((?::(?:sramecc|xnack)[+-])*))\s*$", re.MULTILINE)


def enrich_rocminfo(text: str, r: Reading) -> None:
    kfd = re.search(r"^ROCk module version (\S+) is loaded", text, re.MULTILINE)
    r.put("kfd_version", kfd.group(1) if kfd else None)
    ext = re.search(r"^Runtime Ext Version:\s*(\S+)", text, re.MULTILINE)
    r.put("hsa_runtime_ext_version", ext.group(1) if ext else None)
    for name, gfx, features in _ISA.findall(text):
        r.add("isa_names", name)
        if features:
            r.add("gfx_target_ids", gfx + features)
    if not ELIDED.search(text):
        return
    agents = [int(n) for n in re.findall(r"^\s*Agent (\d+)\s*$", text, re.MULTILINE)]
    nodes = [int(n) for n in re.findall(r"^\s*Node:\s*(\d+)\s*$", text, re.MULTILINE)]
    if agents:
        r.put("hsa_agents_at_least", max(agents))
    if nodes:
        r.put("kfd_nodes_at_least", max(nodes) + 1)
    if agents or nodes:
        r.unread.append(f"The listing elides agents ('...'): the agents shown (highest Agent {max(agents or [0])}, "
                        f"Node {max(nodes or [0])}) give lower bounds of the agent and node counts, and the elided "
                        "agents' models, targets and GPU count could not be read.")
