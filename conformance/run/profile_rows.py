"""`--profile NAME:all`: the backend-row expansion of a serving profile (data/profiles.toml [row_expansion]).

`conformance run --profile NAME:all` runs once per row of NAME's backend matrix, each run its own
results.json recording NAME:ROW: the first (default) row runs every selected check, the others the
engine-level checks (parity, KV accounting, batching, prefix cache, preemption), so "AITER on vs off" is a
row of the parity matrix. The exit code is the worst of the rows'."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conformance.verdicts import profiles

ALL = "all"


@dataclass(frozen=True)
class Row:
    label: str            # the --profile value of this run: NAME:ROW
    engine_level_only: bool


def expand(requested: str | None, table: dict[str, Any] | None = None) -> list[Row] | None:
    """The runs of `--profile NAME:all`, or None when `requested` names one row (or no profile)."""
    if not requested:
        return None
    name, _, row = requested.partition(":")
    if row != ALL:
        return None
    chosen = profiles.profile(name, None, table)  # ProfileError in one sentence for an unknown NAME
    return [Row(f"{name}:{r}", i > 0) for i, r in enumerate(chosen.matrix)]


def engine_level_checks(checks_dir: Path, table: dict[str, Any] | None = None) -> list[str]:
    files = list((table or profiles.data())["row_expansion"]["checks"])
    missing = [f for f in files if not (checks_dir / f).is_file()]
    if missing:
        raise profiles.ProfileError(f"profiles.toml [row_expansion] names check modules that do not exist: "
                                    f"{', '.join(missing)}")
    return [str(checks_dir / f) for f in files]


def row_args(args: list[str], checks_dir: Path, row: Row, table: dict[str, Any] | None = None) -> list[str]:
    """The pytest arguments of one row: its --profile, and the engine-level modules instead of the whole
    checks folder for every row but the first."""
    out = [f"--profile={row.label}" if a.startswith("--profile=") else a for a in args]
    if row.engine_level_only:
        at = out.index(str(checks_dir))
        out[at:at + 1] = engine_level_checks(checks_dir, table)
    return out


SEVERITY = (0, 4, 1, 2, 3)  # passed < narrowed (passed, not whole) < failed < usage/interrupted < internal error


def worst(codes: list[int]) -> int:
    """The most severe exit code of the rows (SEVERITY); an unknown code counts as an internal error."""
    return max(codes, key=lambda c: SEVERITY.index(c) if c in SEVERITY else len(SEVERITY), default=3)


def run_rows(rows: list[Row], args: list[str], checks_dir: Path, run_one: Callable[[list[str]], int],
             say: Callable[[str], None] = print) -> int:
    codes = []
    for n, row in enumerate(rows, 1):
        say(f"conformance: profile row {n}/{len(rows)}: {row.label}"
            f"{' (engine-level checks)' if row.engine_level_only else ''}")
        codes.append(run_one(row_args(args, checks_dir, row)))
        if codes[-1] == 2:  # interrupted or bad usage: the other rows would say the same
            break
    say("conformance: profile rows: " + ", ".join(f"{r.label} -> exit {c}" for r, c in zip(rows, codes)))
    return worst(codes)
