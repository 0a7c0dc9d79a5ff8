"""Where a run's wall time goes, phase by phase, and the start-up work taken off its critical path.

Recorded in results.json as `phases` ({name: seconds}; `nox -s bench` and the dashboard read it):

- `startup`: interpreter start to the end of collection (Python, pytest and the suite's imports);
- `imports`: the forkserver's import of torch, vLLM and transformers (conformance/engines/forkserver.py), from its
  start to the first child it forks;
- `checkpoints`: building (or, when cached, verifying) the tiny checkpoints and the o200k vocabulary, and with
  --model reading its content hash, all in the background from collection on;
- `exact slice`: with --model, writing the exact float32 check's slice in the background (checkpoints/exact_slice.py);
- `load`: the model under test made ready (the `model_under_test` fixture): the tiny checkpoint waited for, or
  --model's directory inspected; each engine's own weight load is part of its start;
- `reference`: the fp64 reference's set-up and every result the run computed rather than read from the cache or a
  reference pack (the `reference` fixture, reference/cache.py); the computes run inside checks, so this overlaps
  their durations; a device reference's share of it in `reference: device` (its device work: reading and
  dequantizing weights, computing; of it, `reference: device weights read` (of that, `reference: device expert
  slices read`) and `reference: device dequantize`, timed by events on the GPU's own timeline), `reference: CPU
  checks` (the CPU's fp64 spot rows, a scored path's in a worker thread beside the device's next layer) and
  `reference: CPU checks waited` (what the device's side waited for them), conformance/reference/device.py SPENT;
- `engine: <kind> #<n>` and `server`: each engine start and the suite's server start (RunContext.startups);
- `vllm start: weights`, `vllm start: compile`, `vllm start: graphs`: over every vLLM engine and server start of
  the run, the seconds vLLM's own log gives to loading the weights, torch.compile and capturing CUDA/HIP graphs
  (`vllm_start_breakdown`); on the H200 at 120b's dimensions the graphs were two thirds of each MXFP4 start;
- `parity_decode`: the greedy decode with prompt logprobs that the parity checks share;
- `report`: the end of the last check to the record (fingerprint, machine health, summary);
- `wall`: interpreter start to the record; `floor`: the first vLLM engine start plus the parity decode,
  the least a P0 run can take here; `floor_ratio`: wall / floor.

Each run keeps its own `Phases` (RunContext.phases); the plugin's session hooks (plugin.RunSession) order the checks,
start the builds and stamp the end of the last check. Off the critical path:

- the checkpoints and the vocabulary are built in a background thread from the end of collection on,
  overlapping the first checks, and with --model the exact float32 check's slice after them; a fixture or check
  that needs one waits for that build only (`Phases.wait_built`; a check asks its `engines`);
- the checks that use the suite's own server run last, so the server (started in the background at
  collection, serving_fixtures.prestart_server) starts while every other check runs.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conformance.engines import compile_cache

SERVER_FIXTURE = "server"


def _clock_ticks() -> int:
    try:
        return int(os.sysconf("SC_CLK_TCK"))
    except (ValueError, OSError):
        return 100


def process_age_s(stat_text: str | None = None, uptime_text: str | None = None) -> float | None:
    """Seconds since this process started, from /proc (None where there is no /proc)."""
    try:
        stat_text = stat_text if stat_text is not None else Path("/proc/self/stat").read_text()
        uptime_text = uptime_text if uptime_text is not None else Path("/proc/uptime").read_text()
        started_ticks = int(stat_text.rsplit(")", 1)[1].split()[19])  # field 22, counted after the comm
        return max(0.0, float(uptime_text.split()[0]) - started_ticks / _clock_ticks())
    except (OSError, IndexError, ValueError):
        return None


# perf_counter() at interpreter start: what `wall` and `startup` are measured from
_age = process_age_s()
T0 = time.perf_counter() - (_age if _age is not None else 0.0)


# What vLLM logs of its start, per phase name: the first match in an engine's or the server's log.
VLLM_START_LINES = {
    "vllm start: weights": re.compile(r"Loading weights took ([0-9.]+) seconds"),
    "vllm start: compile": re.compile(r"torch\.compile took ([0-9.]+) s in total"),
    "vllm start: graphs": re.compile(r"Graph capturing finished in ([0-9.]+) secs"),
}


def vllm_start_breakdown(log_text: str) -> dict[str, float]:
    """The seconds one vLLM start gave to each VLLM_START_LINES phase it logged (a phase it skipped, as graphs
    under enforce_eager or on the CPU, is absent)."""
    found = {name: pattern.search(log_text) for name, pattern in VLLM_START_LINES.items()}
    return {name: float(m.group(1)) for name, m in found.items() if m}


class Phases:
    """One run's phases (RunContext.phases): the seconds recorded per phase, the marks, the background builds and the
    forkserver's import probe. Thread-safe: engines start and builds run in threads of their own."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.seconds: dict[str, float] = {}
        self.marks: dict[str, float] = {}  # perf_counter stamps
        self.built: dict[str, threading.Event] = {}
        self.build_errors: dict[str, BaseException] = {}
        self._forkserver_probe: threading.Event | None = None

    def add_vllm_start(self, log_path: Path) -> None:
        """Add a vLLM start's breakdown (its log, read once it is ready) to the run's phases; an unreadable log adds
        nothing (a missing figure, never a failed run)."""
        try:
            text = log_path.read_text(errors="replace")
        except OSError:
            return
        compile_cache.note_start(log_path.name, text)
        with self._lock:
            for name, seconds in vllm_start_breakdown(text).items():
                self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def record(self, name: str, seconds: float) -> None:
        """Set phase `name` (seconds >= 0); a phase recorded twice keeps the first value (the first start)."""
        with self._lock:
            self.seconds.setdefault(name, max(0.0, float(seconds)))

    def mark(self, name: str) -> None:
        """Stamp `name` now (the last stamp wins): `checks_done` is the end of the last check."""
        with self._lock:
            self.marks[name] = time.perf_counter()

    def snapshot(self, startups: list[tuple[str, float]] | None = None, now: float | None = None) -> dict[str, float]:
        """The phases so far, with the start-ups, `wall`, `floor` and `floor_ratio` (rounded to ms)."""
        now = time.perf_counter() if now is None else now
        with self._lock:
            out = dict(self.seconds)
            marks = dict(self.marks)
        counts: dict[str, int] = {}
        for what, seconds in startups or []:
            name = "server" if "server" in what.lower() else what
            counts[name] = counts.get(name, 0) + 1
            out.setdefault(name if name == "server" else f"engine: {name} #{counts[name]}", max(0.0, float(seconds)))
        if "checks_done" in marks:
            out["report"] = now - marks["checks_done"]
        out["wall"] = now - T0
        first_vllm = out.get("engine: vllm engine #1")
        if first_vllm is not None and "parity_decode" in out:
            out["floor"] = first_vllm + out["parity_decode"]
            if out["floor"] > 0:
                out["floor_ratio"] = out["wall"] / out["floor"]
        return {k: round(v, 3) for k, v in out.items()}

    def start_builds(self, jobs: list[tuple[str, Callable[[], Any]]]) -> threading.Thread | None:
        """Run the build jobs in order in one daemon thread; `checkpoints` is their total time. A job that
        raises is recorded and raised again to whoever waits for it (the fixture reports it)."""
        if not jobs:
            return None
        with self._lock:
            for name, _ in jobs:
                self.built.setdefault(name, threading.Event())

        def work() -> None:
            started = time.perf_counter()
            for name, job in jobs:
                try:
                    job()
                except BaseException as exc:  # noqa: BLE001 - handed to the fixture that needs it
                    self.build_errors[name] = exc
                finally:
                    self.built[name].set()
            self.record("checkpoints", time.perf_counter() - started)

        thread = threading.Thread(target=work, name="prebuild", daemon=True)
        thread.start()
        return thread

    def wait_built(self, name: str, timeout_s: float = 1800.0) -> None:
        """Wait until the background build `name` is done (at once when none was started); its error, if any,
        is left for the caller's own build call to raise with its own message."""
        event = self.built.get(name)
        if event is not None:
            event.wait(timeout_s)

    def forkserver_ready(self) -> threading.Event | None:
        """An event set once the run's forkserver has done its preload imports (None when no forkserver was
        started: engines are spawned). The first call starts a probe that records `imports`: from the forkserver's
        start until it forks a child, which it does only once its imports are done."""
        from conformance.engines import forkserver

        if forkserver.started_at is None:
            return None
        with self._lock:
            if self._forkserver_probe is not None:
                return self._forkserver_probe
            event = self._forkserver_probe = threading.Event()
        started, ctx = forkserver.started_at, forkserver.context()
        if forkserver.imports_vllm:
            forkserver.expect_inspection(event)

        def probe() -> None:
            try:
                child = ctx.Process(target=os.getpid, daemon=True)
                child.start()
                child.join(1800)
                self.record("imports", time.perf_counter() - started)
                if forkserver.imports_vllm:  # vLLM's model inspection, cached for the engines (they wait for it)
                    forkserver.inspect_ahead(ctx)
            except Exception:  # noqa: BLE001 - a missing figure, never a failed run
                pass
            finally:
                event.set()

        threading.Thread(target=probe, name="forkserver-probe", daemon=True).start()
        return event


