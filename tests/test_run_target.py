"""The run's target resolved once (conformance/run/run_target.py): one frozen RunTarget from targets.toml, the
choices of --target / --engine / the GPU flags from data, and the `needs` marker end to end through the
plugin (strict markers) with the skip sentence in the run record."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.datafiles import DataError
from conformance.run import cli, matrix, plugin, run_target
from conformance.run.run_target import TargetReport
from conformance.run.runcontext import RunContext
from tests.test_run_options import DOC, run_plugin


def test_the_cpu_target_is_read_once_into_a_frozen_object():
    t = run_target.build("cpu")
    assert (t.name, t.engine, t.dtype, t.exact_dtype, t.engine_start, t.needs_device) == \
        ("cpu", "vllm", "float32", "float32", "forkserver", False)
    assert t.options_for("vllm")["max_model_len"] == 1024 and t.env["VLLM_TARGET_DEVICE"] == "cpu"
    assert t.timeouts.engine_call_s == 300.0 and t.suite["soak"]["rounds"] > 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.dtype = "bfloat16"  # type: ignore[misc]
    with pytest.raises(TypeError):
        t.env["X"] = "1"  # type: ignore[index]
    t.options_for("vllm")["seed"] = 99  # a fresh dict each time: the target's own table stays as read
    assert t.options_for("vllm")["seed"] == 0


def test_engine_and_dtype_of_the_run_override_the_targets_defaults():
    t = run_target.build("rocm", "transformers", "float16")
    assert (t.engine, t.dtype, t.vllm_platform, t.needs_device) == ("transformers", "float16", "rocm", True)


def test_a_dtype_the_engine_does_not_run_the_checkpoints_format_in_is_refused_in_one_sentence(tmp_path: Path):
    """vLLM runs MXFP4 in bf16 only (data/quant.toml serves): vLLM 0.26.0 on the H100 refused float16 at the
    engine's start ("torch.float16 is not supported for quantization method gpt_oss_mxfp4",
    fixtures/recorded/h100/layers-fp16-mxfp4-refused-vllm-0.26.0); the run is refused before anything starts."""
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "mxfp4"}}))
    for target, dtype in (("cuda", "float16"), ("cpu", None)):  # the CPU default's dtype is float32
        with pytest.raises(run_target.RunRefused) as refused:
            run_target.build(target, "vllm", dtype, model=str(tmp_path))
        assert str(refused.value).startswith(f"vllm runs this checkpoint's mxfp4 weights in bfloat16 only, not "
                                             f"{dtype or 'float32'}") and "--dtype bfloat16" in str(refused.value)
    assert run_target.build("cuda", "vllm", "bfloat16", model=str(tmp_path)).dtype == "bfloat16"
    assert run_target.build("cuda", "transformers", "float16", model=str(tmp_path)).dtype == "float16"


def test_engine_kinds_start_as_their_target_says_and_the_forkserver_leaves_out_what_none_forks(tmp_path: Path):
    """ROCm forks the transformers engine and the device probe and spawns vLLM (forking vLLM is unverified there);
    the CPU and CUDA (verified on the H200) fork all."""
    cpu, cuda, rocm = (run_target.build(name) for name in ("cpu", "cuda", "rocm"))
    for forks_all in (cpu, cuda):
        assert {k: forks_all.start_method(k) for k in ("vllm", "transformers", "device")} == dict.fromkeys(
            ("vllm", "transformers", "device"), "forkserver")
    assert (rocm.start_method("vllm"), rocm.start_method("transformers"), rocm.start_method("device")) == \
        ("spawn", "forkserver", "forkserver") and rocm.forks_engines
    # vLLM's model inspection ahead of the engines: in a fresh interpreter where vLLM engines spawn, and only where
    # vLLM is the engine under test (where they fork, a child of the forkserver runs it)
    assert rocm.inspects_vllm_in_an_interpreter("vllm") and not rocm.inspects_vllm_in_an_interpreter("transformers")
    assert not cpu.inspects_vllm_in_an_interpreter("vllm") and not cuda.inspects_vllm_in_an_interpreter("vllm")
    # what a forkserver imports: preload.py with the stacks named left out (a GPU run's: vLLM)
    probe = ("import sys, conformance.engines.preload; "
             "print(sorted({'vllm', 'transformers', 'torch'} & set(sys.modules)))")
    for skip, imported in (("vllm,transformers,torch", "[]"), ("vllm,transformers", "['torch']")):
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, check=True,
                             env=os.environ | {"CONFORMANCE_PRELOAD_SKIP": skip}).stdout
        assert out.strip() == imported, (skip, out)


def test_an_unknown_target_is_one_sentence():
    with pytest.raises(DataError, match=r"targets.toml has no \[tpu\] target \(it has cpu, cuda"):
        run_target.build("tpu")


def test_the_run_target_is_built_whole_and_the_run_state_takes_nothing_undeclared(tmp_path: Path):
    report = TargetReport("auto", "cpu", devices=[])
    t = run_target.build("cpu", None, None, report, "auto", str(tmp_path))
    assert (t.name, t.requested, t.engine, t.dtype, t.model, t.profile.label) == \
        ("cpu", "auto", "vllm", "float32", str(tmp_path), "cpu")
    run = RunContext("id", tmp_path, "now", t)
    assert (run.target is t, run.engine, run.dtype_name, run.model_arg, run.resolved()) == (True, "vllm", "float32",
                                                                                          str(tmp_path), report)
    with pytest.raises(AttributeError):
        run.shortfal = "a typo"  # type: ignore[attr-defined]


@pytest.mark.parametrize("engine, dtype, profile, sentence", [
    ("sglang", None, None, "--engine 'sglang' is no engine of data/engines.toml: use one of vllm, transformers."),
    (None, "float8", None, "--dtype 'float8' is not a dtype the suite has limits for"),
    (None, None, "nosuch", "there is no serving profile 'nosuch'"),
])
def test_engine_dtype_and_profile_the_data_does_not_allow_are_one_sentence(engine, dtype, profile, sentence):
    with pytest.raises(run_target.RunRefused) as exc:
        run_target.build("cpu", engine, dtype, profile=profile)
    assert str(exc.value).startswith(sentence) and "\n" not in str(exc.value)


def test_choices_come_from_the_data_files():
    assert run_target.names() == ("cpu", "cuda", "rocm")
    assert run_target.choices() == ["auto", "cpu", "cuda", "rocm"]
    assert run_target.engine_names() == ("vllm", "transformers") == matrix.ENGINES
    assert set(matrix.TARGETS) == set(run_target.names())
    parser = argparse.ArgumentParser()
    cli.run_parser(parser.add_subparsers(dest="command"))
    assert parser.parse_args(["run", "--rocm", "--engine", "transformers"]).target == "rocm"
    with pytest.raises(SystemExit):
        parser.parse_args(["run", "--engine", "sglang"])


def test_the_needs_marker_skips_through_the_plugin_with_the_capability_sentence(tmp_path: Path):
    checks = tmp_path / "checks"
    checks.mkdir()
    (checks / "test_needs.py").write_text(f'''import pytest


@pytest.mark.p0
@pytest.mark.needs("paged_kv")
def test_needs_paged_kv():
    {DOC}


@pytest.mark.p0
def test_needs_nothing():
    {DOC}
''')
    proc = run_plugin(checks, "--engine", "transformers")
    assert "needs' not found in `markers`" not in proc.stdout + proc.stderr  # registered: strict markers pass
    newest = max((tmp_path / "reports" / "runs").glob("*/results.json"), key=lambda p: p.stat().st_mtime_ns)
    record = json.loads(newest.read_text())["checks"]
    got = {c["id"].rsplit("::", 1)[1]: (c["outcome"], c.get("message")) for c in record}
    assert got["test_needs_paged_kv"] == ("skipped", "Skipped: the transformers engine has no paged KV cache to "
                                                     "inspect")
    assert got["test_needs_nothing"][0] == "passed"


def test_options_are_declared_once_and_handed_on_by_the_same_table():
    """conformance/run/cli.py declares every option both sides take in one table (OPTIONS), each flag once; the
    plugin names none (the fault drill spells the flags of the runs it starts)."""
    cli_source = Path(cli.__file__).read_text()
    assert [o.flag for o in cli.OPTIONS if cli_source.count(f'_option("{o.flag}"') != 1] == []
    plugin_source = Path(plugin.__file__).read_text()
    assert not [o.flag for o in cli.OPTIONS if f'"{o.flag}"' in plugin_source]
    parser = argparse.ArgumentParser()
    cli.run_parser(parser.add_subparsers(dest="command"))
    ns = parser.parse_args(["run", "--rocm", "--tier", "p0,p1", "--dtype", "bfloat16", "--fresh-reference", "--server"])
    args = cli.build_pytest_args(ns)
    assert {"--rocm", "--dtype=bfloat16", "--fresh-reference", f"--server={cli.SERVER_FROM_ENV}"} <= set(args)
    assert args[args.index("--tier") + 1] == "p0,p1" and "--model" not in " ".join(args)
