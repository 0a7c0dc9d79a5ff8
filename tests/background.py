"""A command started as a background job is (SIGINT ignored), interrupted as nox interrupts it (SIGTERM) once its
first `conformance run` has begun writing its run directory: the controls of the commands that start runs."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

START_S, FINISH_S = 120.0, 180.0


def interrupted_in_background(cmd: list[str], runs: Path, **popen: object) -> tuple[int, str, str]:
    """Run `cmd` with SIGINT ignored; SIGTERM once `runs` holds a run (or after START_S); (its exit status, stdout,
    stderr) once it ends (within FINISH_S)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=popen.pop("stderr", subprocess.PIPE), text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN), **popen)
    deadline = time.monotonic() + START_S
    while not (runs.is_dir() and any(runs.iterdir())) and time.monotonic() < deadline:  # the run is under way
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=FINISH_S)
    return proc.returncode, out, err or ""
