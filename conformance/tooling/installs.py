"""What the nox sessions ask of the environment they install into, run with that environment's Python.

  python -m conformance.tooling.installs satisfied ROOT REQ...  exit 0 when the suite is installed editable from
                                                              ROOT and every requirement REQ holds; else 1, one
                                                              line per missing or wrong package
  python -m conformance.tooling.installs freeze OUT            write `name==version` of every distribution visible
                                                              here (the image's stack), as a pip constraints file
  python -m conformance.tooling.installs has-module NAME       exit 0 when NAME imports here (found, not imported)
  python -m conformance.tooling.installs version DIST          print DIST's installed version; exit 1 if absent
  python -m conformance.tooling.installs uv-env                print the UV_* variables that make uv install as
                                                              pip is configured here (its indexes, find-links,
                                                              constraints)

Standard library only (plus `packaging`, vendored by pip, when present), so it runs from the checkout
before the suite is installed (`python -m` puts the working directory on the path). The sessions run it
instead of keeping an install stamp: it reads what is installed, so it cannot go stale.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from urllib.parse import unquote, urlparse

SUITE = "gpu-llm-conformance"


def _requirement_class():
    try:
        from packaging.requirements import Requirement
    except ImportError:
        try:
            from pip._vendor.packaging.requirements import Requirement
        except ImportError:
            return None
    return Requirement


def _normal(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def editable_root(dist: metadata.Distribution) -> Path | None:
    """The source directory of an editable install (PEP 610 direct_url.json), else None."""
    text = dist.read_text("direct_url.json")
    if not text:
        return None
    try:
        info = json.loads(text)
    except ValueError:
        return None
    if not info.get("dir_info", {}).get("editable"):
        return None
    url = urlparse(info.get("url", ""))
    return Path(unquote(url.path)).resolve() if url.scheme == "file" else None


def unsatisfied(root: Path, requirements: Iterable[str]) -> list[str]:
    """One sentence per requirement not met here; the suite must be installed editable from `root`."""
    problems = []
    # the checkout's own *.egg-info (on the path through the working directory) is not an install
    roots = [editable_root(d) for d in metadata.distributions(name=SUITE)]
    if Path(root).resolve() not in roots:
        problems.append(f"{SUITE} is not installed editable from {root}")
    requirement = _requirement_class()
    if requirement is None:
        return [*problems, "cannot parse requirements here (neither packaging nor pip is installed)"]
    for text in requirements:
        req = requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        try:
            version = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            problems.append(f"{req.name} is not installed (wanted {text})")
            continue
        if req.specifier and not req.specifier.contains(version, prereleases=True):
            problems.append(f"{req.name} {version} does not satisfy {text}")
    return problems


def _version_class():
    try:
        from packaging.version import InvalidVersion, Version
    except ImportError:
        try:
            from pip._vendor.packaging.version import InvalidVersion, Version
        except ImportError:
            return None, ValueError
    return Version, InvalidVersion


def frozen(exclude: Sequence[str] = (SUITE,)) -> list[str]:
    """`name==version` of every visible distribution, as import would find them (first on the path wins).
    Versions that are not PEP 440 (some distributions' system packages) are left out: pip rejects them."""
    version_class, invalid = _version_class()
    skip = {_normal(n) for n in exclude}
    seen: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if not name or _normal(name) in skip or _normal(name) in seen:
            continue
        if version_class is not None:
            try:
                version_class(dist.version)
            except invalid:
                continue
        seen[_normal(name)] = f"{name}=={dist.version}"
    return sorted(seen.values(), key=str.lower)


def _pyproject(pyproject: Path) -> dict:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    return tomllib.loads(Path(pyproject).read_text())["project"]


def _named(requirements: Iterable[str], name: str) -> list[str]:
    return [r for r in requirements if _normal(r).startswith(name)]


def gpu_requirements(pyproject: Path, harmony: bool, eval_extra: bool) -> list[str]:
    """What a GPU venv adds to the image, each with its own dependencies: the suite's light dependencies,
    the offline o200k vocabulary (quicktok-v1), the openai_harmony module (oss-harmony, as in the cpu
    extra) when the image has none, and lm-eval for P3. Never torch or vLLM."""
    project = _pyproject(pyproject)
    extras = project["optional-dependencies"]
    return [*project["dependencies"], *_named(extras["cpu"], "quicktok-v1"),
            *(_named(extras["cpu"], "oss-harmony") if harmony else []), *(extras["eval"] if eval_extra else [])]


def gpu_install_commands(constraints: str, requirements: Sequence[str], python: str = "python") -> list[list[str]]:
    """Install the suite over a GPU image without touching its torch/vLLM: the suite alone without
    dependencies, a freeze of the image as constraints, then `requirements` with all of their own."""
    pip = [python, "-m", "pip", "install"]  # the image's pip (the venv sees its site-packages)
    return [[*pip, "--no-deps", "-e", "."],
            [python, "-m", "conformance.tooling.installs", "freeze", constraints],
            [*pip, "-c", constraints, *requirements]]


# pip settings that uv reads under its own names (uv reads no pip.conf and no PIP_* variable): pip's key ->
# (uv's variable, how uv separates several values)
PIP_TO_UV = {"index-url": ("UV_INDEX_URL", " "), "extra-index-url": ("UV_EXTRA_INDEX_URL", " "),
             "find-links": ("UV_FIND_LINKS", ","), "constraint": ("UV_CONSTRAINT", " ")}


def uv_env(pip_config: str, environ: Mapping[str, str]) -> dict[str, str]:
    """The UV_* variables under which uv resolves as pip does here, from `pip config list` (lines
    `scope.key='value'`, a value holding one or more whitespace-separated entries): the same indexes, find-links
    (a local wheel of torch's CPU build) and constraints, and pip's rule of the best version over all indexes
    (UV_INDEX_STRATEGY=unsafe-best-match). A variable already set in `environ` is left as it is."""
    values: dict[str, list[str]] = {}
    for line in pip_config.splitlines():
        name, sep, raw = line.partition("=")
        key = name.rsplit(".", 1)[-1].strip()
        if not sep or key not in PIP_TO_UV:
            continue
        try:
            value = ast.literal_eval(raw.strip())
        except (ValueError, SyntaxError):
            value = raw.strip().strip("'\"")
        for entry in str(value).split():
            if entry not in values.setdefault(key, []):
                values[key].append(entry)
    out = {PIP_TO_UV[k][0]: PIP_TO_UV[k][1].join(v) for k, v in values.items() if v}
    if out:
        out["UV_INDEX_STRATEGY"] = "unsafe-best-match"
    return {k: v for k, v in out.items() if k not in environ}


def pip_config_list() -> str:
    """`pip config list` of this interpreter's pip ('' when pip cannot say)."""
    try:
        return subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                              timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command = args.pop(0) if args else ""
    if command == "satisfied" and args:
        problems = unsatisfied(Path(args[0]), args[1:])
        for problem in problems:
            print(f"to install: {problem}")
        return 1 if problems else 0
    if command == "freeze" and len(args) == 1:
        lines = frozen()
        Path(args[0]).write_text("# the image's stack, frozen before the suite's own dependencies went in\n"
                                 + "\n".join(lines) + "\n")
        print(f"froze {len(lines)} distributions of this environment into {args[0]}")
        return 0
    if command == "has-module" and len(args) == 1:
        found = importlib.util.find_spec(args[0]) is not None
        print("found" if found else "absent")
        return 0 if found else 1
    if command == "version" and len(args) == 1:
        try:
            print(metadata.version(args[0]))
        except metadata.PackageNotFoundError:
            return 1
        return 0
    if command == "uv-env" and not args:
        for name, value in uv_env(pip_config_list(), os.environ).items():
            print(f"{name}={value}")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
