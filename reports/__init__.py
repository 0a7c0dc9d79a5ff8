"""The results record, the history store and the parity dashboard.

`results` reads and validates one run's record (the contract lives in `env_checks.results`, with its
schema `env_checks/results.schema.json`: the suite writes runs by it); `history` keeps every ingested run
in SQLite; `analysis` turns runs into parity scores, disagreements and regressions; `dashboard` renders the
self-contained static site and is the `conformance dashboard` CLI.
"""
