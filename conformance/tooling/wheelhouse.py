"""An offline wheelhouse: the wheels a node that cannot download lacks for the stack under test and for the suite,
built where pip can download, carried in parts, assembled and installed on the node without an index.

  python -m conformance.tooling.wheelhouse build --target cuda --python 3.12 --constraint FREEZE --out DIR
                                           [--part-size 56MiB] [--trim hopper] [--eval]
  python -m conformance.tooling.wheelhouse assemble DIR  check every part's hash, join them, unpack and check the wheels
  python -m conformance.tooling.wheelhouse install DIR   assemble, then install the wheels and the suite (editable,
                                                         from the checkout) with no index: nothing the node holds moves

FREEZE is `pip freeze` of the node's image (`python -m conformance.tooling.installs freeze FILE` there). The build
resolves against it as if it were installed: what the node holds is never carried and never replaced; where the
stack pins another version of a package the node holds (vLLM 0.26.0's numba==0.65.0 beside an image's 0.68), the
node's stays and the manifest says so. What the target's data (conformance/data/wheelhouse.toml) leaves out, and
whatever only it needs, is left out and named. Standard library only (plus pip): it runs before the suite is
installed, from the checkout (docs/wheelhouse.md).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from conformance.tooling.wheelhouse_node import (  # the node's side: parts, assembly, install
    MANIFEST,
    WheelhouseError,
    assemble,
    install,
    sha256,
    split,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parents[1] / "data" / "wheelhouse.toml"


def normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def spec(target: str) -> dict:
    data = tomllib.loads(DATA.read_text())
    if target not in data["target"]:
        raise WheelhouseError(f"no wheelhouse target {target!r}: {DATA.name} knows {', '.join(data['target'])}")
    return data | {"row": data["target"][target]}


def node_packages(freeze: Path) -> dict[str, str]:
    """name -> version of a `pip freeze` (lines `name==version`; editable, URL and comment lines are skipped)."""
    try:
        text = Path(freeze).read_text()
    except OSError as exc:
        raise WheelhouseError(f"cannot read the node's freeze {freeze}: {exc.strerror}") from exc
    held: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith("-") or " @ " in line:
            continue
        name, sep, version = line.partition("==")
        if not sep or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name.strip()) or not version.strip():
            raise WheelhouseError(f"{freeze}:{number} is not a `name==version` line of pip freeze: {raw.strip()!r}")
        held[normal(name)] = version.strip()
    if not held:
        raise WheelhouseError(f"{freeze} names no package: give the node's `pip freeze`")
    return held


def _stub_environment(where: Path, held: dict[str, str]) -> Path:
    """A venv without pip whose site-packages holds only the metadata of what the node holds: pip resolves against
    it (`pip --python`) as against the node."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    (site,) = where.glob("lib/python*/site-packages")
    for name, version in held.items():
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\n")
        (info / "INSTALLER").write_text("conformance-wheelhouse-stub\n")
    return where / "bin" / "python"


