"""Readers of the tool outputs and logs people paste (`conformance diagnose`), one module per tool family, named by the
tool it reads, behind one table (`registry.FAMILIES`).

Unlike the probes' parsers (`env_checks.probes`, which refuse anything incomplete, so a fingerprint never holds a
guess), these readers take whatever can be read from a truncated, wrapped or partial paste and say, in one sentence
each, what could not be read. A fact is only ever a value the text states; nothing is inferred from a device id. The
contract of a reader and the fact vocabulary are in `reading`.
"""
