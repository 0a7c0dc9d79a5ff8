"""`python -m conformance` is the `conformance` command."""

from conformance.run.cli import entry

entry()
