"""The tooling nox and CI run around a run: installs, the offline wheelhouse, the benchmark of run phases.
Standard library only: it runs from the checkout, before the suite is installed."""
