"""Long phases (an engine or server start, `vllm bench serve`, lm-eval) announce themselves with their log
path, print a heartbeat line every N seconds while they run (with the log's last line), and say how they
ended, so that a run that sits for minutes shows what it is waiting for and where to look:

  conformance: vllm engine start: started; log reports/runs/<id>/engine-vllm-0.log
  conformance: vllm engine start: still running after 30 s; log ...; last: Loading weights took 2.1 s
  conformance: vllm engine start: done in 41.3 s

Every `CONFORMANCE_HEARTBEAT_S` seconds (default 30; 0 turns heartbeats off, the start and end lines stay).
Inside pytest the plugin points the lines at the terminal (`to_fd`), past the output capture that holds a
check's own output; elsewhere they go to stderr."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

PREFIX = "conformance:"
DEFAULT_EVERY_S = 30.0
ENV = "CONFORMANCE_HEARTBEAT_S"
_LAST_LINE_CHARS = 120

_sink: Callable[[str], None] | None = None
_lock = threading.Lock()


def every_s() -> float:
    """The heartbeat period; a value that is not a number is the default (one bad variable must not stop a run)."""
    try:
        return max(0.0, float(os.environ.get(ENV, DEFAULT_EVERY_S)))
    except ValueError:
        return DEFAULT_EVERY_S


def to_fd(fd: int) -> None:
    """Send the lines to a duplicate of `fd` (taken now, while it is the terminal: pytest's capture later
    points fd 1 elsewhere during a check)."""
    global _sink
    out = os.dup(fd)

    def write(line: str) -> None:
        try:
            os.write(out, (line + "\n").encode("utf-8", "replace"))
        except OSError:
            pass  # a closed terminal must not fail the phase

    _sink = write


def to_callable(sink: Callable[[str], None] | None) -> None:
    """Send the lines to `sink` (None: back to stderr)."""
    global _sink
    _sink = sink


def emit(line: str) -> None:
    with _lock:
        if _sink is not None:
            _sink(line)
        else:
            print(line, file=sys.stderr, flush=True)


def last_line(path: Path | None) -> str | None:
    """The log's last non-empty line, shortened (None when there is none yet)."""
    if path is None:
        return None
    try:
        with Path(path).open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 8192))
            tail = fh.read().decode("utf-8", "replace")
    except OSError:
        return None
    lines = [ln.strip() for ln in tail.replace("\r", "\n").splitlines() if ln.strip()]
    if not lines:
        return None
    text = lines[-1]
    return text if len(text) <= _LAST_LINE_CHARS else text[: _LAST_LINE_CHARS - 3] + "..."


@contextmanager
def phase(what: str, log_path: Path | None = None, every: float | None = None) -> Iterator[None]:
    """Announce `what` (its log at `log_path`), heartbeat every `every` seconds (default `every_s()`;
    0 = none) until the block ends, then say how it ended."""
    period = every_s() if every is None else every
    where = f"; log {log_path}" if log_path is not None else ""
    emit(f"{PREFIX} {what}: started{where}")
    started = time.monotonic()
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(period):
            last = last_line(log_path)
            emit(f"{PREFIX} {what}: still running after {time.monotonic() - started:.0f} s{where}"
                 + (f"; last: {last}" if last else ""))

    thread = None
    if period > 0:
        thread = threading.Thread(target=beat, name=f"heartbeat {what}", daemon=True)
        thread.start()
    try:
        yield
    except BaseException as exc:
        stop.set()
        emit(f"{PREFIX} {what}: failed after {time.monotonic() - started:.1f} s ({type(exc).__name__}){where}")
        raise
    finally:
        stop.set()
        if thread is not None:
            thread.join(5)
    emit(f"{PREFIX} {what}: done in {time.monotonic() - started:.1f} s")
