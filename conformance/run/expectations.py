"""Known failures per platform, as data (expectations/*.toml), applied at collection.

An entry names a check id (a prefix for a skip; the exact id, parameters included, for an xfail), conditions on the
run info (target, engine, dtype, torch_flavour, gcn_arch, cpu_isa, cpu_amx, the serving profile's `sku` and
`model` (profiles.toml: H200, MI300X, cpu; tiny, gpt-oss-120b), `needs_device`: the target's fact in
targets.toml, `missing_modules`: those of the modules the entries name there that this environment cannot import,
and `versions`: distribution -> version specifier, e.g. `{ vllm = "<0.32" }`, which holds when that distribution is
installed at a version the specifier contains) and a status: `xfail` (a known bug: needs a link) or `skip` (an
environment gap or a platform's capability absent: needs a reason). What only some engines can show is no
expectation but a capability (conformance/run/capabilities.py). Entries that match no collected check are reported,
as array-api-tests does, so stale expectations do not linger.

An xfail may carry `match` (a text, or a list of texts): the known bug's failure message contains one of
them. Any other failure of that check (a crash, a hang, another verdict) is then no xfail but a failure,
whose message says so (the hook below): the known bug never hides an unknown one."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from packaging.specifiers import InvalidSpecifier, SpecifierSet

from conformance import datafiles
from conformance.verdicts.settings import release_within

DIR = resources.files("conformance") / "data" / "expectations"  # package data
NARROWED = pytest.StashKey[tuple[list[str], str]]()  # on an item: (texts its xfail's failure must hold, entry)


def load(directory: Path = DIR) -> list[dict[str, Any]]:
    entries = []
    for f in sorted(directory.glob("*.toml")):
        for e in datafiles.load_toml(f).get("expect", []):
            if e.get("status") not in ("xfail", "skip") or "check" not in e:
                raise datafiles.DataError(f"{f}: entry {e} needs `check` and `status` = xfail|skip.")
            if e["status"] == "xfail" and "link" not in e:
                raise datafiles.DataError(f"{f}: xfail entry for {e['check']} needs a bug `link`.")
            for dist, spec in e.get("when", {}).get("versions", {}).items():
                try:
                    SpecifierSet(spec)
                except (InvalidSpecifier, TypeError):
                    raise datafiles.DataError(f"{f}: `versions` of {e['check']}: {dist} = {spec!r} is no version "
                                              f"specifier (such as \"<0.32\").") from None
            if "match" in e and not _texts(e["match"]):
                raise datafiles.DataError(f"{f}: `match` of {e['check']} must be a non-empty text or list of texts.")
            entries.append(e | {"file": f.name})
    return entries


def missing_modules(entries: list[dict[str, Any]] | None = None) -> list[str]:
    """The modules that entries condition on (`when.missing_modules`) which this environment cannot import: an
    optional package a loader needs (transformers' GPTQ loader needs optimum). Found without importing them."""
    entries = load() if entries is None else entries
    named = {m for e in entries for m in _texts(e.get("when", {}).get("missing_modules", []))}
    return sorted(m for m in named if importlib.util.find_spec(m) is None)


def installed_versions(entries: list[dict[str, Any]] | None = None) -> dict[str, str]:
    """The installed versions of the distributions that entries condition on (`when.versions`); one that is not
    installed is left out, so an entry that names it matches nothing."""
    entries = load() if entries is None else entries
    named = {d for e in entries for d in e.get("when", {}).get("versions", {})}
    out = {}
    for dist in sorted(named):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def _versions_hold(want: dict[str, str], have: dict[str, str]) -> bool:
    """Every named distribution is installed at a version its specifier contains (a local build such as
    0.26.0+hopper counts as its release)."""
    return all(dist in have and release_within(have[dist], spec) for dist, spec in want.items())


def matches(when: dict[str, Any], run_info: dict[str, Any]) -> bool:
    for key, want in when.items():
        if key == "versions":
            if not _versions_hold(want, run_info.get("versions", {})):
                return False
            continue
        have = run_info.get(key)
        wants = want if isinstance(want, list) else [want]
        haves = have if isinstance(have, list) else [have]
        if not any(w in haves for w in wants):
            return False
    return True


def apply(items: list[pytest.Item], run_info: dict[str, Any], entries: list[dict] | None = None) -> list[str]:
    """Mark matching items; return descriptions of entries that matched nothing collected."""
    entries = load() if entries is None else entries
    unmatched = []
    for e in entries:
        if not matches(e.get("when", {}), run_info):
            continue
        want = _short(e["check"])  # a skip covers a check id prefix; an xfail (a known bug) one exact check id
        hit = [i for i in items if (_short(i.nodeid) == want if e["status"] == "xfail" else
                                    _short(i.nodeid).startswith(want))]
        if not hit:
            unmatched.append(f"{e['file']}: {e['check']}")
        for item in hit:
            if e["status"] == "xfail":
                item.add_marker(pytest.mark.xfail(reason=f"{e.get('reason', 'known bug')} [{e['link']}]",
                                                  strict=False))
                if "match" in e:
                    item.stash[NARROWED] = (_texts(e["match"]), f"{e['file']}: {e['check']}")
            else:
                item.add_marker(pytest.mark.skip(reason=e.get("reason", "not applicable here")))
    return unmatched


def _texts(match: Any) -> list[str]:
    texts = [match] if isinstance(match, str) else list(match) if isinstance(match, list) else []
    return texts if texts and all(isinstance(t, str) and t for t in texts) else []


@pytest.hookimpl(hookwrapper=True, tryfirst=True)  # outermost: sees the report after pytest's xfail handling
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    """A narrowed xfail whose failure does not hold its `match` text is reported failed, not xfailed."""
    outcome = yield
    narrowed = item.stash.get(NARROWED, None)
    report = outcome.get_result()
    if narrowed is None or call.excinfo is None or not hasattr(report, "wasxfail"):
        return
    texts, entry = narrowed
    failure = f"{call.excinfo.typename}: {call.excinfo.value}"
    if any(t in failure for t in texts):
        return
    del report.wasxfail
    report.outcome = "failed"
    report.longrepr = (f"not the known bug ({entry}, whose failure holds {' or '.join(map(repr, texts))}), so no "
                       f"xfail: {failure}\n{report.longrepr}")


def _short(node_id: str) -> str:
    """Ids relative to the checks directory, whatever rootdir pytest chose."""
    return node_id.rsplit("/", 1)[-1]


def link_of(message: str) -> str | None:
    m = re.search(r"\[(https?://[^\]]+)\]", message)
    return m.group(1) if m else None
