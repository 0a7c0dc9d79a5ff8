"""The run: the pytest plugin and the command line, the target a run tests, the run's state and its record,
the fixtures the checks take, and the capabilities and known failures that decide what applies."""