def build_jobs(run: Any, items: list[pytest.Item]) -> list[tuple[str, Callable[[], Any]]]:
    """What the selected checks will need built: the tiny checkpoint (no --model), the o200k vocabulary
    and the tiny model with the o200k tokenizer (tokenizer and server checks); with --model, its content hash, then
    the slice the exact float32 check will run (checkpoints/exact_slice.py)."""
    names = {name for item in items for name in getattr(item, "fixturenames", ())}
    jobs: list[tuple[str, Callable[[], Any]]] = []
    if run.model_arg is None and names & {"model_under_test", "engine", "engines", "reference", "prompts"}:
        from conformance.checkpoints.models import tiny_gpt_oss

        jobs.append(("tiny", tiny_gpt_oss))
    if names & {"o200k_vocab", "served_model", SERVER_FIXTURE, "model_tokenizer_dir", "hf_tokenizer",
                "o200k_harmony", "harmony_encoding"}:
        from conformance.checkpoints.tokenizer import vocab

        jobs.append(("o200k", vocab.ensure_o200k))
        if run.model_arg is None:
            from conformance.checkpoints.models import tiny_gpt_oss_with_tokenizer

            jobs.append(("tiny-tok", tiny_gpt_oss_with_tokenizer))
    if run.model_arg is not None:  # last: the vocabulary is wanted sooner; the record and the reference wait for it
        from conformance.datafiles import content_hash

        model_dir = Path(run.model_arg)  # a directory it cannot read is the model_under_test fixture's to report
        jobs.append(("model hash", lambda: content_hash(model_dir)))
        from conformance.checkpoints import exact_slice

        if exact_slice.wanted(run, items):  # the exact check's slice (15 GB at 120b's dimensions), keyed by the hash
            def slice_job() -> Path | None:
                started = time.perf_counter()
                try:
                    return exact_slice.prebuild(run, model_dir)
                finally:  # its own phase: 0 where an earlier run wrote it
                    run.phases.record(exact_slice.JOB, time.perf_counter() - started)

            jobs.append((exact_slice.JOB, slice_job))
    return jobs


