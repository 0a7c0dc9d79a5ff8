"""Dashboard build time as a benchmark (`nox -s bench` runs it; a figure, not a timed test):
N runs made from recorded results, ingested and rendered, then rendered again with nothing new.

  python -m reports.bench --templates fixtures/runs --runs 1000 --repeat 3
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from reports.dashboard import build
from reports.results import summarize

BAR_S = 10.0  # the dashboard's goal on the 2-core machine, per build of 1,000 runs


def synthetic_runs(templates: list[dict[str, Any]], out: Path, n: int, combos: int = 12) -> Path:
    """`n` runs in `out` made from `templates`: one an hour, `combos` combinations, every 7th with a failure."""
    for i in range(n):
        rec = copy.deepcopy(templates[i % len(templates)])
        day, hour = divmod(i, 24)
        month, mday = day // 28 + 1, day % 28 + 1
        rec["run_id"] = f"2025{month:02d}{mday:02d}T{hour:02d}0000Z-{rec['target']}-{i:06x}"
        rec["started_at"] = rec["finished_at"] = f"2025-{month:02d}-{mday:02d}T{hour:02d}:00:00Z"
        rec["combo"] = f"combo-{i % combos}"
        if i % 7 == 0:
            rec["checks"][3]["outcome"] = "failed"
        rec["summary"] = summarize(rec["checks"])
        (out / rec["run_id"]).mkdir(parents=True)
        (out / rec["run_id"] / "results.json").write_text(json.dumps(rec))
    return out


def templates_in(runs: Path) -> list[dict[str, Any]]:
    """Every readable results.json under `runs` (a malformed one is left out, as the dashboard skips it)."""
    found = []
    for path in sorted(runs.glob("*/results.json")):
        try:
            found.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            continue
    return [rec for rec in found if isinstance(rec.get("checks"), list) and len(rec["checks"]) > 3]


def time_builds(templates: list[dict[str, Any]], n: int, work: Path) -> tuple[float, float]:
    """(first build, second build) seconds for `n` synthetic runs in a fresh history."""
    runs = synthetic_runs(templates, work / "runs", n)
    start = time.perf_counter()
    build(runs, work / "h.sqlite", work / "site")
    first = time.perf_counter() - start
    start = time.perf_counter()
    build(runs, work / "h.sqlite", work / "site")
    return first, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="reports.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--templates", type=Path, default=Path("fixtures/runs"),
                        help="run directories whose results.json the synthetic runs copy (default fixtures/runs)")
    parser.add_argument("--runs", type=int, default=1000, help="synthetic runs per build (default 1000)")
    parser.add_argument("--repeat", type=int, default=3, help="builds to time (default 3)")
    args = parser.parse_args(argv)
    templates = templates_in(args.templates)
    if not templates:
        parser.error(f"no usable results.json under {args.templates}")
    samples = []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory() as tmp:
            samples.append(time_builds(templates, args.runs, Path(tmp)))
    print(f"dashboard, {args.runs} runs, {args.repeat} builds (goal {BAR_S:.0f} s each)")
    print(f"{'build':<28}{'median':>9}{'min':>9}{'max':>9}")
    for label, values in (("first (ingest + render)", [s[0] for s in samples]),
                          ("again (nothing new)", [s[1] for s in samples])):
        print(f"{label:<28}{statistics.median(values):>8.2f}s{min(values):>8.2f}s{max(values):>8.2f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
