"""The plugin's run-time rules kept out of plugin.py: the `--tier` selection, the xdist refusal, the run
header at session start, the heartbeat lines on the terminal and the `--server` address.

Tiers are a plugin option, not a `-m` expression, so that a user's own `-m "not slow"` (or `-k`) narrows the
tiers asked for instead of replacing them."""

from __future__ import annotations

import os
from typing import Any

import pytest

from conformance.engines import heartbeat, openai_api
from conformance.engines.vllm_server import SERVER_URL_ENV, ServerError
from conformance.run import phases, runheader, tiers

XDIST_SENTENCE = ("the conformance plugin runs its checks in one process (its engines, server and run record are "
                  "per session), so it cannot run under pytest-xdist: drop -n/--dist (for one run per GPU use "
                  "`nox -s matrix -- --gpus N`).")


def refuse_xdist(config: pytest.Config) -> None:
    """A UsageError (one sentence) under `-n N` / `--dist`: without it the workers die on a KeyError."""
    opt = config.option
    if hasattr(config, "workerinput") or getattr(opt, "numprocesses", None) or \
            getattr(opt, "dist", "no") not in ("no", None):
        raise pytest.UsageError(XDIST_SENTENCE)


def selected_tiers(config: pytest.Config) -> tuple[str, ...]:
    try:
        return tiers.selected(config.option.tier)
    except ValueError as exc:
        raise pytest.UsageError(f"--tier: {exc}") from None


def deselect_other_tiers(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep the checks of the selected tiers; the others are reported as deselected, as `-m` would."""
    wanted = set(selected_tiers(config))
    if wanted == set(tiers.TIERS):
        return
    keep, drop = [], []
    for item in items:
        (keep if tiers.tier_of(m.name for m in item.iter_markers()) in wanted else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def configure(config: pytest.Config) -> None:
    """At pytest_configure: tier markers, heartbeats to the terminal, and the user's server if any."""
    for line in tiers.marker_lines():
        config.addinivalue_line("markers", line)
    config.addinivalue_line("markers", phases.OWN_ENGINE_LINE)
    selected_tiers(config)  # a bad --tier is a usage error before anything starts
    try:
        heartbeat.to_fd(1)  # fd 1 is the terminal now; pytest's capture redirects it during each check
    except OSError:
        pass  # no stdout: the lines go to stderr
    try:
        url = openai_api.server_url(config.option.server, os.environ)
    except ServerError as exc:
        raise pytest.UsageError(str(exc)) from None
    if url:  # the serving checks read it; a user's server replaces the suite's own
        os.environ[SERVER_URL_ENV] = url


def print_header(session: pytest.Session, ctx: Any) -> None:
    """The run header, where pytest shows none (`-q`, `--no-header`: what `conformance run` uses)."""
    config = session.config
    tw = config.pluginmanager.get_plugin("terminalreporter")
    if tw is None or runheader.pytest_shows_header(config):
        return
    for line in header_lines(config, ctx):
        tw.write_line(line, bold=True)


def header_lines(config: pytest.Config, ctx: Any) -> list[str]:
    return runheader.lines(ctx, selected_tiers(config))