# -- collection order -------------------------------------------------------------------------------

ENGINE_FIXTURE = "engines"  # every engine fixture (engine, engine_greedy, the device probe) depends on it
FORKSERVER_FIXTURE = "collective_launch"  # the collectives' ranks fork from the forkserver, without an engine


OWN_ENGINE_MARKER = "own_engine"
OWN_ENGINE_LINE = (f"{OWN_ENGINE_MARKER}: the check starts an engine of a configuration of its own (the layer probe, "
                   "the float32 twin) and shares no module fixture nor engines_ahead plan: it runs after the checks "
                   "that use the default engine")


def order_checks(items: list[pytest.Item]) -> None:
    """Stable reorder in place, whole modules at a time (module-scoped fixtures stay set up once): first the
    modules that need no forkserver (they run while it imports vLLM), then those whose ranks fork from it, then
    those that start engines, last those that use the suite's server (it starts in the background meanwhile).
    Among the modules that start engines, the checks marked `own_engine` run after the others: where two engines
    cannot share the device (a 120b profile gives each 90%), each of them closes the default engine, and a default-
    engine check after them would start it again (seen on the H200 at 120b's dimensions: the default engine's
    configuration started twice in one P0)."""
    rank: dict[str, int] = {}
    for item in items:
        names = getattr(item, "fixturenames", ())
        mine = (3 if SERVER_FIXTURE in names else 2 if ENGINE_FIXTURE in names
                else 1 if FORKSERVER_FIXTURE in names else 0)
        key = _module_of(item)
        rank[key] = max(rank.get(key, 0), mine)

    def order(item: pytest.Item) -> float:
        module = rank[_module_of(item)]
        own = module == 2 and item.get_closest_marker(OWN_ENGINE_MARKER) is not None
        return module + 0.5 if own else module

    items.sort(key=order)


def need_engines(items: list[pytest.Item]) -> bool:
    """Whether any of these checks starts an engine or the suite's server."""
    return any({ENGINE_FIXTURE, SERVER_FIXTURE} & set(getattr(item, "fixturenames", ())) for item in items)


def _module_of(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]