def _pip(*args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join(line for line in (done.stderr or done.stdout).splitlines()
                         if not line.startswith("WARNING: Location"))[-3000:]
        raise WheelhouseError(f"pip {args[0]} failed (exit {done.returncode}):\n{tail}")
    return done


def _platform_args(row: dict, python: str) -> list[str]:
    return [*(a for p in row["platforms"] for a in ("--platform", p)), "--python-version", python,
            "--implementation", "cp", "--only-binary=:all:"]


@dataclass
class Item:
    name: str
    version: str
    file: str
    url: str
    sha256: str | None
    requires: list[str]
    extras: list[str]


def _pure_wheel(name: str, where: Path) -> None:
    """A dependency published only as an sdist (lm-eval's sqlitedict): built here into a wheel, which must be pure
    Python (py3-none-any) to serve another platform."""
    before = set(where.glob("*.whl"))
    _pip("wheel", "--no-deps", "--quiet", "-w", str(where), name)
    new = set(where.glob("*.whl")) - before
    if not new or any(not w.name.endswith("-none-any.whl") for w in new):
        raise WheelhouseError(f"{name} has no wheel for the node's platform and its sdist builds no pure-Python wheel")


def resolve(requirements: Sequence[str], held: dict[str, str], row: dict, python: str,
            constraints: Path | None, built: Path | None = None) -> list[Item]:
    """pip's resolution of `requirements` for the node (its platform, its Python, its packages held); sdist-only
    dependencies are built into `built` as pure-Python wheels."""
    with tempfile.TemporaryDirectory() as tmp:
        stub = _stub_environment(Path(tmp) / "node", held)
        report = Path(tmp) / "report.json"
        extra = ["-c", str(constraints)] if constraints else []
        extra += ["--find-links", str(built)] if built else []
        for _ in range(20):  # each round builds one more sdist-only dependency into a wheel
            try:
                _pip("--python", str(stub), "install", "--dry-run", "--quiet", "--report", str(report),
                     *_platform_args(row, python), *extra, *requirements)
                break
            except WheelhouseError as exc:
                sdist = re.search(r"No matching distribution found for ([A-Za-z0-9._-]+)", str(exc))
                if built is None or sdist is None:
                    raise
                _pure_wheel(sdist[1], built)
        install = json.loads(report.read_text())["install"]
    items = []
    for entry in install:
        meta, info = entry["metadata"], entry["download_info"]
        items.append(Item(meta["name"], meta["version"], info["url"].rsplit("/", 1)[-1], info["url"],
                          info.get("archive_info", {}).get("hashes", {}).get("sha256"),
                          list(meta.get("requires_dist", [])), list(entry.get("requested_extras") or [])))
    return items


def _marker_env(python: str) -> dict[str, str]:
    return {"python_version": python, "python_full_version": f"{python}.0", "implementation_name": "cpython",
            "platform_python_implementation": "CPython", "sys_platform": "linux", "platform_system": "Linux",
            "platform_machine": "x86_64", "os_name": "posix", "platform_release": "", "platform_version": "",
            "implementation_version": f"{python}.0"}


def reachable(roots: Iterable[str], items: list[Item], leave_out: Iterable[str], python: str) -> set[str]:
    """Names reached from `roots` through the items' requirements, never through a package left out."""
    from pip._vendor.packaging.requirements import Requirement

    by_name = {normal(i.name): i for i in items}
    skip = {normal(n) for n in leave_out}
    env = _marker_env(python)
    seen: set[str] = set()
    todo = [(normal(Requirement(r).name), set(Requirement(r).extras)) for r in roots]
    while todo:
        name, extras = todo.pop()
        if name in skip or name in seen and not extras:
            continue
        seen.add(name)
        item = by_name.get(name)
        for text in item.requires if item else []:
            req = Requirement(text)
            if req.marker is None or any(req.marker.evaluate(env | {"extra": e}) for e in ("", *extras)):
                todo.append((normal(req.name), set(req.extras)))
    return seen


@dataclass
class Plan:
    carry: list[Item]
    left_out: dict[str, str]
    only_for_left_out: list[str]
    node_keeps: list[dict] = field(default_factory=list)


def plan(requirements: Sequence[str], items: list[Item], held: dict[str, str], leave_out: dict[str, str],
         python: str) -> Plan:
    """What to carry: what pip would install, less what the node holds (kept, with the version the stack wanted),
    less what the data leaves out and what only that needs."""
    wanted = reachable(requirements, items, leave_out, python)
    carry, keeps, only = [], [], []
    for item in items:
        name = normal(item.name)
        if name in held:
            keeps.append({"name": item.name, "node": held[name], "stack_wants": item.version})
        elif name in wanted:
            carry.append(item)
        elif name not in {normal(n) for n in leave_out}:
            only.append(item.name)
    present = {normal(i.name) for i in items}
    return Plan(carry, {n: r for n, r in leave_out.items() if normal(n) in present}, sorted(only), keeps)


def download(items: list[Item], row: dict, python: str, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    local = [i for i in items if i.url.startswith("file:")]
    for item in local:
        shutil.copy(Path(item.url.removeprefix("file://")), dest / item.file)
    _pip("download", "--no-deps", "--quiet", "-d", str(dest), *_platform_args(row, python),
         *(f"{i.name}=={i.version}" for i in items if i not in local))
    for item in items:
        path = dest / item.file
        if not path.exists():
            raise WheelhouseError(f"pip download left no {item.file} for {item.name}=={item.version}")
        if item.sha256 and sha256(path) != item.sha256:
            raise WheelhouseError(f"{item.file} does not match the index's sha256: a damaged download")


def trim_wheel(wheel: Path, drop: Sequence[str], label: str) -> Path:
    """The wheel without the files `drop`, under version `<version>+<label>` (its dist-info and RECORD renamed)."""
    name, version, rest = wheel.name.split("-", 2)
    new_version = f"{version}+{label}"
    old_info, new_info = f"{name}-{version}.dist-info/", f"{name}-{new_version}.dist-info/"
    out = wheel.with_name(f"{name}-{new_version}-{rest}")
    dropped = set(drop)
    with zipfile.ZipFile(wheel) as src:
        missing = dropped - set(src.namelist())
        if missing:
            raise WheelhouseError(f"{wheel.name} holds no {', '.join(sorted(missing))}: the trim's data is stale")
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as dst:
            for info in src.infolist():
                if info.filename in dropped:
                    continue
                data = src.read(info)
                target = info.filename.replace(old_info, new_info, 1)
                if target == new_info + "METADATA":
                    data = re.sub(rb"(?m)^Version: .*$", f"Version: {new_version}".encode(), data, count=1)
                if target == new_info + "RECORD":
                    rows = [r for r in data.decode().splitlines() if r.split(",", 1)[0] not in dropped]
                    data = ("\n".join(r.replace(old_info, new_info, 1) if r.startswith(old_info) else r
                                      for r in rows) + "\n").encode()
                    data = re.sub(rb"(?m)^(.*(?:METADATA|RECORD)),[^,\n]*,[^,\n]*$", rb"\1,,", data)
                dst.writestr(zipfile.ZipInfo(target, info.date_time), data, compress_type=info.compress_type)
    wheel.unlink()
    return out


def build(target: str, python: str, constraint: Path, out: Path, part_size: int | None, trim: str | None,
          eval_extra: bool, log=print) -> dict:
    from conformance.tooling import installs

    data = spec(target)
    row = data["row"]
    held = node_packages(constraint)
    if trim and trim not in data.get("trim", {}):
        raise WheelhouseError(f"no trim {trim!r} in {DATA.name}: it knows {', '.join(data.get('trim', {}))}")
    pyproject = installs._pyproject(ROOT / "pyproject.toml")
    suite = installs.gpu_requirements(ROOT / "pyproject.toml", harmony=False, eval_extra=eval_extra)
    extras = [r for x in row.get("extras", []) for r in pyproject["optional-dependencies"][x]]
    requirements = [*row["stack"], *suite, *extras, "nox"]
    constraints = ROOT / row["constraints"] if row.get("constraints") else None
    started = time.monotonic()
    log(f"resolving {len(requirements)} requirements for {target} (Python {python}) against the node's "
        f"{len(held)} packages ...")
    built = out / "built-sdists"
    built.mkdir(exist_ok=True)
    items = resolve(requirements, held, row, python, constraints, built)
    chosen = plan(requirements, items, held, row.get("leave_out", {}), python)
    log(f"carrying {len(chosen.carry)} wheels; the node keeps {len(chosen.node_keeps)} of its own; "
        f"left out: {', '.join(chosen.left_out) or 'none'}")
    wheels_dir = out / "wheels"
    shutil.rmtree(wheels_dir, ignore_errors=True)
    download(chosen.carry, row, python, wheels_dir)
    files = {i.name: wheels_dir / i.file for i in chosen.carry}
    trimmed = {}
    for dist, drop in (data["trim"][trim]["files"].items() if trim else []):
        if dist not in files:
            raise WheelhouseError(f"trim {trim!r} names {dist}, which this wheelhouse does not carry")
        files[dist] = trim_wheel(files[dist], drop, trim)
        trimmed[dist] = {"dropped": list(drop), "version": files[dist].name.split("-")[1]}
    wheels = [{"file": p.name, "name": n, "bytes": p.stat().st_size, "sha256": sha256(p)} for n, p in files.items()]
    manifest = {
        "format": 1, "target": target, "python": python, "platforms": row["platforms"], "requirements": requirements,
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "node_constraint": {"file": Path(constraint).name, "sha256": sha256(Path(constraint)), "packages": len(held)},
        "wheels": sorted(wheels, key=lambda w: w["file"]), "left_out": chosen.left_out,
        "only_for_left_out": chosen.only_for_left_out, "node_keeps": chosen.node_keeps,
        "trim": {"name": trim, "description": data["trim"][trim]["description"], "wheels": trimmed} if trim else None,
        "bytes": sum(w["bytes"] for w in wheels),
    }
    if part_size:
        manifest["parts"] = split(out, list(files.values()), part_size)
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    log(f"wrote {out / MANIFEST}: {len(wheels)} wheels, {manifest['bytes'] / 2**20:.1f} MiB"
        + (f" in {len(manifest['parts'])} parts" if part_size else "") + f" ({time.monotonic() - started:.0f} s)")
    return manifest


def _size(text: str) -> int:
    match = re.fullmatch(r"(\d+)\s*(|k|m|g|kib|mib|gib|kb|mb|gb)", text.strip().lower())
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size such as 56MiB")
    scale = {"": 1, "k": 2**10, "kib": 2**10, "kb": 10**3, "m": 2**20, "mib": 2**20, "mb": 10**6,
             "g": 2**30, "gib": 2**30, "gb": 10**9}[match[2]]
    return int(match[1]) * scale


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="conformance.tooling.wheelhouse", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="resolve and download the wheels the node lacks")
    b.add_argument("--target", required=True, help="a target of data/wheelhouse.toml (cuda, cpu)")
    b.add_argument("--python", default=f"{sys.version_info[0]}.{sys.version_info[1]}", help="the node's Python")
    b.add_argument("--constraint", required=True, type=Path, help="`pip freeze` of the node's image")
    b.add_argument("--out", required=True, type=Path, help="the wheelhouse directory to write")
    b.add_argument("--part-size", type=_size, help="also cut the wheels into parts of this size (e.g. 56MiB)")
    b.add_argument("--trim", help="drop files the node's GPU never loads (data/wheelhouse.toml [trim.NAME])")
    b.add_argument("--eval", action="store_true", help="carry lm-eval too (P3 accuracy)")
    for name, text in (("assemble", "check and join the parts"), ("install", "assemble, then install offline")):
        s = sub.add_parser(name, help=text)
        s.add_argument("where", type=Path)
        if name == "install":
            s.add_argument("--python", default=sys.executable, help="the interpreter to install into")
            s.add_argument("--no-suite", action="store_true", help="only the wheels, not the suite itself")
    args = p.parse_args(argv)
    try:
        if args.command == "build":
            args.out.mkdir(parents=True, exist_ok=True)
            build(args.target, args.python, args.constraint, args.out, args.part_size, args.trim, args.eval)
        elif args.command == "assemble":
            assemble(args.where)
        else:
            install(args.where, args.python, None if args.no_suite else ROOT)
    except WheelhouseError as exc:
        print(f"wheelhouse: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
