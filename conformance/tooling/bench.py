"""`nox -s bench`: run tiers N times and print, per phase, the median/min/max wall time.

  python -m conformance.tooling.bench --runs 3 --tiers p0,p1 [--nox "python -m nox"] [--reports-dir DIR] [-- run args]
  python -m conformance.tooling.bench --realdim 2,8,24 --tiers p0 --runs 1 [--realdim-dir DIR] -- --cuda
  python -m conformance.tooling.bench --realdim 8 --tiers p0 --runs 1 --second-node -- --cuda --reference-pack DIR
      [--compile-cache DIR2]
  python -m conformance.tooling.bench --from-runs RUN_DIR...

Each run is `nox -s <tier> -- ...` when a nox command is given (what a user types: its time beyond the run
itself is the `venv` phase), else `python -m conformance run --tier <tier> ...`. The phases come from each
run's results.json (`phases`, conformance/run/phases.py) and its checks' durations; `floor_ratio` is the run's
wall over its floor (its first vLLM engine start plus the parity decode, both measured in the same run).
The 1-minute load average before each run is shown as `load_1m`: on a shared machine it explains outliers;
`host_mops` and `host_copy_gbs`, the host's single-thread and memory-copy speeds the run's fingerprint measured
(env_checks.host), explain the spread between nodes that fingerprint alike (engine starts follow the host; two H100
nodes ran the single-thread probe alike and every host phase 1.5x apart).
--second-node (with `-- --reference-pack DIR`) adds, per layer count, one run per tier as a second node of a
fleet would make it: the suite's cache empty (at the path the first runs used, as on a fleet's nodes; both start
it empty), so its fp64 results come from the pack the first runs wrote, and
vLLM's, Triton's and Inductor's caches empty too (only the OS's page cache stays warm); it is tabled apart
(`· second node`). Give the runs `--compile-cache DIR` too (after --) and the second node shares the compilers' caches
the first runs filled, as a fleet that copies or mounts them does (vLLM documents copying its torch.compile cache
between machines); its table then says `· fleet's compile cache`.
With --realdim, each tier runs at gpt-oss-120b's real dimensions with each of these layer counts (the checkpoint
written once per count, its writing the `generate` row), a table per layer count, then the fit of wall against
layers and its extrapolation to the real depth (conformance/tooling/bench_realdim.py). --from-runs tabulates recorded
runs the same way, grouping real-dimension runs by their layer count.
A benchmark, not a test: it never fails on a time, only when a run could not be read.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Row order of the table: the run's own phases first, then each check, then the totals.
HEAD = ("load_1m", "host_mops", "host_copy_gbs", "generate", "venv", "startup", "imports", "checkpoints", "load")
TAIL = ("reference", "parity_decode", "report", "exit", "wall", "outer_wall", "floor", "floor_ratio",
        "reference results computed", "reference results read", "reference results derived")
COUNTS = ("floor_ratio", "load_1m", "host_mops", "host_copy_gbs", "reference results computed",
          "reference results read", "reference results derived")  # plain numbers, not seconds


class BenchError(RuntimeError):
    """A run that could not be made or read; one sentence."""


@dataclass(frozen=True)
class Stat:
    median: float
    low: float
    high: float
    n: int


def phases_of(record: dict[str, Any], outer_wall_s: float | None = None, load_1m: float | None = None,
              outside: str = "venv") -> dict[str, float]:
    """One run's row values: its recorded phases, `check: <name>` per check, the outer wall beyond the run's
    own wall (`outside`: "venv" for a run through nox, "exit" for a direct one: what follows the record)
    and the load average it started under."""
    if not isinstance(record.get("phases"), dict):
        raise BenchError(f"run {record.get('run_id', '?')} has no phases in its results.json (a run of an older "
                         "suite?): rerun it with this one.")
    out = {str(k): float(v) for k, v in record["phases"].items() if isinstance(v, (int, float))}
    for check in record.get("checks", []):
        name = "check: " + str(check["id"]).split("::")[-1]
        out[name] = out.get(name, 0.0) + float(check.get("duration_s", 0.0))
    if outer_wall_s is not None:
        out["outer_wall"] = outer_wall_s
        if "wall" in out:
            out[outside] = max(0.0, outer_wall_s - out["wall"])
    if load_1m is not None:
        out["load_1m"] = load_1m
    done = record.get("reference_results") or {}  # what the fp64 reference computed, read (cache, pack) and cut
    for what in ("computed", "read", "derived"):
        if isinstance(done.get(what), int):
            out[f"reference results {what}"] = float(done[what])
    platform = (record.get("fingerprint") or {}).get("platform") or {}
    for figure, row in (("host_single_thread_mops", "host_mops"), ("host_copy_gbs", "host_copy_gbs")):
        if isinstance(platform.get(figure), (int, float)):
            out[row] = float(platform[figure])
    return out


def aggregate(samples: list[dict[str, float]]) -> dict[str, Stat]:
    """Per row: median, min, max over the runs that have it, and how many did."""
    names = {name for sample in samples for name in sample}
    out = {}
    for name in names:
        values = [s[name] for s in samples if name in s]
        out[name] = Stat(statistics.median(values), min(values), max(values), len(values))
    return out


def _order(name: str) -> tuple[int, str]:
    if name in HEAD:
        return HEAD.index(name), ""
    if name.startswith("engine: ") or name == "server":
        return 10, "~" if name == "server" else name  # the server after the engines
    if name.startswith("check: "):
        return 20, ""  # checks keep their run order (a stable sort over the first run's order)
    if name in TAIL:
        return 30 + TAIL.index(name), ""
    return 25, name


def format_table(tier: str, stats: dict[str, Stat], runs: int, check_order: list[str] | None = None) -> str:
    """The table of one tier: phase, median, min, max (seconds; floor_ratio, load and host speed are plain numbers)."""
    from conformance.tooling.bench_realdim import heading

    order = {name: i for i, name in enumerate(check_order or [])}
    names = sorted(stats, key=lambda n: (*_order(n), order.get(n, len(order)), n))
    width = max([len(n) for n in names] + [len("phase")])
    lines = [f"{heading(tier)}: {runs} run(s)",
             f"{'phase':{width}s} {'median':>9s} {'min':>9s} {'max':>9s}  runs"]
    for name in names:
        st = stats[name]
        unit = "" if name in COUNTS else "s"
        cells = " ".join(f"{v:8.2f}{unit or ' '}" for v in (st.median, st.low, st.high))
        lines.append(f"{name:{width}s} {cells}  {st.n}" + ("" if st.n == runs else f" of {runs}"))
    return "\n".join(lines)


def read_record(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "results.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BenchError(f"{path} was not written: the run failed before its record (see its output).") from None
    except ValueError as exc:
        raise BenchError(f"{path} is not JSON ({exc}).") from None


def run_once(tier: str, index: int, reports_dir: Path, nox: list[str] | None, extra: list[str], label: str = "",
             env: dict[str, str] | None = None) -> tuple[dict[str, Any], float, float]:
    """One run of `tier` (with `env` added to the environment): (its record, its outer wall seconds, the 1-minute
    load before it)."""
    run_id = time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + f"-bench-{tier}{label}-{index}"
    args = ["--reports-dir", str(reports_dir), *extra]
    if nox:
        cmd = [*nox, "-s", tier, "--", *args, "--", "--run-id", run_id]
    else:
        cmd = [sys.executable, "-m", "conformance", "run", "--tier", tier, *args, "--", "--run-id", run_id]
    load = os.getloadavg()[0]
    print(f"bench: {tier} run {index + 1}: {shlex.join(cmd)}  (load {load:.2f})", flush=True)
    started = time.perf_counter()
    code = subprocess.run(cmd, env=os.environ | env if env else None).returncode
    wall = time.perf_counter() - started
    record = read_record(reports_dir / run_id)
    if code not in (0, 1):
        print(f"bench: {tier} run {index + 1} exited {code}", flush=True)
    return record, wall, load


def _key(record: dict[str, Any], tier: str | None = None, second: bool | None = None) -> tuple[str, int | None]:
    """What a run is tabulated under: its tier, dtype, engine and whether it took profiles.toml [gate] ('p0
    bfloat16 · vllm · gate options'), whether it loaded its compiled kernels from a fleet's (--compile-cache found
    filled and the run compiled nothing into it), the card it ran on, whether the bench ran it as a second node (its
    run id), and its real-dimension layer count: a fit never mixes engines, options, cards or nodes (a 16-layer run
    on an H100 beside earlier counts on the H200; first nodes at 2 and 8 layers that found the compile cache filled by
    the 24-layer model's and compiled their own)."""
    from conformance.tooling.bench_realdim import layers_of

    name = tier or ",".join(record.get("tiers", [])) or "?"
    gate = ((record.get("profile_settings") or {}).get("gate"))
    shared = record.get("compile_cache") or {}
    fleet = shared.get("warm") and shared.get("files_at_end") == shared.get("files_at_start")
    cards = ((record.get("fingerprint") or {}).get("platform") or {}).get("gpu_names") or []
    if second is None:  # a recorded run (--from-runs): the bench named it
        second = bool(re.search(r"-second-node-\d+$", str(record.get("run_id", ""))))
    parts = [name, record.get("dtype"), record.get("engine") and f"· {record['engine']}", gate and "· gate options",
             fleet and "· fleet's compile cache", cards and "· " + ", ".join(sorted(set(cards))),
             second and "· second node"]
    return " ".join(p for p in parts if p), layers_of(record)


def print_tables(results: dict[tuple[str, int | None], list[dict[str, Any]]], outside: str | None,
                 extra_rows: dict[int, dict[str, float]] | None = None, variant: str = "gpt-oss-120b") -> None:
    """A table per (tier, layer count), in run order; then, per tier benched at two or more layer counts, the
    fit of wall against layers. `extra_rows`: rows the bench measured itself per layer count (`generate`)."""
    from conformance.tooling import bench_realdim

    by_tier: dict[str, dict[int, list[dict[str, float]]]] = {}
    fitted: dict[str, list[dict[str, Any]]] = {}
    for (tier, layers), records in results.items():
        samples = [phases_of(r, *r["_outer"], outside=outside) if "_outer" in r and outside else phases_of(r)
                   for r in records]
        if layers is not None and extra_rows and layers in extra_rows:
            samples[0] |= extra_rows[layers]
        order = ["check: " + str(c["id"]).split("::")[-1] for c in records[0].get("checks", [])]
        title = tier if layers is None else f"{tier} at {layers} layers"
        print(format_table(title, aggregate(samples), len(samples), order) + "\n")
        if layers is not None:
            by_tier.setdefault(tier, {})[layers] = samples
            fitted.setdefault(tier, []).extend(records)
    for tier, by_layers in by_tier.items():
        if len(by_layers) > 1:
            goal = bench_realdim.SECOND_NODE_GOAL_S if tier.endswith("· second node") else bench_realdim.GOAL_S
            text = bench_realdim.format_fit(tier, by_layers, bench_realdim.real_layers(variant), goal_s=goal)
            first, _, phases = text.partition("\n")
            machines = bench_realdim.machines_line(fitted[tier])  # said under the wall's line, where it is read
            print("\n".join([first, *([machines] if machines else []), phases]) + "\n")
        else:
            print(f"{bench_realdim.heading(tier)}: runs at one layer count ({next(iter(by_layers))}): no fit of "
                  "wall against layers (bench two counts or more, e.g. --realdim 2,8).\n")


def bench_runs(ns: argparse.Namespace) -> None:
    """Run the tiers ns.runs times (per real-dimension layer count with --realdim) and print the tables."""
    from conformance.tooling import bench_realdim

    tiers = [t.strip() for t in ns.tiers.split(",") if t.strip()]
    nox = shlex.split(ns.nox) if ns.nox else None
    reports = Path(ns.reports_dir)
    reports.mkdir(parents=True, exist_ok=True)
    results: dict[tuple[str, int | None], list[dict[str, Any]]] = {}
    generated: dict[int, dict[str, float]] = {}
    checkpoints: list[bench_realdim.Checkpoint | None] = [None]
    if ns.realdim:
        root = Path(ns.realdim_dir) if ns.realdim_dir else None
        checkpoints = list(bench_realdim.plan(bench_realdim.parse_layers(ns.realdim), root, ns.variant,
                                              sys.executable))
    for ckpt in checkpoints:
        extra, label = list(ns.extra), ""
        if ckpt is not None:
            if not ckpt.present:
                bench_realdim.check_disk(ckpt, bench_realdim.free_bytes(ckpt.path.parent))
                generated[ckpt.layers] = {"generate": bench_realdim.generate(ckpt, ns.variant, sys.executable)}
            extra, label = [*extra, "--model", str(ckpt.path)], f"-L{ckpt.layers}"
        nodes = tempfile.TemporaryDirectory(prefix="bench-nodes-", dir=_nodes_parent()) if ns.second_node else None
        try:
            # with --second-node both nodes keep the suite's cache at one path, as a fleet's nodes do: the twin's
            # slice lives there and vLLM keys its compiled graph on the model's path (a simulated second node at
            # another path compiled the twin again for that alone); the first node starts it empty
            suite_cache = {"CONFORMANCE_CACHE": os.path.join(nodes.name, "conformance_cache")} if nodes else None
            for index in range(ns.runs):
                for tier in tiers:
                    record, wall, load = run_once(tier, index, reports, nox, extra, label, suite_cache)
                    results.setdefault(_key(record, tier, second=False), []).append(record | {"_outer": (wall, load)})
            for tier in tiers if nodes else ():
                # a node that shares only the pack: the suite's cache (its fp64 results among it) starts empty, and
                # so do the compiled kernels and graphs a fresh node would build again
                with tempfile.TemporaryDirectory(prefix="bench-second-node-", dir=nodes.name) as fresh:
                    record, wall, load = run_once(tier, ns.runs, reports, nox, extra, label + "-second-node",
                                                  fresh_node_env(fresh, suite_cache))
                results.setdefault(_key(record, tier, second=True), []).append(record | {"_outer": (wall, load)})
        finally:
            if nodes is not None:
                nodes.cleanup()
            if ckpt is not None and not ckpt.present and not ns.keep_checkpoints:
                bench_realdim.remove(ckpt)  # room for the next, deeper one
    print_tables(results, "venv" if nox else "exit", generated, ns.variant)


# What a fresh node of a fleet starts without, besides the reference pack it is handed: the suite's cache (the fp64
# results, the twin's slice, the content hashes), vLLM's (its torch.compile artifacts, its model inspection), and the
# kernels Triton and Inductor compiled. The OS's page cache stays warm: the bench cannot empty it for one run.
FRESH_NODE_CACHES = ("CONFORMANCE_CACHE", "VLLM_CACHE_ROOT", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")


def _nodes_parent() -> Path:
    """Where the bench keeps its nodes' caches: beside the suite's own cache, on the disk the user gave it (the exact
    check's slice alone is 15 GB at gpt-oss-120b's dimensions, which a GPU node's /tmp may not hold beside a 24-layer
    checkpoint)."""
    suite_cache = os.environ.get("CONFORMANCE_CACHE")  # where the runs keep it (conformance/datafiles.py cache_root)
    parent = Path(suite_cache).parent if suite_cache else Path.home() / ".cache"
    parent.mkdir(parents=True, exist_ok=True)
    return parent


def fresh_node_env(root: str, same_paths: dict[str, str] | None = None) -> dict[str, str]:
    """Each of FRESH_NODE_CACHES pointed at an empty folder: at its path in `same_paths` (emptied first), else under
    `root`."""
    env = {var: os.path.join(root, var.lower()) for var in FRESH_NODE_CACHES} | (same_paths or {})
    for path in env.values():
        shutil.rmtree(path, ignore_errors=True)
        os.makedirs(path)
    return env


def main(argv: list[str] | None = None) -> int:
    from conformance.tooling.bench_realdim import RealdimError

    parser = argparse.ArgumentParser(prog="conformance.tooling.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="runs per tier (default 3)")
    parser.add_argument("--tiers", default="p0,p1", help="comma-separated tiers (default p0,p1)")
    parser.add_argument("--nox", default=None, help="nox command to run each tier through (e.g. 'python -m nox')")
    parser.add_argument("--reports-dir", default="reports/runs/bench", help="where the runs go")
    parser.add_argument("--from-runs", nargs="*", default=None,
                        help="tabulate these recorded run directories instead of running anything")
    parser.add_argument("--realdim", default=None, metavar="L1,L2,...",
                        help="run at gpt-oss's real dimensions with these layer counts (e.g. 2,8,24) and fit wall "
                             "against layers")
    parser.add_argument("--realdim-dir", default=None,
                        help="where the real-dimension checkpoints go (default: the suite's cache, realdim/)")
    parser.add_argument("--variant", default="gpt-oss-120b", choices=["gpt-oss-120b", "gpt-oss-20b"],
                        help="whose real dimensions (default gpt-oss-120b)")
    parser.add_argument("--keep-checkpoints", action="store_true",
                        help="keep the real-dimension checkpoints the bench wrote (default: removed after their runs)")
    parser.add_argument("--second-node", action="store_true",
                        help="after each tier's runs, one more as a second node of a fleet: with the run's "
                             "--reference-pack and empty caches (the suite's, vLLM's, Triton's, Inductor's), so that "
                             "its fp64 results come from the pack alone and its kernels compile again (tabled apart); "
                             "with the runs' --compile-cache DIR it loads the kernels the first runs built instead")
    parser.add_argument("extra", nargs="*", help="arguments for `conformance run` (after --)")
    ns, unknown = parser.parse_known_args(argv)  # --rocm, --cuda, --model ...: for `conformance run`
    ns.extra = [*unknown, *ns.extra]
    if ns.second_node and "--reference-pack" not in ns.extra:
        print("bench: --second-node reads the first runs' reference pack: give the runs --reference-pack DIR "
              "(after --).", file=sys.stderr)
        return 2
    try:
        if ns.from_runs is not None:
            recorded: dict[tuple[str, int | None], list[dict[str, Any]]] = {}
            for d in ns.from_runs:
                record = read_record(Path(d))
                recorded.setdefault(_key(record), []).append(record)
            print_tables(recorded, None, variant=ns.variant)
            return 0
        bench_runs(ns)
    except (BenchError, RealdimError) as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
