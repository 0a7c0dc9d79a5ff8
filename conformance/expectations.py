"""Known failures per platform, as data (expectations/*.toml), applied at collection.

An entry names a check id prefix, conditions on the run info (target, engine, dtype,
torch_flavour, gcn_arch) and a status: `xfail` (a known bug: needs a link) or `skip`
(capability absent: needs a reason). Entries that match no collected check are reported, as
array-api-tests does, so stale expectations do not linger."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from conformance import settings

DIR = resources.files("conformance") / "expectations"  # package data


def load(directory: Path = DIR) -> list[dict[str, Any]]:
    entries = []
    for f in sorted(directory.glob("*.toml")):
        for e in settings.load_toml(f).get("expect", []):
            if e.get("status") not in ("xfail", "skip") or "check" not in e:
                raise settings.DataError(f"{f}: entry {e} needs `check` and `status` = xfail|skip.")
            if e["status"] == "xfail" and "link" not in e:
                raise settings.DataError(f"{f}: xfail entry for {e['check']} needs a bug `link`.")
            entries.append(e | {"file": f.name})
    return entries


def matches(when: dict[str, Any], run_info: dict[str, Any]) -> bool:
    for key, want in when.items():
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
        hit = [i for i in items if _short(i.nodeid).startswith(_short(e["check"]))]
        if not hit:
            unmatched.append(f"{e['file']}: {e['check']}")
        for item in hit:
            if e["status"] == "xfail":
                item.add_marker(pytest.mark.xfail(reason=f"{e.get('reason', 'known bug')} [{e['link']}]",
                                                  strict=False))
            else:
                item.add_marker(pytest.mark.skip(reason=e.get("reason", "not applicable here")))
    return unmatched


def _short(node_id: str) -> str:
    """Ids relative to the checks directory, whatever rootdir pytest chose."""
    return node_id.rsplit("/", 1)[-1]


def link_of(message: str) -> str | None:
    m = re.search(r"\[(https?://[^\]]+)\]", message)
    return m.group(1) if m else None
