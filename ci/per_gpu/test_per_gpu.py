"""One whole `conformance run` per GPU, all at once: pytest-xdist with one worker per GPU.

The `matrix` nox session runs this file when asked for `--gpus N` (`nox -s "matrix(<id>)" -- p2 --gpus 8`):
`pytest ci/per_gpu -n N`, with the `conformance run` command line, the target and N in the environment.

Why not `conformance run ... -n 8` (xdist inside the suite): the suite's engines are session-scoped fixtures
and its run record (results.json, with the fingerprint, the model and the engine's backends) is written by the
one pytest session that owns the run. Under xdist every worker would start its own engines on whatever GPUs it
sees, and what the workers' fixtures learn never reaches the controller that writes the record. So each GPU
gets a run of its own instead: a child process started with HIP_VISIBLE_DEVICES (ROCm) or CUDA_VISIBLE_DEVICES
(CUDA) set to that GPU's index before torch or vLLM enumerate devices (conformance.run.matrix.device_env), writing
its own reports/runs/<run-id>/ (the fingerprint records the variable). There is one test per GPU index, so
whichever worker takes a test, no two children share a GPU; with -n equal to the GPU count they all run at once.

Tiers that need several GPUs in one process (P1's tensor parallel and collectives) run without --gpus.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from conformance.run.matrix import device_env

GPUS = int(os.environ.get("CONFORMANCE_GPUS") or 0)
LOGS = Path(os.environ.get("CONFORMANCE_FANOUT_LOGS") or "reports/per-gpu")
GRACE_S = 60  # after SIGTERM the suite writes its run, marked incomplete, before it exits


@pytest.mark.parametrize("gpu", list(range(GPUS)) or [None])
def test_conformance_run_on_one_gpu(gpu: int | None) -> None:
    """The run pinned to GPU `gpu` exits 0 (every selected check passed on that GPU)."""
    if gpu is None:  # an empty parameter set would be a skip, and zero runs would pass
        pytest.fail("no GPUs to fan out over: set CONFORMANCE_GPUS (the matrix session does, from --gpus N)")
    args = json.loads(os.environ["CONFORMANCE_RUN_ARGS"])
    timeout = float(os.environ["CONFORMANCE_TIMEOUT_S"]) if os.environ.get("CONFORMANCE_TIMEOUT_S") else None
    env = device_env(os.environ["CONFORMANCE_TARGET"], gpu, os.environ)
    LOGS.mkdir(parents=True, exist_ok=True)
    log = LOGS / f"gpu{gpu}.log"
    with log.open("w") as out:
        # A session of its own, so that a timeout reaches the engine processes the run started, too.
        child = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = child.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGTERM)
            try:
                child.wait(timeout=GRACE_S)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
            pytest.fail(f"GPU {gpu}: `{' '.join(args)}` ran past {timeout:.0f} s and was stopped; output: {log}")
    tail = log.read_text(errors="replace")[-4000:]
    assert code == 0, f"GPU {gpu}: `{' '.join(args)}` exited {code}; last output ({log}):\n{tail}"
