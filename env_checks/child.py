"""A `conformance run` started by another command (the fault drill, `baseline establish`) that must record itself
when that command is interrupted. The child is passed the interrupt as SIGTERM, which a run always takes: a command
started in the background (nohup, `&`) runs with SIGINT ignored, and so would its child, which then finished
complete instead of recording itself interrupted. It is given RECORD_GRACE_S to stop its engines and write its
record incomplete (subprocess.run would kill it after 0.25 s), then killed."""

from __future__ import annotations

import signal
import subprocess
from typing import Any

RECORD_GRACE_S = 60.0  # an interrupted run stops its engines and writes its record incomplete in this time


def interrupt_on_sigterm() -> None:
    """Take SIGTERM as Ctrl-C (nox passes SIGTERM on), so that `wait_recording` passes it to the child."""
    signal.signal(signal.SIGTERM, _interrupted)


def _interrupted(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def wait_recording(proc: subprocess.Popen, grace_s: float = RECORD_GRACE_S) -> int | None:
    """`proc`'s exit status; None where this process was interrupted while it ran (the child then passed SIGTERM and
    given `grace_s` to record itself, then killed)."""
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        return None
