"""The conformance suite: pytest plugin, targets, engines under test, fp64 reference and checks."""
