"""The results record, the history store and the parity dashboard.

`results` validates and writes one run's record (the contract in `schema/results.schema.json`);
`history` keeps every ingested run in SQLite; `analysis` turns runs into parity scores, disagreements and
regressions; `dashboard` renders the self-contained static site and is the `conformance dashboard` CLI.
"""
