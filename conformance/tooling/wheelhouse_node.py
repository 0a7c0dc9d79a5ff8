"""The node's side of an offline wheelhouse (conformance/tooling/wheelhouse.py builds it): the parts cut from the
wheels, each with its sha256, joined and checked, then the carried wheels installed with no index. Standard library
only: it runs on the node before anything else is installed there (ci/offline-node.sh)."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tarfile
from pathlib import Path

MANIFEST = "manifest.json"
BUNDLE = "wheels.tar"


class WheelhouseError(RuntimeError):
    """One sentence that says what is wrong with the wheelhouse, its input or the node."""


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def split(out: Path, wheels: list[Path], part_size: int) -> list[dict]:
    """One uncompressed tar of the wheels (they are compressed already), cut into parts of `part_size` bytes."""
    parts_dir = out / "parts"
    shutil.rmtree(parts_dir, ignore_errors=True)
    parts_dir.mkdir()
    bundle = out / BUNDLE
    with tarfile.open(bundle, "w") as tar:
        for wheel in sorted(wheels):
            tar.add(wheel, arcname=wheel.name)
    parts = []
    with open(bundle, "rb") as f:
        for index in range(10**4):
            chunk = f.read(part_size)
            if not chunk:
                break
            path = parts_dir / f"{BUNDLE}.{index:03d}"
            path.write_bytes(chunk)
            parts.append({"file": path.name, "bytes": len(chunk), "sha256": hashlib.sha256(chunk).hexdigest()})
    bundle.unlink()
    return parts


def read_manifest(where: Path) -> dict:
    path = Path(where) / MANIFEST
    try:
        return json.loads(path.read_text())
    except OSError as exc:
        raise WheelhouseError(f"{where} holds no readable {MANIFEST} ({exc.strerror}): not a wheelhouse") from exc
    except ValueError as exc:
        raise WheelhouseError(f"{path} is not valid JSON ({exc}): the wheelhouse is damaged") from exc


def _wheels_ok(where: Path, manifest: dict) -> list[str]:
    bad = []
    for wheel in manifest["wheels"]:
        path = where / "wheels" / wheel["file"]
        if not path.exists():
            bad.append(f"{wheel['file']} is missing")
        elif path.stat().st_size != wheel["bytes"] or sha256(path) != wheel["sha256"]:
            bad.append(f"{wheel['file']} does not match its sha256")
    return bad


def assemble(where: Path, log=print) -> dict:
    """The wheels of the wheelhouse at `where`, each checked against the manifest; joined from the parts if needed."""
    where = Path(where)
    manifest = read_manifest(where)
    if not _wheels_ok(where, manifest):
        return manifest
    parts = manifest.get("parts")
    if not parts:
        raise WheelhouseError(f"{where}: {_wheels_ok(where, manifest)[0]}, and the wheelhouse has no parts to join")
    found = [p for p in parts if (where / "parts" / p["file"]).exists()]
    if len(found) < len(parts):
        missing = [p["file"] for p in parts if p not in found]
        raise WheelhouseError(f"{where}/parts lacks {', '.join(missing)} ({len(found)} of {len(parts)} parts here)")
    for part in parts:
        path = where / "parts" / part["file"]
        if path.stat().st_size != part["bytes"] or sha256(path) != part["sha256"]:
            raise WheelhouseError(f"part {part['file']} does not match its sha256: carry it again")
    bundle = where / BUNDLE
    with open(bundle, "wb") as out:
        for part in parts:
            with open(where / "parts" / part["file"], "rb") as f:
                shutil.copyfileobj(f, out)
    (where / "wheels").mkdir(exist_ok=True)
    with tarfile.open(bundle) as tar:
        tar.extractall(where / "wheels", filter="data") if hasattr(tarfile, "data_filter") else tar.extractall(
            where / "wheels")
    bundle.unlink()
    bad = _wheels_ok(where, manifest)
    if bad:
        raise WheelhouseError(f"{where}: {bad[0]} after joining the parts")
    log(f"assembled {len(manifest['wheels'])} wheels from {len(parts)} parts, every sha256 as the manifest says")
    return manifest


def install_commands(where: Path, manifest: dict, python: str, suite_root: Path | None) -> list[list[str]]:
    """No index, no dependency resolution: exactly the wheels carried; then the suite from its checkout, built by the
    node's own setuptools (no build isolation, which would need an index)."""
    wheels = [str(Path(where) / "wheels" / w["file"]) for w in manifest["wheels"]]
    pip = [python, "-m", "pip", "install", "--no-index", "--no-deps", "--no-cache-dir"]
    commands = [[*pip, *wheels]]
    if suite_root is not None:
        commands.append([*pip, "--no-build-isolation", "-e", str(suite_root)])
    return commands


def install(where: Path, python: str, suite_root: Path | None, log=print) -> None:
    manifest = assemble(where, log)
    for command in install_commands(where, manifest, python, suite_root):
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise WheelhouseError(f"installing from {where} failed (exit {done.returncode}): "
                                  f"{(done.stderr or done.stdout).strip().splitlines()[-1]}")
    keeps = ", ".join(f"{k['name']} {k['node']} (the stack pins {k['stack_wants']})" for k in manifest["node_keeps"]
                      if k["node"].split("+")[0] != k["stack_wants"].split("+")[0])
    log(f"installed {len(manifest['wheels'])} wheels with no index" + (f"; the node keeps its own {keeps}"
                                                                        if keeps else ""))
