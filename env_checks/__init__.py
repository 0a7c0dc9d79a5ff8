"""Platform checks that run before any model is loaded.

`env_checks` reads the machine (rocminfo, amd-smi, rocm-smi, nvidia-smi, /proc, /sys, device nodes),
records what it found as one JSON fingerprint (`env_checks.record.fingerprint.collect`) and judges it against
per-platform pin manifests kept as TOML data (`env_checks.pins`). It imports only the standard library so
that it runs on a bare CI runner and inside a broken stack alike: `python -m env_checks --pins auto`.
"""

__all__ = ["fingerprint", "pins"]
