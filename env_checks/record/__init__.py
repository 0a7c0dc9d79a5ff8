"""The record contract shared by the suite (which writes runs) and the reports (which read them): one run's record and
its JSON Schema (`results`, `results.schema.json`), the fingerprint of the stack a run tested (`fingerprint`), and the
reading of a fingerprint into a platform label, a lineage and a diff (`stack`).
"""
