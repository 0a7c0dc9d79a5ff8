"""The conformance checks: one module per area, each check a plain pytest function with a tier."""
