"""`--profile NAME:all` (conformance/run/cli.py): a profile's backend matrix expanded to one run per row,
on the data (MI300X's production profile) and in one real CPU run through the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.run import cli
from conformance.verdicts import profiles


def test_mi300x_production_profile_expands_to_its_backend_rows():
    rows = cli.expand_rows("mi300x-gpt-oss-120b:all")
    labels = [r.label for r in rows]
    assert labels == ["mi300x-gpt-oss-120b:rocm-aiter-unified", "mi300x-gpt-oss-120b:rocm-triton-aiter-off",
                      "mi300x-gpt-oss-120b:rocm-aiter-fa", "mi300x-gpt-oss-120b:rocm-attn-aiter-off"]
    assert [r.engine_level_only for r in rows] == [False, True, True, True]
    chosen = [profiles.select(r.label, "rocm", ["AMD Instinct MI300X"], "gpt-oss-120b", "bfloat16") for r in rows]
    assert [p.engine_options()["attention_backend"] for p in chosen] == [
        "ROCM_AITER_UNIFIED_ATTN", "TRITON_ATTN", "ROCM_AITER_FA", "ROCM_ATTN"]
    assert [p.engine_env()["VLLM_ROCM_USE_AITER"] for p in chosen] == ["1", "0", "1", "0"]  # AITER MoE on / off
    assert all(p.engine_options()["gpu_memory_utilization"] == 0.9 for p in chosen)  # the profile, per row
    assert chosen[0].label == "mi300x-gpt-oss-120b" and chosen[1].label == labels[1]  # what results.json records


def test_one_row_or_no_profile_is_not_expanded():
    assert cli.expand_rows(None) is None
    assert cli.expand_rows("mi300x-gpt-oss-120b:rocm-aiter-fa") is None
    assert [r.label for r in cli.expand_rows("cpu:all")] == ["cpu:cpu"]


def test_an_unknown_profile_fails_in_one_sentence():
    with pytest.raises(profiles.ProfileError, match="there is no serving profile 'mi999x'"):
        cli.expand_rows("mi999x:all")
    assert cli.main(["run", "--profile", "mi999x:all"]) == 2


def test_rows_after_the_first_run_the_engine_level_checks_only():
    rows = cli.expand_rows("mi300x-gpt-oss-120b:all")
    args = ["x", str(cli.CHECKS), "-q", "--profile=mi300x-gpt-oss-120b:all", "--rocm"]
    first = cli.row_args(args[1:], cli.CHECKS, rows[0])
    assert first == [str(cli.CHECKS), "-q", "--profile=mi300x-gpt-oss-120b:rocm-aiter-unified", "--rocm"]
    later = cli.row_args(args[1:], cli.CHECKS, rows[2])
    modules = [Path(a).name for a in later if a.endswith(".py")]
    assert modules == ["test_logit_parity.py", "test_kv_cache.py", "test_kv_accounting.py", "test_scheduling.py",
                       "test_prefix_cache.py", "test_running_config.py"] and str(cli.CHECKS) not in later
    assert "--profile=mi300x-gpt-oss-120b:rocm-aiter-fa" in later


def test_a_missing_engine_level_module_fails_in_one_sentence(tmp_path):
    with pytest.raises(profiles.ProfileError, match="do not exist: test_gone.py"):
        cli.engine_level_checks(tmp_path, {"row_expansion": {"checks": ["test_gone.py"]}})


def test_run_rows_runs_each_row_and_returns_the_worst_exit():
    rows = cli.expand_rows("mi300x-gpt-oss-120b:all")
    seen: list[list[str]] = []
    codes = iter([0, 1, 0, 0])
    said: list[str] = []
    code = cli.run_rows(rows, [str(cli.CHECKS), "--profile=x:all"], cli.CHECKS,
                                 lambda a: (seen.append(a), next(codes))[1], said.append)
    assert code == 1 and len(seen) == 4
    assert [next(a for a in s if a.startswith("--profile=")) for s in seen] == [f"--profile={r.label}" for r in rows]
    assert "rocm-triton-aiter-off -> exit 1" in said[-1]


@pytest.mark.slow
def test_cpu_all_rows_through_the_cli_records_each_row_as_its_own_run(tmp_path):
    """The real CLI on the CPU default: `--profile cpu:all` runs the one row of the cpu matrix as its own
    run, whose results.json records the profile and its backend row."""
    proc = subprocess.run([sys.executable, "-m", "conformance", "run", "--reports-dir", str(tmp_path),
                           "--profile", "cpu:all", "--tier", "p0", "-k", "torch_build"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 4, proc.stdout[-3000:] + proc.stderr[-2000:]  # passed, narrowed by -k
    assert "profile row 1/1: cpu:cpu" in proc.stdout and "cpu:cpu -> exit 4" in proc.stdout
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    record = json.loads((run_dir / "results.json").read_text())
    assert record["profile"] == "cpu" and record["profile_settings"]["backend"] == "cpu"
    assert record["profile_settings"]["matrix"] == ["cpu"]
