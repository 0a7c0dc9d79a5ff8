"""Measurement tools: the campaigns that set a limit of conformance/data (docs/notebook/) run from here."""
