"""Tests of reports/: the results record, the history store and the parity dashboard."""
