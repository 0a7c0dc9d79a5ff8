"""Strict probes of this machine: each runs a tool (rocminfo, amd-smi, rocm-smi, nvidia-smi, dmesg or journalctl, the
code-object readers of `isa`) or reads a file (/proc, /sys, the ROCm version file) and parses what it gets strictly: an
output that is cut or of a form the parser does not know becomes a `ProbeFailure` (`facts`), never a guess, so the
fingerprint holds only what the machine stated. The tolerant counterpart, for outputs people paste, is
`env_checks.pasted`.
"""
