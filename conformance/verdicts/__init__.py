"""Verdicts: comparison helpers that return reports (raising only via `raise_if_failed`), and
the tolerances and limits they read from data/."""
