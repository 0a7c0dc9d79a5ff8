"""Platform checks that run before any model is loaded.

`env_checks` reads the machine (rocminfo, amd-smi, rocm-smi, nvidia-smi, /proc, /sys, device nodes),
records what it found as one JSON fingerprint (`env_checks.record.fingerprint.collect`) and judges it against
per-platform pin manifests kept as TOML data (`env_checks.pins`). It imports only the standard library so
that it runs on a bare CI runner and inside a broken stack alike: `python -m env_checks --pins auto`.

- `probes/`: the strict probes, which run the tools on this machine (a cut or unknown output is a failure, never a
  guess); `health` snapshots the machine with them before and after a run.
- `pasted/`: the tolerant readers of pasted tool outputs and logs, one module per tool, behind one table
  (`pasted.registry`) that `diagnose` (`conformance diagnose`) iterates; `crosscheck` compares the facts of several
  outputs, `signatures` (with `prefilter`) matches known faults.
- `record/`: the record contract shared with the reports: a run's results and their schema, the fingerprint, and
  the stack a fingerprint names.
- `pins` and `versions` judge a fingerprint against its platform's pin manifest; `baselines` holds the pinned serving
  baselines; `child` lets a run started by another command record itself when interrupted; `tool_text` holds the
  text helpers the probes and the readers share.
"""

__all__ = ["pins", "record"]
