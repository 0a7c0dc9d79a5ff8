"""`conformance checks`: every check, what it verifies, against what, within which limits, and what to do when it
fails, read from the checks' source and the data tables (nothing is imported or run).

  conformance checks [--tier p0|p1|p2|p3 ...]        the list, one check a paragraph, limits per dtype
  conformance checks --json                          the same as JSON (one object per check)
  conformance checks --markdown [--docs DIR]          write the reference: DIR/checks/README.md (by tier), one page
                                                     per area DIR/checks/<area>.md, and DIR/failure-catalogue.md
  conformance checks --catalogue                     print the failure catalogue (symptom, cause, remedy)

The committed pages under docs/ are this command's output; tests/test_check_reference.py fails when they drift."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from conformance.tooling import check_limits, check_pages, failure_catalogue
from conformance.tooling.check_catalogue import CHECKS_DIR, TIERS, read_checks

CHECKOUT = Path(__file__).resolve().parents[2]
DOCS = CHECKOUT / "docs"
REGENERATE = "conformance checks --markdown"


def written_pages(docs: Path, tier_info: Mapping[str, str], checks_dir: Path = CHECKS_DIR) -> dict[Path, str]:
    """Every page the reference is made of, by path under `docs`, with its text."""
    checks = read_checks(checks_dir)
    classes = {klass: meaning for _, klass, meaning in failure_catalogue.failure_classes(docs / "results.md")}
    out = {docs / "checks" / name: text for name, text in check_pages.pages(checks, tier_info, classes).items()}
    out[docs / "failure-catalogue.md"] = failure_catalogue.catalogue_page(docs / "results.md")
    return out


def leftover_pages(docs: Path, want: Mapping[Path, str]) -> list[Path]:
    """Pages under docs/checks/ the command no longer writes (an area no check has any more)."""
    return [p for p in sorted((docs / "checks").glob("*.md")) if p not in want]


def stale_pages(docs: Path, tier_info: Mapping[str, str], checks_dir: Path = CHECKS_DIR) -> list[str]:
    """The pages under `docs` that differ from what the command writes now (or are missing, or left over)."""
    want = written_pages(docs, tier_info, checks_dir)
    stale = [str(p.relative_to(docs)) for p, text in want.items()
             if not p.is_file() or p.read_text(encoding="utf-8") != text]
    return sorted(stale + [f"{p.relative_to(docs)} (no check has this area any more)"
                           for p in leftover_pages(docs, want)])


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="conformance checks", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tier", action="append", choices=TIERS, help="only checks of this tier (repeatable)")
    form = p.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="one JSON object per check, limits read from the data")
    form.add_argument("--markdown", action="store_true", help="write the per-check reference and the failure "
                                                              "catalogue under --docs")
    form.add_argument("--catalogue", action="store_true", help="print the failure catalogue")
    p.add_argument("--docs", type=Path, default=DOCS, help="the docs folder --markdown writes into (default: the "
                                                           "checkout's docs/)")
    return p


def main(argv: Sequence[str], tier_info: Mapping[str, str]) -> int:
    """Exit 0, or 2 with one sentence where the checks' metadata or the data cannot be read."""
    ns = parser().parse_args(list(argv))
    try:
        if ns.markdown:
            if ns.tier:
                print("conformance checks: --markdown writes every tier; leave out --tier", file=sys.stderr)
                return 2
            want = written_pages(ns.docs, tier_info)
            for path, text in want.items():
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text, encoding="utf-8")
            for left in leftover_pages(ns.docs, want):
                left.unlink()
            print(f"wrote {ns.docs / 'checks'} and {ns.docs / 'failure-catalogue.md'}")
            return 0
        if ns.catalogue:
            sys.stdout.write(failure_catalogue.catalogue_page(ns.docs / "results.md"))
            return 0
        checks = [c for c in read_checks() if not ns.tier or c.tier in ns.tier]
        sys.stdout.write(check_pages.as_json(checks) if ns.json else check_pages.as_text(checks))
        return 0
    except (check_limits.LimitsError, failure_catalogue.CatalogueError, SyntaxError, OSError) as exc:
        print(f"conformance checks: {exc}", file=sys.stderr)
        return 2
