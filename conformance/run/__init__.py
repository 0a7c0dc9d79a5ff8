"""The run: the pytest plugin and the CLI, targets, tiers, expectations, fixtures, machine health and
the run record."""
