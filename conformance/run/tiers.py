"""The check tiers, declared once: the CLI's `--tier` choices, the plugin's `--tier` option and tier markers,
the run record and the matrix all read them from here (standard library only: nox imports it)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

# name -> what the tier is for (the marker's description)
TIER_INFO: dict[str, str] = {
    "p0": "the gate",
    "p1": "production",
    "p2": "performance",
    "p3": "extended",
}
TIERS: tuple[str, ...] = tuple(TIER_INFO)
DEFAULT_TIERS: tuple[str, ...] = ("p0",)


def marker_lines() -> list[str]:
    """The `markers` ini lines that declare the tier markers."""
    return [f"{tier}: tier {tier.upper()}, {what}" for tier, what in TIER_INFO.items()]


def selected(asked: Sequence[str] | None) -> tuple[str, ...]:
    """The tiers asked for (repeatable `--tier`; each value may also be a comma list such as `p0,p1`), in
    declaration order and without repeats; none asked = every tier. ValueError names an unknown tier."""
    if not asked:
        return TIERS
    names = {part.strip().lower() for value in asked for part in value.split(",") if part.strip()}
    unknown = sorted(names - set(TIERS))
    if unknown:
        raise ValueError(f"unknown tier {', '.join(unknown)}: the tiers are {', '.join(TIERS)}.")
    return tuple(t for t in TIERS if t in names)


def tier_of(marker_names: Iterable[str]) -> str | None:
    """The tier among a check's marker names (None when it has none)."""
    return next((name for name in marker_names if name in TIER_INFO), None)
